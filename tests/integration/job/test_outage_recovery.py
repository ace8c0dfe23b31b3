"""After an outage: back at full speed at once, and no phantom money left behind (docs/faults.md,
outages; docs/money.md).

Staged for real over loopback: long generations (`max_tokens` 10000) through a fault proxy
(tests/support/faultproxy.py) in front of the OpenRouter simulator; the proxy stops listening,
which cuts every stream in flight (64 of them) and refuses every new connection, then listens again
on the same port. The outage lasts longer than a bill's lookup may take (`reconcile_timeout_s`), so
lookups that counted the outage against themselves would give up and leave the cut streams' worst
cases counted as spent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

from regen.engine.backends.openrouter.report import build_catalog
from regen.engine.config.settings import Settings
from regen.engine.control.headless import status_line
from regen.engine.job.job import Job, StopReason
from regen.sim.openrouter.server import OpenRouterSim
from tests.support.datasets import read_rows, write_dataset
from tests.support.faultproxy import FaultProxy
from tests.support.journals import journal
from tests.support.openrouter_sim import fast_sim_config

CONCURRENCY = 64
OUTAGE_S = 5.0
PROBE_S = 1.0  # job.outage_probe_s
LOOKUP_S = 2.0  # job.reconcile_timeout_s: shorter than the outage


async def wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> float:
    """Wait until `condition` holds; returns the monotonic time it was seen to."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)
    return time.monotonic()


def long_generations() -> OpenRouterSim:
    # 3000-9000 tokens an answer at a simulated 3000 tokens a second: each stream runs 1-3 s.
    return OpenRouterSim(
        fast_sim_config(
            time_scale=0.02,
            min_completion_tokens=3000,
            max_completion_tokens=9000,
            chunk_interval_s=0.05,
            keepalive_interval_s=0.2,
            generation_lookup_delay_s=0.2,
        )
    )


async def outage_and_return(
    tmp_path: Path, make_settings: Callable[..., Settings], *, stream: bool
) -> tuple[Job, OpenRouterSim, Path, float]:
    """A run cut by a 5 s outage once its 64 streams are going; returns the job, the simulator,
    the dataset and how long the hold outlived the port's return."""
    sim = long_generations()
    await sim.start()
    proxy = FaultProxy("127.0.0.1", sim.port)
    await proxy.start()
    try:
        a = write_dataset(tmp_path, "A", 200)
        settings = make_settings(
            proxy.base_url,
            [a],
            concurrency=CONCURRENCY,
            max_attempts=3,
            reconcile_timeout_s=LOOKUP_S,
            outage_probe_s=PROBE_S,
            openrouter={"stream": stream, "usage_settle_s": 0.5, "usage_settle_max_s": 20.0},
        )
        settings.openrouter = settings.openrouter.model_copy(update={"max_tokens": 10000})
        job = Job(settings)
        await job.prepare()
        runner = asyncio.create_task(job.run())
        lane = job.lanes[0]
        await wait_for(lambda: lane.stats.counters.rows >= 10 and job.in_flight >= CONCURRENCY)
        await asyncio.sleep(0.3)  # the streams' headers (their generation ids) are in
        proxy.refuse = True
        await proxy.stop()  # every connection cut, every new one refused
        await wait_for(lambda: lane.outage is not None)
        await asyncio.sleep(OUTAGE_S)
        proxy.refuse = False
        await proxy.restart()
        back = time.monotonic()
        ended = await wait_for(lambda: lane.outage is None, 30)
        full = await wait_for(lambda: job.in_flight >= CONCURRENCY, 10)
        assert full - ended <= 2.0, f"full concurrency {full - ended:.2f} s after the hold ended"
        outcome = await asyncio.wait_for(runner, 180)
        assert outcome.reason is StopReason.DONE, outcome.message
        return job, sim, a, ended - back
    finally:
        await proxy.stop()
        await sim.stop()


