"""Throughput benchmark: regen's job against a bare aiohttp loop and the official openai client.

The claim (docs/architecture.md; the client must never be what limits the run): against the OpenRouter simulator on loopback, in the
same run and at the same concurrency, regen's job output throughput (output tokens/s) is at least
80% of a bare aiohttp + orjson loop making the same requests, and at least 3x a loop on the official
`openai` AsyncOpenAI client.

Layout of one run:
- the simulator runs as its own process (sim/runner.py, on uvloop), pinned to one core and
  the client to the other, so they never share a core; a fresh simulator serves each run (its
  ledger grows with every request). Its profile (short TTFT, fast tokens) offers far more load than
  one client core can take at 2000 streams, so the client is the busy side; the simulator's CPU
  share is reported per run, so a saturated simulator would be visible;
- each variant runs in a fresh interpreter (this file with `--child VARIANT`) on uvloop, over the
  same prompts, same request bodies and same concurrency, and prints one JSON line of figures;
- variants are interleaved (aiohttp, regen, openai, then rotated) and the median of the
  repetitions is taken. openai runs a fifth of the prompts (it is an order of magnitude slower;
  its rate is steady because it is CPU-bound throughout).

Throughput is output tokens (usage.completion_tokens summed over finished requests) divided by the
wall time from the first request to the last completion. regen's figure includes everything its
job does per request: journal records, group-committed fsynced rows, the money ledger, and the
folded snapshot the console reads on a timer.

    .venv/bin/python bench/throughput.py                 # the default run (2000 and 200, ~4 min)
    .venv/bin/python bench/throughput.py --quick         # a smoke run
    .venv/bin/python bench/throughput.py --write-md      # also update BENCHMARKS.md
    .venv/bin/python bench/throughput.py --hotpath       # issue 19's bar: zero latency, 2000 in flight,
                                                         # streamed and not, 9 rounds (~10 min)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.processes import free_port  # noqa: E402

VARIANTS = ("aiohttp", "regen", "openai")
# With --against DIR: regen as another checkout has it (DIR/src first on the child's path), in the
# same run, so a change's effect is measured against the moment's load on a shared machine too.
BASE_VARIANT = "regen-base"
AGAINST: Path | None = None
MODES = ("stream", "json")  # a streamed answer (SSE) or one chat.completion body
API_KEY = "sk-sim-test"
MODEL = "moonshotai/kimi-k2.5"
MD_START = "<!-- bench:throughput:start -->"
MD_END = "<!-- bench:throughput:end -->"
MD_HOTPATH = ("<!-- bench:throughput-hotpath:start -->", "<!-- bench:throughput-hotpath:end -->")

# The simulator profile. Every endpoint gets the same speed so the routing draw does not move the
# figures; time_scale shrinks TTFT and stretches the token rate: 0.8 s TTFT and 100 tokens/s
# become 8 ms and 10,000 tokens/s, so a completion of 256-1024 tokens (~640 on average, 30%
# reasoning) streams in ~0.1 s. Events carry 128 tokens each (tokens_per_event), about 6.5 token
# events per completion plus role, finish and usage, whatever the timing: with one event per flush
# instead, a simulator lagging behind a fast client packs a whole completion into one or two
# events, so the faster client would also be given less to parse per request (the events per
# request are printed for every run, from the simulator's own count). Few, large events: the
# per-request work (connection, headers, regen's journal, row and fsync) weighs more than in a
# token-per-event stream, which is where regen adds to the bare loop.
SIM_PROFILE: dict[str, Any] = {
    "time_scale": 0.01,
    "ttft_s": 0.8,
    "tokens_per_s": 100.0,
    "chunk_interval_s": 0.02,
    "tokens_per_event": 128,
    "keepalive_interval_s": 1.0,
    "min_completion_tokens": 256,
    "max_completion_tokens": 1024,
}
MAX_TOKENS = 8192  # above max_completion_tokens: every completion ends with "stop"
# --hotpath (issue 19): the per-request cost alone. time_scale 0 makes the simulator answer at
# once (no TTFT, no token delays), so whatever limits a run is CPU on one side or the other.
HOTPATH: dict[str, Any] = {
    "concurrency": 2000,
    "prompts": 6000,
    "repeat": 9,
    "variants": "aiohttp,regen",
    "modes": "stream,json",
    "sim_profile": {"time_scale": 0.0},
    "bar": 0.9,
}
BAR = 0.8  # regen / aiohttp, the claim above; --hotpath raises it to HOTPATH["bar"]


# ------------------------------------------------------------------------------------ requests


def prompt_messages(i: int) -> list[dict[str, str]]:
    return [
        {
            "role": "user",
            "content": f"Prompt {i}: explain, in a few sentences, idea number {i * 7919 % 100003}.",
        }
    ]


def static_body(stream: bool = True) -> dict[str, Any]:
    """The fields regen's client sends with every request (engine/backends/openrouter/client.py)."""
    from regen.engine.backends.openrouter.client import OpenRouterClient

    settings = regen_settings("http://127.0.0.1:1/api/v1", Path("."), Path("."), 1, stream)
    client = OpenRouterClient(settings.openrouter, pool_size=1)
    body = orjson_loads(client.request_body([{"role": "user", "content": "x"}], []))
    del body["messages"]
    return body


