"""The job against OpenRouter's account-wide limits: platform 429s, request pacing, the in-flight hold."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from regen.engine.backends.openrouter.backend import FREE_MODEL_REQUESTS_PER_MINUTE
from regen.engine.config.settings import Settings
from regen.engine.control.headless import status_line
from regen.engine.job.job import Job, StopReason
from regen.sim.openrouter.server import OpenRouterSim
from tests.support.datasets import read_rows, write_dataset
from tests.support.metrics_page import page_of


def events(job: Job) -> list[dict]:
    return [orjson.loads(x) for x in (job.run_dir / "events.jsonl").read_bytes().splitlines()]


async def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_requests_per_minute_caps_dispatch(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    a = write_dataset(tmp_path, "A", 12)
    job = Job(make_settings(sim.base_url, [a], requests_per_minute=5))
    await job.prepare()
    runner = asyncio.create_task(job.run())
    await wait_for(lambda: job.lanes[0].stats.counters.rows >= 5)
    await asyncio.sleep(0.5)
    assert sim.total_requests == 5, "the sixth request waits for the minute to pass"
    assert job.lanes[0].stats.counters.rows == 5
    job.stop(cancel=True)
    await runner
    assert len(read_rows(a)) == 5


async def test_a_free_model_is_held_to_its_platform_limit(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    a = write_dataset(tmp_path, "A", 3)
    free = make_settings(sim.base_url, [a], openrouter={"model": "moonshotai/kimi-k2.5:free"})
    assert Job(free).lanes[0].requests_per_minute == FREE_MODEL_REQUESTS_PER_MINUTE
    capped = make_settings(
        sim.base_url, [a], requests_per_minute=500, openrouter={"model": "moonshotai/kimi-k2.5:free"}
    )
    assert Job(capped).lanes[0].requests_per_minute == FREE_MODEL_REQUESTS_PER_MINUTE
    assert Job(make_settings(sim.base_url, [a], requests_per_minute=7)).lanes[0].requests_per_minute == 7
    assert Job(make_settings(sim.base_url, [a])).lanes[0].requests_per_minute is None
    job = Job(free)
    await job.prepare()
    outcome = await job.run()
    assert outcome.reason is StopReason.DONE
    assert len(read_rows(a)) == 3 and all(r["cost"] == 0 for r in read_rows(a))


async def test_a_platform_rate_limit_holds_all_dispatch_until_its_reset(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.retry_after_s = 2  # X-RateLimit-Reset two seconds ahead
    sim.config.faults = {"http_429_ratelimit_reset": 1.0}
    a = write_dataset(tmp_path, "A", 10)
    job = Job(make_settings(sim.base_url, [a], concurrency=4, max_attempts=20))
    await job.prepare()
    runner = asyncio.create_task(job.run())
    await wait_for(lambda: job.lanes[0].held_until > 0)
    snap = job.snapshot()
    assert snap["lanes"][0]["held_s"] is not None and 0 < snap["lanes"][0]["held_s"] <= 2.0
    held_reason = snap["lanes"][0]["held_reason"]
    assert held_reason is not None and "rate limit" in held_reason.lower()
    assert "(held 00:00:0" in status_line(snap)
    page = page_of(job)  # /metrics says the same
    assert 0 < page.total("regen_held_seconds", backend="openrouter") <= 2.0
    assert page.values("regen_lane_state", backend="openrouter", state="held") == [1.0]
    await asyncio.sleep(0.1)  # requests already sent when the first 429 came back land
    sent = sim.total_requests
    sim.config.faults = {}
    await asyncio.sleep(0.5)
    assert sim.total_requests == sent, "nothing is sent while the limit holds"
    outcome = await asyncio.wait_for(runner, 10)
    assert outcome.reason is StopReason.DONE and len(read_rows(a)) == 10
    names = [e["event"] for e in events(job)]
    assert "hold" in names and "hold_end" in names
    assert names.count("hold") <= 2, "the 429s of one burst make one hold, not one each"
    assert page_of(job).values("regen_holds_total", backend="openrouter") == [names.count("hold")]
    assert job.snapshot()["lanes"][0]["held_s"] is None


async def test_a_request_too_costly_for_the_in_flight_budget_gives_up_then_stops_with_a_hint(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.in_flight_budget = True
    sim.config.in_flight_budget_ceiling = 1e-7  # below any single request's worst case
    a = write_dataset(tmp_path, "A", 30)
    job = Job(make_settings(sim.base_url, [a]))
    await job.prepare()
    outcome = await job.run()
    assert outcome.reason is StopReason.FATAL
    assert "lower openrouter.max_tokens (64) or add credits" in outcome.message
    assert job.lanes[0].stats.counters.errors["too_costly"] >= 20
    assert read_rows(a) == []
    journal = [orjson.loads(x) for x in (job.run_dir / "attempts.jsonl").read_bytes().splitlines()]
    gave_up = [r for r in journal if r["k"] == "gave_up"]
    assert gave_up and all(r["attempts"] == 1 for r in gave_up), "no retry: waiting cannot make it fit"


async def test_in_flight_budget_402s_slow_the_job_down_and_lose_nothing(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.time_scale = 0.01  # requests last long enough for holds to pile up
    sim.config.in_flight_budget = True
    sim.config.in_flight_settlement_s = 0.05
    sim.config.in_flight_budget_ceiling = 0.002  # room for a handful of requests' worst cases
    a = write_dataset(tmp_path, "A", 60)
    job = Job(make_settings(sim.base_url, [a], concurrency=64, max_attempts=50))
    await job.prepare()
    outcome = await asyncio.wait_for(job.run(), 60)
    assert outcome.reason is StopReason.DONE
    assert len(read_rows(a)) == 60
    assert job.lanes[0].stats.counters.errors["in_flight_budget"] > 0, "the hold was reached"
    assert job.lanes[0].limit.backoffs > 0, "a storm of in-flight 402s lowers the concurrency"
    assert job.lanes[0].ledger.spent == sim.billing.billed_total
