"""Restart cost: how long a job takes to resume on a big results file, against `wc -l` on it.

    python bench/restart.py                 # 1,000,000 prompts and rows (about 1.35 GB of rows)
    python bench/restart.py --rows 200000   # smaller

Resuming rebuilds which prompts are done, the tokens and statuses so far, checks each row against
its prompt line (a prompt edited under its row stops the job), validates every prompt line and
rebuilds spend from the attempt journal. A checkpoint (engine/run/checkpoint.py) and the kept scan
(engine/data/scancache.py) leave a start only what was written since the last checkpoint. The
baseline is `wc -l` on the same results file in the same run: the least any tool can do to learn
how many rows there are. Files are in the page cache (each is read once first), so the figure is CPU.

Printed: the readers' phases without a checkpoint or kept scan (a first start), then Job.prepare()
each in a process of its own (seconds and peak RSS, VmHWM): a first start, after a clean stop (goal
10x `wc -l`), and after a SIGKILL with `--since` rows and their attempts written after the last
checkpoint (goal 15x); peak RSS goal 150 MB (BENCHMARKS.md "Restart").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from regen.engine.data.datasets import Dataset
from regen.engine.data.scan import scan
from regen.engine.data.scancache import SCANS_DIR
from regen.engine.run.checkpoint import CHECKPOINTS_DIR
from regen.engine.run.inputs import check_rows_match
from regen.engine.run.records import end_record, gen_record, start_record
from regen.engine.run.recovery import read_journals, read_rows

OUT = Path(__file__).resolve().parent / "out" / "restart"
# About 1 KB a row: a short answer with its reasoning and the row's fixed fields, ids left empty
# (they are tokenized locally; a row with ids is about 3x longer and the parse scales with bytes).
ANSWER = "Mixture-of-experts layers route each token to a few experts. " * 3
REASONING = "The user asks about routing; explain gating and load balancing briefly. " * 2
RESERVED, COST = Decimal("0.27"), Decimal("0.000408")
STARTED, ENDED = 1796119200.0, 1796119204.1  # the rows' started_at and created_at


def build(rows: int) -> tuple[Path, Path]:
    """A dataset of `rows` prompts whose every prompt has a row, and a journal of their attempts."""
    folder = OUT / f"D{rows}"
    run_dir = OUT / f"run{rows}"
    prompts, results = folder / "prompts.jsonl", folder / "raw_responses.jsonl"
    if results.exists() and prompts.exists() and (run_dir / "attempts.jsonl").exists():
        return folder, run_dir
    folder.mkdir(parents=True, exist_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    from regen.engine.data.validate import validate_line

    with open(prompts, "wb") as p, open(results, "wb") as r, open(run_dir / "attempts.jsonl", "wb") as j:
        for line in range(rows):
            raw = orjson.dumps(
                {"messages": [{"role": "user", "content": f"question {line}: explain topic {line % 97}"}]}
            )
            p.write(raw + b"\n")
            prompt = validate_line(raw, folder.name, line)
            assert not isinstance(prompt, str)
            rid, gen = f"{prompt.id}#0", f"gen-{line:012d}"
            row = {
                "schema_version": 1,
                "id": prompt.id,
                "dataset": folder.name,
                "line": line,
                "prompt_sha256": prompt.sha256,
                "source_id": None,
                "meta": None,
                "status": "ok",
                "backend": "openrouter",
                "model": "moonshotai/kimi-k2.5",
                "served_model": "moonshotai/kimi-k2.5-0127",
                "provider": "DeepInfra",
                "generation_id": gen,
                "finish_reason": "stop",
                "native_finish_reason": "stop",
                "reasoning": REASONING,
                "content": ANSWER,
                "prompt_ids": [],
                "output_ids": [],
                "output_ids_source": None,
                "terminator_appended": False,
                "num_prompt_tokens": 0,
                "num_output_tokens": 0,
                "usage": {
                    "prompt_tokens": 20,
                    "completion_tokens": 180,
                    "reasoning_tokens": 60,
                    "cached_tokens": 0,
                },
                "cost": 0.000408,
                "cost_estimated": False,
                "is_byok": False,
                "request": {"thinking": True, "max_tokens": 16384, "temperature": 1.0, "top_p": 0.95},
                "server": {"kind": "openrouter", "endpoint": "/api/v1/chat/completions"},
                "tokenizer": None,
                "flags": [],
                "timing": {
                    "started_at": "2026-12-01T10:00:00.000Z",
                    "ttft_s": 0.8,
                    "e2e_s": 4.1,
                    "attempts": 1,
                },
                "created_at": "2026-12-01T10:00:04.100Z",
            }
            r.write(orjson.dumps(row) + b"\n")
            # The attempt's journal as the job writes it (engine/run/records.py).
            j.write(
                orjson.dumps(start_record(rid, folder.name, line, RESERVED, "openrouter", STARTED)) + b"\n"
            )
            j.write(orjson.dumps(gen_record(rid, gen)) + b"\n")
            j.write(
                orjson.dumps(
                    end_record(rid, folder.name, line, gen, "openrouter", "ok", COST, False, ENDED, ctok=180)
                )
                + b"\n"
            )
    return folder, run_dir


def wc_lines(path: Path) -> float:
    started = time.perf_counter()
    subprocess.run(["wc", "-l", str(path)], check=True, capture_output=True)
    return time.perf_counter() - started


def resume(folder: Path, run_dir: Path) -> dict[str, float]:
    """The readers Job.prepare() runs, phase by phase, without a checkpoint or a kept scan: a first
    start (engine/run/inputs.py, engine/run/recovery.py)."""
    dataset = Dataset(folder.name, folder)
    phases: dict[str, float] = {}
    started = time.perf_counter()
    report = scan(dataset, keep_digests=True)
    phases["validate prompts"] = time.perf_counter() - started
    mark = time.perf_counter()
    journal = read_journals(run_dir / "attempts.jsonl", run_dir / "events.jsonl")
    phases["read journal"] = time.perf_counter() - mark
    mark = time.perf_counter()
    # Each row is checked against its prompt's digest as it is read (read_rows(prompts=...)).
    progress = read_rows(dataset.results_path, {c.line for c in journal.crashed}, report)
    check_rows_match(dataset, progress)
    phases["read and check rows"] = time.perf_counter() - mark
    phases["total"] = time.perf_counter() - started
    return phases


async def resume_job(folder: Path, run_dir: Path, *, prepare: bool = True) -> float:
    """The real thing: Job.prepare() against the simulator, for the end-to-end figure (without
    `prepare`: everything but it, the process's memory before any file is read)."""
    from regen.engine.config.settings import JobSettings, OpenRouterSettings, Settings
    from regen.engine.job.job import Job
    from regen.sim.openrouter.config import SimConfig
    from regen.sim.openrouter.server import OpenRouterSim

    sim = OpenRouterSim(SimConfig(api_keys=["sk-bench"]))
    await sim.start()
    try:
        settings = Settings(
            openrouter=OpenRouterSettings(base_url=sim.base_url, api_key="sk-bench"),
            job=JobSettings(datasets=[folder], run_dir=run_dir),
        )
        job = Job(settings)
        started = time.perf_counter()
        if not prepare:
            return 0.0
        await job.prepare()
        took = time.perf_counter() - started
        await job.lanes[0].backend.close()
        await job.results.close()
        await job.events.close()
        job.lock.release()
        return took
    finally:
        await sim.stop()


def peak_mb() -> float:
    """This process's peak RSS (VmHWM: since its exec, not the forked parent's pages)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def prepare_in_child(folder: Path, run_dir: Path, mode: str = "--prepare") -> tuple[float, float]:
    """Job.prepare() in a process of its own: its seconds and its peak RSS (MB)."""
    out = subprocess.run(
        [sys.executable, __file__, mode, str(folder), str(run_dir)],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    ).stdout.split()
    return float(out[-2]), float(out[-1])


def forget(run_dir: Path) -> None:
    """No checkpoint and no kept scan: the next start reads every file whole."""
    for sub in (CHECKPOINTS_DIR, SCANS_DIR):
        shutil.rmtree(run_dir / sub, ignore_errors=True)


def cut_tail(path: Path, lines: int) -> bytes:
    """The last `lines` lines of `path`, cut off it (put back with `path.open("ab")`)."""
    data = path.read_bytes()
    at = len(data)
    for _ in range(lines):
        at = data.rindex(b"\n", 0, at - 1) + 1 if at > 1 else 0
    path.write_bytes(data[:at])
    return data[at:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--since", type=int, default=100_000, help="rows written after the last checkpoint before the SIGKILL"
    )
    parser.add_argument("--prepare", nargs=2, type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--baseline", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.prepare or args.baseline:
        took = asyncio.run(resume_job(*(args.prepare or args.baseline), prepare=bool(args.prepare)))
        print(f"{took:.3f} {peak_mb():.0f}")
        return 0
    folder, run_dir = build(args.rows)
    results = folder / "raw_responses.jsonl"
    size = results.stat().st_size
    print(
        f"{args.rows:,} rows, {size / 1e9:.2f} GB of results, {os.path.getsize(folder / 'prompts.jsonl') / 1e6:.0f} MB of prompts"
    )
    forget(run_dir)
    wc_lines(results)
    resume(folder, run_dir)  # warm the page cache for both
    wc = statistics.median(wc_lines(results) for _ in range(args.repeat))
    runs = [resume(folder, run_dir) for _ in range(args.repeat)]
    phases = {name: statistics.median(r[name] for r in runs) for name in runs[0]}
    print(f"wc -l on the results file: {wc:.3f} s")
    print("the readers without a checkpoint or a kept scan (a first start):")
    for name, took in phases.items():
        print(f"  {name:<28} {took:7.3f} s")

    def report(label: str, figures: list[tuple[float, float]]) -> None:
        took = statistics.median(f[0] for f in figures)
        peak = max(f[1] for f in figures)
        print(f"Job.prepare() {label:<44} {took:7.3f} s = {took / wc:6.1f}x wc -l, peak RSS {peak:5.0f} MB")

    baseline = prepare_in_child(folder, run_dir, "--baseline")[1]
    print(f"the process before Job.prepare() (imports, the simulator, the Job): peak RSS {baseline:.0f} MB")
    first = []
    for _ in range(args.repeat):
        forget(run_dir)
        first.append(prepare_in_child(folder, run_dir))
    report("first start (no checkpoint, no kept scan)", first)
    # That start kept its scan and wrote a checkpoint of everything: what a clean stop leaves.
    report("after a clean stop (goal: 10x)", [prepare_in_child(folder, run_dir) for _ in range(args.repeat)])
    # A SIGKILL: the last checkpoint is `since` rows (and their attempts' records) behind the files.
    killed = []
    for _ in range(args.repeat):
        rows_tail = cut_tail(results, args.since)
        journal_tail = cut_tail(run_dir / "attempts.jsonl", 3 * args.since)
        for old in (run_dir / CHECKPOINTS_DIR).glob("*.ckpt"):
            old.unlink()
        prepare_in_child(folder, run_dir)  # the checkpoint, behind
        with results.open("ab") as f:
            f.write(rows_tail)
        with (run_dir / "attempts.jsonl").open("ab") as f:
            f.write(journal_tail)
        killed.append(prepare_in_child(folder, run_dir))
    report(f"after a SIGKILL, {args.since:,} rows past the checkpoint (goal: 15x)", killed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