def orjson_loads(data: bytes) -> Any:
    import orjson

    return orjson.loads(data)


def regen_settings(base_url: str, dataset: Path, run_dir: Path, concurrency: int, stream: bool = True) -> Any:
    from regen.engine.config.settings import JobSettings, OpenRouterSettings, ProviderSettings, Settings

    return Settings(
        openrouter=OpenRouterSettings(
            base_url=base_url,
            api_key=API_KEY,
            model=MODEL,
            max_tokens=MAX_TOKENS,
            stream=stream,
            provider=ProviderSettings(sort=None),
        ),
        job=JobSettings(datasets=[dataset], run_dir=run_dir, concurrency=concurrency, budget_usd=1e6),
    )


# ------------------------------------------------------------------------------------- variants


class Window:
    """The timed window of one variant: first request to last completion.

    It also takes the client process's CPU time (all threads: the fsync threads count) and the
    simulator's, so a saturated simulator shows up in the figures; and runs cProfile when asked.
    """

    def __init__(
        self, sim_pid: int | None, profile: Path | None, also: Callable[[], float] | None = None
    ) -> None:
        self.sim_pid = sim_pid
        self.also = also  # CPU seconds of other processes on the server's side (the tunnel's sshd)
        self.also_cpu_s = 0.0
        self.profiler: Any = None
        if profile is not None:
            import cProfile

            self.profiler = cProfile.Profile()
        self.profile = profile
        self.tokens = 0
        self.requests = 0
        self.errors = 0
        self.first_error: str | None = None
        self.wall_s = self.cpu_s = self.sim_cpu_s = 0.0
        self.stopped_at = 0.0
        self.stop_s = 0.0  # after the window: a job's clean stop (drive)

    def error(self, what: str) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = what[:300]

    def start(self) -> None:
        self._sim0 = proc_cpu_s(self.sim_pid)
        self._also0 = self.also() if self.also is not None else 0.0
        self._cpu0 = _rusage_s()
        self._t0 = time.perf_counter()
        if self.profiler is not None:
            self.profiler.enable()

    def stop(self) -> None:
        if self.profiler is not None:
            self.profiler.disable()
            self.profiler.dump_stats(str(self.profile))
        self.stopped_at = time.perf_counter()
        self.wall_s = self.stopped_at - self._t0
        self.cpu_s = _rusage_s() - self._cpu0
        self.sim_cpu_s = proc_cpu_s(self.sim_pid) - self._sim0
        if self.also is not None:
            self.also_cpu_s = self.also() - self._also0


