"""The SGLang backend against a bare aiohttp loop, at 512 in flight, on the SGLang simulator.

The claim (the client must never be what limits the run): against the SGLang simulator on
loopback, in the same run and at 512 requests in flight, regen's job on the SGLang backend delivers
at least 80% of the output throughput (output tokens/s) of a bare aiohttp + orjson loop posting the
same `/generate` bodies.

Method, as bench/throughput.py's:
- the simulator runs as its own process (`python -m regen.sim sglang`, uvloop), pinned to one core
  and the client to the other (the job's tokenizer worker inherits the client's core, so regen's
  whole process tree shares that one core); a fresh simulator serves each run;
- each variant runs in a fresh interpreter (this file with `--child VARIANT`) on uvloop, over the
  same prompts at the same concurrency, and prints one JSON line of figures; the variants alternate
  and the median of the repetitions is taken;
- the bare loop gets its bodies rendered before its timed window (so rendering costs it nothing),
  posts them with 512 workers over one pool, and reads each stream as a careful client of a
  cumulative stream must: whole network reads, only the newest complete event kept, the answer
  parsed once at the end; it counts meta_info.completion_tokens of every stop or length answer;
- regen's figure is its whole job: rendering every prompt with the chat template, the rid journaled
  before sending, the stream, the GPU meter, journal records, fsynced rows, the tokenizer worker's
  fill, and a folded snapshot every half second as an attached console would take.

Three profiles by default: "long" (about 400-token answers at 40 tokens/s a request, a chunk per
20 ms forward: what a GPU server's stream looks like), "fast" (the same answers five times faster) and
"short" (64-token answers at 400 tokens/s a request: many requests a second, where per-request costs
weigh most). "reasoning" (`--profiles reasoning`) is the long-answer one: 8k-token reasoning
answers (7,500-8,500 ids, 80% of them reasoning) at 200 tokens/s a request, max_tokens 16384, 512
streams; there the bar is 0.9. Every row also says the bytes the simulator wrote per output token
(cumulative chunks: each repeats the answer so far).

What a stream costs in bytes as answers grow (`--bytes`): 2k, 4k and 8k-token answers, 32 streams,
read by a bare client counting every byte, once with regen's bodies (a chunk every
`stream_interval(max_tokens)` ids, engine/net/sglang_server.py) and once without it (a chunk per
forward, as before regen asked for an interval).

The SSH tunnel's cost (`--tunnel`): the same job twice, once with `sglang.urls` naming the simulator
("regen", direct) and once with no urls and a `[[hosts]]` table instead, so the job reaches the
simulator through its own tunnel over a real OpenSSH server on loopback ("regen-tunnel": asyncssh's
local forward in the job's process, sshd's per-connection process on the simulator's core, as it
would run on the GPU host). The figure is regen-tunnel / regen. `--bare` adds the bare loop direct
and through regen's tunnel: what the tunnel costs a client that does nothing else.

Where sshd runs (`--sshd-cpu`): on a GPU host it has cores to spare, so by default it gets a core of
its own (the third; the client and the simulator keep theirs). A two-core machine has none to give:
sshd then shares the simulator's core, and at the short profile the two need more than one core at
direct's rate (BENCHMARKS.md, "SGLang backend through the SSH tunnel"). `--sshd-cpu client` puts it
on the client's core instead, and `--time-scale 2` runs the simulator's clock at half speed (the
same answers at half the rate), so that two cores can hold all three parts.

    .venv/bin/python bench/sglang_backend.py             # both profiles, 3 repetitions (~6 min)
    .venv/bin/python bench/sglang_backend.py --quick     # a smoke run
    .venv/bin/python bench/sglang_backend.py --write-md  # also update BENCHMARKS.md
    .venv/bin/python bench/sglang_backend.py --tunnel --write-md   # the tunnel's cost
    .venv/bin/python bench/sglang_backend.py --tunnel --profiles short --bare --sshd-cpu client --time-scale 2
    .venv/bin/python bench/sglang_backend.py --profiles reasoning --write-md            # long answers
    .venv/bin/python bench/sglang_backend.py --profiles reasoning --tunnel --write-md   # ... tunnelled
    .venv/bin/python bench/sglang_backend.py --bytes --write-md      # bytes per token as answers grow
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.throughput import (  # noqa: E402 - the sibling benchmark's helpers
    Window,
    drive,
    machine,
    named_cpu_s,
    revision,
    versions,
    write_md,
)

VARIANTS = ("aiohttp", "regen")
TUNNEL_VARIANTS = ("regen", "regen-tunnel")
BARE_TUNNEL_VARIANTS = (
    "aiohttp",
    "aiohttp-tunnel",
)  # --bare: what the tunnel costs a client doing nothing else
SSHD_PLACES = ("sim", "client", "own")  # --sshd-cpu: the core sshd runs on
SSHD_NAMES = ("sshd", "sshd-session", "sshd-auth")  # OpenSSH 9.8 on: a connection's process is sshd-session
CONCURRENCY = 512
MAX_TOKENS = 8192  # above every planned answer: each one ends with "stop"
MD_START = "<!-- bench:sglang-backend:start -->"
MD_END = "<!-- bench:sglang-backend:end -->"
MD_TUNNEL_START = "<!-- bench:sglang-tunnel:start -->"
MD_TUNNEL_END = "<!-- bench:sglang-tunnel:end -->"
PROFILES: dict[str, dict[str, Any]] = {
    "long": {"decode_tokens_per_s": 40.0, "output_len_min": 300, "output_len_max": 500, "min_step_s": 0.02},
    "fast": {"decode_tokens_per_s": 200.0, "output_len_min": 300, "output_len_max": 500, "min_step_s": 0.02},
    "short": {"decode_tokens_per_s": 400.0, "output_len_min": 48, "output_len_max": 80, "min_step_s": 0.02},
    "reasoning": {
        "decode_tokens_per_s": 200.0,
        "output_len_min": 7500,
        "output_len_max": 8500,
        "min_step_s": 0.02,
        "reasoning_share": 0.8,
    },
}
PROMPTS = {"long": 2048, "fast": 4096, "short": 8192, "reasoning": 1024}
MAX_TOKENS_OF = {"reasoning": 16384}  # the settings' default: answers this long need it
BAR = {"reasoning": 0.9}  # the long-answer profile's bar; 0.8 elsewhere
MD_REASONING = ("<!-- bench:sglang-reasoning:start -->", "<!-- bench:sglang-reasoning:end -->")
MD_REASONING_TUNNEL = (
    "<!-- bench:sglang-reasoning-tunnel:start -->",
    "<!-- bench:sglang-reasoning-tunnel:end -->",
)
MD_TUNNEL_BARE = ("<!-- bench:sglang-tunnel-bare:start -->", "<!-- bench:sglang-tunnel-bare:end -->")
MD_TUNNEL_PLACED = ("<!-- bench:sglang-tunnel-placed:start -->", "<!-- bench:sglang-tunnel-placed:end -->")
MD_BYTES = ("<!-- bench:sglang-bytes:start -->", "<!-- bench:sglang-bytes:end -->")
BYTES_LENGTHS = (2000, 4000, 8000)
BYTES_STREAMS = 32


def prompt_messages(i: int) -> list[dict[str, str]]:
    return [
        {
            "role": "user",
            "content": f"Prompt {i}: explain, in a few sentences, idea number {i * 7919 % 100003}.",
        }
    ]


def regen_settings(
    url: str,
    model: Path,
    dataset: Path,
    run_dir: Path,
    host: dict[str, Any] | None = None,
    max_tokens: int = MAX_TOKENS,
) -> Any:
    """The job's settings: straight at `url`, or (with `host`) through a tunnel to that host's port."""
    from regen.engine.config.settings import (
        HostSettings,
        JobSettings,
        OpenRouterSettings,
        Settings,
        SGLangSettings,
        TokenizerSettings,
    )

    return Settings(
        openrouter=OpenRouterSettings(max_tokens=max_tokens),
        # The simulator serves "kimi-k2.5" (SIM_CONFIG); a host's servers are named by the setting,
        # else by the model folder (docs/gpu-host.md, "One model").
        sglang=SGLangSettings(urls=[] if host else [url], served_model_name="kimi-k2.5"),
        tokenizer=TokenizerSettings(path=model, workers=1),
        job=JobSettings(backend="sglang", datasets=[dataset], run_dir=run_dir, concurrency=CONCURRENCY),
        hosts=[HostSettings(**host, sglang_port=int(url.rsplit(":", 1)[1]))] if host else [],
    )


def bodies(model: Path, n: int, max_tokens: int = MAX_TOKENS, interval: bool = True) -> list[bytes]:
    """The exact bodies the backend sends (engine/backends/sglang/wire.py), rendered ahead; without
    `interval`, less the stream_interval key (a chunk per forward)."""
    from regen.engine.backends.sglang.wire import request_body, sampling_params
    from regen.engine.data.tokenizer import TargetTokenizer, TokenizerSpec

    tok = TargetTokenizer(TokenizerSpec(model, template_kwargs={"thinking": True}))
    sampling = sampling_params(max_tokens, 1.0, 0.95, tok.end_of_turn_id)
    if not interval:
        sampling.pop("stream_interval", None)
    return [request_body(tok.prompt_ids(prompt_messages(i)), sampling, f"B-{i:08d}#0") for i in range(n)]


# ------------------------------------------------------------------------------------- variants


async def run_aiohttp(url: str, model: Path, n: int, w: Window, max_tokens: int = MAX_TOKENS) -> None:
    import aiohttp
    import orjson

    work = bodies(model, n, max_tokens)
    done_event = b"data: [DONE]"
    generate = url + "/generate"
    headers = {"Content-Type": "application/json"}
    items = iter(work)
    connector = aiohttp.TCPConnector(limit=CONCURRENCY, limit_per_host=0)
    async with aiohttp.ClientSession(connector=connector, read_bufsize=2**18) as session:

        async def worker() -> None:
            for body in items:
                try:
                    async with session.post(generate, data=body, headers=headers) as resp:
                        if resp.status != 200:
                            w.error(f"HTTP {resp.status}: {(await resp.read())[:200]!r}")
                            continue
                        pending = bytearray()
                        last = b""
                        async for block in resp.content.iter_any():
                            pending += block
                            end = pending.rfind(b"\n\n")
                            if end < 0:
                                continue
                            start = pending.rfind(b"\n\n", 0, end)
                            event = bytes(pending[start + 2 if start >= 0 else 0 : end])
                            if event == done_event and start >= 0:
                                before = pending.rfind(b"\n\n", 0, start)
                                event = bytes(pending[before + 2 if before >= 0 else 0 : start])
                            if event != done_event:
                                last = event
                            del pending[: end + 2]
                    meta = orjson.loads(last[6:])["meta_info"]
                    finish = (meta.get("finish_reason") or {}).get("type")
                    if finish not in ("stop", "length"):
                        w.error(f"finish {finish}")
                        continue
                    w.tokens += meta["completion_tokens"]
                    w.requests += 1
                except (aiohttp.ClientError, OSError, ValueError, KeyError) as exc:
                    w.error(f"{type(exc).__name__}: {exc}")

        w.start()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        w.stop()


async def run_aiohttp_tunnel(
    url: str, host: dict[str, Any], model: Path, n: int, w: Window, max_tokens: int
) -> None:
    """The bare loop through regen's own tunnel to the simulator's port (opened before the window)."""
    from regen.engine.config.settings import HostSettings
    from regen.engine.host.ssh import HostConnection
    from regen.engine.host.tunnel import Tunnel

    port = int(url.rsplit(":", 1)[1])
    conn = HostConnection(HostSettings(**host, sglang_port=port))
    tunnel = Tunnel(conn, port)
    try:
        await run_aiohttp(await tunnel.open(), model, n, w, max_tokens)
    finally:
        await tunnel.close()
        await conn.close()


async def run_regen(
    url: str,
    model: Path,
    n: int,
    w: Window,
    workdir: Path,
    host: dict[str, Any] | None = None,
    max_tokens: int = MAX_TOKENS,
) -> None:
    import orjson

    from regen.engine.job.job import Job

    dataset = workdir / "dataset"
    dataset.mkdir(parents=True)
    (dataset / "prompts.jsonl").write_bytes(
        b"".join(orjson.dumps({"messages": prompt_messages(i)}) + b"\n" for i in range(n))
    )
    job = Job(regen_settings(url, model, dataset, workdir / "run", host, max_tokens))
    await job.prepare()

    await drive(job, w)


def child(
    variant: str,
    url: str,
    model: Path,
    n: int,
    workdir: Path,
    sim_pid: int,
    host: Path | None,
    max_tokens: int,
) -> None:
    from regen.engine.runtime import run

    # Through the tunnel, sshd's processes (the host's side of it) are counted apart.
    tunnelled = variant.endswith("-tunnel")
    w = Window(sim_pid, None, also=(lambda: named_cpu_s(SSHD_NAMES)) if tunnelled else None)

    async def main() -> None:
        if variant == "aiohttp":
            await run_aiohttp(url, model, n, w, max_tokens)
        elif variant == "aiohttp-tunnel":
            assert host is not None
            await run_aiohttp_tunnel(url, json.loads(host.read_text()), model, n, w, max_tokens)
        elif variant == "regen-tunnel":
            assert host is not None
            await run_regen(url, model, n, w, workdir, json.loads(host.read_text()), max_tokens)
        else:
            await run_regen(url, model, n, w, workdir, max_tokens=max_tokens)

    run(main())
    print(
        json.dumps(
            {
                "variant": variant,
                "prompts": n,
                "tokens": w.tokens,
                "requests": w.requests,
                "errors": w.errors,
                "first_error": w.first_error,
                "wall_s": w.wall_s,
                "cpu_s": w.cpu_s,
                "sim_cpu_s": w.sim_cpu_s,
                "sshd_cpu_s": w.also_cpu_s,
            }
        ),
        flush=True,
    )


# ------------------------------------------------------------------------------------ simulator

SIM_CPU, CLIENT_CPU = 1, 0
SSHD_OWN_CPU = 2  # --sshd-cpu own: on a machine with a third core


def _pin(cpu: int) -> Any:
    def pin() -> None:
        if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2:
            os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[cpu]})

    return pin


class Sim:
    """`python -m regen.sim sglang` in its own process, on its own core, serving the model folder."""

    def __init__(self, workdir: Path, model: Path, profile: dict[str, Any], time_scale: float = 1.0) -> None:
        config = {
            "served_model_name": "kimi-k2.5",
            "time_scale": time_scale,
            "startup_weights_s": 0,
            "startup_kv_pool_s": 0,
            "startup_cuda_graph_s": 0,
            "startup_http_s": 0,
            "startup_warmup_s": 0,
            "max_running_requests": CONCURRENCY,
            "max_total_tokens": 4_000_000,
            "max_gen_throughput": 1e9,
            "prefill_tokens_per_s": 1e7,
            "decode_log_interval": 100_000,
            "requests_maxlen": 100,
            "child_processes": 0,
            "seed": 1,
            **profile,
        }
        path = workdir / "sim.json"
        path.write_text(json.dumps(config))
        self.log = open(workdir / "sim.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "regen.sim",
                "sglang",
                "--port",
                "0",
                "--config",
                str(path),
                "--tokenizer",
                str(model),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            preexec_fn=_pin(SIM_CPU),
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if " on " not in line:
            self.stop()
            raise SystemExit(f"the simulator did not start; see {workdir / 'sim.log'}")
        self.url = line.split(" on ", 1)[1].strip()
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise SystemExit(f"the simulator was not ready; see {workdir / 'sim.log'}")
            time.sleep(0.05)

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/_sim/state", timeout=10) as resp:
            return dict(json.loads(resp.read()))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def run_child(
    variant: str,
    sim: Sim,
    model: Path,
    n: int,
    workdir: Path,
    host: Path | None = None,
    max_tokens: int = MAX_TOKENS,
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        variant,
        "--url",
        sim.url,
        "--model",
        str(model),
        "--prompts",
        str(n),
        "--workdir",
        str(workdir),
        "--sim-pid",
        str(sim.proc.pid),
        "--max-tokens",
        str(max_tokens),
    ]
    if host is not None:
        cmd += ["--host-json", str(host)]
    proc = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200, preexec_fn=_pin(CLIENT_CPU)
    )
    if proc.returncode != 0:
        raise SystemExit(f"{variant} child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result = dict(json.loads(proc.stdout.strip().splitlines()[-1]))
    result["bytes"] = sim.state().get("generate_bytes")  # None from a simulator that does not count
    return result


# ------------------------------------------------------------------------------------- report


def median_row(results: list[dict[str, Any]]) -> dict[str, Any]:
    tps = [r["tokens"] / r["wall_s"] for r in results]
    mid = sorted(range(len(results)), key=lambda k: tps[k])[len(results) // 2]
    row = dict(results[mid])
    row["tok_s"] = statistics.median(tps)
    row["tok_s_all"] = tps
    row["req_s"] = statistics.median(r["requests"] / r["wall_s"] for r in results)
    row["tok_cpu_s"] = statistics.median(r["tokens"] / max(r["cpu_s"], 1e-9) for r in results)
    row["errors"] = sum(r["errors"] for r in results)
    row["first_error"] = next((r["first_error"] for r in results if r["first_error"]), None)
    per_token = [r["bytes"] / r["tokens"] for r in results if r.get("bytes") and r["tokens"]]
    row["bytes_per_token"] = statistics.median(per_token) if per_token else None
    return row


def table(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "| profile | client | output tok/s (median) | each run | req/s | tokens | requests | errors | wall s "
        "| client CPU s (% of wall) | tok per client CPU-s | sim CPU % | bytes per output token |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        runs = ", ".join(f"{x:,.0f}" for x in r["tok_s_all"])
        per_token = "-" if r.get("bytes_per_token") is None else f"{r['bytes_per_token']:,.0f}"
        out.append(
            f"| {r['profile']} | {r['variant']} | {r['tok_s']:,.0f} | {runs} | {r['req_s']:,.0f} | {r['tokens']:,} "
            f"| {r['requests']:,} | {r['errors']:,} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} "
            f"({100 * r['cpu_s'] / r['wall_s']:.0f}%) | {r['tok_cpu_s']:,.0f} | {100 * r['sim_cpu_s'] / r['wall_s']:.0f}% "
            f"| {per_token} |"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profiles", default="long,fast,short", help="comma-separated: " + ",".join(PROFILES))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=None, help="prompts per run (default per profile)")
    ap.add_argument("--quick", action="store_true", help="one repetition of the short profile, 2048 prompts")
    ap.add_argument(
        "--write-md", action="store_true", help="update the SGLang backend section of BENCHMARKS.md"
    )
    ap.add_argument(
        "--tunnel", action="store_true", help="the SSH tunnel's cost: regen through a tunnel against direct"
    )
    ap.add_argument(
        "--bytes",
        action="store_true",
        help="bytes per output token as answers grow, with and without an interval",
    )
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help=argparse.SUPPRESS)
    ap.add_argument(
        "--bare",
        action="store_true",
        help="with --tunnel: also the bare aiohttp loop, direct and through regen's tunnel",
    )
    ap.add_argument(
        "--sshd-cpu",
        choices=SSHD_PLACES,
        default=None,
        help="with --tunnel: the core sshd runs on: the simulator's (the default on two cores), the "
        "client's, or one of its own (the default on three or more)",
    )
    ap.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="the simulator's time runs this many times slower (the same answers at a fraction of the "
        "rate: for a machine with too few cores to give each part one)",
    )
    ap.add_argument(
        "--child", choices=VARIANTS + TUNNEL_VARIANTS[1:] + BARE_TUNNEL_VARIANTS[1:], help=argparse.SUPPRESS
    )
    ap.add_argument("--host-json", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--sim-pid", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(
            args.child,
            args.url,
            args.model,
            args.prompts,
            args.workdir,
            args.sim_pid,
            args.host_json,
            args.max_tokens,
        )
        return 0
    if args.tunnel:
        return tunnel_main(args, argv)
    if args.bytes:
        return bytes_main(args, argv)

    profiles = ["short"] if args.quick else [p.strip() for p in args.profiles.split(",") if p.strip()]
    repeat = 1 if args.quick else args.repeat
    tmp = Path(tempfile.mkdtemp(prefix="regen-bench-sglang-"))
    started = time.monotonic()
    load0 = os.getloadavg()[0]
    print(f"machine: {machine()}")
    if load0 > 0.5:
        print(
            f"warning: load average {load0:.1f} before the run; other work on this machine skews the figures"
        )
    from tests.support.sglang_sim import model_folder

    model = model_folder(tmp / "model")
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    try:
        for profile in profiles:
            n = args.prompts or (2048 if args.quick else PROMPTS[profile])
            for k in range(repeat):
                for v in VARIANTS[k % 2 :] + VARIANTS[: k % 2]:
                    work = tmp / f"{profile}-{v}-{k}"
                    work.mkdir()
                    sim = Sim(work, model, PROFILES[profile], args.time_scale)
                    try:
                        r = run_child(
                            v, sim, model, n, work, max_tokens=MAX_TOKENS_OF.get(profile, MAX_TOKENS)
                        )
                        r["peak_in_flight"] = sim.state()["peak_in_flight"]
                    finally:
                        sim.stop()
                        shutil.rmtree(work, ignore_errors=True)
                    r["profile"] = profile
                    results.setdefault((profile, v), []).append(r)
                    err = f", {r['errors']} errors (first: {r['first_error']})" if r["errors"] else ""
                    print(
                        f"  {profile} run {k + 1}/{repeat} {v:8s} {r['tokens'] / r['wall_s']:>9,.0f} tok/s "
                        f"{r['requests'] / r['wall_s']:>6,.0f} req/s wall {r['wall_s']:5.1f} s cpu {r['cpu_s']:5.1f} s "
                        f"sim cpu {100 * r['sim_cpu_s'] / r['wall_s']:3.0f}% peak in flight {r['peak_in_flight']}{err}",
                        flush=True,
                    )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.monotonic() - started
    rows = [median_row(results[(p, v)]) for p in profiles for v in VARIANTS if (p, v) in results]
    lines = table(rows)
    ok = True
    ratios = []
    for p in profiles:
        by = {r["variant"]: r for r in rows if r["profile"] == p}
        ratio = by["regen"]["tok_s"] / by["aiohttp"]["tok_s"]
        per_cpu = by["regen"]["tok_cpu_s"] / by["aiohttp"]["tok_cpu_s"]
        bar = BAR.get(p, 0.8)
        good = ratio >= bar
        ok &= good
        ratios.append(
            f"- {p}: regen/aiohttp = {ratio:.2f} ({'meets' if good else 'BELOW'} the {bar:.2f} bar; "
            f"per client CPU-second {per_cpu:.2f})"
        )
    load_note = f"load average {load0:.2f} before the run, {os.getloadavg()[0]:.2f} after"
    verdict = f"Claim {'holds' if ok else 'does NOT hold'} in this run."
    print("\n".join(["", *lines, "", *ratios, "", verdict, f"(took {elapsed:.0f} s; {load_note})"]))
    if args.write_md:
        given = sys.argv[1:] if argv is None else argv
        cmd = ".venv/bin/python bench/sglang_backend.py" + "".join(f" {a}" for a in given)
        block = "\n".join(
            [
                f"Run {dt.date.today().isoformat()} on revision {revision()}: `{cmd}` ({elapsed:.0f} s).",
                "",
                f"Machine: {machine()}; {versions()}; {load_note}.",
                f"Simulator profiles (time_scale {args.time_scale:g}, max_running_requests 512, one process per run): "
                + "; ".join(f"{p} {json.dumps(PROFILES[p])}" for p in profiles)
                + f". {CONCURRENCY} in flight, max_tokens "
                + ", ".join(f"{MAX_TOKENS_OF.get(p, MAX_TOKENS)} ({p})" for p in profiles)
                + "; prompts per run: "
                + ", ".join(f"{args.prompts or PROMPTS[p]} ({p})" for p in profiles)
                + f"; {repeat} repetition(s), median.",
                "",
                *lines,
                "",
                *ratios,
                "",
                verdict,
            ]
        )
        if profiles == ["reasoning"]:
            write_md(block, *MD_REASONING, heading="SGLang backend: long reasoning answers")
        else:
            write_md(block, MD_START, MD_END)
        print("BENCHMARKS.md updated")
    return 0


def sshd_core(place: str | None) -> tuple[str, int | None]:
    """Where sshd runs: (the place, the index of its core among this process's), None unpinned.
    By default a core of its own where the machine has one, as on a GPU host; else the simulator's."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    place = place or ("own" if cores >= 3 else "sim")
    if cores < 2:
        return place, None
    if place == "own" and cores < 3:
        raise SystemExit("--sshd-cpu own needs three cores (client, simulator, sshd); this machine has two")
    return place, {"sim": SIM_CPU, "client": CLIENT_CPU, "own": SSHD_OWN_CPU}[place]


def start_sshd(tmp: Path, model: Path, core: int | None = SIM_CPU) -> tuple[Any, Path]:
    """A real OpenSSH server on loopback (the tests' harness), pinned to the `core`-th of this
    process's cores (sshd_core); returns it and the [[hosts]] table as JSON."""
    from tests.support.sshd import make_server

    server = make_server(tmp / "sshd")
    server.start()
    assert server.proc is not None
    if core is not None:
        # Each connection's process is forked from this one and keeps its core.
        os.sched_setaffinity(server.proc.pid, {sorted(os.sched_getaffinity(0))[core]})
    (tmp / "data").mkdir(exist_ok=True)
    host = {
        "name": "gpu1",
        "address": "127.0.0.1",
        "port": server.port,
        "user": server.user,
        "key_files": [str(server.client_key)],
        "known_hosts": str(server.write_known_hosts(tmp / "known_hosts")),
        "data_root": str(tmp / "data"),
        "model_path": str(model),
        "python": sys.executable,
        "poll_interval_s": 3600.0,
    }
    path = tmp / "host.json"
    path.write_text(json.dumps(host))
    return server, path


def tunnel_main(args: argparse.Namespace, argv: list[str] | None) -> int:
    profiles = ["short"] if args.quick else [p.strip() for p in args.profiles.split(",") if p.strip()]
    repeat = 1 if args.quick else args.repeat
    variants = TUNNEL_VARIANTS + (BARE_TUNNEL_VARIANTS if args.bare else ())
    place, core = sshd_core(args.sshd_cpu)
    tmp = Path(tempfile.mkdtemp(prefix="regen-bench-tunnel-"))
    started = time.monotonic()
    load0 = os.getloadavg()[0]
    print(f"machine: {machine()}; sshd on the {place} core; simulator time scale {args.time_scale:g}")
    from tests.support.sglang_sim import model_folder

    model = model_folder(tmp / "model")
    server, host = start_sshd(tmp, model, core)
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    try:
        for profile in profiles:
            n = args.prompts or (2048 if args.quick else PROMPTS[profile])
            for k in range(repeat):
                for v in variants[k % 2 :] + variants[: k % 2]:
                    work = tmp / f"{profile}-{v}-{k}"
                    work.mkdir()
                    sim = Sim(work, model, PROFILES[profile], args.time_scale)
                    try:
                        r = run_child(
                            v,
                            sim,
                            model,
                            n,
                            work,
                            host if v.endswith("-tunnel") else None,
                            MAX_TOKENS_OF.get(profile, MAX_TOKENS),
                        )
                    finally:
                        sim.stop()
                        shutil.rmtree(work, ignore_errors=True)
                    r["profile"] = profile
                    results.setdefault((profile, v), []).append(r)
                    err = f", {r['errors']} errors (first: {r['first_error']})" if r["errors"] else ""
                    print(
                        f"  {profile} run {k + 1}/{repeat} {v:14s} {r['tokens'] / r['wall_s']:>9,.0f} tok/s "
                        f"wall {r['wall_s']:5.1f} s cpu {r['cpu_s']:5.1f} s "
                        f"sim cpu {100 * r['sim_cpu_s'] / r['wall_s']:3.0f}% "
                        f"sshd cpu {100 * (r['sshd_cpu_s'] or 0) / r['wall_s']:3.0f}%{err}",
                        flush=True,
                    )
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.monotonic() - started
    rows = [median_row(results[(p, v)]) for p in profiles for v in variants if (p, v) in results]
    lines = table(rows)
    ratios = []
    for p in profiles:
        by = {r["variant"]: r for r in rows if r["profile"] == p}
        for client in ("regen", "aiohttp") if args.bare else ("regen",):
            direct, tunnelled = by[client], by[f"{client}-tunnel"]
            ratio = tunnelled["tok_s"] / direct["tok_s"]
            per_cpu = tunnelled["tok_cpu_s"] / direct["tok_cpu_s"]
            sshd, sim = (100 * tunnelled[k] / tunnelled["wall_s"] for k in ("sshd_cpu_s", "sim_cpu_s"))
            where = (
                f"of their one core ({sshd + sim:.0f}% together)"
                if place == "sim"
                else f"(sshd on the {place} core)"
            )
            ratios.append(
                f"- {p}, {client}: through the tunnel / direct = {ratio:.2f} (per client CPU-second "
                f"{per_cpu:.2f}); through it, sshd {sshd:.0f}% and the simulator {sim:.0f}% {where}"
            )
    load_note = f"load average {load0:.2f} before the run, {os.getloadavg()[0]:.2f} after"
    print("\n".join(["", *lines, "", *ratios, f"(took {elapsed:.0f} s; {load_note})"]))
    if args.write_md:
        given = sys.argv[1:] if argv is None else argv
        cmd = ".venv/bin/python bench/sglang_backend.py" + "".join(f" {a}" for a in given)
        block = "\n".join(
            [
                f"Run {dt.date.today().isoformat()} on revision {revision()}: `{cmd}` ({elapsed:.0f} s).",
                "",
                f"Machine: {machine()}; {versions()}; {load_note}. The same job and simulator profiles as above"
                f" (time scale {args.time_scale:g}); "
                '"regen" straight at the simulator\'s URL, "regen-tunnel" through its own SSH tunnel (a real '
                f"OpenSSH server on loopback, on the {place} core; asyncssh in the job's process)"
                + (
                    '; "aiohttp" the bare loop, direct and through regen\'s tunnel ("aiohttp-tunnel")'
                    if args.bare
                    else ""
                )
                + f". {repeat} repetition(s), median.",
                "",
                *lines,
                "",
                *ratios,
            ]
        )
        if profiles == ["reasoning"]:
            write_md(
                block,
                *MD_REASONING_TUNNEL,
                heading="SGLang backend: long reasoning answers through the tunnel",
            )
        elif place != "sim" or args.time_scale != 1:
            write_md(block, *MD_TUNNEL_PLACED, heading="SGLang backend through the SSH tunnel, sshd placed")
        elif args.bare:
            write_md(
                block, *MD_TUNNEL_BARE, heading="SGLang backend through the SSH tunnel, with the bare loop"
            )
        else:
            write_md(block, MD_TUNNEL_START, MD_TUNNEL_END, heading="SGLang backend through the SSH tunnel")
        print("BENCHMARKS.md updated")
    return 0


# --------------------------------------------------------------------------------- bytes per token


async def read_streams(url: str, work: list[bytes], streams: int) -> tuple[int, int, int]:
    """A bare client reading every stream whole: (bytes received, output tokens, chunks)."""
    import aiohttp
    import orjson

    received = tokens = chunks = 0
    items = iter(work)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=streams), read_bufsize=2**20
    ) as session:

        async def worker() -> None:
            nonlocal received, tokens, chunks
            for body in items:
                tail = b""  # the stream's last megabyte: its final chunk is in it
                async with session.post(url + "/generate", data=body, headers=headers) as resp:
                    async for block in resp.content.iter_any():
                        received += len(block)
                        joined = tail[-8:] + block  # an event's start cut between two reads counts once
                        chunks += joined.count(b"data: {") - tail[-8:].count(b"data: {")
                        tail = (tail + block)[-(1 << 20) :]
                events = [e for e in tail.split(b"\n\n") if e.startswith(b"data: {")]
                tokens += orjson.loads(events[-1][6:])["meta_info"]["completion_tokens"]

        await asyncio.gather(*(worker() for _ in range(streams)))
    return received, tokens, chunks


