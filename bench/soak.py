"""The soak: an hour at 2000 in flight, every fault class on, a SIGKILL every few minutes.

    make soak                                  # = python bench/soak.py (60 minutes)
    python bench/soak.py --minutes 10          # shorter

`regen run --headless` runs against `regen sim openrouter` (each its own process). The simulator
draws every fault class of sim/openrouter/config.py (FAULT_CLASSES) at a small rate each;
the job is killed with SIGKILL at random moments, 2 to 5 minutes apart, and started again at once
with the same command. When the time is up the job gets SIGINT (it drains) and the soak checks:

- one row per prompt: no line twice in any raw_responses.jsonl, every row for a line of its dataset;
- money: what the journals say was spent against what the simulator billed: every attempt whose
  generation id was journaled is settled at its bill, and the worst case of attempts killed before
  any id arrived is bounded at the final drain's end by what the key's usage grew by since the run's
  first start (docs/money.md, "Bounded by the key's usage"), so spent == billed exactly; a run
  without that base (the first start could not read /key) is held to confirmed <= billed <= spent;
- memory: each job process's RSS is sampled every second (written to bench/out/soak/rss.tsv); flat
  memory is the RSS of the longest segment's last two minutes against its minutes 5-7 (the issue's
  measure: growth after the first 5 minutes). `--trace-memory` starts tracemalloc in each job
  process (bench/out/soak/trace/sitecustomize.py on its PYTHONPATH) and dumps a snapshot every
  minute; the soak then prints what grew most between the longest segment's minute 5 and its end,
  by the line that allocated it (tracing slows the job, so its rows and money are not the soak's).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from decimal import Decimal
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from regen.engine.run.recovery import read_journals  # noqa: E402
from regen.sim.openrouter.config import FAULT_CLASSES  # noqa: E402
from tests.support.processes import free_port  # noqa: E402

OUT = ROOT / "bench" / "out" / "soak"
KEY = "sk-bench-soak"


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


# Loaded by each job process when --trace-memory is on (bench/out/soak/trace/ is first on its
# PYTHONPATH): traces allocations from the start and dumps a snapshot every minute.
TRACER = """
import os, threading, time, tracemalloc

tracemalloc.start(12)


def _dump():
    started = time.monotonic()
    folder = os.environ["SOAK_TRACE_DIR"]
    while True:
        time.sleep(60)
        minute = round((time.monotonic() - started) / 60)
        path = os.path.join(folder, f"{os.getpid()}-{minute:04d}.snap")
        tracemalloc.take_snapshot().dump(path + ".part")
        os.replace(path + ".part", path)


threading.Thread(target=_dump, daemon=True, name="soak-trace").start()
"""


def memory_growth(folder: Path, pid: int, top: int = 15) -> list[str]:
    """What grew most in one job process between its snapshot at minute 5 (or its first) and its last,
    by the line that allocated it, with the regen frames of the allocation's traceback."""
    import tracemalloc

    snaps = sorted(folder.glob(f"{pid}-*.snap"))
    if len(snaps) < 2:
        return [f"memory growth: fewer than two snapshots of process {pid}"]
    early = next((p for p in snaps if int(p.stem.split("-")[1]) >= 5), snaps[0])
    late = snaps[-1]
    filters = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen *>")]
    before = tracemalloc.Snapshot.load(str(early)).filter_traces(filters)
    after = tracemalloc.Snapshot.load(str(late)).filter_traces(filters)
    total = sum(s.size for s in after.statistics("filename")) - sum(
        s.size for s in before.statistics("filename")
    )
    lines = [
        f"memory growth in process {pid}, traced, minute {early.stem.split('-')[1]} to "
        f"{late.stem.split('-')[1]}: {total / 1e6:+.1f} MB in all; the largest by where it was allocated:"
    ]
    grown = sorted(
        (d for d in after.compare_to(before, "traceback") if d.size_diff > 0), key=lambda d: -d.size_diff
    )
    for diff in grown[:top]:
        # Innermost first: where the block was made, then the regen frames that called it.
        frames = list(reversed(diff.traceback))
        frames = frames[:1] + [f for f in frames[1:] if "/regen/" in f.filename][:3]
        where = " <- ".join(
            f"{f.filename.split('/src/')[-1].split('site-packages/')[-1]}:{f.lineno}" for f in frames
        )
        lines.append(f"  {diff.size_diff / 1e6:+7.2f} MB {diff.count_diff:+8d} blocks  {where}")
    return lines


def make_datasets(count: int, prompts: int) -> list[Path]:
    folders = []
    for n in range(count):
        folder = OUT / "data" / f"S{n}"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "prompts.jsonl", "wb") as f:
            for i in range(prompts):
                text = f"soak {n} question {i}: explain topic {i % 311} with a short example."
                f.write(orjson.dumps({"messages": [{"role": "user", "content": text}]}) + b"\n")
        folders.append(folder)
    return folders


