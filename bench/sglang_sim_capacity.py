"""Capacity of the SGLang simulator at 512 concurrent streams: can it stay out of the way?

The SGLang backend's benchmark compares regen's client with a bare aiohttp loop against this
simulator at 512 in flight, so the simulator must deliver the token rate it is configured for with
CPU to spare. This measures, for a sweep of per-request decode rates (512 x rate = the offered
aggregate rate), what a bare aiohttp client really receives and how busy the simulator's core is.

Layout of one run: the simulator is its own process (`python -m regen.sim sglang`, on uvloop)
pinned to one core, the client (this process, uvloop) to the other. The client keeps 512 streaming
/generate requests open for the whole window (a closed loop: each finished stream starts the next),
and counts output tokens (from each chunk's cumulative completion_tokens) and chunks received in the
window. The simulator's CPU share comes from /proc/<pid>/stat over the same window, the client's
from getrusage: whichever side is near 1.0 is the one that limits the run.

    .venv/bin/python bench/sglang_sim_capacity.py            # the default sweep (~2 min)
    .venv/bin/python bench/sglang_sim_capacity.py --quick    # one short point
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
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

STREAMS = 512
PROMPT = list(range(1, 201))  # 200 prompt tokens


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def _pin(pid: int, cpu: int) -> None:
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(pid, {cpu})


def start_sim(rate: float, tokens: int, tmp: Path, min_step_s: float) -> tuple[subprocess.Popen[str], str]:
    config = {
        "time_scale": 1.0,
        "startup_weights_s": 0,
        "startup_kv_pool_s": 0,
        "startup_cuda_graph_s": 0,
        "startup_http_s": 0,
        "startup_warmup_s": 0,
        "max_running_requests": STREAMS,
        "max_total_tokens": 4_000_000,
        "decode_tokens_per_s": rate,
        "max_gen_throughput": 1e9,
        "prefill_tokens_per_s": 1e7,
        "min_step_s": min_step_s,
        "output_len_min": tokens,
        "output_len_max": tokens,
        "decode_log_interval": 100_000,
        "requests_maxlen": 100,
    }
    path = tmp / "sim.json"
    path.write_text(json.dumps(config))
    proc = subprocess.Popen(
        [sys.executable, "-m", "regen.sim", "sglang", "--port", "0", "--config", str(path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    url = line.split(" on ", 1)[1].strip()
    _pin(proc.pid, 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.05)
    return proc, url


async def client(url: str, tokens: int, window_s: float, warmup_s: float) -> dict[str, Any]:
    import aiohttp
    import orjson

    body = orjson.dumps(
        {
            "input_ids": PROMPT,
            "stream": True,
            "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True},
        }
    )
    counting = False
    stop = False
    got_tokens = 0
    got_chunks = 0
    completed = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal got_tokens, got_chunks, completed
        while not stop:
            seen = 0
            async with session.post(url + "/generate", data=body) as r:
                async for line in r.content:
                    if not line.startswith(b"data: {"):
                        continue
                    n = orjson.loads(line[6:])["meta_info"]["completion_tokens"]
                    if counting:
                        got_tokens += n - seen
                        got_chunks += 1
                    seen = n
                    if stop:
                        return
            if counting:
                completed += 1

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, read_bufsize=2**22) as session:
        tasks = [asyncio.create_task(worker(session)) for _ in range(STREAMS)]
        await asyncio.sleep(warmup_s)
        counting = True
        t0 = time.perf_counter()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        await asyncio.sleep(window_s)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        elapsed = time.perf_counter() - t0
        counting = False
        stop = True
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    client_cpu = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / elapsed
    return {
        "tokens_per_s": got_tokens / elapsed,
        "chunks_per_s": got_chunks / elapsed,
        "completed": completed,
        "window_s": elapsed,
        "client_cpu_share": client_cpu,
    }


def run_point(rate: float, tokens: int, window_s: float, min_step_s: float) -> dict[str, Any]:
    import uvloop

    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_sim(rate, tokens, Path(tmp), min_step_s)
        try:
            warmup = 3.0
            cpu0 = None

            async def measured() -> dict[str, Any]:
                nonlocal cpu0
                task = asyncio.create_task(client(url, tokens, window_s, warmup))
                await asyncio.sleep(warmup)
                cpu0 = _cpu_seconds(proc.pid)
                return await task

            result = uvloop.run(measured())
            assert cpu0 is not None
            sim_cpu = (_cpu_seconds(proc.pid) - cpu0) / result["window_s"]
        finally:
            proc.terminate()
            proc.wait(timeout=15)
    offered = STREAMS * rate
    return {
        "rate_per_request": rate,
        "offered_tokens_per_s": offered,
        **result,
        "delivered_share": result["tokens_per_s"] / offered,
        "sim_cpu_share": sim_cpu,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--min-step", type=float, default=0.02, help="simulator min_step_s (chunk cadence)")
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65535), hard))
    _pin(0, 0)
    rates = [20.0] if args.quick else [5.0, 10.0, 20.0, 40.0, 80.0]
    window = 4.0 if args.quick else args.window
    print(
        f"{STREAMS} streams, prompt {len(PROMPT)} tokens, outputs of 400 tokens, min_step_s {args.min_step}"
    )
    print(
        f"{'rate/req':>8} {'offered tok/s':>13} {'got tok/s':>10} {'share':>6} {'chunks/s':>9} "
        f"{'sim CPU':>7} {'client CPU':>10}"
    )
    for rate in rates:
        p = run_point(rate, 400, window, args.min_step)
        print(
            f"{p['rate_per_request']:8.0f} {p['offered_tokens_per_s']:13.0f} {p['tokens_per_s']:10.0f} "
            f"{p['delivered_share']:6.2f} {p['chunks_per_s']:9.0f} {p['sim_cpu_share']:7.2f} "
            f"{p['client_cpu_share']:10.2f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