async def test_streams_cut_by_an_outage_end_billed_exactly_and_the_hold_ends_at_the_return(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    job, sim, a, late = await outage_and_return(tmp_path, make_settings, stream=True)
    assert late <= 2.0 + PROBE_S, f"the hold outlived the port's return by {late:.1f} s"
    assert len(read_rows(a)) == 200
    records = journal(job.settings.job.run_dir / "attempts.jsonl")
    cut = [r for r in records if r["k"] == "end" and r["gen"] and r["outcome"] == "network" and r["est"]]
    # Most of the 64 are mid-stream when the port goes (a busy machine may have a few between
    # requests); each cut one carries its generation id, whose bill the end must look up.
    assert len(cut) >= CONCURRENCY // 2, f"{len(cut)} streams cut with their generation id"
    ledger = job.lanes[0].ledger
    assert ledger.estimates.pending == 0 and ledger.estimates.pending_count == 0, "every bill looked up"
    assert ledger.spent == sim.billing.billed_total, "spent is what the simulator billed, exactly"
    events = journal(job.settings.job.run_dir / "events.jsonl")
    [ended] = [e for e in events if e["event"] == "outage_end"]
    assert ended["checks"] >= 1


async def test_non_streamed_requests_cut_by_an_outage_end_billed_exactly_and_the_hold_ends_at_the_return(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    """A non-stream answer says nothing until it is done, so its headers cannot end the hold
    early: the free probe's answer does. The requests cut have no generation id: the key's usage
    bounds them at the end (docs/money.md), once the simulator has billed them in full."""
    job, sim, a, late = await outage_and_return(tmp_path, make_settings, stream=False)
    assert late <= 2.0 + PROBE_S, f"the hold outlived the port's return by {late:.1f} s"
    assert len(read_rows(a)) == 200
    ledger = job.lanes[0].ledger
    assert ledger.estimates.pending == 0
    assert ledger.spent == sim.billing.billed_total, "spent is what the simulator billed, exactly"
    assert ledger.spent > Decimal(0)


async def test_the_end_of_a_drained_run_waits_for_its_bills_and_says_so(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    """Answers without their cost, whose bills /generation names only after 1.5 s: the run's end
    waits for them (`settling N bills` on the status line), then spent is what was billed."""
    sim = OpenRouterSim(fast_sim_config(usage_shape="B", generation_lookup_delay_s=1.5))
    await sim.start()
    try:
        a = write_dataset(tmp_path, "A", 6)
        job = Job(make_settings(sim.base_url, [a], reconcile_timeout_s=10.0))
        await job.prepare()
        runner = asyncio.create_task(job.run())
        lines: list[str] = []
        while not runner.done():
            lines.append(status_line(job.snapshot()))
            await asyncio.sleep(0.05)
        assert (await runner).reason is StopReason.DONE
    finally:
        await sim.stop()
    settling = [line for line in lines if "(settling " in line]
    assert settling and "pending for" in settling[0], lines[-3:]
    ledger = job.lanes[0].ledger
    assert ledger.estimates.pending_count == 0 and ledger.spent == sim.billing.billed_total


async def test_regen_catalog_plans_with_the_bills_a_run_left_pending_looked_up(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    """A run that could not look up its bills (they came after its lookups gave up) leaves them
    estimated in the journal; `regen catalog` looks them up and plans with what was billed."""
    sim = OpenRouterSim(fast_sim_config(usage_shape="C", generation_lookup_delay_s=0.5))
    await sim.start()
    try:
        a = write_dataset(tmp_path, "A", 6)
        settings = make_settings(sim.base_url, [a], reconcile_timeout_s=0.0, budget_usd=10.0)
        job = Job(settings)
        await job.prepare()
        assert (await job.run()).reason is StopReason.DONE
        left = job.lanes[0].ledger.estimates
        assert left.pending_count > 0 and job.lanes[0].ledger.spent > sim.billing.billed_total
        await asyncio.sleep(0.6)  # the bills are there now
        report = await build_catalog(settings)
    finally:
        await sim.stop()
    assert Decimal(str(report["spent"])) == sim.billing.billed_total
    assert report["plan"]["budget_left"] == float(Decimal(10) - sim.billing.billed_total)