def faults(rate: float) -> dict[str, float]:
    """Every fault class at `rate`, but the account-wide limit: each one holds all dispatch for a
    second at least (engine/job/dispatch.py), so at the same rate the soak would be held half the time."""
    rates = dict.fromkeys(FAULT_CLASSES, rate)
    rates["http_429_ratelimit_reset"] = rate / 50
    return rates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--concurrency", type=int, default=2000)
    parser.add_argument("--datasets", type=int, default=8)
    parser.add_argument(
        "--prompts",
        type=int,
        default=500_000,
        help="per dataset (a quiet hour makes ~3M rows of the 4M)",
    )
    parser.add_argument("--fault-rate", type=float, default=0.004, help="per fault class")
    parser.add_argument(
        "--kill-every", type=float, nargs=2, default=(120.0, 300.0), metavar=("MIN_S", "MAX_S")
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--checkpoint-s", type=float, default=None, help="job.checkpoint_interval_s (default 300)"
    )
    parser.add_argument(
        "--segment-mb",
        type=float,
        default=None,
        help="job.journal_segment_mb (default 64): "
        "below what a segment between kills writes, the journal rotates while the job runs",
    )
    parser.add_argument(
        "--trace-memory",
        action="store_true",
        help="tracemalloc in each job process, a snapshot a minute; print what grew (slows the job)",
    )
    args = parser.parse_args()
    rng = random.Random(args.seed)
    if OUT.exists():
        subprocess.run(["rm", "-rf", str(OUT)], check=True)
    OUT.mkdir(parents=True)
    folders = make_datasets(args.datasets, args.prompts)
    port = free_port()
    (OUT / "sim.json").write_text(
        json.dumps(
            {
                "api_keys": [KEY],
                "time_scale": 0.3,
                "min_completion_tokens": 20,
                "max_completion_tokens": 120,
                "chunk_interval_s": 0.2,
                "tokens_per_event": 16,
                "generation_lookup_delay_s": 0.5,
                "faults": faults(args.fault_rate),
                "seed": args.seed,
            }
        )
    )
    settings = OUT / "settings.toml"
    settings.write_text(
        f'[openrouter]\nbase_url = "http://127.0.0.1:{port}/api/v1"\nmax_tokens = 256\n'
        f"[job]\ndatasets = {json.dumps([str(f) for f in folders])}\nrun_dir = {json.dumps(str(OUT / 'run'))}\n"
        f"concurrency = {args.concurrency}\nbudget_usd = 100000.0\nmax_attempts = 50\n"
        + (f"checkpoint_interval_s = {args.checkpoint_s}\n" if args.checkpoint_s is not None else "")
        + (f"journal_segment_mb = {args.segment_mb}\n" if args.segment_mb is not None else "")
        + "[headless]\nstatus_interval_s = 10.0\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OPENROUTER_API_KEY": KEY}
    regen = [sys.executable, "-m", "regen.cli.main"]
    job_env = env
    trace = OUT / "trace"
    if args.trace_memory:
        trace.mkdir()
        (trace / "sitecustomize.py").write_text(TRACER)
        job_env = {
            **env,
            "PYTHONPATH": f"{trace}{os.pathsep}{env['PYTHONPATH']}",
            "SOAK_TRACE_DIR": str(trace),
        }
    sim = subprocess.Popen(
        [*regen, "sim", "openrouter", "--port", str(port), "--config", str(OUT / "sim.json")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert sim.stdout is not None and "listening" in sim.stdout.readline()
    started = time.monotonic()
    ends = started + args.minutes * 60
    segments: list[list[tuple[float, float]]] = []
    pids: list[int] = []
    kills = 0
    log = open(OUT / "job.log", "ab")  # noqa: SIM115 - closed below
    try:
        while True:
            job = subprocess.Popen(
                [*regen, "run", "--headless", "--settings", str(settings)],
                env=job_env,
                stdout=log,
                stderr=log,
            )
            segment: list[tuple[float, float]] = []
            segments.append(segment)
            pids.append(job.pid)
            kill_at = time.monotonic() + rng.uniform(*args.kill_every)
            while job.poll() is None and time.monotonic() < min(kill_at, ends):
                rss = rss_mb(job.pid)
                if rss is not None:
                    segment.append((time.monotonic() - started, rss))
                time.sleep(1.0)
            if job.poll() is not None:
                print(
                    f"the job ended by itself (exit {job.returncode}) at {time.monotonic() - started:.0f} s"
                )
                break
            if time.monotonic() >= ends:
                job.send_signal(signal.SIGINT)  # drain, then exit
                job.wait(timeout=600)
                break
            job.kill()
            job.wait()
            kills += 1
            print(f"SIGKILL {kills} at {time.monotonic() - started:.0f} s", flush=True)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_sim/ledger", timeout=60) as response:
            billed = Decimal(json.loads(response.read())["billed_total"])
    finally:
        log.close()
        sim.send_signal(signal.SIGTERM)
        sim.wait(timeout=60)
    rows = 0
    duplicates = 0
    for folder in folders:
        path = folder / "raw_responses.jsonl"
        if not path.exists():
            continue
        lines = Counter(orjson.loads(line)["line"] for line in path.read_bytes().splitlines())
        rows += len(lines)
        duplicates += sum(n - 1 for n in lines.values() if n > 1)
        assert all(0 <= line < args.prompts for line in lines), f"{path}: a row for no prompt"
    state = read_journals(OUT / "run" / "attempts.jsonl", OUT / "run" / "events.jsonl")
    confirmed = state.spent - state.estimated
    usage_events = [
        e
        for e in map(orjson.loads, (OUT / "run" / "events.jsonl").read_bytes().splitlines())
        if e["event"] in ("usage_bound", "usage_unbounded")
    ]
    with open(OUT / "rss.tsv", "w") as samples:
        samples.write("segment\tpid\tseconds\trss_mb\n")
        for n, (pid, segment) in enumerate(zip(pids, segments, strict=True)):
            samples.writelines(f"{n}\t{pid}\t{t:.1f}\t{rss:.1f}\n" for t, rss in segment)
    longest = max(segments, key=len)
    minute = 60  # samples, one a second
    # The measure: growth after the first 5 minutes (minutes 5-7 against the last two).
    first = [r for _, r in longest[5 * minute : 7 * minute]] or [r for _, r in longest[: len(longest) // 3]]
    last = [r for _, r in longest[-2 * minute :]] or [r for _, r in longest[-len(longest) // 3 :]]
    peak = max(r for segment in segments for _, r in segment)
    print(
        f"soak: {args.minutes:.0f} minutes, {kills} SIGKILLs, {len(FAULT_CLASSES)} fault classes at {args.fault_rate:.1%} each"
    )
    print(f"rows: {rows:,} of {args.datasets * args.prompts:,} prompts, {duplicates} duplicates")
    print(
        f"money: spent ${state.spent:.4f} (confirmed ${confirmed:.4f}, estimated ${state.estimated:.4f}: "
        f"{state.estimates.pending_count} awaiting their bill, {state.estimates.unknowable_count} cut before an id)"
    )
    if state.usage_base is not None:
        bound = usage_events[-1] if usage_events else None
        if bound is not None and bound["event"] == "usage_bound":
            print(
                f"       bounded by the key's usage: unknowable ${Decimal(bound['unknowable_before']):.4f} -> "
                f"${Decimal(bound['unknowable_after']):.4f} for {bound['count']} requests, after waiting "
                f"{bound['waited_s']:.1f} s for the usage to settle"
            )
        elif bound is not None:
            print(f"       not bounded by the key's usage: {bound['reason']}")
        money_ok = state.spent == billed
        print(
            f"       the simulator billed ${billed:.4f}; spent == billed: {money_ok} "
            f"(spent - billed = ${state.spent - billed:f})"
        )
    else:
        money_ok = confirmed <= billed <= state.spent
        print("       no key usage base (the first start could not read /key): the worst case stays")
        print(f"       the simulator billed ${billed:.4f}; confirmed <= billed <= spent: {money_ok}")
    print(
        f"memory: longest segment {len(longest) / 60:.0f} min, RSS {sum(first) / len(first):.0f} MB at minutes "
        f"5-7, {sum(last) / len(last):.0f} MB in the last two ({sum(last) / len(last) / (sum(first) / len(first)) - 1:+.0%}); "
        f"peak {peak:.0f} MB (samples: {OUT / 'rss.tsv'})"
    )
    if args.trace_memory:
        print("\n".join(memory_growth(trace, pids[segments.index(longest)])))
    # The run folder's journals (and checkpoints, kept scans, compressed segments) against the results.
    results_bytes = sum(
        (f / "raw_responses.jsonl").stat().st_size for f in folders if (f / "raw_responses.jsonl").exists()
    )
    run_bytes = sum(p.stat().st_size for p in (OUT / "run").rglob("*") if p.is_file())
    attempts_bytes = (
        (OUT / "run" / "attempts.jsonl").stat().st_size if (OUT / "run" / "attempts.jsonl").exists() else 0
    )
    parts = list((OUT / "run" / "segments").glob("attempts.*"))
    parts_bytes = sum(p.stat().st_size for p in parts)
    starts = sum(
        1
        for e in map(orjson.loads, (OUT / "run" / "events.jsonl").read_bytes().splitlines())
        if e["event"] == "start"
    )
    events_bytes = (OUT / "run" / "events.jsonl").stat().st_size
    print(
        f"disk: results {results_bytes / 1e6:.0f} MB, run folder {run_bytes / 1e6:.0f} MB "
        f"(attempts.jsonl {attempts_bytes / 1e6:.0f} MB, {len(parts)} segments {parts_bytes / 1e6:.0f} MB "
        f"for {starts} starts, events.jsonl {events_bytes / 1e3:.0f} KB) = {run_bytes / max(results_bytes, 1):.2f}x the results"
    )
    ok = duplicates == 0 and money_ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