def _rusage_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def run_aiohttp(base_url: str, n: int, concurrency: int, w: Window, stream: bool = True) -> None:
    """The bare loop: one pool, C workers over the prompts, SSE lines parsed with orjson (or the
    one body, not streamed)."""
    import aiohttp
    import orjson

    static = static_body(stream)
    url = base_url + "/chat/completions"
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    prompts = iter(range(n))
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=600)
    ) as session:

        async def worker() -> None:
            for i in prompts:
                body = dict(static)
                body["messages"] = prompt_messages(i)
                try:
                    async with session.post(url, data=orjson.dumps(body), headers=headers) as resp:
                        if resp.status != 200:
                            w.error(f"HTTP {resp.status}: {(await resp.read())[:200]!r}")
                            continue
                        tokens = None
                        if not stream:
                            usage = orjson.loads(await resp.read()).get("usage")
                            tokens = usage["completion_tokens"] if usage else None
                        else:
                            async for line in resp.content:
                                if not line.startswith(b"data: "):
                                    continue
                                data = line[6:].strip()
                                if data == b"[DONE]":
                                    break
                                usage = orjson.loads(data).get("usage")
                                if usage:
                                    tokens = usage["completion_tokens"]
                        if tokens is None:
                            w.error("stream without usage")
                            continue
                        w.tokens += tokens
                        w.requests += 1
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    w.error(f"{type(exc).__name__}: {exc}")

        w.start()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        w.stop()


async def run_openai(base_url: str, n: int, concurrency: int, w: Window) -> None:
    """The official client: AsyncOpenAI on its httpx pool raised to C connections, no retries."""
    import openai
    from openai.types.chat import ChatCompletionMessageParam

    try:  # openai >= 3 runs on httpx2; older releases on httpx
        import httpx2 as httpx_mod
    except ImportError:  # pragma: no cover - depends on the installed openai
        import httpx as httpx_mod  # type: ignore[no-redef,import-not-found]  # not installed beside httpx2

    static = static_body()
    extra_body: dict[str, Any] = {k: static[k] for k in ("provider", "usage", "reasoning") if k in static}
    sampling: dict[str, Any] = {k: static[k] for k in ("temperature", "top_p") if k in static}
    client = openai.AsyncOpenAI(
        base_url=base_url,
        api_key=API_KEY,
        max_retries=0,
        http_client=openai.DefaultAsyncHttpxClient(
            limits=httpx_mod.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
            timeout=600,
        ),
    )
    prompts = iter(range(n))

    async def worker() -> None:
        for i in prompts:
            try:
                stream = await client.chat.completions.create(
                    model=static["model"],
                    # the same plain dicts every variant sends; the client's message type is a TypedDict
                    messages=cast(list[ChatCompletionMessageParam], prompt_messages(i)),
                    max_tokens=static["max_tokens"],
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body=extra_body,
                    **sampling,
                )
                tokens = None
                async for chunk in stream:
                    if chunk.usage is not None:
                        tokens = chunk.usage.completion_tokens
                if tokens is None:
                    w.error("stream without usage")
                    continue
                w.tokens += tokens
                w.requests += 1
            except Exception as exc:  # every failure is a finding: counted and reported
                w.error(f"{type(exc).__name__}: {exc}")

    try:
        w.start()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        w.stop()
    finally:
        await client.close()


async def drive(job: Any, w: Any) -> None:
    """Run a prepared job under the watch `w`, taking a snapshot every half second as a console
    would, and fill in what it produced; shared with bench/sglang_backend.py."""

    async def ticker() -> None:  # what the console does: a folded snapshot on a timer
        while True:
            await asyncio.sleep(0.5)
            job.snapshot()

    # The window ends at the last completion, as the bare loop's does: when the dispatcher returns,
    # every attempt has landed and its row is durable. The clean stop after it (the journals' last
    # checkpoint, compaction, closing the backend) is a job's once, not a request's: timed apart.
    dispatch = job.dispatcher.run

    async def dispatch_then_stop_the_clock() -> None:
        await dispatch()
        w.stop()

    job.dispatcher.run = dispatch_then_stop_the_clock
    tick = asyncio.get_running_loop().create_task(ticker())
    w.start()
    try:
        outcome = await job.run()
    finally:
        tick.cancel()
    w.stop_s = time.perf_counter() - w.stopped_at
    snap = job.snapshot()
    w.tokens = job.lanes[0].stats.counters.output_tokens
    w.requests = snap["rows"]
    for name, count in snap["errors"].items():
        w.errors += count
        w.first_error = w.first_error or name
    if outcome.exit_code != 0:
        w.first_error = f"{outcome.reason.value}: {outcome.message}"


async def run_regen(
    base_url: str, n: int, concurrency: int, w: Window, workdir: Path, stream: bool = True
) -> None:
    """regen's job as shipped: fresh dataset and run folder, so nothing resumes."""
    from regen.engine.job.job import Job

    dataset = workdir / "dataset"
    dataset.mkdir(parents=True)
    write_prompts(dataset / "prompts.jsonl", n)
    job = Job(regen_settings(base_url, dataset, workdir / "run", concurrency, stream))
    await job.prepare()

    await drive(job, w)


