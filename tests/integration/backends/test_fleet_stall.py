"""A GPU fleet that stalls under a deadline (docs/fleets.md, "A stalled fleet" and "Work taken back").

The SGLang simulator runs in a process of its own and is stopped with SIGSTOP, the most real fault
there is: the kernel still accepts its connections, nothing answers, its /metrics and /health hang.
In each phase of the job (before any GPU row, mid-run, near the deadline) the stall is said, the
verdict turns in the same tick (its words against the figures beside it), what the GPUs held is
taken back and made by OpenRouter exactly once, and OpenRouter's spend is what it billed. A server
continued after the take-back answers late: those answers are waste, never a second row.
"""

from __future__ import annotations

import asyncio
import io
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from regen.engine.config.settings import Settings, StatsSettings, SteeringSettings
from regen.engine.control.headless import run_headless
from regen.engine.job.job import Job, StopReason
from regen.engine.job.lanes import Lane
from regen.engine.job.stall import STALL_FACTOR
from regen.sim.openrouter.server import OpenRouterSim
from regen.sim.sglang.tokens import SimTokenizer
from tests.support.datasets import one_row_per_prompt, write_dataset
from tests.support.journals import journal
from tests.support.openrouter_sim import fast_sim_config
from tests.support.sglang_sim import SimProcess, fast_config, running_sim, sim_process

# The bar's steering, scaled: ticks every second, the rates smoothed over a minute (the default),
# so a stalled fleet's rate is not forgotten by averaging: only its silence can say it.
INTERVAL_S = 1.0
PROMPTS = 360  # about 10.8k tokens: the GPUs (about 330 tokens/s here) make 90% of it in 30 s
TOKENS = {"output_len_min": 20, "output_len_max": 40}


def steered(settings: Settings, smoothing_s: float = 60.0, request_tokens_per_s: float = 40.0) -> Settings:
    tuning = SteeringSettings(
        interval_s=INTERVAL_S,
        request_tokens_per_s=request_tokens_per_s,
        gpu_tokens_per_s=400.0,
        smoothing_s=smoothing_s,
    )
    return settings.model_copy(update={"steering": tuning, "stats": StatsSettings(expected_output_tokens=30)})


@pytest.fixture
def gpus(tmp_path: Path, sglang_model: Path) -> Iterator[SimProcess]:
    """About 400 tokens/s: 4 running, 20-40 tokens an answer."""
    config = {
        "served_model_name": "kimi-k2.5",
        "max_running_requests": 4,
        "time_scale": 0.4,
        "startup_weights_s": 0.2,
        "startup_kv_pool_s": 0.1,
        "startup_cuda_graph_s": 0.1,
        "startup_http_s": 0.1,
        "startup_warmup_s": 0.1,
        "min_step_s": 0.002,
        "child_processes": 0,
        "seed": 7,
        **TOKENS,
    }
    with sim_process(tmp_path, sglang_model, config) as sim:
        yield sim


@pytest.fixture
async def openrouter() -> Any:
    sim = OpenRouterSim(fast_sim_config(time_scale=0.3, min_completion_tokens=20, max_completion_tokens=40))
    await sim.start()
    try:
        yield sim
    finally:
        await sim.stop()


_PLAN = re.compile(r"\(budget left \$(?P<left>[\d.]+)\): (?P<verdict>[^|]+?) \| deadline (?P<deadline>[^|]*)")
_COST = re.compile(r"OpenRouter \S+ tok \$(?P<cost>[\d.]+) \(budget left")


def check_lines(out: str) -> list[str]:
    """Every status line's verdicts: never "fits" beside a cost over the budget left or an ETA
    past the deadline. The verdicts said, in order."""
    said = []
    for line in out.splitlines():
        plan = _PLAN.search(line)
        if plan is None:
            continue
        verdict = plan["verdict"].strip()
        said.append(verdict)
        if verdict == "fits":
            cost = _COST.search(line)
            assert cost is not None and float(cost["cost"]) <= float(plan["left"]), line
            assert "late" not in plan["deadline"] and "CANNOT" not in plan["deadline"], line
    return said


def after(events: list[dict[str, Any]], name: str, start: int = 0) -> int:
    return next(i for i in range(start, len(events)) if events[i]["event"] == name)


