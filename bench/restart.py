"""Restart cost: how long a job takes to resume on a big results file, against `wc -l` on it.

    python bench/restart.py                 # 1,000,000 prompts and rows (about 1 GB of rows)
    python bench/restart.py --rows 200000   # smaller

Resuming reads every row (which prompts are done, the tokens and statuses so far), checks each row
against its prompt line (a prompt edited under its row stops the job), validates every prompt line
and rebuilds spend from the attempt journal. The baseline is `wc -l` on the same results file in the
same run: the least any tool can do to learn how many rows there are. Both run with the files in
the page cache (each is run once first), so the figure is CPU, not disk.

Goal (the engine split must not regress it): the resume within 10x of `wc -l`. The bench prints the
resume's phases, so a miss says where the time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
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
            raw = orjson.dumps({"messages": [{"role": "user", "content": f"question {line}: explain topic {line % 97}"}]})
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
                "usage": {"prompt_tokens": 20, "completion_tokens": 180, "reasoning_tokens": 60, "cached_tokens": 0},
                "cost": 0.000408,
                "cost_estimated": False,
                "is_byok": False,
                "request": {"thinking": True, "max_tokens": 16384, "temperature": 1.0, "top_p": 0.95},
                "server": {"kind": "openrouter", "endpoint": "/api/v1/chat/completions"},
                "tokenizer": None,
                "flags": [],
                "timing": {"started_at": "2026-12-01T10:00:00.000Z", "ttft_s": 0.8, "e2e_s": 4.1, "attempts": 1},
                "created_at": "2026-12-01T10:00:04.100Z",
            }
            r.write(orjson.dumps(row) + b"\n")
            # The attempt's journal as the job writes it (engine/run/records.py).
            j.write(orjson.dumps(start_record(rid, folder.name, line, RESERVED, "openrouter", STARTED)) + b"\n")
            j.write(orjson.dumps(gen_record(rid, gen)) + b"\n")
            j.write(
                orjson.dumps(
                    end_record(rid, folder.name, line, gen, "openrouter", "ok", COST, False, ENDED, ctok=180)
                ) + b"\n"
            )
    return folder, run_dir


def wc_lines(path: Path) -> float:
    started = time.perf_counter()
    subprocess.run(["wc", "-l", str(path)], check=True, capture_output=True)
    return time.perf_counter() - started


def resume(folder: Path, run_dir: Path) -> dict[str, float]:
    """What Job.prepare() does with the files (engine/run/inputs.py, engine/run/recovery.py), phase by phase."""
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


async def resume_job(folder: Path, run_dir: Path) -> float:
    """The real thing: Job.prepare() against the simulator, for the end-to-end figure."""
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
        await job.prepare()
        took = time.perf_counter() - started
        await job.lanes[0].backend.close()
        await job.results.close()
        await job.events.close()
        job.lock.release()
        return took
    finally:
        await sim.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    folder, run_dir = build(args.rows)
    results = folder / "raw_responses.jsonl"
    size = results.stat().st_size
    print(f"{args.rows:,} rows, {size / 1e9:.2f} GB of results, {os.path.getsize(folder / 'prompts.jsonl') / 1e6:.0f} MB of prompts")
    wc_lines(results)
    resume(folder, run_dir)  # warm the page cache for both
    wc = statistics.median(wc_lines(results) for _ in range(args.repeat))
    runs = [resume(folder, run_dir) for _ in range(args.repeat)]
    phases = {name: statistics.median(r[name] for r in runs) for name in runs[0]}
    job = statistics.median(asyncio.run(resume_job(folder, run_dir)) for _ in range(args.repeat))
    print(f"wc -l on the results file: {wc:.3f} s")
    for name, took in phases.items():
        print(f"  {name:<28} {took:7.3f} s")
    print(f"Job.prepare() end to end:  {job:.3f} s  = {job / wc:.1f}x wc -l (goal: within 10x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
