"""What a resume holds in memory after a long run: the journals and the rows read back.

    .venv/bin/python bench/resume_memory.py                 # on what `make soak` left in bench/out/soak
    .venv/bin/python bench/resume_memory.py --out DIR       # another soak's output folder

A job resumed after the soak (1.16M rows, 3.5M attempt records) read its journals and rows before
it sent anything; this measures the two readers alone, in this process, in that order, as
`Job.prepare()` calls them: seconds, resident memory after each (after a collection) and the peak.
"""

from __future__ import annotations

import argparse
import gc
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from regen.engine.run.recovery import read_journals, read_rows  # noqa: E402


def rss_mb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    return 0


def peak_mb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "out" / "soak", help="a soak's output folder"
    )
    args = ap.parse_args(argv)
    run, data = args.out / "run", args.out / "data"
    if not (run / "attempts.jsonl").exists():
        print(f"{run / 'attempts.jsonl'}: not there; run `make soak` first", file=sys.stderr)
        return 2
    print(f"start: rss {rss_mb()} MB")
    began = time.monotonic()
    journal = read_journals(run / "attempts.jsonl", run / "events.jsonl")
    gc.collect()
    print(
        f"journals: {time.monotonic() - began:.1f} s, {(run / 'attempts.jsonl').stat().st_size / 1e6:.0f} MB, "
        f"{sum(len(tried) for tried in journal.attempts.values()):,} prompts tried; rss {rss_mb()} MB, peak {peak_mb()} MB"
    )
    began = time.monotonic()
    progress = [read_rows(folder / "raw_responses.jsonl") for folder in sorted(data.iterdir())]
    gc.collect()
    print(
        f"rows: {time.monotonic() - began:.1f} s, {sum(len(p.done) for p in progress):,} rows; "
        f"rss {rss_mb()} MB, peak {peak_mb()} MB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
