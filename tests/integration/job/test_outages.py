"""An outage is a hold, not a failure: the backend gone for a while costs nothing and ends nothing.

Staged for real over loopback: the simulator's HTTP server stopped and started again on the same
port, and a fault proxy that refuses connections (tests/support/faultproxy.py).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import orjson

from regen.engine.config.settings import Settings
from regen.engine.control.headless import status_line
from regen.engine.job.job import Job, StopReason
from regen.engine.run.recovery import read_journals
from regen.sim.openrouter.server import OpenRouterSim
from tests.support.datasets import read_rows, write_dataset
from tests.support.faultproxy import FaultProxy
from tests.support.journals import journal
from tests.support.metrics_page import page_of
from tests.support.openrouter_sim import fast_sim_config


async def wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_the_simulator_stopped_and_started_again_holds_then_finishes(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim = OpenRouterSim(fast_sim_config(time_scale=0.02, generation_lookup_delay_s=0.05))
    await sim.start()
    port = sim.port
    try:
        a = write_dataset(tmp_path, "A", 150)
        # Two attempts a prompt: if the outage's failures counted, most prompts would give up.
        settings = make_settings(sim.base_url, [a], concurrency=16, max_attempts=2)
        job = Job(settings)
        await job.prepare()
        runner = asyncio.create_task(job.run())
        await wait_for(lambda: job.lanes[0].stats.counters.rows >= 20)
        await sim.stop()
        await wait_for(lambda: job.lanes[0].outage is not None)
        snap = job.snapshot()
        assert snap["lanes"][0]["outage_s"] is not None and "OpenRouter unreachable" in str(
            snap["lanes"][0]["held_reason"]
        )
        assert "HELD: OpenRouter unreachable" in status_line(snap)
        # What was launched before the hold began lands (refused) first; each of those journaled
        # its start before it left, so from here on the journal counts every launch.
        await wait_for(lambda: job.in_flight <= 1)
        starts_during = sum(1 for r in journal(settings.job.run_dir / "attempts.jsonl") if r["k"] == "start")
        await asyncio.sleep(3.0)
        probes = job.lanes[0].outage.probes if job.lanes[0].outage else 0
        starts_after = sum(1 for r in journal(settings.job.run_dir / "attempts.jsonl") if r["k"] == "start")
        assert 1 <= probes <= 3, "one probe at a time, backed off (1 s, 2 s, ...)"
        assert starts_after - starts_during <= probes, "nothing but probes was sent while held"
        await sim.start(port=port)
        outcome = await asyncio.wait_for(runner, 120)
    finally:
        await sim.stop()
    assert outcome.reason is StopReason.DONE, outcome.message
    rows = read_rows(a)
    assert len(rows) == 150 and max(Counter(r["line"] for r in rows).values()) == 1
    records = journal(settings.job.run_dir / "attempts.jsonl")
    assert not [r for r in records if r["k"] == "gave_up"], "the outage cost no prompt an attempt"
    refused = [r for r in records if r["k"] == "end" and r.get("sent") is False]
    assert refused and all(r["cost"] == "0" and r["est"] is False for r in refused), "refused costs nothing"
    events = journal(settings.job.run_dir / "events.jsonl")
    began = [e for e in events if e["event"] == "outage"]
    ended = [e for e in events if e["event"] == "outage_end"]
    assert len(began) == 1 and len(ended) == 1 and ended[0]["seconds"] >= 3.0
    assert job.snapshot()["lanes"][0]["outage_total_s"] >= 3.0
    page = page_of(job)  # /metrics counts the outage and its seconds
    assert page.values("regen_outages_total", backend="openrouter") == [1.0]
    assert page.values("regen_outage_seconds_total", backend="openrouter") == [job.lanes[0].outage_total_s]
    # Spend: what the simulator billed, exactly; only attempts cut without any generation id may
    # stay at their worst case, flagged, and they are never below what they cost.
    unknowable = job.lanes[0].ledger.estimates.unknowable
    assert job.lanes[0].ledger.spent - unknowable <= sim.billing.billed_total <= job.lanes[0].ledger.spent
    assert job.lanes[0].ledger.estimates.pending == 0


async def test_connections_refused_cost_nothing_and_resume_at_full_concurrency(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    proxy = FaultProxy("127.0.0.1", sim.port)
    await proxy.start()
    try:
        sim.config.time_scale = 0.02
        a = write_dataset(tmp_path, "A", 200)
        job = Job(make_settings(proxy.base_url, [a], concurrency=32, max_attempts=2))
        await job.prepare()
        runner = asyncio.create_task(job.run())
        await wait_for(lambda: job.lanes[0].stats.counters.rows >= 10)
        proxy.refuse = True  # the far side is up, every new connection is refused
        await proxy.stop()
        await wait_for(lambda: job.lanes[0].outage is not None)
        await asyncio.sleep(1.5)
        proxy.refuse = False
        await proxy.restart()
        await wait_for(lambda: job.lanes[0].outage is None)
        await wait_for(lambda: job.in_flight >= 30, 20)  # straight back to the configured concurrency
        outcome = await asyncio.wait_for(runner, 120)
    finally:
        await proxy.stop()
    assert outcome.reason is StopReason.DONE
    assert len(read_rows(a)) == 200
    unknowable = job.lanes[0].ledger.estimates.unknowable
    assert job.lanes[0].ledger.spent - unknowable <= sim.billing.billed_total <= job.lanes[0].ledger.spent


async def test_an_older_journal_that_charged_refused_connections_is_repaired(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    """A regen before this change charged a refused connection its worst case; the next start
    settles it at zero, once, so a job stuck at its budget can resume without touching it."""
    a = write_dataset(tmp_path, "A", 5)
    settings = make_settings(sim.base_url, [a], budget_usd=1.0)
    run_dir = settings.job.run_dir
    run_dir.mkdir(parents=True)
    old = []
    for n in range(40):
        rid = f"A-{n % 5:08d}#{n // 5}"
        old.append({"k": "start", "rid": rid, "ds": "A", "line": n % 5, "reserved": "0.025", "ts": 1.0})
        old.append(
            {
                "k": "end",
                "rid": rid,
                "ds": "A",
                "line": n % 5,
                "gen": None,
                "provider": None,
                "model": None,
                "outcome": "network",
                "http": None,
                "cost": "0.025",
                "est": True,
                "ptok": None,
                "ctok": None,
                "e2e": 0.001,
                "ttft": None,
                "ts": 1.0,
                "msg": "ClientConnectorError: Cannot connect to host 127.0.0.1:9 ssl:default [Connect call failed ('127.0.0.1', 9)]",
            }
        )
    (run_dir / "attempts.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in old))
    before = read_journals(run_dir / "attempts.jsonl", run_dir / "events.jsonl")
    assert before.spent == Decimal("1.000"), "as the old job left it: the whole budget, phantom"
    job = Job(settings)
    await job.prepare()
    assert job.lanes[0].ledger.spent == 0 and job.lanes[0].ledger.estimated == 0
    outcome = await job.run()
    assert outcome.reason is StopReason.DONE and len(read_rows(a)) == 5
    after = read_journals(run_dir / "attempts.jsonl", run_dir / "events.jsonl")
    assert after.spent == sim.billing.billed_total and after.never_sent == [], "repaired once, for good"
    again = Job(settings)
    await again.prepare()
    assert again.lanes[0].ledger.spent == sim.billing.billed_total
    await again.run()