def write_prompts(path: Path, n: int) -> None:
    import orjson

    with open(path, "wb") as f:
        f.write(b"".join(orjson.dumps({"messages": prompt_messages(i)}) + b"\n" for i in range(n)))


def child(
    variant: str,
    base_url: str,
    n: int,
    concurrency: int,
    workdir: Path,
    sim_pid: int | None,
    profile: Path | None,
    mode: str = "stream",
) -> None:
    """One variant in this (fresh) interpreter, on uvloop; prints one JSON line."""
    from regen.engine.runtime import run

    w = Window(sim_pid, profile)

    async def main() -> str:
        stream = mode == "stream"
        if variant == "aiohttp":
            await run_aiohttp(base_url, n, concurrency, w, stream)
        elif variant == "openai":
            if not stream:
                raise SystemExit("the openai variant streams only")
            await run_openai(base_url, n, concurrency, w)
        else:  # regen, or regen-base (the other checkout's, by the path run_child gave this child)
            await run_regen(base_url, n, concurrency, w, workdir, stream)
        return type(asyncio.get_running_loop()).__module__.split(".")[0]

    loop = run(main())
    print(
        json.dumps(
            {
                "variant": variant,
                "mode": mode,
                "concurrency": concurrency,
                "prompts": n,
                "tokens": w.tokens,
                "requests": w.requests,
                "errors": w.errors,
                "first_error": w.first_error,
                "wall_s": w.wall_s,
                "cpu_s": w.cpu_s,
                "sim_cpu_s": w.sim_cpu_s,
                "stop_s": w.stop_s,
                "loop": loop,
            }
        ),
        flush=True,
    )


# ------------------------------------------------------------------------------------ simulator


def sim_config() -> dict[str, Any]:
    from regen.sim.openrouter.catalog import default_models
    from regen.sim.openrouter.config import SimConfig

    p = SIM_PROFILE
    models = default_models()
    for model in models:
        for ep in model.endpoints:
            ep.ttft_s = p["ttft_s"]
            ep.ttft_jitter = p["ttft_s"] / 4
            ep.tokens_per_s = p["tokens_per_s"]
    config = SimConfig(
        models=models,
        time_scale=p["time_scale"],
        chunk_interval_s=p["chunk_interval_s"],
        tokens_per_event=p["tokens_per_event"],
        keepalive_interval_s=p["keepalive_interval_s"],
        min_completion_tokens=p["min_completion_tokens"],
        max_completion_tokens=p["max_completion_tokens"],
        credits=1e12,
        requests_maxlen=1000,
        seed=1,
    )
    return config.model_dump(mode="json")


