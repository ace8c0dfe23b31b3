"""Peak memory of the job: 8 datasets of 100,000 prompts each, 2000 requests in flight.

    python bench/memory.py                  # 8 x 100,000 prompts, 2000 in flight, 60 s of steady load
    python bench/memory.py --seconds 120

The job runs as `regen run --headless` against `regen sim openrouter` (each its own process); the
simulator answers slowly enough that the in-flight limit is always full. The job's resident memory
is sampled from /proc every 0.2 s; the peak is the kernel's high-water mark (VmHWM) just before the
job is stopped with SIGINT (it drains, then exits). Goal: under 400 MB.

What the figure holds, so a miss can be read: the interpreter and the libraries (about 60 MB
before any work), the validation scan's per-prompt data (content lengths for the planner and the
digest prefixes that check rows against prompts: 24 bytes a prompt while the job prepares), and
2000 attempts in flight (their tasks, HTTP buffers and parse state).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.processes import free_port  # noqa: E402

OUT = ROOT / "bench" / "out" / "memory"
KEY = "sk-bench-memory"


def datasets(count: int, prompts: int) -> list[Path]:
    folders = []
    for n in range(count):
        folder = OUT / "data" / f"D{n}"
        path = folder / "prompts.jsonl"
        folders.append(folder)
        if path.exists() and sum(1 for _ in path.open("rb")) == prompts:
            continue
        folder.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            for i in range(prompts):
                text = (
                    f"dataset {n} question {i}: explain topic {i % 211} with an example and its trade-offs."
                )
                f.write(orjson.dumps({"messages": [{"role": "user", "content": text}]}) + b"\n")
    return folders


def rss_kb(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in kB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields["VmRSS"], fields["VmHWM"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    folders = datasets(args.datasets, args.prompts)
    run_dir = OUT / "run"
    if run_dir.exists():
        for child in run_dir.iterdir():
            child.unlink()
    for folder in folders:
        (folder / "raw_responses.jsonl").unlink(missing_ok=True)
    port = free_port()
    sim_config = OUT / "sim.json"
    # Slow answers (a few seconds each) keep all 2000 slots busy; tokens are few, so the job's
    # memory is the job's, not a pile of long answers.
    sim_config.write_text(
        json.dumps(
            {
                "api_keys": [KEY],
                "time_scale": 0.5,
                "min_completion_tokens": 20,
                "max_completion_tokens": 80,
                "chunk_interval_s": 0.25,
                "tokens_per_event": 16,
                "seed": 1,
            }
        )
    )
    settings = OUT / "settings.toml"
    settings.write_text(
        f'[openrouter]\nbase_url = "http://127.0.0.1:{port}/api/v1"\nmax_tokens = 256\n'
        f"[job]\ndatasets = {json.dumps([str(f) for f in folders])}\nrun_dir = {json.dumps(str(run_dir))}\n"
        f"concurrency = {args.concurrency}\nbudget_usd = 100000.0\n"
        "[headless]\nstatus_interval_s = 5.0\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OPENROUTER_API_KEY": KEY}
    regen = [sys.executable, "-m", "regen.cli.main"]
    sim = subprocess.Popen(
        [*regen, "sim", "openrouter", "--port", str(port), "--config", str(sim_config)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert sim.stdout is not None and "listening" in sim.stdout.readline()
    log = open(OUT / "job.log", "w")  # noqa: SIM115 - closed below
    job = subprocess.Popen(
        [*regen, "run", "--headless", "--settings", str(settings)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    samples: list[tuple[float, int, int]] = []
    started = time.monotonic()
    full_since: float | None = None
    try:
        while job.poll() is None:
            now = time.monotonic() - started
            rss, hwm = rss_kb(job.pid)
            samples.append((now, rss, hwm))
            if full_since is None:
                snapshot = (OUT / "job.log").read_text()
                if f"in flight {args.concurrency}/" in snapshot:
                    full_since = now
            elif now - full_since >= args.seconds:
                break
            time.sleep(0.2)
        _, peak = rss_kb(job.pid)
        job.send_signal(signal.SIGINT)
        job.wait(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
        sim.send_signal(signal.SIGTERM)
        sim.wait(timeout=30)
        log.close()
    if full_since is None:
        print("the in-flight limit was never full; see", OUT / "job.log")
        return 1
    steady = [rss for t, rss, _ in samples if t >= full_since]
    first, last = steady[: max(1, len(steady) // 10)], steady[-max(1, len(steady) // 10) :]
    prompts = args.datasets * args.prompts
    print(f"{args.datasets} datasets x {args.prompts:,} prompts ({prompts:,}), {args.concurrency} in flight")
    print(f"prepared and full after {full_since:.1f} s; {args.seconds:.0f} s at full load")
    print(
        f"RSS at full load: first tenth {sum(first) / len(first) / 1024:.0f} MB, last tenth {sum(last) / len(last) / 1024:.0f} MB"
    )
    print(f"peak RSS (VmHWM): {peak / 1024:.0f} MB (goal: under 400 MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