async def stalled_job(
    gpus: SimProcess, settings: Settings, stall_at: float | None, *, resume: bool
) -> tuple[Job, str, float]:
    """The job under headless, the GPU server stopped once `stall_at` of the time to the deadline
    has gone (None: before the job starts); with `resume`, continued once the deadline has passed
    and the job has taken its work back (the operator's server comes back: it answers late). The
    job, its status lines, and when (wall clock) the server was stopped."""
    started = time.time()
    job = Job(settings)
    await job.prepare()
    out = io.StringIO()
    deadline = job.deadline_control.deadline_ts
    assert deadline is not None
    if stall_at is None:
        gpus.stall()
    stopped_ts = time.time()
    runner = asyncio.create_task(run_headless(job, out=out, interval_s=0.5))
    events = job.run_dir / "events.jsonl"
    try:
        if stall_at is not None:
            while time.time() < started + stall_at * (deadline - started) and not runner.done():
                await asyncio.sleep(0.05)
            stopped_ts = time.time()
            gpus.stall()
        if resume:
            while not runner.done() and (
                time.time() < deadline
                or not any(e["event"] == "taken_back" for e in journal(events, complete_only=True))
            ):
                await asyncio.sleep(0.05)
            gpus.resume()
        outcome = await asyncio.wait_for(runner, 300)
    finally:
        if not runner.done():
            job.stop(cancel=True)
            await runner
    assert outcome.reason is StopReason.DONE, outcome.message
    return job, out.getvalue(), stopped_ts


def checked(job: Job, openrouter: OpenRouterSim, data: Path, prompts: int) -> dict[str, Any]:
    """What every phase keeps: one row per prompt, each taken-back attempt journaled once as waste
    `taken_back` and never a row, OpenRouter's spend what it billed. The events and those records."""
    rows = one_row_per_prompt(data, prompts)
    ends = [r for r in journal(job.run_dir / "attempts.jsonl") if r.get("k") == "end"]
    taken = [r for r in ends if r["outcome"] == "taken_back"]
    events = journal(job.run_dir / "events.jsonl")
    said = sum(e["prompts"] for e in events if e["event"] == "taken_back")
    assert taken and len(taken) == said, f"{said} taken back, {len(taken)} journaled so"
    assert all(r["be"] == "sglang" for r in taken)
    assert len({r["rid"] for r in taken}) == len(taken), "each attempt settled once"
    by_line = {r["line"]: r["backend"] for r in rows}
    assert all(by_line[r["line"]] in ("openrouter", "sglang") for r in taken)
    paid = job.dispatcher.lane("openrouter")
    assert paid.ledger.spent == openrouter.billing.billed_total, "spend is what OpenRouter billed"
    assert paid.ledger.budget is not None and paid.ledger.spent <= paid.ledger.budget
    gpu = job.dispatcher.lane("sglang").settler.breakdown
    assert gpu.waste["taken_back"] == sum(Decimal(r["cost"]) for r in taken), "GPU time of the waste"
    return {"events": events, "taken": taken, "rows": rows}