def _stat_cpu(stat: Path) -> tuple[str, float]:
    """(name, user + system CPU seconds so far) from a /proc/PID/stat file; OSError once it is gone."""
    head, tail = stat.read_text().rsplit(")", 1)
    fields = tail.split()
    return head.split("(", 1)[1], (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def named_cpu_s(names: tuple[str, ...]) -> float:
    """CPU seconds used so far by every process whose name is one of `names` (0 for those gone)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            name, cpu_s = _stat_cpu(stat)
            if name in names:
                total += cpu_s
    return total


def proc_cpu_s(pid: int | None) -> float:
    """User + system CPU seconds process `pid` has used so far (0 where /proc is missing)."""
    if pid is None:
        return 0.0
    try:
        return _stat_cpu(Path(f"/proc/{pid}/stat"))[1]
    except OSError:
        return 0.0


# With two or more cores the simulator and the client each get one of their own (the client's
# fsync threads share its core), so neither steals the other's cycles and runs repeat closely.
SIM_CPU, CLIENT_CPU = 1, 0
PIN = True


def _pin(cpu: int) -> Any:
    def pin() -> None:
        if PIN and hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2:
            os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[cpu]})

    return pin


# `regen sim openrouter` (sim/runner.py): uvloop, and engine/runtime.py's rare cyclic GC. The
# simulator keeps every generation for /generation, so with Python's default thresholds its
# collections grow with the requests served and make the load generator, not the client, the busy side.
SIM_BOOT = """
import sys
from pathlib import Path
from regen.sim.runner import run_sim
sys.exit(run_sim("openrouter", int(sys.argv[1]), "127.0.0.1", Path(sys.argv[2])))
"""


class Sim:
    """The simulator in its own process (sim/runner.py runs it on uvloop)."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/api/v1"
        config_path = workdir / "sim.json"
        config_path.write_text(json.dumps(sim_config()))
        self.log = open(workdir / "sim.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SIM_BOOT, str(self.port), str(config_path)],
            cwd=ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            preexec_fn=_pin(SIM_CPU),
        )
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"simulator exited with {self.proc.returncode}; see {workdir / 'sim.log'}")
            try:
                with urllib.request.urlopen(self.base_url + "/models", timeout=1) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit("simulator did not answer GET /api/v1/models within 30 s")
            time.sleep(0.1)

    def token_events(self) -> int:
        """SSE events carrying tokens the simulator has sent so far (GET /_sim/state)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/_sim/state", timeout=10) as resp:
            return int(json.loads(resp.read())["counters"]["token_events"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


# ------------------------------------------------------------------------------------- driver


def run_child(
    variant: str,
    sim: Sim,
    n: int,
    concurrency: int,
    workdir: Path,
    profile: Path | None = None,
    timeout: float = 900,
    mode: str = "stream",
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        variant,
        "--base-url",
        sim.base_url,
        "--prompts",
        str(n),
        "--concurrency",
        str(concurrency),
        "--workdir",
        str(workdir),
        "--sim-pid",
        str(sim.proc.pid),
        "--child-mode",
        mode,
    ]
    if profile is not None:
        cmd += ["--profile-out", str(profile)]
    env = None
    if variant == BASE_VARIANT:
        assert AGAINST is not None
        env = {**os.environ, "PYTHONPATH": str(AGAINST / "src")}
    proc = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, preexec_fn=_pin(CLIENT_CPU), env=env
    )
    if proc.returncode != 0:
        raise SystemExit(f"{variant} child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def median_row(results: list[dict[str, Any]]) -> dict[str, Any]:
    tps = [r["tokens"] / r["wall_s"] for r in results]
    mid = sorted(range(len(results)), key=lambda k: tps[k])[len(results) // 2]
    row = dict(results[mid])
    row["tok_s"] = statistics.median(tps)
    row["tok_s_all"] = tps
    row["tok_s_rounds"] = tps
    row["req_s"] = statistics.median(r["requests"] / r["wall_s"] for r in results)
    row["events_req"] = statistics.median(r["token_events"] / max(r["requests"], 1) for r in results)
    row["tok_cpu_s"] = statistics.median(r["tokens"] / max(r["cpu_s"], 1e-9) for r in results)
    row["stop_s"] = statistics.median(r.get("stop_s", 0.0) for r in results)
    row["errors"] = sum(r["errors"] for r in results)
    row["first_error"] = next((r["first_error"] for r in results if r["first_error"]), None)
    return row


def fmt_table(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "| concurrency | mode | client | output tok/s (median) | each run | req/s | tokens | requests | errors "
        "| wall s | client CPU s (% of wall) | tok per client CPU-s | sim CPU % | token events/req |",
        "|---:|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        runs = ", ".join(f"{x / 1e3:,.0f}k" for x in r["tok_s_all"])
        out.append(
            f"| {r['concurrency']} | {r['mode']} | {r['variant']} | {r['tok_s']:,.0f} | {runs} | {r['req_s']:,.0f} "
            f"| {r['tokens']:,} | {r['requests']:,} | {r['errors']:,} | {r['wall_s']:.1f} "
            f"| {r['cpu_s']:.1f} ({100 * r['cpu_s'] / r['wall_s']:.0f}%) | {r['tok_cpu_s']:,.0f} "
            f"| {100 * r['sim_cpu_s'] / r['wall_s']:.0f}% | {r['events_req']:.1f} |"
        )
    return out


def ratio_lines(rows: list[dict[str, Any]]) -> tuple[list[str], bool]:
    """The claim's two ratios per concurrency (throughput), plus the CPU-cost ratio for context."""
    lines: list[str] = []
    ok = True
    for c, mode in sorted(
        {(r["concurrency"], r["mode"]) for r in rows}, key=lambda k: (-k[0], MODES.index(k[1]))
    ):
        by = {r["variant"]: r for r in rows if r["concurrency"] == c and r["mode"] == mode}
        if "regen" not in by:
            continue
        parts = []
        if "aiohttp" in by:
            ra = by["regen"]["tok_s"] / by["aiohttp"]["tok_s"]
            good = ra >= BAR
            ok &= good
            eff = by["regen"]["tok_cpu_s"] / by["aiohttp"]["tok_cpu_s"]
            # Paired by round: each round's two runs met the same moment's load on the machine.
            pairs = paired_ratios(by["regen"], by["aiohttp"])
            paired = f"; median of the rounds' own ratios {statistics.median(pairs):.2f}" if pairs else ""
            parts.append(
                f"regen/aiohttp = {ra:.2f} ({'meets' if good else 'BELOW'} the {BAR:.2f} bar; "
                f"per CPU-second {eff:.2f}{paired})"
            )
        if BASE_VARIANT in by:
            base = by[BASE_VARIANT]
            pairs = paired_ratios(by["regen"], base)
            paired = f"; median of the rounds' own ratios {statistics.median(pairs):.2f}" if pairs else ""
            parts.append(
                f"regen/regen-base = {by['regen']['tok_s'] / base['tok_s']:.2f} (per CPU-second "
                f"{by['regen']['tok_cpu_s'] / base['tok_cpu_s']:.2f}{paired})"
            )
            if "aiohttp" in by:
                parts.append(
                    f"regen-base/aiohttp = {base['tok_s'] / by['aiohttp']['tok_s']:.2f} (per CPU-second "
                    f"{base['tok_cpu_s'] / by['aiohttp']['tok_cpu_s']:.2f})"
                )
        if "openai" in by:
            ro = by["regen"]["tok_s"] / by["openai"]["tok_s"]
            good = ro >= 3.0
            ok &= good
            eff = by["regen"]["tok_cpu_s"] / by["openai"]["tok_cpu_s"]
            parts.append(
                f"regen/openai = {ro:.2f} ({'meets' if good else 'BELOW'} the 3.0 bar; "
                f"per CPU-second {eff:.2f})"
            )
        if by["regen"]["stop_s"]:
            parts.append(
                f"regen's clean stop after its last completion {by['regen']['stop_s']:.2f} s (median)"
            )
        lines.append(f"- concurrency {c}, {mode}: " + "; ".join(parts))
    return lines, ok


