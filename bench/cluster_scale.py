"""Scale on paper and in simulation (issue 34): a fleet of 64 nodes x 8 GPUs, all on this machine.

What is measured, in one run:

1. The fleet: 64 `regen sim sglang` servers, each standing for one node of 8 GPUs (the simulator
   reports `tp_size` 8 in /server_info, which the backend counts as the node's GPUs), made cheap
   (the scheduler steps 4 times a second, answers of 64-192 tokens, no radix cache, warnings-only
   logs); and the real smg router (`python -m smg launch`, regen's own command line:
   engine/host/router.py `router_argv`) in front of the 64 with 64 worker URLs.
2. The job's one process at that size: `regen run --headless` (a real job, its own process, as
   bench/fleet_run.py starts it) with `job.backend = "sglang"` and `job.concurrency` 64 x 8 x 16 =
   8192, over the same fleet reached in the ways `sglang.urls` allows: 1 node, 8 nodes and 64 nodes
   named directly (the backend sends each request to the node with the fewest in flight and scrapes
   every node's /metrics), and the router's URL alone (as regen reads the router, and once more with
   every node saying it runs the whole fleet's 8192 at once, so the job's ceiling is not one node's:
   the path a cluster's fleet takes, the router in front and the job's full in-flight through it).
   Each run: a warm-up, then a window in which the job's requests/s (rows), mean in flight (from
   the attempts journal: each attempt's start and end records), CPU per row of the job's process
   (its tokenizer workers included), of the router and of the simulators (/proc/PID/stat user +
   system), and the peak RSS (VmHWM) of the job and the router are measured; then the job is
   stopped (SIGTERM twice: cancel) and the nodes drain before the next run.
3. The plan at 64 x 8: the two-fleet plan (engine/money/fleetplan `plan_fleets`) and one pacing
   tick (`Pacer.update`) take the GPU fleet as one aggregate rate, never a worker count: timed on
   bench/fleet_plan.py's story at one fleet's rate and at 64 times it (work and budget scaled too).
4. The console at 64 workers: the snapshot the 64-node job served on its control socket (64 workers
   as routes and servers), with 64 GPU hosts of 8 GPUs each added to its `hosts` (the host pane's
   view as engine/host/monitor.py gives it), repainted in the real console (Textual, headless,
   160x50) frame after frame; against the 1-node job's snapshot with one host.

    .venv/bin/python bench/cluster_scale.py              # about 5 minutes
    .venv/bin/python bench/cluster_scale.py --write-md   # also update BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import FrameType
from typing import IO, Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.fleet_plan import (  # noqa: E402 - the sibling benchmark's story
    BUDGET,
    DEADLINE,
    GPU_RATE,
    MAX_IN_FLIGHT,
    REQUEST_RATE,
    REQUEST_TOKENS,
    WORK,
    sim_providers,
)
from bench.router_overload import wait_ready  # noqa: E402
from bench.throughput import machine, proc_cpu_s, revision, write_md  # noqa: E402
from regen.console.options import ConsoleOptions  # noqa: E402
from regen.engine.host.router import ADMISSION_ARGS, router_argv  # noqa: E402
from regen.engine.lifetime import die_with_parent  # noqa: E402
from regen.engine.money.fleetplan import RouteOffer, Work, plan_fleets  # noqa: E402
from regen.engine.money.fleetplan.pacing import Facts, Pacer  # noqa: E402
from regen.engine.schema import GpuView, Hello, HostView, Snapshot  # noqa: E402
from regen.sim.sglang.tokens import builtin_tokenizer_folder  # noqa: E402
from tests.support.processes import free_port  # noqa: E402

MD_START = "<!-- bench:cluster-scale:start -->"
MD_END = "<!-- bench:cluster-scale:end -->"
HEADING = "Scale: 64 nodes x 8 GPUs, the router and the job's one process (issue 34)"
OUT = ROOT / "bench" / "out" / "cluster_scale"
MODEL = "kimi-k2.5"
NODES = 64
GPUS_PER_NODE = 8
IN_FLIGHT = NODES * GPUS_PER_NODE * 16  # job.concurrency: 16 requests per GPU
SLOTS = 128  # requests one node runs at once (its max_running_requests): 64 x 128 = 8192
MAX_TOKENS = 256  # openrouter.max_tokens, the sampling settings both backends share
PROMPTS = 60_000  # more than any run finishes: each run is stopped after its window
# One node: a request decodes at 40 tokens/s x time_scale 2.5 = 16 tokens/s, so an answer of 64-192
# tokens takes 4-12 s (8 on average) alone, and 8192 in flight would finish about 1,000 a second;
# the scheduler steps every 0.25 s (several tokens a step), so the simulator's cost follows steps,
# not tokens. That is more than the two cores give the job, the router and 64 nodes together:
# the runs measure what the machine holds.
SIM: dict[str, Any] = {
    "served_model_name": MODEL,
    "tp_size": GPUS_PER_NODE,
    "max_running_requests": SLOTS,
    "time_scale": 2.5,
    "decode_tokens_per_s": 40.0,
    "max_gen_throughput": 1e6,
    "output_len_min": 64,
    "output_len_max": 192,
    "min_step_s": 0.25,
    "radix_cache": False,
    "log_level": "warning",
    "requests_maxlen": 1,
    "startup_weights_s": 0.0,
    "startup_kv_pool_s": 0.0,
    "startup_cuda_graph_s": 0.0,
    "startup_http_s": 0.0,
    "startup_warmup_s": 0.0,
    "child_processes": 0,
    "seed": 1,
}
STOP_GRACE_S = 15.0


# --------------------------------------------------------------------------------- processes


class Procs:
    """Every process this benchmark starts, each ended (SIGTERM, then SIGKILL) by `stop` or at the
    end whatever happens (`stop_all`); each also gets SIGTERM should this process die first."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[IO[bytes]] = []

    def start(self, argv: Sequence[str], log: Path, *, stdout_pipe: bool = False) -> subprocess.Popen[bytes]:
        out = log.open("wb")
        self.logs.append(out)
        proc = subprocess.Popen(
            list(argv),
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout_pipe else out,
            stderr=out,
            preexec_fn=partial(die_with_parent, os.getpid()),
        )
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> None:
        stop_all([proc], grace_s)
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self) -> None:
        stop_all(self.procs, STOP_GRACE_S)
        self.procs.clear()
        for out in self.logs:
            out.close()
        self.logs.clear()


