"""The router's overload veto, measured: real smg (the wheel in the venv) in front of stand-in SGLang
servers (`regen sim sglang`), regen-like load (far more than 8 in flight per worker), once per smg
setting: smg's default overload protection, regen's launch rule (router.OVERLOAD_ARGS), and
thresholds at regen's queue band. Prints requests/s, the per-worker split, the share refused (non-200)
or stalled (over STALL_S), and p50/p99 latency, with ratios to the default (same run, same machine).

    .venv/bin/python bench/router_overload.py [--workers 2] [--in-flight 200] [--requests 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import aiohttp

from regen.engine.host.router import OVERLOAD_ARGS, router_argv

STALL_S = 5.0  # a request this slow waited on smg's 10 s load poll, not on the server
SIM = {
    "served_model_name": "sim-model",
    "time_scale": 1.0,
    "decode_tokens_per_s": 100.0,
    "max_running_requests": 16,
    "output_len_min": 8,
    "output_len_max": 24,
    "min_step_s": 0.002,
    "startup_weights_s": 0.05,
    "startup_kv_pool_s": 0.05,
    "startup_cuda_graph_s": 0.05,
    "startup_http_s": 0.05,
    "startup_warmup_s": 0.05,
    "child_processes": 0,
}


def start_sim(root: Path, i: int) -> tuple[subprocess.Popen[str], str]:
    """Worker i: the first 16 running slots, the others 48 (a mixed fleet: unequal queues)."""
    config = root / f"sim{i}.json"
    config.write_text(json.dumps({**SIM, "max_running_requests": 16 if i == 0 else 48}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "regen", "sim", "sglang", "--port", "0", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on" not in line:
        raise RuntimeError(f"the stand-in server did not start: {line!r}")
    return proc, line.split(" on ", 1)[1].strip()


@contextlib.contextmanager
def running_sims(root: Path, count: int) -> Iterator[list[str]]:
    """`count` stand-in servers (`start_sim`), their URLs; ended (SIGTERM, then SIGKILL) at the exit."""
    procs: list[subprocess.Popen[str]] = []
    try:
        urls = []
        for i in range(count):
            proc, url = start_sim(root, i)
            procs.append(proc)
            urls.append(url)
        yield urls
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def wait_ready(url: str, n_workers: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(url + "/readiness") as resp:
                    if resp.status == 200 and (await resp.json()).get("healthy_workers") == n_workers:
                        # and one generate answered, so the workers' metadata is in
                        async with session.post(url + "/generate", json={"text": "hi"}) as g:
                            if g.status == 200:
                                return
            except (aiohttp.ClientError, OSError, ValueError):
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} did not register {n_workers} workers in {timeout_s:.0f} s")


async def load(url: str, in_flight: int, requests: int) -> dict[str, object]:
    """``requests`` /generate calls, ``in_flight`` at a time; what came back."""
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    workers: Counter[str] = Counter()
    todo = iter(range(requests))
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=0)

    async def one(session: aiohttp.ClientSession) -> None:
        for i in todo:
            t = time.monotonic()
            body = {
                "text": f"question {i}: tell me about topic {i % 17}",
                "sampling_params": {"max_new_tokens": 24},
            }
            try:
                async with session.post(url + "/generate", json=body) as resp:
                    await resp.read()
                    statuses[resp.status] += 1
                    workers[resp.headers.get("x-smg-routed-worker-id", "?")] += 1
            except (aiohttp.ClientError, TimeoutError):
                statuses[0] += 1
            latencies.append(time.monotonic() - t)

    started = time.monotonic()
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await asyncio.gather(*(one(session) for _ in range(in_flight)))
    wall = time.monotonic() - started
    latencies.sort()
    refused = sum(n for s, n in statuses.items() if s != 200)
    return {
        "rps": requests / wall,
        "wall_s": wall,
        "refused": refused / requests,
        "stalled": sum(1 for x in latencies if x >= STALL_S) / requests,
        "p50_s": latencies[len(latencies) // 2],
        "p99_s": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "split": sorted(workers.values(), reverse=True),
        "statuses": dict(statuses),
    }


async def run_one(
    urls: Sequence[str], overload: Sequence[str], in_flight: int, requests: int, log: Path
) -> dict[str, object]:
    import socket

    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
    argv = router_argv(urls, ports[0], ports[1], 600, overload_args=overload)
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{ports[0]}"
        await wait_ready(url, len(urls))
        await asyncio.sleep(11)  # one load poll in, so the veto has loads to read, as in a long run
        return await load(url, in_flight, requests)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--in-flight", type=int, default=200)
    ap.add_argument("--requests", type=int, default=3000)
    args = ap.parse_args()
    band_max = 2000  # SGLangSettings.healthy_queue_max's default
    settings = {
        "default protection": [],
        "regen (OVERLOAD_ARGS)": list(OVERLOAD_ARGS),
        "thresholds at the band": [
            "--worker-overload-waiting-requests",
            str(band_max),
            "--worker-overload-token-usage",
            "1.0",
        ],
    }
    with tempfile.TemporaryDirectory() as tmp, running_sims(Path(tmp), args.workers) as urls:
        results = {}
        for name, flags in settings.items():
            results[name] = asyncio.run(
                run_one(urls, flags, args.in_flight, args.requests, Path(tmp) / "smg.log")
            )
    base = results["default protection"]
    print(
        f"{args.workers} workers, {args.in_flight} in flight, {args.requests} requests, cpus {os.cpu_count()}"
    )
    print(
        f"{'setting':26} {'req/s':>7} {'x base':>7} {'refused':>8} {'stalled':>8} {'p50 s':>7} {'p99 s':>7} split"
    )
    for name, r in results.items():
        ratio = float(r["rps"]) / float(base["rps"])  # type: ignore[arg-type]
        print(
            f"{name:26} {r['rps']:7.1f} {ratio:7.2f} {r['refused']:8.1%} {r['stalled']:8.1%} "
            f"{r['p50_s']:7.2f} {r['p99_s']:7.2f} {r['split']} {r['statuses']}"
        )


if __name__ == "__main__":
    main()