def paired_ratios(a: dict[str, Any], b: dict[str, Any]) -> list[float]:
    """a's throughput over b's, round by round (the runs are listed in round order)."""
    return [x / y for x, y in zip(a["tok_s_rounds"], b["tok_s_rounds"], strict=False) if y]


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} cores ({cpu}), Linux {platform.release()}, Python {platform.python_version()}"


def revision() -> str:
    """The commit measured, "-dirty" when tracked files differ from it (BENCHMARKS.md aside: a bench
    run before this one may have written its block), or REGEN_BENCH_REVISION for a copy."""

    def git(*argv: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(ROOT), *argv], capture_output=True, text=True, timeout=10)
        except OSError:
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("describe", "--always")
    if not commit:
        return os.environ.get("REGEN_BENCH_REVISION", "unknown")
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)BENCHMARKS.md")
    return commit + ("-dirty" if changed else "")


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in ("aiohttp", "orjson", "uvloop", "openai", "httpx2", "httpx"):
        with contextlib.suppress(PackageNotFoundError):
            out.append(f"{name} {version(name)}")
    return ", ".join(out)


def write_md(block: str, start: str = MD_START, end: str = MD_END, heading: str = "") -> None:
    """Replace the block between `start` and `end` in BENCHMARKS.md (every benchmark's --write-md),
    or append it under `heading`; written whole to a temporary file and renamed into place."""
    path = ROOT / "BENCHMARKS.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n\n"
    section = f"{start}\n{block.rstrip()}\n{end}"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + (f"## {heading}\n\n" if heading else "") + section + "\n"
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--concurrency", default="2000,200", help="comma-separated levels (default 2000,200)")
    ap.add_argument(
        "--prompts",
        type=int,
        default=None,
        help="prompts per aiohttp/regen run (default 10 x concurrency, at least 6000)",
    )
    ap.add_argument(
        "--openai-prompts",
        type=int,
        default=None,
        help="prompts per openai run (default a fifth of --prompts: it is ~10x slower)",
    )
    ap.add_argument("--repeat", type=int, default=3, help="repetitions of each variant (median taken)")
    ap.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS)
    )
    ap.add_argument(
        "--quick", action="store_true", help="smoke run: concurrency 200, 1000 prompts, 1 repetition"
    )
    ap.add_argument(
        "--modes", default="stream", help="comma-separated: stream (SSE), json (one body); default stream"
    )
    ap.add_argument(
        "--hotpath",
        action="store_true",
        help="issue 19's hot-path bar: zero latency, aiohttp and regen, 2000 in flight, 6000 prompts, "
        "streamed and not, 9 interleaved rounds, 0.90 bar",
    )
    ap.add_argument(
        "--sim-profile",
        default=None,
        metavar="JSON",
        help="override simulator profile fields, e.g. '{\"chunk_interval_s\": 0.05}'",
    )
    ap.add_argument(
        "--no-pin",
        action="store_true",
        help="let the scheduler place the simulator and the client (default: one core each)",
    )
    ap.add_argument("--write-md", action="store_true", help="update the throughput section of BENCHMARKS.md")
    ap.add_argument(
        "--profile",
        metavar="DIR",
        type=Path,
        default=None,
        help="cProfile each run's timed window into DIR/VARIANT-MODE-C-K.prof",
    )
    ap.add_argument(
        "--against",
        type=Path,
        default=None,
        metavar="DIR",
        help="also run regen from the checkout DIR (e.g. `git worktree add DIR main`) as regen-base",
    )
    ap.add_argument("--child", choices=(*VARIANTS, BASE_VARIANT), help=argparse.SUPPRESS)
    ap.add_argument("--child-mode", choices=MODES, default="stream", help=argparse.SUPPRESS)
    ap.add_argument("--base-url", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--profile-out", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--sim-pid", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child:
        child(
            args.child,
            args.base_url,
            args.prompts,
            int(args.concurrency),
            args.workdir,
            args.sim_pid,
            args.profile_out,
            args.child_mode,
        )
        return 0

    global PIN, BAR, AGAINST
    PIN = not args.no_pin
    if args.against is not None:
        AGAINST = args.against.resolve()
        if not (AGAINST / "src" / "regen").is_dir():
            ap.error(f"--against {args.against}: no src/regen there")
    if args.hotpath:
        SIM_PROFILE.update(HOTPATH["sim_profile"])
        BAR = float(HOTPATH["bar"])
        args.concurrency = str(HOTPATH["concurrency"])
        args.prompts = args.prompts or HOTPATH["prompts"]
        args.repeat = HOTPATH["repeat"] if args.repeat == 3 else args.repeat
        args.variants = HOTPATH["variants"] if args.variants == ",".join(VARIANTS) else args.variants
        args.modes = HOTPATH["modes"] if args.modes == "stream" else args.modes
    if args.sim_profile:
        SIM_PROFILE.update(json.loads(args.sim_profile))
    if args.quick:
        levels, repeat = [200], 1
        prompts_for = {200: args.prompts or 1000}
    else:
        levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
        repeat = args.repeat
        prompts_for = {c: args.prompts or max(6000, 10 * c) for c in levels}
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if AGAINST is not None and BASE_VARIANT not in variants:
        variants.append(BASE_VARIANT)
    for v in variants:
        if v not in (*VARIANTS, BASE_VARIANT):
            ap.error(f"unknown variant {v!r}")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            ap.error(f"unknown mode {m!r}")
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)

    def prompts(c: int, v: str) -> int:
        if v == "openai":
            return args.openai_prompts or max(c, prompts_for[c] // 5)
        return prompts_for[c]

    tmp = Path(tempfile.mkdtemp(prefix="regen-bench-"))
    started = time.monotonic()
    print(f"machine: {machine()}")
    load0 = os.getloadavg()[0]
    if load0 > 0.5:
        print(
            f"warning: load average {load0:.1f} before the run; other work on this machine skews the figures"
        )
    print(f"simulator profile: {SIM_PROFILE}, max_tokens {MAX_TOKENS}")
    results: dict[tuple[int, str, str], list[dict[str, Any]]] = {}
    try:
        # Rounds outermost: each round runs every level, mode and variant once (variants rotated),
        # so the load of one moment on a shared machine falls on all of them alike.
        for k in range(repeat):
            for c in levels:
                for mode in modes:
                    runnable = [v for v in variants if mode == "stream" or v != "openai"]
                    order = runnable[k % len(runnable) :] + runnable[: k % len(runnable)]
                    for v in order:
                        work = tmp / f"{v}-{mode}-{c}-{k}"
                        work.mkdir()
                        # A fresh simulator per run: its ledger grows with every request it serves,
                        # and a run must not inherit the previous one's.
                        sim = Sim(work)
                        try:
                            prof = args.profile / f"{v}-{mode}-{c}-{k}.prof" if args.profile else None
                            r = run_child(v, sim, prompts(c, v), c, work, prof, mode=mode)
                            r["token_events"] = sim.token_events()
                        finally:
                            sim.stop()
                            shutil.rmtree(work, ignore_errors=True)
                        r["load"] = os.getloadavg()[0]
                        results.setdefault((c, mode, v), []).append(r)
                        err = f", {r['errors']} errors (first: {r['first_error']})" if r["errors"] else ""
                        print(
                            f"  c={c} {mode:6s} run {k + 1}/{repeat} {v:8s} "
                            f"{r['tokens'] / r['wall_s']:>10,.0f} tok/s "
                            f"{r['requests'] / r['wall_s']:>7,.0f} req/s  wall {r['wall_s']:5.1f} s  "
                            f"cpu {r['cpu_s']:5.1f} s  sim cpu {100 * r['sim_cpu_s'] / r['wall_s']:3.0f}%  "
                            f"events/req {r['token_events'] / max(r['requests'], 1):4.1f}  "
                            f"load {os.getloadavg()[0]:.1f}"
                            + (f"  then its stop {r['stop_s']:.2f} s" if r.get("stop_s") else "")
                            + err,
                            flush=True,
                        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.monotonic() - started
    loads = [r["load"] for runs in results.values() for r in runs]
    load_note = (
        f"load average {load0:.2f} before the run, {min(loads, default=0):.1f} to "
        f"{max(loads, default=0):.1f} after each run (the benchmark itself takes about 2)"
    )

    rows = [
        median_row(results[(c, m, v)])
        for c in levels
        for m in modes
        for v in variants
        if (c, m, v) in results
    ]
    table = fmt_table(rows)
    ratios, ok = ratio_lines(rows)
    failures = [
        f"- {r['variant']} at concurrency {r['concurrency']}: {r['errors']} failed requests "
        f"(first: `{r['first_error']}`)"
        for r in rows
        if r["errors"]
    ]
    verdict = f"Claim {'holds' if ok else 'does NOT hold'} in this run."
    print()
    print(
        "\n".join(
            [*table, "", *ratios, *failures, "", verdict, f"(benchmark took {elapsed:.0f} s; {load_note})"]
        )
    )

    if args.write_md:
        given = sys.argv[1:] if argv is None else argv
        cmd = ".venv/bin/python bench/throughput.py" + "".join(f" {a}" for a in given)
        block = "\n".join(
            [
                f"Run {dt.date.today().isoformat()} on revision {revision()}: `{cmd}` ({elapsed:.0f} s).",
                "",
                f"Machine: {machine()}; {versions()}; {load_note}.",
                f"Simulator: {json.dumps(SIM_PROFILE)}, every endpoint at that speed, max_tokens {MAX_TOKENS}, "
                "rare GC (engine/runtime.py), a fresh process per run.",
                "Prompts per run: "
                + "; ".join(
                    f"{prompts_for[c]} at concurrency {c} ({prompts(c, 'openai')} for openai)" for c in levels
                )
                + f"; {repeat} repetition(s), median of output tokens/s.",
                "",
                *table,
                "",
                *ratios,
                *failures,
                "",
                verdict,
            ]
        )
        if args.hotpath:
            write_md(
                block,
                *MD_HOTPATH,
                heading="Throughput: the hot path at zero latency, the latest --hotpath run",
            )
        else:
            write_md(block)
        print("BENCHMARKS.md updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