def stop_all(procs: Sequence[subprocess.Popen[bytes]], grace_s: float) -> None:
    """SIGTERM to every one still running, then SIGKILL to any left after `grace_s`."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    ends = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(max(0.1, ends - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def descendants(pid: int) -> list[int]:
    """`pid`'s children, theirs, and so on (the job's tokenizer workers), from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def tree_cpu_s(pid: int) -> float:
    return proc_cpu_s(pid) + sum(proc_cpu_s(child) for child in descendants(pid))


def status_kib(pid: int, key: str) -> int:
    """A VmHWM / VmRSS figure of /proc/PID/status, in KiB (0 once the process is gone)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


# ------------------------------------------------------------------------------- the fleet


@dataclass
class Fleet:
    """The simulated nodes: their processes and URLs."""

    procs: list[subprocess.Popen[bytes]]
    urls: list[str]
    started_s: float
    rss_mib: float


def start_fleet(procs: Procs, folder: Path, nodes: int) -> Fleet:
    """`nodes` simulators started at once; each prints its URL on stdout once it listens."""
    config = folder / "node.json"
    config.write_text(json.dumps(SIM))
    began = time.monotonic()
    started = [
        procs.start(
            [sys.executable, "-m", "regen", "sim", "sglang", "--port", "0", "--config", str(config)],
            folder / f"node{i:02d}.log",
            stdout_pipe=True,
        )
        for i in range(nodes)
    ]
    urls = []
    for i, proc in enumerate(started):
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        if "listening on" not in line:
            raise SystemExit(f"node {i} did not start: {line!r}; see {folder / f'node{i:02d}.log'}")
        urls.append(line.split(" on ", 1)[1].strip().rstrip("/"))
    took = time.monotonic() - began
    rss = sum(status_kib(p.pid, "VmRSS") for p in started) / 1024 / nodes
    return Fleet(started, urls, took, rss)


def get_json(url: str, body: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        return json.loads(resp.read())


def patch_nodes(urls: Sequence[str], patch: dict[str, Any]) -> None:
    for url in urls:
        get_json(url + "/_sim/config", patch)


def wait_idle(urls: Sequence[str], timeout_s: float = 60.0) -> None:
    """Until no node runs or queues anything (a cancelled job's aborts have landed)."""
    ends = time.monotonic() + timeout_s
    while time.monotonic() < ends:
        states = [get_json(url + "/_sim/state") for url in urls]
        if all(s["running"] == 0 and s["queued"] == 0 for s in states):
            return
        time.sleep(0.5)
    raise SystemExit(f"the nodes did not drain in {timeout_s:.0f} s")


def served(urls: Sequence[str]) -> list[int]:
    return [int(get_json(url + "/_sim/state")["counters"]["requests"]) for url in urls]


# --------------------------------------------------------------------------------- one run


@dataclass(frozen=True)
class Case:
    name: str
    nodes: int  # the nodes the job's requests reach
    router: bool  # sglang.urls is the router's URL (else the nodes' own URLs)
    fleet_slots: bool = False  # every node says it runs the whole fleet's IN_FLIGHT at once
    smg_bound: bool = False  # smg's own admission bound left on (regen's launch lifts it: ADMISSION_ARGS)
    capture: bool = False  # keep the job's snapshot for the console part


@dataclass
class Result:
    case: Case
    window_s: float
    rows: int
    rows_per_s: float
    in_flight: float
    limit: str
    e2e_p50_s: float | None
    job_cpu_s: float
    job_tokenizer_cpu_s: float
    job_hwm_mib: float
    router_cpu_s: float | None
    router_hwm_mib: float | None
    nodes_cpu_s: float
    split: tuple[int, int] | None  # fewest and most requests one node served
    errors: dict[str, int] = field(default_factory=dict)
    hello: Hello | None = None
    snapshot: Snapshot | None = None


def write_dataset(folder: Path, prompts: int) -> Path:
    folder.mkdir(parents=True)
    lines = (
        orjson.dumps({"messages": [{"role": "user", "content": f"question {i}: explain topic {i % 97}."}]})
        for i in range(prompts)
    )
    (folder / "prompts.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
    return folder


def settings_text(urls: Sequence[str], dataset: Path, run_dir: Path, tokenizer: Path) -> str:
    return (
        f"[openrouter]\nmax_tokens = {MAX_TOKENS}\n"
        f"[sglang]\nurls = {json.dumps(list(urls))}\nserved_model_name = {json.dumps(MODEL)}\n"
        f"[tokenizer]\npath = {json.dumps(str(tokenizer))}\nworkers = 1\n"
        f'[job]\nbackend = "sglang"\ndatasets = [{json.dumps(str(dataset))}]\n'
        f"run_dir = {json.dumps(str(run_dir))}\nconcurrency = {IN_FLIGHT}\n"
        "[headless]\nstatus_interval_s = 5.0\n"
    )


def journal_figures(path: Path, t0: float, t1: float) -> tuple[int, float, float | None, dict[str, int]]:
    """From attempts.jsonl: rows finished in [t0, t1] (epoch), the mean in flight over it (each
    attempt from its start record to its end record, or to t1), the median e2e of those rows, and
    the failures by outcome."""
    starts: dict[str, float] = {}
    spans: list[tuple[float, float]] = []
    rows = 0
    e2e: list[float] = []
    errors: dict[str, int] = {}
    for line in path.read_bytes().splitlines():
        record = orjson.loads(line)
        kind = record.get("k")
        if kind == "start":
            starts[record["rid"]] = float(record["ts"])
        elif kind == "end":
            began = starts.pop(record["rid"], None)
            ended = float(record["ts"])
            if began is not None:
                spans.append((began, ended))
            if t0 <= ended <= t1:
                outcome = record.get("outcome")
                if outcome in ("ok", "truncated"):
                    rows += 1
                    if record.get("e2e") is not None:
                        e2e.append(float(record["e2e"]))
                elif outcome != "cancelled":
                    errors[str(outcome)] = errors.get(str(outcome), 0) + 1
    spans.extend((began, t1) for began in starts.values())
    held = sum(max(0.0, min(end, t1) - max(start, t0)) for start, end in spans)
    return rows, held / (t1 - t0), statistics.median(e2e) if e2e else None, errors


def limits_said(log: Path, start: int, end: int) -> str:
    """The in-flight limits the job's status lines said between byte offsets `start` and `end` of its
    log: "8192", "160<8192" (lowered below the configured 8192), or the lowest and highest
    effective limits when they moved ("1966-7495<8192")."""
    text = log.read_bytes()[start:end].decode(errors="replace")
    said = [
        line.split("| in flight ", 1)[1].split(" |", 1)[0].split("/", 1)[-1]
        for line in text.splitlines()
        if "| in flight " in line
    ]
    if not said:
        return "?"
    effective = sorted({int(x.split("<", 1)[0]) for x in said})
    configured = said[-1].split("<", 1)[1] if "<" in said[-1] else None
    shown = f"{effective[0]}" if len(effective) == 1 else f"{effective[0]}-{effective[-1]}"
    return shown if configured is None and len(effective) == 1 else f"{shown}<{configured or IN_FLIGHT}"


async def take_snapshot(sock: Path) -> tuple[Hello, Snapshot]:
    """The hello and the next snapshot a read-only console gets from the job."""
    from regen.console.client import SocketSource

    source = SocketSource(sock, readonly=True)
    hello = await source.connect()
    try:
        async for snap in source.snapshots():
            return hello, snap
        raise SystemExit("the job closed its control socket before a snapshot")
    finally:
        await source.close()


def wait_for(path: Path, proc: subprocess.Popen[bytes], timeout_s: float, log: Path) -> None:
    ends = time.monotonic() + timeout_s
    while not (path.exists() and path.stat().st_size > 0):
        if proc.poll() is not None:
            raise SystemExit(f"the job exited ({proc.returncode}) before its first request; see {log}")
        if time.monotonic() > ends:
            raise SystemExit(f"the job sent nothing in {timeout_s:.0f} s; see {log}")
        time.sleep(0.1)


def run_case(
    procs: Procs, fleet: Fleet, case: Case, folder: Path, tokenizer: Path, warmup_s: float, window_s: float
) -> Result:
    folder.mkdir(parents=True)
    nodes = fleet.urls[: case.nodes]
    node_pids = [p.pid for p in fleet.procs[: case.nodes]]
    if case.fleet_slots:
        patch_nodes(fleet.urls, {"max_running_requests": IN_FLIGHT})
    router: subprocess.Popen[bytes] | None = None
    try:
        urls = nodes
        if case.router:
            port, metrics_port = free_port(), free_port()
            argv = router_argv(
                nodes, port, metrics_port, 600, admission_args=() if case.smg_bound else ADMISSION_ARGS
            )
            router = procs.start(argv, folder / "router.log")
            url = f"http://127.0.0.1:{port}"
            asyncio.run(wait_ready(url, len(nodes), timeout_s=120))
            urls = [url]
        served_before = served(nodes)
        dataset = write_dataset(folder / "data" / "set0", PROMPTS)
        settings = folder / "settings.toml"
        settings.write_text(settings_text(urls, dataset, folder / "run", tokenizer))
        log = folder / "job.log"
        job = procs.start(
            [sys.executable, "-m", "regen.cli.main", "run", "--headless", "--settings", str(settings)], log
        )
        attempts = folder / "run" / "attempts.jsonl"
        wait_for(attempts, job, 120, log)
        time.sleep(warmup_s)
        if job.poll() is not None:
            raise SystemExit(f"{case.name}: the job exited ({job.returncode}) during the warm-up; see {log}")
        t0, log_0 = time.time(), log.stat().st_size
        job_0 = proc_cpu_s(job.pid)
        tok_0 = sum(tree_cpu_s(c) for c in descendants(job.pid))
        router_0 = proc_cpu_s(router.pid) if router is not None else 0.0
        nodes_0 = sum(proc_cpu_s(pid) for pid in node_pids)
        time.sleep(window_s)
        t1, log_1 = time.time(), log.stat().st_size
        job_1 = proc_cpu_s(job.pid)
        tok_1 = sum(tree_cpu_s(c) for c in descendants(job.pid))
        router_1 = proc_cpu_s(router.pid) if router is not None else 0.0
        nodes_1 = sum(proc_cpu_s(pid) for pid in node_pids)
        job_hwm = status_kib(job.pid, "VmHWM") / 1024
        router_hwm = status_kib(router.pid, "VmHWM") / 1024 if router is not None else None
        if job.poll() is not None:
            raise SystemExit(f"{case.name}: the job exited ({job.returncode}) in the window; see {log}")
        hello: Hello | None = None
        snap: Snapshot | None = None
        if case.capture:
            hello, snap = asyncio.run(take_snapshot(folder / "run" / "control.sock"))
        # Stop: the first SIGTERM drains, the second cancels what is in flight (aborted on the nodes).
        job.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        procs.stop(job, 60.0)
        served_after = served(nodes)
    finally:
        if router is not None:
            procs.stop(router)
        if case.fleet_slots:
            patch_nodes(fleet.urls, {"max_running_requests": SLOTS})
    wait_idle(nodes)
    rows, in_flight, e2e, errors = journal_figures(attempts, t0, t1)
    window = t1 - t0
    split = [after - before for before, after in zip(served_before, served_after, strict=True)]
    return Result(
        case=case,
        window_s=window,
        rows=rows,
        rows_per_s=rows / window,
        in_flight=in_flight,
        limit=limits_said(log, log_0, log_1),
        e2e_p50_s=e2e,
        job_cpu_s=(job_1 - job_0) + (tok_1 - tok_0),
        job_tokenizer_cpu_s=tok_1 - tok_0,
        job_hwm_mib=job_hwm,
        router_cpu_s=(router_1 - router_0) if router is not None else None,
        router_hwm_mib=router_hwm,
        nodes_cpu_s=nodes_1 - nodes_0,
        split=(min(split), max(split)) if len(split) > 1 else None,
        errors=errors,
        hello=hello,
        snapshot=snap,
    )


def ms_per_row(cpu_s: float | None, rows: int) -> str:
    return "-" if cpu_s is None or not rows else f"{cpu_s / rows * 1000:.2f}"


def share(cpu_s: float | None, window_s: float) -> str:
    return "-" if cpu_s is None else f"{cpu_s / window_s:.0%}"


def machine_share(r: Result) -> str:
    """The CPU of the job, the router and the nodes over the window, as a share of this machine's cores."""
    used = r.job_cpu_s + (r.router_cpu_s or 0.0) + r.nodes_cpu_s
    return f"{used / r.window_s / (os.cpu_count() or 1):.0%}"


def run_table(results: Sequence[Result]) -> list[str]:
    lines = [
        "| run | nodes (GPUs) | in flight, mean (limit said) | rows/s | e2e p50 s | job CPU ms/row (% of a core) "
        "| job peak RSS MiB | router CPU ms/row (% of a core) | router peak RSS MiB | nodes' CPU ms/row "
        "| all three, of the machine | requests per node (fewest-most) | failed attempts |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in results:
        c = r.case
        e2e = "-" if r.e2e_p50_s is None else f"{r.e2e_p50_s:.2f}"
        router = (
            "-"
            if r.router_cpu_s is None
            else f"{ms_per_row(r.router_cpu_s, r.rows)} ({share(r.router_cpu_s, r.window_s)})"
        )
        failed = ", ".join(f"{n:,} {k}" for k, n in sorted(r.errors.items())) or "0"
        lines.append(
            f"| {c.name} | {c.nodes} ({c.nodes * GPUS_PER_NODE}) | {r.in_flight:,.0f} ({r.limit}) | {r.rows_per_s:,.1f} "
            f"| {e2e} | {ms_per_row(r.job_cpu_s, r.rows)} ({share(r.job_cpu_s, r.window_s)}) | {r.job_hwm_mib:,.0f} "
            f"| {router} | {'-' if r.router_hwm_mib is None else f'{r.router_hwm_mib:,.0f}'} "
            f"| {ms_per_row(r.nodes_cpu_s, r.rows)} | {machine_share(r)} "
            f"| {'-' if r.split is None else f'{r.split[0]:,}-{r.split[1]:,}'} | {failed} |"
        )
    return lines


# ---------------------------------------------------------------------------------- the plan


def time_calls(call: Callable[[], object], seconds: float = 1.0, repeats: int = 3) -> tuple[float, int]:
    """Seconds per call of `call()`: the least of `repeats` means, each over about `seconds` (the
    least is the one other work on the machine disturbed least); and the calls made in all."""
    means = []
    calls = 0
    for _ in range(repeats):
        n = 0
        began = time.perf_counter()
        while True:
            call()
            n += 1
            took = time.perf_counter() - began
            if took >= seconds / repeats and n >= 5:
                break
        means.append(took / n)
        calls += n
    return min(means), calls


class Ticks:
    """The pacer fed one tick every 5 s of a simulated run on the story's case at `scale` fleets:
    the work left shrinking, the GPU rate noisy, the budget and the deadline as planned."""

    def __init__(self, scale: int, offers: Sequence[RouteOffer]) -> None:
        self.work = Work(WORK * scale, WORK * scale // REQUEST_TOKENS, 0)
        self.gpu = GPU_RATE * scale
        self.budget = BUDGET * scale
        self.offers = tuple(offers)
        self.pacer = Pacer(MAX_IN_FLIGHT, gpu_tokens_per_s=self.gpu, request_tokens_per_s=REQUEST_RATE)
        self.start = time.time()
        self.k = 0

    def tick(self) -> None:
        self.k += 1
        k, work = self.k, self.work
        made = min(work.output_tokens - 1, int(k * 5 * self.gpu * 1.3))
        left = Work(work.output_tokens - made, max(1, work.prompts - made // REQUEST_TOKENS), 0)
        self.pacer.update(
            Facts(
                now=self.start + k * 5,
                work_left=left,
                gpu_tokens_per_s=self.gpu * (0.95 + 0.1 * (k % 7) / 7),
                request_tokens_per_s=REQUEST_RATE,
                in_flight=200,
                budget_left=self.budget,
                deadline=self.start + DEADLINE,
                offers=self.offers,
                rows=k * 100,
                gpu_rows=k * 70,
            )
        )


def plan_lines() -> list[str]:
    """plan_fleets and one Pacer tick on the story's case at 1 fleet's rate and at 64 times it."""
    offers = sim_providers()
    lines = [
        "| GPU fleet | GPU rate the plan takes | work | budget | `plan_fleets` | `Pacer.update` (one tick) "
        "| plan: GPUs make, OpenRouter carries |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for scale, label in (
        (1, "the story's fleet (bench/fleet_plan.py)"),
        (NODES, f"{NODES} x the story's fleet"),
    ):
        ticks = Ticks(scale, offers)
        work, gpu, budget = ticks.work, ticks.gpu, ticks.budget
        plan = plan_fleets(work, DEADLINE, gpu, offers, budget)
        plan_s, _ = time_calls(partial(plan_fleets, work, DEADLINE, gpu, offers, budget))
        tick_s, _ = time_calls(ticks.tick)
        lines.append(
            f"| {label} | {gpu:,.0f} tok/s | {work.output_tokens / 1e6:,.0f}M tok | ${budget} | {plan_s * 1e6:,.0f} us "
            f"| {tick_s * 1e6:,.0f} us | {plan.gpu_tokens / 1e6:,.1f}M, {plan.openrouter_tokens / 1e6:,.1f}M |"
        )
    return lines


# ------------------------------------------------------------------------------- the console


def host_view(i: int, now: float) -> HostView:
    """Node i as the host pane gets it (engine/host/monitor.py view()): 8 GPUs busy, SGLang running."""
    gpus: list[GpuView] = [
        {
            "index": g,
            "name": "NVIDIA H200",
            "memory_used_mib": 131_000 + 97 * g + i,
            "memory_total_mib": 143_771,
            "utilization_pct": 90 + (i + g) % 10,
            "processes": [{"pid": 4000 + g, "name": "sglang::scheduler", "memory_mib": 130_000}],
        }
        for g in range(GPUS_PER_NODE)
    ]
    return {
        "name": f"node{i:02d}",
        "address": f"10.1.{i // 200}.{i % 200 + 10}:22",
        "state": "connected",
        "error": None,
        "retries": 0,
        "connected_at": now - 3600,
        "gpus": gpus,
        "gpu_error": None,
        "disk": {
            "data_root": {"path": "/data", "free_bytes": 900_000_000_000},
            "model_path": {"path": "/models/kimi-k2.5", "free_bytes": 2_000_000_000_000},
        },
        "polled_at": now - 2,
        "polls": 1800,
        "inspect": None,
        "tunnel": {
            "host": f"node{i:02d}",
            "url": f"http://10.1.0.{i + 10}:30000",
            "remote_port": 30000,
            "state": "direct",
            "error": None,
            "drops": 0,
            "reopens": 0,
            "connections": 0,
        },
        "sglang": {
            "ok": True,
            "error": None,
            "state": "running",
            "pid": 4000,
            "alive": True,
            "phase": "ready",
            "failure": None,
            "ready": True,
            "version": "0.5.23",
            "launched_version": "0.5.23",
            "served_model_name": MODEL,
            "running": float(SLOTS),
            "queued": float(i % 5),
            "gen_throughput": 4200.0 + i,
            "kv_usage": 0.6 + (i % 30) / 100,
            "retractions": 0.0,
            "port": 30000,
        },
        "sglang_action": None,
    }


def frame(snap: Snapshot, hosts: int, k: int) -> Snapshot:
    """Frame k of the console's stream: the snapshot with its figures moved (so every pane has
    something to draw) and `hosts` GPU hosts."""
    out = copy.deepcopy(snap)
    now = time.time()
    out["elapsed_s"] = snap["elapsed_s"] + k
    out["events"] = []
    out["hosts"] = [host_view(i, now) for i in range(hosts)]
    for host in out["hosts"]:
        for gpu in host["gpus"]:
            gpu["utilization_pct"] = 90 + (k + int(gpu["index"] or 0)) % 10
    for lane in out["lanes"]:
        for provider in lane["providers"]:
            provider["requests"] += k
            provider["ok"] += k
            provider["output_tokens"] += 128 * k
    return out


class StillSource:
    """A JobSource that greets with a job's hello and sends nothing by itself: the benchmark posts
    each frame to the console as the snapshot worker does."""

    readonly = True
    closed_reason: str | None = None

    def __init__(self, hello: Hello) -> None:
        self.hello = hello
        self._closed = asyncio.Event()

    async def connect(self) -> Hello:
        return self.hello

    async def snapshots(self) -> Any:
        await self._closed.wait()
        return
        yield

    async def command(self, name: str, **args: Any) -> Any:
        return {"ok": False, "message": "read-only benchmark"}

    async def close(self) -> None:
        self._closed.set()


@dataclass
class Frames:
    cpu_s: float  # this process's CPU per frame, median: the console's work for one snapshot
    wall_s: float  # wall seconds per frame, median (Pilot.pause waits for idle, a floor of its own)
    wall_max_s: float
    host_text_s: float  # the host pane's text for every host (widgets/host.py host_lines)


async def console_frames(hello: Hello, snap: Snapshot, hosts: int, frames: int) -> Frames:
    """The console at 160x50 (Textual headless) shown `frames` frames of `snap` with `hosts` GPU
    hosts, each posted as the snapshot worker posts it and repainted whole (repaint_interval_s 0)."""
    from regen.console.options import configure_environment

    configure_environment()
    from regen.console.app import RegenApp
    from regen.console.messages import SnapshotArrived
    from regen.console.widgets.host import host_lines

    options = ConsoleOptions()
    options.repaint_interval_s = 0.0  # every snapshot repaints every pane at once: the whole cost
    app = RegenApp(StillSource(hello), options)
    app.animation_level = "none"
    cpu: list[float] = []
    wall: list[float] = []
    shown = [frame(snap, hosts, k) for k in range(frames + 3)]
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        for k, snapshot in enumerate(shown):
            began, began_cpu = time.perf_counter(), time.process_time()
            app.history.add(snapshot, time.time())
            app.post_message(SnapshotArrived(snapshot, time.time()))
            await pilot.pause()
            if k >= 3:  # the first frames build the panes
                wall.append(time.perf_counter() - began)
                cpu.append(time.process_time() - began_cpu)
    now = time.time()
    text_s, _ = time_calls(lambda: [line for h in shown[0]["hosts"] for line in host_lines(h, now)], 0.3)
    return Frames(statistics.median(cpu), statistics.median(wall), max(wall), text_s)


@dataclass
class Captured:
    """What a console got from one run's job: its hello and a snapshot (saved beside the runs)."""

    name: str
    nodes: int
    hello: Hello
    snapshot: Snapshot


def save_captured(results: Sequence[Result], path: Path) -> list[Captured]:
    captured = [
        Captured(r.case.name, r.case.nodes, r.hello, r.snapshot)
        for r in results
        if r.hello is not None and r.snapshot is not None
    ]
    path.write_bytes(orjson.dumps([c.__dict__ for c in captured]))
    return captured


def load_captured(path: Path) -> list[Captured]:
    if not path.exists():
        raise SystemExit(f"{path} is missing: run the whole benchmark once first")
    return [Captured(**c) for c in orjson.loads(path.read_bytes())]


def console_lines(small: Captured, large: Captured, frames: int) -> tuple[list[str], list[Frames]]:
    lines = [
        "| snapshot | workers (routes) | GPU hosts (GPUs) | snapshot JSON | console CPU per frame (median) "
        "| wall per frame, median (max) | host pane text |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    measured = []
    for c, hosts in ((small, small.nodes), (large, 0), (large, large.nodes)):
        f = asyncio.run(console_frames(c.hello, c.snapshot, hosts, frames))
        measured.append(f)
        routes = sum(len(lane["providers"]) for lane in c.snapshot["lanes"])
        size = len(orjson.dumps(frame(c.snapshot, hosts, 0)))
        lines.append(
            f"| {c.name} | {routes} | {hosts} ({hosts * GPUS_PER_NODE}) | {size / 1024:,.0f} KiB "
            f"| {f.cpu_s * 1000:,.1f} ms | {f.wall_s * 1000:,.1f} ms ({f.wall_max_s * 1000:,.1f}) "
            f"| {f.host_text_s * 1000:,.2f} ms |"
        )
    return lines, measured


# -------------------------------------------------------------------------------------- main


CASES = (
    Case("1 node, direct", 1, router=False, capture=True),
    Case("8 nodes, direct", 8, router=False),
    Case("64 nodes, direct", NODES, router=False, capture=True),
    Case("64 nodes, router", NODES, router=True),
    Case(
        "64 nodes, router, fleet's slots, smg's own bound",
        NODES,
        router=True,
        fleet_slots=True,
        smg_bound=True,
    ),
    Case("64 nodes, router, fleet's slots", NODES, router=True, fleet_slots=True),
)


@contextlib.contextmanager
def terminated_as_exit() -> Iterator[None]:
    """SIGTERM and SIGHUP end this benchmark as Ctrl-C does: through the finally blocks."""

    def leave(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    saved = {s: signal.signal(s, leave) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def smg_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("smg")
    except PackageNotFoundError:
        return "(not installed)"


def fleet_notes(results: Sequence[Result], nodes: int) -> list[str]:
    """What the table says, in sentences (each only when its runs are in the table)."""
    by = {r.case.name: r for r in results}
    one, direct = by.get("1 node, direct"), by.get(f"{nodes} nodes, direct")
    as_read, bounded = (
        by.get(f"{nodes} nodes, router"),
        by.get(f"{nodes} nodes, router, fleet's slots, smg's own bound"),
    )
    unbounded = by.get(f"{nodes} nodes, router, fleet's slots")
    notes = []
    if one is not None and direct is not None:
        job = (direct.job_cpu_s / direct.rows * 1000) if direct.rows else float("nan")
        notes.append(
            f"- The job's one process at {nodes} nodes named in `sglang.urls`: {direct.in_flight:,.0f} in flight on "
            f"average, {direct.rows_per_s:,.0f} rows/s, {job:.2f} ms of CPU a row ({ms_per_row(one.job_cpu_s, one.rows)} "
            f"ms at 1 node, where the fixed costs weigh on {one.rows_per_s:.0f} rows/s), "
            f"{direct.job_cpu_s / direct.window_s:.0%} of one core, peak RSS {direct.job_hwm_mib:,.0f} MiB "
            f"({one.job_hwm_mib:,.0f} at 1 node). At that cost one core would hold about {1000 / job:,.0f} rows/s "
            f"of answers this size; here the two cores were shared with the {nodes} stand-in nodes "
            f"({machine_share(direct)} of the machine busy), which cost more per row than the job."
        )
    if as_read is not None:
        notes.append(
            f"- `sglang.urls = [router]` (the form docs/sglang.md names for a router) held {as_read.in_flight:,.0f} "
            f"in flight for the whole fleet ({as_read.limit}): the backend reads the router's /get_server_info, "
            f"which smg answers from one worker, so the ceiling is one node's {SLOTS} running slots plus a "
            f"quarter (and its GPU time is counted for {GPUS_PER_NODE} GPUs, not {nodes * GPUS_PER_NODE}); "
            f"{as_read.rows_per_s:,.1f} rows/s."
        )
    if bounded is not None:
        limited = bounded.errors.get("rate_limited", 0)
        notes.append(
            f"- With the ceiling out of the way (every node says it runs {IN_FLIGHT:,}) and smg's own admission bound "
            f"left on ({bounded.case.name}: `--max-concurrent-requests` unset is 1024 per core, at least 4096, plus a "
            f"queue of 100), smg refused {limited:,} attempts in the window with 429, and the job's adaptive limit "
            f"moved {bounded.limit}: {bounded.in_flight:,.0f} in flight on average, {bounded.rows_per_s:,.0f} rows/s. "
            "This is why regen launches smg with `--max-concurrent-requests 0` (router.ADMISSION_ARGS): the job's "
            "in-flight limit is the bound."
        )
    if unbounded is not None:
        notes.append(
            f"- As regen launches smg (`--max-concurrent-requests 0`), the router carried {unbounded.in_flight:,.0f} in flight "
            f"({unbounded.rows_per_s:,.0f} rows/s) at {ms_per_row(unbounded.router_cpu_s, unbounded.rows)} ms of CPU a "
            f"row ({share(unbounded.router_cpu_s, unbounded.window_s)} of a core) and {unbounded.router_hwm_mib or 0:,.0f} "
            f"MiB peak RSS; the job behind it {ms_per_row(unbounded.job_cpu_s, unbounded.rows)} ms a row, "
            f"{unbounded.job_hwm_mib:,.0f} MiB."
        )
    return notes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=NODES, help="simulated nodes (8 GPUs each)")
    ap.add_argument("--warmup-s", type=float, default=8.0)
    ap.add_argument("--window-s", type=float, default=20.0)
    ap.add_argument("--frames", type=int, default=20, help="console frames timed per snapshot")
    ap.add_argument(
        "--console-only",
        action="store_true",
        help="only the console part, on the snapshots the last whole run saved (prints, writes nothing)",
    )
    ap.add_argument(
        "--write-md", action="store_true", help="update the cluster-scale section of BENCHMARKS.md"
    )
    args = ap.parse_args(argv)
    if args.console_only:
        captured = load_captured(OUT / "snapshots.json")
        print("\n".join(console_lines(captured[0], captured[-1], args.frames)[0]))
        return 0
    began = time.monotonic()
    load_before = os.getloadavg()[0]
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    tokenizer = builtin_tokenizer_folder(OUT / "tokenizer")
    cases = [
        Case(
            c.name.replace(str(NODES), str(args.nodes)),
            min(c.nodes, args.nodes),
            c.router,
            c.fleet_slots,
            c.smg_bound,
            c.capture,
        )
        for c in CASES
        if c.nodes < args.nodes or c.nodes == NODES
    ]
    procs = Procs()
    results: list[Result] = []
    with terminated_as_exit():
        try:
            fleet = start_fleet(procs, OUT, args.nodes)
            print(
                f"{args.nodes} nodes started in {fleet.started_s:.1f} s, {fleet.rss_mib:.0f} MiB RSS each",
                flush=True,
            )
            for case in cases:
                slug = case.name.replace(",", "").replace("'", "").replace(" ", "-")
                result = run_case(procs, fleet, case, OUT / slug, tokenizer, args.warmup_s, args.window_s)
                results.append(result)
                print("\n".join(run_table([result])[2:]), flush=True)
        finally:
            procs.stop_all()
    load_after = os.getloadavg()[0]
    captured = save_captured(results, OUT / "snapshots.json")
    plan = plan_lines()
    console, frames = console_lines(captured[0], captured[-1], args.frames)
    elapsed = time.monotonic() - began
    small, large = frames[0], frames[-1]
    body = [
        f"What ran: {args.nodes} `regen sim sglang` processes at once, each one node of {GPUS_PER_NODE} GPUs "
        f"(the simulator's tp_size {GPUS_PER_NODE}, which the backend counts as the node's GPUs) running "
        f"{SLOTS} requests at once (started in {fleet.started_s:.0f} s, {fleet.rss_mib:.0f} MiB RSS each); "
        f"answers of {SIM['output_len_min']}-{SIM['output_len_max']} tokens at 16 tok/s each (4-12 s), the "
        f"scheduler stepping every {SIM['min_step_s']} s; the real job (`regen run --headless`, `job.backend = "
        f'"sglang"`, `job.concurrency = {IN_FLIGHT:,}` = {NODES} x {GPUS_PER_NODE} x 16, one dataset of {PROMPTS:,} prompts, '
        f"`tokenizer.workers = 1`); smg {smg_version()} with regen's command line (`router_argv`) and the "
        f"{args.nodes} worker URLs. Each run: {args.warmup_s:g} s after the job's first request, a "
        f"{args.window_s:g} s window, then the job is stopped (SIGTERM twice) and the nodes drain; the same "
        "nodes serve every run. Nothing was scaled down: every node, the router and the job ran at full count.",
        "",
        "(a) The router and the job's one process",
        "",
        *run_table(results),
        "",
        "In flight: the attempts open (from the start record to the end record in attempts.jsonl), averaged over "
        "the window; in brackets the limits the job's status lines said in it (effective<configured when "
        "lowered). Rows/s and e2e p50: the rows finished in the window, and their median send-to-last-chunk "
        "time. CPU ms/row: user + system CPU (/proc/PID/stat) over the window per row finished in it, for the "
        "job's process with its tokenizer worker, for smg, and for all the stand-in nodes together (what the "
        "simulated GPUs cost this machine, not part of a real job); % of one core beside it; 'all three' is "
        "their sum as a share of the machine's cores. Peak RSS: VmHWM at the window's end. Requests per node: "
        "the fewest and most that one node was sent during the run (the balancing). Failed attempts: those "
        "that ended in the window with a failure, by class (all are retried; none gave up).",
        "",
        *fleet_notes(results, args.nodes),
        "",
        "(b) The plan at that size",
        "",
        *plan,
        "",
        "The plan (`plan_fleets`) and the pacer's tick (`Pacer.update`, which plans several times: the live plan, "
        "the aim and the verdict's bounds) take the GPU fleet as one rate in tokens/s, never a count of workers "
        "or GPUs: 64 nodes are the same computation at 64 times the rate (bench/fleet_plan.py's story with its "
        "work and budget scaled alike), timed here as the mean of repeated calls.",
        "",
        "(c) The console at that size",
        "",
        *console,
        "",
        "The snapshots are the ones the 1-node and the 64-node jobs above served to a read-only console on their "
        "control socket (one route and one server per node), with GPU hosts added as engine/host/monitor.py "
        "views them (8 GPUs each, SGLang running); each frame's figures move, and the real console (Textual, "
        "headless at 160x50, every pane repainted at once: `repaint_interval_s` 0) is posted it as its snapshot "
        "worker posts one. CPU per frame: this process's CPU from the post until Pilot.pause returns (the "
        "panes' update and the frame drawn); the wall time also holds Pilot.pause's own wait for idle. Host "
        "pane text: `host_lines` for every host. "
        f"At {captured[-1].nodes} workers and as many hosts the console spends {large.cpu_s * 1000:,.0f} ms of CPU a frame, "
        f"{large.cpu_s / small.cpu_s if small.cpu_s else float('nan'):.1f}x the 1-node frame, against its "
        f"repaint interval of {ConsoleOptions().repaint_interval_s:g} s.",
    ]
    print("\n".join(body))
    print(f"(took {elapsed:.0f} s)")
    if args.write_md:
        given = sys.argv[1:] if argv is None else argv
        command = ".venv/bin/python bench/cluster_scale.py" + "".join(f" {a}" for a in given)
        header = (
            f"Run {time.strftime('%Y-%m-%d')} on revision {revision()}: `{command}` ({elapsed:.0f} s).\n\n"
            f"Machine: {machine()}; load average {load_before:.2f} before the run, {load_after:.2f} after the "
            f"fleet's runs (their own {args.nodes + 2} processes).\n\n"
        )
        write_md(header + "\n".join(body), MD_START, MD_END, heading=HEADING)
        print("BENCHMARKS.md updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
