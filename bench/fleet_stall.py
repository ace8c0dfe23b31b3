"""A two-fleet job whose GPUs stall at 30% of the deadline (docs/fleets.md, "A stalled fleet").

bench/fleet_run.py's job (the story's proportions in minutes: the GPUs make 72% of the work by the
deadline, OpenRouter the rest within a budget that pays for its share), with the GPU simulator's
process stopped with SIGSTOP once 30% of the time to the deadline has gone and continued once the
deadline has passed (the operator's server comes back: what it held answers late, as waste). The
job is the real one, `regen run --headless`, a process of its own. Three figures, each with its bar
(issue 32):

- the time from the stall to the verdict's turn (`deadline_unreachable`), at 2 s steering: <= 15 s;
- the share of the remaining work finished by the deadline against what the budget could buy at
  the stall (the budget left then, at the lowest price per output token seen: the plan's cheapest
  provider or what OpenRouter's answers cost; at most the work left): >= 0.9;
- prompts generated twice into the results: 0.

    .venv/bin/python bench/fleet_stall.py               # about 3 minutes
    .venv/bin/python bench/fleet_stall.py --write-md    # also update BENCHMARKS.md
"""

from __future__ import annotations

import datetime as dt
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.fleet_run import DATASETS, arguments, one_run, sized  # noqa: E402 - the sibling benchmark
from bench.throughput import machine, revision, write_md  # noqa: E402
from tests.support.journals import journal  # noqa: E402

MD_START = "<!-- bench:fleet-stall:start -->"
MD_END = "<!-- bench:fleet-stall:end -->"
OUT = ROOT / "bench" / "out" / "fleet_stall"
STALL_AT = 0.3  # of the time to the deadline
TURN_BAR_S = 15.0
SHARE_BAR = 0.9


def stall_at_and_resume(
    deadline_s: float, marks: dict[str, float]
) -> Callable[[subprocess.Popen[bytes], subprocess.Popen[bytes]], None]:
    """The fault: SIGSTOP to the GPU simulator at STALL_AT of the deadline after the job's start,
    SIGCONT once the deadline has passed (its wall-clock instants written to `marks`)."""

    def during(gpu: subprocess.Popen[bytes], job: subprocess.Popen[bytes]) -> None:
        began = time.time()
        while job.poll() is None and time.time() < began + STALL_AT * deadline_s:
            time.sleep(0.05)
        gpu.send_signal(signal.SIGSTOP)
        marks["stopped"] = time.time()
        while job.poll() is None and time.time() < began + deadline_s + 2.0:
            time.sleep(0.05)
        gpu.send_signal(signal.SIGCONT)
        marks["continued"] = time.time()

    return during


def fmt(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.1f} s"