def bytes_main(args: argparse.Namespace, argv: list[str] | None) -> int:
    """Bytes per output token for answers of 2k, 4k and 8k tokens, with and without the interval."""
    from regen.engine.net.sglang_server import stream_interval
    from regen.engine.runtime import run

    tmp = Path(tempfile.mkdtemp(prefix="regen-bench-bytes-"))
    started = time.monotonic()
    load0 = os.getloadavg()[0]
    from tests.support.sglang_sim import model_folder

    model = model_folder(tmp / "model")
    max_tokens = MAX_TOKENS_OF["reasoning"]
    profile = {"decode_tokens_per_s": 400.0, "min_step_s": 0.02, "reasoning_share": 0.8}
    lines = [
        "| answer (ids) | bodies | chunks per answer | bytes per answer | bytes per output token "
        "| x the answer's own bytes |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    try:
        for length in BYTES_LENGTHS:
            for interval in (True, False):
                work = tmp / f"{length}-{interval}"
                work.mkdir()
                sim = Sim(work, model, {**profile, "output_len_min": length, "output_len_max": length})
                try:
                    sent = bodies(model, BYTES_STREAMS, max_tokens, interval=interval)
                    final_one = sim_final_answer_bytes(sim.url, sent[0])
                    received, tokens, chunks = run(read_streams(sim.url, sent, BYTES_STREAMS))
                finally:
                    sim.stop()
                    shutil.rmtree(work, ignore_errors=True)
                one = received / BYTES_STREAMS
                label = (
                    f"stream_interval {stream_interval(max_tokens)}"
                    if interval
                    else "none (a chunk per forward)"
                )
                row = (
                    f"| {length:,} | {label} | {chunks / BYTES_STREAMS:,.0f} | {one:,.0f} | {received / tokens:,.0f} "
                    f"| {one / final_one:,.1f} |"
                )
                lines.append(row)
                print(row, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.monotonic() - started
    load_note = f"load average {load0:.2f} before the run, {os.getloadavg()[0]:.2f} after"
    print(f"(took {elapsed:.0f} s; {load_note})")
    if args.write_md:
        given = sys.argv[1:] if argv is None else argv
        cmd = ".venv/bin/python bench/sglang_backend.py" + "".join(f" {a}" for a in given)
        block = "\n".join(
            [
                f"Run {dt.date.today().isoformat()} on revision {revision()}: `{cmd}` ({elapsed:.0f} s).",
                "",
                f"Machine: {machine()}; {versions()}; {load_note}. The simulator {json.dumps(profile)} with "
                f"output_len_min = output_len_max = the answer's length; {BYTES_STREAMS} streams, {BYTES_STREAMS} "
                f"answers each, regen's bodies at max_tokens {max_tokens} (with and without their "
                "stream_interval), read whole by a bare aiohttp client. The answer's own bytes: the same request "
                "unstreamed.",
                "",
                *lines,
            ]
        )
        write_md(block, *MD_BYTES, heading="SGLang: the bytes of a cumulative stream as answers grow")
        print("BENCHMARKS.md updated")
    return 0


def sim_final_answer_bytes(url: str, body: bytes) -> int:
    """The bytes of one answer unstreamed (the same prompt and seed give the same answer)."""
    import orjson

    plain = orjson.loads(body)
    plain.pop("stream", None)
    plain["rid"] = plain["rid"] + "-plain"
    req = urllib.request.Request(
        url + "/generate", data=orjson.dumps(plain), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        return len(resp.read())


if __name__ == "__main__":
    sys.exit(main())
