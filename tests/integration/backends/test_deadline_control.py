"""The deadline control in a real job on both simulators (engine/job/deadline_control.py, docs/fleets.md).

OpenRouter's in-flight ceiling follows the GPUs: idle while they alone make the deadline, up when
they are slowed mid-run; a deadline that cannot be met is said before the start and as soon as it
becomes so; the deadline's instant survives a restart; the operator changes it live.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from regen.engine.config.settings import Settings, StatsSettings, SteeringSettings
from regen.engine.control.headless import run_headless
from regen.engine.job.job import Job, JobError, StopReason
from regen.engine.money.fleetplan import Work
from regen.sim.openrouter.server import OpenRouterSim
from regen.sim.sglang.server import SGLangSim
from regen.sim.sglang.tokens import SimTokenizer
from tests.support.datasets import one_row_per_prompt, write_dataset
from tests.support.journals import journal
from tests.support.openrouter_sim import fast_sim_config
from tests.support.sglang_sim import fast_config

# Answers of 20-40 tokens on both simulators: the plan's expected tokens per prompt is their mean.
TOKENS = {"output_len_min": 20, "output_len_max": 40}


def paced(settings: Settings, **tuning: Any) -> Settings:
    """Quick ticks and short smoothing, so a test sees in seconds what a night run does in minutes."""
    values: dict[str, Any] = {"interval_s": 0.25, "smoothing_s": 1.0, "request_tokens_per_s": 40.0, **tuning}
    return settings.model_copy(
        update={"steering": SteeringSettings(**values), "stats": StatsSettings(expected_output_tokens=30)}
    )


@pytest.fixture
async def gpus(fleet_tok: SimTokenizer) -> Any:
    """The SGLang simulator at about 3,000 tokens/s: 4 running, short decode steps."""
    sim = SGLangSim(
        fast_config(served_model_name="kimi-k2.5", max_running_requests=4, time_scale=0.05, **TOKENS),
        fleet_tok,
    )
    await sim.start()
    try:
        await sim.wait_ready(30)
        yield sim
    finally:
        await sim.stop()


@pytest.fixture
async def openrouter() -> Any:
    sim = OpenRouterSim(fast_sim_config(time_scale=0.3, min_completion_tokens=20, max_completion_tokens=40))
    await sim.start()
    try:
        yield sim
    finally:
        await sim.stop()


def ceiling(job: Job) -> int | None:
    return {lane["name"]: lane["ceiling"] for lane in job.snapshot()["lanes"]}["openrouter"]


async def test_openrouter_idles_while_the_gpus_make_the_deadline_and_rises_when_they_are_slowed(
    gpus: SGLangSim, openrouter: OpenRouterSim, fleet_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    # 700 prompts of ~30 tokens: 7 s of the GPUs' nominal pace against a 60 s deadline, so a busy
    # machine slowing them (the simulator shares the test's CPU) still leaves them alone on it; slowed
    # 40-fold they cannot make it.
    data = write_dataset(tmp_path, "A", 700)
    settings = paced(
        fleet_settings(gpus.base_url, openrouter.base_url, [data], deadline="60s", budget_usd=5.0),
        gpu_tokens_per_s=3000.0,
    )
    job = Job(settings)
    await job.prepare()
    # Before the start, from the settings' GPU rate: the GPUs alone make it, OpenRouter is idle.
    fleet = job.snapshot()["fleet"]
    assert fleet["steered"] and fleet["fits"] and fleet["plan"]["gpus_alone_meet"], fleet["reason"]
    assert ceiling(job) == 0
    runner = asyncio.create_task(job.run())
    paid = job.dispatcher.lane("openrouter")
    while job.dispatcher.lane("sglang").stats.counters.rows < 150 and not runner.done():
        await asyncio.sleep(0.02)
    steered = [e["reason"] for e in journal(job.run_dir / "events.jsonl") if e["event"] == "steer"]
    assert paid.stats.counters.attempts == 0, (
        f"nothing bought while the GPUs alone make the deadline: {steered}"
    )
    # The GPUs slow to a crawl (another tenant took them): the work left no longer fits on them.
    slowed_at = time.time()
    gpus.apply_config(gpus.config.model_copy(update={"time_scale": 2.0}))
    while not runner.done() and (ceiling(job) or 0) == 0:
        await asyncio.sleep(0.05)
    risen = ceiling(job)
    assert risen is not None and risen > 0, "OpenRouter's share rises when the GPUs fall behind"
    assert time.time() - slowed_at < 10, "the pacer noticed within a few ticks"
    outcome = await runner
    assert outcome.reason is StopReason.DONE, outcome.message
    rows = one_row_per_prompt(data, 700)
    made = Counter(row["backend"] for row in rows)
    assert made["openrouter"] > 0 and made["sglang"] > 0
    assert paid.ledger.budget is not None and paid.ledger.spent <= paid.ledger.budget
    # The plan's offers share the lane's flat-out rate as OpenRouter shared the requests.
    offers = job.deadline_control.offers(Work(30_000, 1_000, 20_000), 40.0)
    assert sum(p.tokens_per_s or 0.0 for p in offers) == pytest.approx(16 * 40.0)
    routes = paid.backend.routes
    assert routes is not None
    served = Counter({routes.route_id(name): stats.requests for name, stats in paid.stats.routes.items()})
    for offer in offers:
        share = served[routes.route_id(offer.price.route)] / sum(served.values())
        assert offer.tokens_per_s == pytest.approx(16 * 40.0 * share)
    steers = [e for e in journal(job.run_dir / "events.jsonl") if e["event"] == "steer"]
    assert steers[0]["ceiling"] == 0 and "GPUs alone make the deadline" in steers[0]["reason"]
    assert any(e["ceiling"] > 0 for e in steers[1:]), steers


async def test_a_deadline_that_cannot_be_met_is_said_before_the_start(
    gpus: SGLangSim, openrouter: OpenRouterSim, fleet_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    # 2,000 prompts of ~30 tokens in 5 s: the GPUs (1,000 tokens/s by the settings) make 5,000 of the
    # 60,000 tokens; OpenRouter's 16 in flight at 40 tokens/s each carry 3,200 more, and $0.0005
    # would buy few of them anyway.
    data = write_dataset(tmp_path, "A", 2000)
    settings = paced(
        fleet_settings(gpus.base_url, openrouter.base_url, [data], deadline="5s", budget_usd=0.0005),
        gpu_tokens_per_s=1000.0,
    )
    job = Job(settings)
    await job.prepare()
    said = [e for e in job.events_since(0)[1] if e["event"] == "deadline_unreachable"]
    assert said and "deadline cannot be met" in said[0]["detail"], said
    fleet = job.snapshot()["fleet"]
    assert not fleet["fits"] and not fleet["plan"]["reachable"] and not fleet["plan"]["affordable"]
    assert "the earliest deadline that fits is" in said[0]["reason"], "and what does fit"
    out = io.StringIO()
    runner = asyncio.create_task(run_headless(job, out=out, interval_s=0.2))
    await asyncio.sleep(0.5)
    job.stop(cancel=True)
    await runner
    first = out.getvalue().splitlines()[0]
    assert first.startswith("deadline ") and "cannot be met" in first, out.getvalue()


async def test_the_deadline_becomes_unreachable_mid_run_and_it_is_said_at_once(
    gpus: SGLangSim, openrouter: OpenRouterSim, fleet_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    # 1,500 prompts of ~30 tokens: 15 s of the GPUs' nominal pace against a 2 min deadline, so a
    # starved CPU (the suite's workers share two cores) slowing them sixfold still fits; slowed
    # 100-fold they cannot, and $0.002 buys little.
    data = write_dataset(tmp_path, "A", 1500)
    settings = paced(
        fleet_settings(gpus.base_url, openrouter.base_url, [data], deadline="2m", budget_usd=0.002),
        gpu_tokens_per_s=3000.0,
    )
    job = Job(settings)
    await job.prepare()
    assert job.snapshot()["fleet"]["fits"]
    runner = asyncio.create_task(job.run())
    try:
        while job.dispatcher.lane("sglang").stats.counters.rows < 100:
            await asyncio.sleep(0.02)
        assert not [e for e in job.events_since(0)[1] if e["event"] == "deadline_unreachable"]
        slowed_at = time.time()
        gpus.apply_config(gpus.config.model_copy(update={"time_scale": 5.0}))
        said: list[dict[str, Any]] = []
        while not said and time.time() - slowed_at < 30:
            said = [e for e in job.events_since(0)[1] if e["event"] == "deadline_unreachable"]
            await asyncio.sleep(0.05)
        assert said, "a deadline that no longer fits is said"
        assert said[0]["ts"] - slowed_at < 10, "within a few ticks of the GPUs slowing"
        assert "cannot be met" in job.snapshot()["fleet"]["reason"]
    finally:
        job.stop(cancel=True)
        await runner


async def test_the_deadline_is_kept_across_restarts_and_changed_live(
    gpus: SGLangSim, openrouter: OpenRouterSim, fleet_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    data = write_dataset(tmp_path, "A", 6)

    async def session(deadline: str | None, then: Callable[[Job], Any] | None = None) -> Job:
        job = Job(paced(fleet_settings(gpus.base_url, openrouter.base_url, [data], deadline=deadline)))
        await job.prepare()
        if then is not None:
            then(job)
        job.stop()
        await job.run()
        return job

    before = time.time()
    first = await session("2h")
    at = first.deadline_control.deadline_ts
    # 2h from the moment the job resolved it: between the session's first and last instant, however
    # long its start took on a busy machine.
    assert at is not None and before + 7200 <= at <= time.time() + 7200
    await asyncio.sleep(1.1)
    again = await session("2h")
    assert again.deadline_control.deadline_ts == at, "a restart keeps the instant: 2h from the first start"
    changed = await session("3h")
    assert changed.deadline_control.deadline_ts == pytest.approx(at + 3600, abs=1), (
        "a new setting counts from the first start too"
    )

    typed = time.time()
    operator = await session("3h", lambda job: job.deadline_control.set_deadline("30m", "console"))
    moved = operator.deadline_control.deadline_ts
    assert moved is not None and typed + 1800 <= moved <= time.time() + 1800, (
        "typed live, a duration counts from now"
    )
    kept = await session("3h")
    assert kept.deadline_control.deadline_ts == moved, (
        "the operator's deadline outlives a restart with the same settings"
    )
    cleared = await session("3h", lambda job: job.deadline_control.set_deadline(None, "console"))
    assert cleared.deadline_control.deadline_ts is None and "fleet" in cleared.snapshot()
    assert (await session("3h")).deadline_control.deadline_ts is None, "cleared stays cleared"
    dropped = await session(None)
    assert dropped.deadline_control.deadline_ts is None
    sources = [
        (e["text"], e["source"])
        for e in journal(data.parent / "run" / "events.jsonl")
        if e["event"] == "deadline"
    ]
    assert sources == [
        ("2h", "settings"),
        ("3h", "settings"),
        ("30m", "console"),
        (None, "console"),
        (None, "settings"),
    ]


async def test_the_deadline_command_answers_and_refuses_bad_text(
    gpus: SGLangSim, openrouter: OpenRouterSim, fleet_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    data = write_dataset(tmp_path, "A", 4)
    job = Job(paced(fleet_settings(gpus.base_url, openrouter.base_url, [data])))
    await job.prepare()
    try:
        assert job.snapshot()["fleet"]["deadline"] is None, "two lanes show the fleet view without a deadline"
        reply = await job.handle_command("deadline", {"value": "45m"})
        assert reply.startswith("deadline ") and "from now" in reply, reply
        assert job.snapshot()["fleet"]["deadline"] == "45m"
        with pytest.raises(JobError, match=r"job.deadline = '1.5h': not a time of day or a duration"):
            await job.handle_command("deadline", {"value": "1.5h"})
        assert job.snapshot()["fleet"]["deadline"] == "45m", "a refused deadline changes nothing"
        assert (await job.handle_command("deadline", {"value": "none"})).startswith("deadline cleared")
    finally:
        job.stop()
        await job.run()


async def test_a_job_without_a_gpu_lane_plans_no_gpus_whatever_the_gpu_rate_setting(
    openrouter: OpenRouterSim, fleet_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    data = write_dataset(tmp_path, "A", 300)
    settings = paced(
        fleet_settings(
            "http://127.0.0.1:9", openrouter.base_url, [data], backends=["openrouter"], deadline="90s"
        ),
        gpu_tokens_per_s=3000.0,
    )
    job = Job(settings)
    await job.prepare()
    try:
        plan = job.snapshot()["fleet"]["plan"]
        assert plan["gpu_tokens_per_s"] == 0 and plan["gpu_tokens"] == 0 and not plan["gpus_alone_meet"]
        assert plan["openrouter_tokens"] == plan["output_tokens"] > 0
        assert "OpenRouter must carry" in plan["reason"] and "GPUs alone" not in plan["reason"], plan[
            "reason"
        ]
    finally:
        job.stop()
        await job.run()


async def test_the_plan_before_any_row_expects_no_answer_longer_than_max_tokens(
    openrouter: OpenRouterSim, fleet_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    # stats.expected_output_tokens left at its 2,000 while every request asks for 64 at most: the plan
    # said before the start counted 30 times the work there can be, called the deadline unreachable and
    # sent OpenRouter flat out until the first rows corrected it (found by tests/integration/test_journey.py).
    data = write_dataset(tmp_path, "A", 300)
    settings = fleet_settings(
        "http://127.0.0.1:9", openrouter.base_url, [data], backends=["openrouter"], deadline="90s"
    )
    assert settings.openrouter.max_tokens == 64 and settings.stats.expected_output_tokens == 2000
    job = Job(settings)
    await job.prepare()
    try:
        assert job.snapshot()["fleet"]["plan"]["output_tokens"] == 300 * 64
    finally:
        job.stop()
        await job.run()


async def test_work_is_not_held_in_the_gpus_queue_past_the_deadline_while_openrouter_could_take_it(
    fleet_tok: SimTokenizer,
    openrouter: OpenRouterSim,
    fleet_settings: Callable[..., Settings],
    tmp_path: Path,
) -> None:
    # The operator's night in small (docs/fleets.md, "The GPU lane's queue"): GPUs that run two
    # at once (about 0.4 s an answer) and 64 in flight allowed on each lane. Were the GPUs' lane
    # to keep 64 in flight, 62 would wait in their queue to the end (some 12 s of work there)
    # while OpenRouter had nothing left to take, and the deadline would be missed.
    config = fast_config(served_model_name="kimi-k2.5", max_running_requests=2, time_scale=0.5, **TOKENS)
    gpu_sim = SGLangSim(config, fleet_tok)
    await gpu_sim.start()
    try:
        await gpu_sim.wait_ready(30)
        data = write_dataset(tmp_path, "A", 200)
        settings = paced(
            fleet_settings(
                gpu_sim.base_url, openrouter.base_url, [data], deadline="20s", budget_usd=5.0, concurrency=64
            ),
            gpu_tokens_per_s=160.0,
            margin=0.1,
        )
        job = Job(settings)
        await job.prepare()
        gpus = job.dispatcher.lane("sglang")
        runner = asyncio.create_task(job.run())
        lanes = job.dispatcher.lanes
        peak = 0
        last_answer = time.time()  # when the last attempt in flight on either fleet ended
        while not runner.done():
            peak = max(peak, gpus.in_flight)
            if any(lane.in_flight for lane in lanes):
                last_answer = time.time()
            await asyncio.sleep(0.01)
        outcome = await runner
    finally:
        await gpu_sim.stop()
    assert outcome.reason is StopReason.DONE, outcome.message
    deadline = job.deadline_control.deadline_ts
    assert deadline is not None
    # The answers are what the deadline is for; the job's own close after them is not paced.
    assert last_answer <= deadline, f"the last answer came {last_answer - deadline:.1f} s after the deadline"
    assert peak <= 3, f"{peak} in flight on GPUs that run 2 at once"
    made = Counter(row["backend"] for row in one_row_per_prompt(data, 200))
    assert made["openrouter"] > 0 and made["sglang"] > 0