def created(row: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(row["created_at"].replace("Z", "+00:00")).timestamp()


def main() -> int:
    args = arguments(__doc__.split("\n\n")[0], deadline_s=90.0, concurrency=192).parse_args()
    began = time.monotonic()
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    prompts, budget = sized(args)
    marks: dict[str, float] = {}
    result = one_run(
        "stalled",
        args,
        args.deadline_s,
        prompts,
        budget,
        out=OUT,
        during=stall_at_and_resume(args.deadline_s, marks),
    )
    run = OUT / "stalled" / "run"
    events = journal(run / "events.jsonl")
    start = next(e["ts"] for e in events if e["event"] == "start")
    deadline = next(e["at"] for e in events if e["event"] == "deadline")
    stopped = marks["stopped"]
    said = next((e for e in events if e["event"] == "stall" and e["ts"] >= stopped), None)
    turn = next((e for e in events if e["event"] == "deadline_unreachable" and e["ts"] >= stopped), None)
    taken = sum(e["prompts"] for e in events if e["event"] == "taken_back")

    rows = [
        orjson.loads(line)
        for folder in sorted((OUT / "stalled" / "datasets").iterdir())
        for line in (folder / "raw_responses.jsonl").read_bytes().splitlines()
    ]
    twice = sum(n - 1 for n in Counter((r["dataset"], r["line"]) for r in rows).values() if n > 1)
    total = sum(r["usage"]["completion_tokens"] for r in rows)
    before = sum(r["usage"]["completion_tokens"] for r in rows if created(r) <= stopped)
    by_deadline = sum(r["usage"]["completion_tokens"] for r in rows if stopped < created(r) <= deadline)
    ends = [r for r in journal(run / "attempts.jsonl") if r.get("k") == "end" and r["be"] == "openrouter"]
    spent_before = sum((Decimal(r["cost"]) for r in ends if r["ts"] <= stopped), Decimal(0))
    # The price the budget buys at: the lower of the plan's cheapest provider (its prompt share from
    # the settings' estimate before any row) and what OpenRouter's answers cost per output token.
    plan = next(e["plan"] for e in events if e["event"] == "fleet_plan")
    prices = [share["per_million"] / 1e6 for share in plan["shares"]]
    paid = [r for r in ends if r.get("ctok")]
    if paid:
        prices.append(float(sum(Decimal(r["cost"]) for r in paid)) / sum(r["ctok"] for r in paid))
    left = total - before
    money_left = float(Decimal(str(budget)) - spent_before)
    buyable = min(left, int(money_left / min(prices))) if prices else left
    share = by_deadline / buyable if buyable else float("nan")
    turn_s = None if turn is None else turn["ts"] - stopped
    said_s = None if said is None else said["ts"] - stopped

    lines = [
        "| stalled at | stall said after | verdict turned after | work left at the stall | budget buys then | made by the deadline | share | taken back | made twice | spent $ | billed $ | budget $ |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {stopped - start:.1f} s of {deadline - start:.0f} s | {fmt(said_s)} | {fmt(turn_s)} | {left:,} tok | "
        f"{buyable:,} tok | {by_deadline:,} tok | {share:.2f} | {taken} | {twice} | {result.spent:.4f} | "
        f"{result.billed:.4f} | {budget:.4f} |",
    ]
    turned = turn_s is not None and turn_s <= TURN_BAR_S
    enough = share >= SHARE_BAR
    exact = twice == 0 and result.spent == result.billed and result.spent <= Decimal(str(budget))
    verdict = (
        f"The verdict turned {fmt(turn_s)} after the stall (bar {TURN_BAR_S:.0f} s: {'holds' if turned else 'MISSED'}); "
        f"{share:.2f} of what the budget could buy was made by the deadline (bar {SHARE_BAR}: "
        f"{'holds' if enough else 'MISSED'}); made twice {twice}, spent what was billed, within the budget: "
        f"{'holds' if exact else 'BROKEN'}."
    )
    text = "\n".join([*lines, "", verdict])
    print(text)
    if args.write_md:
        header = (
            f"Run {time.strftime('%Y-%m-%d')} on revision {revision()}: `.venv/bin/python bench/fleet_stall.py --write-md` "
            f"({time.monotonic() - began:.0f} s).\n\nMachine: {machine()}.\n"
            f"bench/fleet_run.py's job ({prompts:,} prompts over {DATASETS} datasets, GPUs {args.gpu_tokens_per_s:,.0f} "
            f"tok/s nominal, budget ${budget:.4f}, {args.concurrency} in flight per lane at most, pacing every "
            f"{args.interval_s:g} s, smoothing {args.smoothing_s:g} s), the GPU simulator stopped (SIGSTOP) at "
            f"{STALL_AT:.0%} of the deadline and continued after it. 'Budget buys then': the budget left at the "
            "stall at the lowest price per output token seen (the plan's cheapest provider, or what OpenRouter's "
            "answers cost), at most the work left.\n\n"
        )
        write_md(header + text, MD_START, MD_END, heading="Both fleets, one deadline: the GPUs stall at 30%")
    return 0 if turned and enough and exact else 1


if __name__ == "__main__":
    sys.exit(main())