def turned_in_the_stalls_tick(events: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The stall said, and the verdict turned by the same tick: between the two, only what that
    tick also did (the take-back, one ceiling move). The `deadline_unreachable` event, and the
    ceiling moves of that tick."""
    stall = after(events, "stall")
    assert not [e for e in events[:stall] if e["event"] == "deadline_unreachable"], "it fitted before"
    turns = [i for i in range(stall, len(events)) if events[i]["event"] == "deadline_unreachable"]
    assert turns, [e["event"] for e in events]
    between = events[stall + 1 : turns[0]]
    kinds = Counter(e["event"] for e in between)
    assert set(kinds) <= {"taken_back", "steer"} and kinds["steer"] <= 1, kinds
    return events[turns[0]], [e for e in between if e["event"] == "steer"]


def steered_up(events: list[dict[str, Any]], moves: list[dict[str, Any]], stopped_ts: float) -> None:
    """OpenRouter paced for what is left by the stall's tick: its ceiling rose from where it stood
    when the GPUs stopped (in that tick, or in one between, where the GPUs' measured rate fell
    first: on a loaded machine the rates may say it a tick before the silence does)."""
    stall = after(events, "stall")
    steers = [e for e in events[:stall] if e["event"] == "steer"]
    before = [e["ceiling"] for e in steers if e["ts"] <= stopped_ts]
    now = (moves or steers)[-1]["ceiling"]
    assert before, (steers, moves)
    assert now is None or (before[-1] is not None and now > before[-1]), (before, steers, moves)


async def test_a_stall_mid_run_turns_the_verdict_in_its_tick_and_late_answers_are_waste(
    gpus: SimProcess, openrouter: OpenRouterSim, fleet_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    # The job in small: the GPUs make most of it, OpenRouter helps within a budget that pays
    # for its share but not for the whole; the GPUs stop 30% into the deadline and come back after it.
    data = write_dataset(tmp_path, "A", PROMPTS)
    settings = steered(
        fleet_settings(gpus.url, openrouter.base_url, [data], deadline="30s", budget_usd=0.008)
    )
    job, out, stopped_ts = await stalled_job(gpus, settings, 0.3, resume=True)
    facts = checked(job, openrouter, data, PROMPTS)
    events = facts["events"]
    turn, moves = turned_in_the_stalls_tick(events)
    assert "deadline cannot be met within the budget: OpenRouter spends the $" in turn["detail"], turn
    steered_up(events, moves, stopped_ts)
    stall = events[after(events, "stall")]
    assert stall["backend"] == "sglang" and "SGLang stalled" in stall["reason"] and stall["in_flight"] > 0
    said = check_lines(out)
    assert said[0] in ("fits", "at risk: ETA past the deadline"), out
    assert "over the budget" in said, f"the budget verdict said plainly: {said}"
    # Continued after the take-back, the server answered what it held (the abort, or the whole
    # answer): measured GPU time, journaled as waste, never a second row.
    assert any(Decimal(r["cost"]) > 0 and not r["est"] for r in facts["taken"]), facts["taken"]
    assert "sglang: answering again" in out, out


async def test_a_stall_before_any_gpu_row_turns_the_verdict_the_settings_gave(
    gpus: SimProcess, openrouter: OpenRouterSim, fleet_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    # By the settings' GPU rate the GPUs alone make it; their server is stopped before the start, so
    # no GPU row ever comes to measure them by: the silence alone says it.
    data = write_dataset(tmp_path, "A", PROMPTS)
    settings = steered(
        fleet_settings(gpus.url, openrouter.base_url, [data], deadline="30s", budget_usd=0.008)
    )
    job, out, _ = await stalled_job(gpus, settings, None, resume=True)
    facts = checked(job, openrouter, data, PROMPTS)
    events = facts["events"]
    turn, _ = turned_in_the_stalls_tick(events)
    assert "deadline cannot be met within the budget" in turn["detail"], turn
    stall_ts = events[after(events, "stall")]["ts"]
    ends = [r for r in journal(job.run_dir / "attempts.jsonl") if r.get("k") == "end" and r["be"] == "sglang"]
    assert all(r["ts"] > stall_ts for r in ends), "no GPU answer before the stall was said"
    said = check_lines(out)
    assert said[0] == "fits" and "over the budget" in said, said


async def test_a_stall_near_the_deadline_says_too_slow_and_openrouter_finishes_alone(
    gpus: SimProcess, openrouter: OpenRouterSim, fleet_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    # OpenRouter allowed 4 in flight: enough for its share, not for what the GPUs leave at 70% of the
    # deadline. The server stays stopped: the job ends without it, what it held cut as taken back.
    data = write_dataset(tmp_path, "A", PROMPTS)
    settings = steered(
        fleet_settings(
            gpus.url,
            openrouter.base_url,
            [data],
            deadline="30s",
            budget_usd=1.0,
            backend_concurrency={"openrouter": 4},
        )
    )
    job, out, _ = await stalled_job(gpus, settings, 0.7, resume=False)
    facts = checked(job, openrouter, data, PROMPTS)
    events = facts["events"]
    turn, _ = turned_in_the_stalls_tick(events)
    assert "deadline cannot be met at OpenRouter's rates: flat out" in turn["detail"], turn
    said = check_lines(out)
    assert "too slow" in said, said
    assert all(r["est"] for r in facts["taken"]), "never answered: cut at the end, estimated"


async def test_work_taken_back_from_a_live_server_is_aborted_by_rid_and_made_once(
    fleet_tok: SimTokenizer,
    openrouter: OpenRouterSim,
    fleet_settings: Callable[..., Settings],
    tmp_path: Path,
) -> None:
    # A server that answers (one at a time, slowly): what is taken back is ended there by its rid,
    # and the server's answer to the abort ("Abort in waiting queue" for a queued one) is waste with
    # its measured GPU time, while the prompt is made once, elsewhere.
    config = fast_config(
        served_model_name="kimi-k2.5", max_running_requests=1, time_scale=1.0, record_ids=True, **TOKENS
    )
    async with running_sim(config, fleet_tok) as sim:
        data = write_dataset(tmp_path, "A", 60)
        job = Job(fleet_settings(sim.base_url, openrouter.base_url, [data], budget_usd=1.0))
        await job.prepare()
        runner = asyncio.create_task(job.run())
        gpus = job.dispatcher.lane("sglang")
        while len(sim.scheduler.live) < 2 and not runner.done():  # on the server, one queued
            await asyncio.sleep(0.01)
        held = gpus.in_flight
        taken = job.dispatcher.take_back(gpus, "a test takes it back")
        assert taken == held >= 2
        outcome = await runner
    assert outcome.reason is StopReason.DONE, outcome.message
    facts = checked(job, openrouter, data, 60)
    rids = {r["rid"] for r in facts["taken"]}
    assert rids <= set(sim.abort_requests), "each ended on its server by its rid"
    assert all(not r["est"] for r in facts["taken"]), "answered: its GPU time measured"
    assert any("waiting queue" in r.get("msg", "") for r in facts["taken"]), facts["taken"]


async def test_near_the_deadline_the_gpu_queue_it_cannot_finish_is_taken_back_for_openrouter(
    fleet_tok: SimTokenizer,
    openrouter: OpenRouterSim,
    fleet_settings: Callable[..., Settings],
    tmp_path: Path,
) -> None:
    # A server that answers, but slowly per request (10 tokens/s each, 8 at once: about 3 s an
    # answer), beside an OpenRouter that answers in under a second: in the last answer times the GPU
    # lane holds what its server cannot finish by the deadline. That queue is taken back (the newest,
    # ended by rid on the server) and made by OpenRouter, once (engine/job/overdue.py).
    config = fast_config(
        served_model_name="kimi-k2.5",
        max_running_requests=8,
        time_scale=1.0,
        decode_tokens_per_s=10.0,
        record_ids=True,
        **TOKENS,
    )
    async with running_sim(config, fleet_tok) as sim:
        data = write_dataset(tmp_path, "A", 150)
        # Rates smoothed over 5 s: the first GPU sample (a burst, as the first batch ends at once)
        # is not the fleet's pace for the rest of a 20 s job.
        settings = steered(
            fleet_settings(sim.base_url, openrouter.base_url, [data], deadline="20s", budget_usd=1.0),
            smoothing_s=5.0,
        )
        job = Job(settings)
        await job.prepare()
        started = time.time()
        deadline = job.deadline_control.deadline_ts
        assert deadline is not None
        outcome = await asyncio.wait_for(job.run(), 120)
    assert outcome.reason is StopReason.DONE, outcome.message
    facts = checked(job, openrouter, data, 150)
    events = facts["events"]
    assert not [e for e in events if e["event"] == "stall"], "it answered throughout: slow, not stalled"
    moves = [e for e in events if e["event"] == "taken_back"]
    assert moves and all("past the deadline: SGLang finishes about" in e["reason"] for e in moves), moves
    assert all(e["ts"] > started + 0.5 * (deadline - started) for e in moves), "only in the end game"
    rids = {r["rid"] for r in facts["taken"]}
    assert rids <= set(sim.abort_requests), "each ended on its server by its rid"
    kept = [r for r in facts["rows"] if r["backend"] == "sglang"]
    assert kept and len(kept) < 150, "both fleets made rows"


# Answers of about 6 s (48 tokens at 8 tokens/s): silence alone would need four of them or more.
SLOW = {"max_running_requests": 4, "decode_tokens_per_s": 8.0, "output_len_min": 40, "output_len_max": 56}


async def slow_run(
    url: str,
    openrouter: OpenRouterSim,
    fleet_settings: Callable[..., Settings],
    data: Path,
    fault: Callable[[Lane, asyncio.Task[Any]], Awaitable[None]],
) -> tuple[Job, Any]:
    """A 40-prompt job on both fleets with a 90 s deadline, `fault` done to the GPUs once 4 GPU
    attempts have come back; the job and how it ended."""
    settings = fleet_settings(url, openrouter.base_url, [data], deadline="90s", budget_usd=1.0)
    job = Job(steered(settings, request_tokens_per_s=8.0))
    await job.prepare()
    runner = asyncio.create_task(job.run())
    lane = job.dispatcher.lane("sglang")
    try:
        while lane.landed < 4 and not runner.done():
            await asyncio.sleep(0.05)
        await fault(lane, runner)
        outcome = await asyncio.wait_for(runner, 120)
    finally:
        if not runner.done():
            job.stop(cancel=True)
            await runner
    return job, outcome


async def test_a_stopped_server_is_said_stalled_from_its_unanswered_metrics_before_four_answer_times(
    tmp_path: Path, sglang_model: Path, openrouter: OpenRouterSim, fleet_settings: Callable[..., Settings]
) -> None:
    config = fast_config(served_model_name="kimi-k2.5", time_scale=1.0, **SLOW).model_dump(mode="json")
    data = write_dataset(tmp_path, "A", 40)
    with sim_process(tmp_path, sglang_model, config) as gpus:

        async def stop(lane: Lane, runner: asyncio.Task[Any]) -> None:
            gpus.stall()
            try:
                while lane.stalled is None and not runner.done():
                    await asyncio.sleep(0.05)
            finally:
                gpus.resume()

        job, outcome = await slow_run(gpus.url, openrouter, fleet_settings, data, stop)
    assert outcome.reason is StopReason.DONE, outcome.message
    facts = checked(job, openrouter, data, 40)
    reason = facts["events"][after(facts["events"], "stall")]["reason"]
    said = re.search(
        r"none answered or streamed for (?P<silent>[\d.]+)s \(an answer takes about (?P<answer>[\d.]+)s\)",
        reason,
    )
    assert said is not None, reason
    assert "/metrics unanswered for" in reason, reason
    assert float(said["silent"]) < STALL_FACTOR * float(said["answer"]), reason


async def test_a_wedged_scheduler_that_answers_its_aborts_gets_one_request_at_a_time_until_it_answers(
    fleet_tok: SimTokenizer,
    openrouter: OpenRouterSim,
    fleet_settings: Callable[..., Settings],
    tmp_path: Path,
) -> None:
    # The scheduler's forward never completes while its HTTP side answers /metrics and aborts. The
    # stall is said by silence; the aborts' answers end it on probation, one attempt at a time,
    # until the scheduler runs again and one it still wanted comes back (docs/fleets.md).
    config = fast_config(served_model_name="kimi-k2.5", time_scale=1.0, **SLOW)
    data = write_dataset(tmp_path, "A", 40)
    unwedged = 0.0
    async with running_sim(config, fleet_tok) as sim:

        async def wedge(lane: Lane, runner: asyncio.Task[Any]) -> None:
            nonlocal unwedged
            async with aiohttp.ClientSession() as session:
                post = f"{sim.base_url}/_sim/config"
                async with session.post(post, json={"faults": {"stall": True}}) as resp:
                    assert resp.status == 200, await resp.text()
                while not lane.probation and not runner.done():
                    await asyncio.sleep(0.05)
                await asyncio.sleep(2.0)  # on probation, still wedged
                unwedged = time.time()
                async with session.post(post, json={"faults": {"stall": False}}) as resp:
                    assert resp.status == 200, await resp.text()

        job, outcome = await slow_run(sim.base_url, openrouter, fleet_settings, data, wedge)
    assert outcome.reason is StopReason.DONE, outcome.message
    facts = checked(job, openrouter, data, 40)
    events = facts["events"]
    reason = events[after(events, "stall")]["reason"]
    assert "unanswered" not in reason, reason  # its /metrics answers: said by its silence alone
    end = events[after(events, "stall_end")]
    assert end["probation"] is True, end
    sent = [
        r
        for r in journal(job.run_dir / "attempts.jsonl")
        if r.get("k") == "start" and r["be"] == "sglang" and end["ts"] <= r["ts"] <= unwedged
    ]
    assert len(sent) <= 1, f"one attempt at a time on probation: {sent}"
