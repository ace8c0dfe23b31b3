"""The end game's bound on the GPU queue (engine/job/overdue.py), on plans made by the real planner."""

from __future__ import annotations

from decimal import Decimal

import pytest

from regen.engine.job.overdue import gpu_hold, over, shares
from regen.engine.money.fleetplan import RouteOffer, Work, plan_fleets
from regen.engine.money.fleetplan.plan import FleetPlan
from regen.engine.money.ledger import PER_MILLION, RoutePrice

PRICE = RoutePrice("cheap", Decimal(0), Decimal(27) / PER_MILLION)
PER_PROMPT = 30  # output tokens per prompt


def plan(prompts: int, time_left_s: float, gpu: float, budget: str = "1") -> FleetPlan:
    work = Work(prompts * PER_PROMPT, prompts, prompts * 10)
    return plan_fleets(work, time_left_s, gpu, [RouteOffer(PRICE, 2000.0)], Decimal(budget))


def test_early_in_a_run_the_bound_is_far_above_what_the_gpus_hold() -> None:
    # 10 minutes left at 300 tokens/s: the GPUs make 6000 of the 10,000 prompts by then, OpenRouter
    # (with the money for it) the rest: the GPUs hold 6000, where their lane's limit holds tens.
    hold = gpu_hold(plan(10_000, 600.0, 300.0, budget="100"), PER_PROMPT, 1.0)
    assert hold == 6000


def test_near_the_deadline_the_gpus_hold_what_they_finish_by_it() -> None:
    # 4 s left at 300 tokens/s: 1200 tokens, 40 prompts; OpenRouter affords the rest.
    hold = gpu_hold(plan(200, 4.0, 300.0), PER_PROMPT, 1.0)
    assert hold == 40


def test_what_nobody_makes_by_the_deadline_stays_on_the_gpus() -> None:
    # The budget buys OpenRouter about 37 prompts (0.03 / (30 x 27e-6)); the other 123 are late
    # whoever makes them, and cost nothing on the GPUs: they are not taken back.
    p = plan(200, 4.0, 300.0, budget="0.03")
    assert not p.affordable
    hold = gpu_hold(p, PER_PROMPT, 1.0)
    assert hold is not None and 40 < hold < 200
    late = p.output_tokens - p.tokens_by_deadline
    assert hold == -(-(p.gpu_tokens + late) // PER_PROMPT)


@pytest.mark.parametrize(
    ("time_left_s", "answer_s", "per_prompt"),
    [(0.0, 1.0, PER_PROMPT), (-5.0, 1.0, PER_PROMPT), (3.0, 2.0, PER_PROMPT), (10.0, 1.0, 0)],
)
def test_no_bound_when_taking_back_cannot_help(time_left_s: float, answer_s: float, per_prompt: int) -> None:
    # The deadline passed, too little time for OpenRouter to answer (2 answer times), no measure.
    assert gpu_hold(plan(200, time_left_s, 300.0), per_prompt, answer_s) is None


def test_no_bound_without_a_deadline() -> None:
    work = Work(200 * PER_PROMPT, 200, 2000)
    assert (
        gpu_hold(plan_fleets(work, None, 300.0, [RouteOffer(PRICE, 2000.0)], None), PER_PROMPT, 1.0) is None
    )


def test_the_excess_is_cut_only_past_the_slack() -> None:
    assert over(10, 40) == 0
    assert over(41, 40) == 0, "one over is noise"
    assert over(43, 40) == 0, "within 10%"
    assert over(44, 40) == 4
    assert over(5, 1) == 4
    assert over(2, 0) == 2


def test_the_bound_is_shared_by_what_each_lane_holds_rounded_toward_the_gpus() -> None:
    assert shares(40, [30, 10]) == [30, 10]
    assert shares(10, [3, 3, 3]) == [4, 4, 4]
    assert shares(9, [0, 0]) == [5, 5]
    assert shares(0, [4, 4]) == [0, 0]
