"""What an outage costs: the same run with and without the API's port taken away for a while.

    python bench/outage.py                                  # issue 18's run: 3 x 200 prompts, 75 s outage
    python bench/outage.py --prompts 60 --outage-s 20       # smaller

Both runs: the OpenRouter simulator behind the fault proxy (tests/support/faultproxy.py), streaming,
concurrency 64, `max_tokens` 10000, answers of 2000-9000 tokens (a few seconds each at the
simulator's time scale). The outage run has the proxy stop listening `--cut-at-s` into the run
(every stream in flight cut, every new connection refused) and listen again on the same port
`--outage-s` later.

Goals (issue 18, BENCHMARKS.md "Outage"): the outage's cost in wall time at most the outage + 5 s,
and in dollars nothing: at the end spent == what the simulator billed, in both runs. It also says
how long the hold outlived the port's return and how soon after the hold the job was back at its
full concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from regen.engine.config.settings import JobSettings, OpenRouterSettings, Settings
from regen.engine.job.job import Job, StopReason
from regen.sim.openrouter.config import SimConfig
from regen.sim.openrouter.server import OpenRouterSim
from tests.support.datasets import write_dataset
from tests.support.faultproxy import FaultProxy

OUT = Path(__file__).resolve().parent / "out" / "outage"
KEY = "sk-bench"
CONCURRENCY = 64


@dataclass
class Run:
    wall_s: float
    spent: Decimal
    billed: Decimal
    pending: int
    cut: int = 0
    late_s: float | None = None  # the hold's end after the port came back
    full_s: float | None = None  # full concurrency after the hold's end


async def wait_for(condition: object, timeout: float = 600.0) -> float:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError
        await asyncio.sleep(0.01)
    return time.monotonic()


async def one_run(args: argparse.Namespace, outage: bool) -> Run:
    folder = OUT / ("outage" if outage else "clean")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    datasets = [write_dataset(folder, f"D{n}", args.prompts) for n in range(args.datasets)]
    sim = OpenRouterSim(
        SimConfig(
            api_keys=[KEY],
            time_scale=args.time_scale,
            min_completion_tokens=2000,
            max_completion_tokens=9000,
            chunk_interval_s=0.05,
            generation_lookup_delay_s=2.0,
            seed=7,
        )
    )
    await sim.start()
    proxy = FaultProxy("127.0.0.1", sim.port)
    await proxy.start()
    settings = Settings(
        openrouter=OpenRouterSettings(
            base_url=proxy.base_url, api_key=KEY, max_tokens=10000, stream=True, usage_settle_s=1.0
        ),
        job=JobSettings(
            datasets=datasets, run_dir=folder / "run", concurrency=CONCURRENCY, budget_usd=args.budget
        ),
    )
    job = Job(settings)
    await job.prepare()
    lane = job.lanes[0]
    began = time.monotonic()
    runner = asyncio.create_task(job.run())
    result = Run(0.0, Decimal(0), Decimal(0), 0)
    try:
        if outage:
            await asyncio.sleep(args.cut_at_s)
            result.cut = job.in_flight
            proxy.refuse = True
            await proxy.stop()
            await asyncio.sleep(args.outage_s)
            proxy.refuse = False
            await proxy.restart()
            back = time.monotonic()
            ended = await wait_for(lambda: lane.outage is None)
            full = await wait_for(lambda: job.in_flight >= CONCURRENCY or runner.done())
            result.late_s, result.full_s = ended - back, full - ended
        outcome = await runner
        assert outcome.reason is StopReason.DONE, outcome.message
    finally:
        await proxy.stop()
        await sim.stop()
    result.wall_s = time.monotonic() - began
    result.spent, result.billed = lane.ledger.spent, sim.billing.billed_total
    result.pending = lane.ledger.estimates.pending_count
    return result


def _quiet_cancels(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
    """The fault proxy's connections cancelled by its stop are no news; anything else is said."""
    if not isinstance(context.get("exception"), asyncio.CancelledError):
        loop.default_exception_handler(context)


async def main(args: argparse.Namespace) -> int:
    asyncio.get_running_loop().set_exception_handler(_quiet_cancels)
    clean = await one_run(args, outage=False)
    out = await one_run(args, outage=True)
    cost = out.wall_s - clean.wall_s
    print(
        f"{args.datasets} x {args.prompts} prompts, concurrency {CONCURRENCY}, max_tokens 10000, "
        f"time scale {args.time_scale}, outage {args.outage_s:.0f} s at {args.cut_at_s:.0f} s"
    )
    for name, run in (("without outage", clean), ("with outage", out)):
        print(
            f"  {name:<15} wall {run.wall_s:6.1f} s  spent ${run.spent:.6f}  billed ${run.billed:.6f}  "
            f"pending bills {run.pending}"
        )
    assert out.late_s is not None and out.full_s is not None
    print(
        f"  {out.cut} streams cut; hold ended {out.late_s:.2f} s after the port came back; "
        f"full concurrency {out.full_s:.2f} s after that"
    )
    wall_ok = cost <= args.outage_s + 5.0
    money_ok = clean.spent == clean.billed and out.spent == out.billed
    print(
        f"  outage cost in wall time {cost:.1f} s (goal <= {args.outage_s + 5.0:.0f} s): {'met' if wall_ok else 'MISSED'}"
    )
    print(f"  outage cost in dollars: spent == billed in both runs: {'met' if money_ok else 'MISSED'}")
    return 0 if wall_ok and money_ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--datasets", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=200, help="prompts per dataset")
    parser.add_argument("--outage-s", type=float, default=75.0)
    parser.add_argument("--cut-at-s", type=float, default=5.0)
    parser.add_argument(
        "--time-scale", type=float, default=0.05, help="the simulator's: 0.05 is 20x real speed"
    )
    parser.add_argument("--budget", type=float, default=100.0)
    sys.exit(asyncio.run(main(parser.parse_args())))
