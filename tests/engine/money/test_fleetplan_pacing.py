"""The pacer of OpenRouter's share: fed time series, and in a discrete-time simulation of a whole run."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regen.engine.money.fleetplan import RouteOffer, Work, fill
from regen.engine.money.fleetplan.pacing import Facts, Pacer
from regen.engine.money.ledger import PER_MILLION, RoutePrice
from tests.support.fleet_sim import Sim, SimProvider

CHEAP = RouteOffer(RoutePrice("cheap", Decimal(0), Decimal("2.20") / PER_MILLION), None)


def facts(
    now: float,
    left: int,
    gpu: float | None,
    *,
    per_request: float | None = 10.0,
    in_flight: int = 10,
    budget: Decimal | None = Decimal(1000),
    deadline: float | None = 1000.0,
) -> Facts:
    return Facts(now, Work(left), gpu, per_request, in_flight, budget, deadline, (CHEAP,))


def test_no_deadline_no_limit() -> None:
    decision = Pacer(100).update(facts(0.0, 1_000_000, 500.0, deadline=None))
    assert decision.ceiling is None and decision.reason == "no deadline: both fleets flat out, GPUs first"
    assert decision.plan.time_left_s is None


def test_the_ceiling_is_the_rate_openrouter_must_carry_over_the_per_request_rate() -> None:
    decision = Pacer(100, margin=0.05).update(facts(0.0, 1_000_000, 500.0))
    target = 1000.0 * 0.95  # the finish aimed at, 5% of the time left before the deadline
    need = 1_000_000 - math.floor(500.0 * target)
    assert decision.aim.openrouter_tokens == need and decision.aim.time_left_s == target
    assert (
        decision.plan.time_left_s == 1000.0 and decision.plan.openrouter_tokens == 500_000
    )  # to the deadline
    assert decision.openrouter_tokens_per_s == need / target
    assert decision.ceiling == math.ceil(need / target / 10.0) == 56
    assert decision.reason.startswith(
        "on track: OpenRouter 56 in flight, 553 tokens/s for 525.0k tokens by the deadline in 16m40s"
    )


def test_gpus_alone_enough_openrouter_idle() -> None:
    pacer = Pacer(100)
    assert pacer.update(facts(0.0, 1_000_000, 500.0)).ceiling == 56
    decision = pacer.update(facts(5.0, 400_000, 500.0))  # far ahead: 400k left, the GPUs make 470k by then
    assert decision.ceiling == 0
    assert decision.reason == "GPUs alone make the deadline: OpenRouter idle (OpenRouter 56 -> 0 in flight)"


def test_the_ceiling_rises_when_the_gpus_slow_and_falls_when_they_speed_up() -> None:
    pacer = Pacer(200, smoothing_s=10.0)
    start = pacer.update(facts(0.0, 1_000_000, 500.0)).ceiling
    assert start is not None
    now, left = 0.0, 1_000_000
    for _ in range(10):  # the GPUs drop to 200 tokens/s; OpenRouter keeps its pace
        now += 5.0
        left -= int(5 * (200 + start * 10))
        slow = pacer.update(facts(now, left, 200.0))
    assert slow.ceiling is not None and slow.ceiling > start
    risen = slow.ceiling
    for _ in range(10):
        now += 5.0
        left -= int(5 * (900 + risen * 10))
        fast = pacer.update(facts(now, left, 900.0))
    assert fast.ceiling is not None and fast.ceiling < risen


def test_a_reason_names_the_move() -> None:
    pacer = Pacer(200, smoothing_s=1.0)
    pacer.update(facts(0.0, 1_000_000, 500.0))
    behind = pacer.update(facts(50.0, 1_000_000 - 50 * 500, 100.0))
    assert behind.reason.startswith("GPUs behind: OpenRouter 56 -> ")
    ahead = pacer.update(facts(100.0, 1_000_000 - 100 * 500, 700.0))
    assert ahead.reason.startswith("GPUs ahead: OpenRouter ")


def test_smoothing_a_one_tick_spike_barely_moves_the_ceiling() -> None:
    pacer = Pacer(200, smoothing_s=60.0)
    base = pacer.update(facts(0.0, 1_000_000, 500.0)).ceiling
    spike = pacer.update(facts(5.0, 1_000_000 - 5 * 1060, 50.0)).ceiling  # one noisy sample
    unsmoothed = Pacer(200).update(facts(5.0, 1_000_000 - 5 * 1060, 50.0)).ceiling
    assert base is not None and spike is not None and unsmoothed is not None
    assert abs(spike - base) * 5 < abs(unsmoothed - base)


def test_noise_does_not_make_it_oscillate() -> None:
    rng = random.Random(7)
    pacer = Pacer(200, smoothing_s=60.0)
    now, left, ceilings = 0.0, 1_000_000, []
    for _ in range(60):
        c = pacer.update(facts(now, left, 500.0 * math.exp(rng.gauss(0, 0.2)))).ceiling
        assert c is not None
        ceilings.append(c)
        left -= int(5 * (500 + c * 10))
        now += 5.0
    changes = sum(1 for a, b in itertools.pairwise(ceilings) if a != b)
    assert changes <= 15, ceilings  # the deadband holds it still through noise of +-20% a sample


def test_over_the_budget_it_spends_what_is_left_by_the_deadline_and_no_more() -> None:
    decision = Pacer(500).update(facts(0.0, 1_000_000, 500.0, budget=Decimal("0.5")))
    affordable = int(Decimal("0.5") / (Decimal("2.20") / PER_MILLION))  # 227,272 tokens
    assert decision.openrouter_tokens_per_s is not None
    assert decision.openrouter_tokens_per_s * 950.0 == pytest.approx(affordable, abs=1)
    assert decision.ceiling == math.ceil(affordable / 950.0 / 10.0)
    assert decision.reason.startswith(
        "deadline cannot be met within the budget: OpenRouter spends the $0.50 left"
    )


def test_the_deadline_passed_openrouter_flat_out() -> None:
    decision = Pacer(300).update(facts(2000.0, 10_000, 500.0))
    assert decision.ceiling == 300 and decision.reason.startswith("deadline passed")


def test_rates_too_slow_flat_out() -> None:
    slow = RouteOffer(CHEAP.price, 100.0)
    f = Facts(0.0, Work(1_000_000), 100.0, 10.0, 10, Decimal(1000), 1000.0, (slow,))
    decision = Pacer(40).update(f)
    assert decision.ceiling == 40 and decision.reason.startswith(
        "deadline cannot be met at OpenRouter's rates"
    )


def test_settings_stand_in_until_there_are_samples() -> None:
    pacer = Pacer(100, gpu_tokens_per_s=500.0, request_tokens_per_s=10.0)
    decision = pacer.update(facts(0.0, 1_000_000, None, per_request=None, in_flight=0))
    assert decision.ceiling == 56
    no_gpu_setting = Pacer(100, request_tokens_per_s=10.0).update(
        facts(0.0, 1_000_000, None, per_request=None, in_flight=0)
    )
    assert no_gpu_setting.ceiling == 100  # without a GPU rate OpenRouter must make it all: capped at the most


# The verdict (docs/fleets.md, "The verdict"): 1M tokens left, the GPUs make half by the deadline,
# OpenRouter's half costs $1.10 at the cheap route and the budget is $1.35 (1.23x the need).
EDGE = Decimal("1.35")


def near_the_edge(now: float, left: int, rows: int | None, gpu_rows: int | None) -> Facts:
    return Facts(now, Work(left), 500.0, 10.0, 10, EDGE, 1000.0, (CHEAP,), rows=rows, gpu_rows=gpu_rows)


def test_the_verdict_waits_for_the_first_rows() -> None:
    pacer = Pacer(100)
    assert pacer.update(near_the_edge(0.0, 1_000_000, 0, 0)).fits, "the plan before the start fits"
    # The first OpenRouter rows are longer than expected: the work left looks 25% larger, $1.65.
    early = pacer.update(near_the_edge(1.0, 1_250_000, 0, 0))
    assert not early.plan.fits and early.fits, "no row yet: the verdict stands"
    no_gpu_row = pacer.update(near_the_edge(2.0, 1_250_000, 400, 0))
    assert not no_gpu_row.plan.fits and no_gpu_row.fits, "OpenRouter's rows but not yet the GPUs'"


def test_the_verdict_changes_only_when_the_change_is_beyond_the_uncertainty() -> None:
    pacer = Pacer(100)
    pacer.update(near_the_edge(0.0, 1_000_000, 0, 0))
    # Nine rows measure a rate to about a third: a plan 25% over is within that.
    few = pacer.update(near_the_edge(1.0, 1_250_000, 9, 9))
    assert not few.plan.fits and few.fits
    # Four hundred rows measure it to 5%: the same plan is a real change, and it is said.
    many = pacer.update(near_the_edge(2.0, 1_250_000, 400, 400))
    assert not many.fits
    # Within reach again only when the doubtful end fits too: 2% below the edge is not enough...
    close = pacer.update(near_the_edge(3.0, 1_110_000, 400, 400))
    assert close.plan.fits and not close.fits
    # ...back to the plan of the start is.
    assert pacer.update(near_the_edge(4.0, 1_000_000, 400, 400)).fits


def test_a_stalled_fleet_counts_as_nothing_at_once_and_turns_the_verdict_in_that_tick() -> None:
    # Smoothed over a minute, a fleet that stops answering keeps most of its old rate for half a
    # minute, and with no GPU row yet there is no evidence to turn the verdict: its silence is.
    pacer = Pacer(100, smoothing_s=60.0)
    before = pacer.update(near_the_edge(0.0, 1_000_000, 0, 0))
    assert before.fits and pacer.gpu_tokens_per_s == 500.0
    quiet = Facts(1.0, Work(1_000_000), 0.0, 10.0, 10, EDGE, 1000.0, (CHEAP,), rows=5, gpu_rows=0)
    averaged = pacer.update(quiet)
    assert averaged.fits and pacer.gpu_tokens_per_s > 490, "one quiet sample is averaged in: noise"
    stalled = pacer.update(
        Facts(
            2.0, Work(1_000_000), 0.0, 10.0, 10, EDGE, 1000.0, (CHEAP,), rows=5, gpu_rows=0, gpu_stalled=True
        )
    )
    assert pacer.gpu_tokens_per_s == 0.0 and stalled.plan.gpu_tokens == 0
    assert not stalled.fits, "the verdict turns in the tick the stall is said, before any GPU row"
    assert "deadline cannot be met within the budget" in stalled.reason, stalled.reason
    assert stalled.ceiling is not None and stalled.ceiling > (averaged.ceiling or 0), "paced for it all"
    # Answering again: the first sample replaces the zero outright, and the verdict is judged afresh.
    back = pacer.update(near_the_edge(3.0, 1_000_000, 5, 1))
    assert pacer.gpu_tokens_per_s == 500.0 and back.fits


# The whole run, in the simulation (tests/support/fleet_sim.py).

PROVIDERS = [
    SimProvider("cheap", Decimal("2.20"), 10),
    SimProvider("mid", Decimal("2.50"), 14),
    SimProvider("dear", Decimal("3.00"), None),
]
DEADLINE = 2 * 3600.0


def changing_gpus(t: float) -> float:
    """1000 tokens/s, then 600 from 30% of the time, then 1400 from 60%."""
    return 1000.0 if t < 0.3 * DEADLINE else (600.0 if t < 0.6 * DEADLINE else 1400.0)


def mean_ceiling(ceilings: list[tuple[float, int | None]], start: float, end: float) -> float:
    values = [c or 0 for t, c in ceilings if start <= t < end]
    return sum(values) / len(values)


def test_a_simulated_run_follows_the_gpus_and_lands_on_the_deadline() -> None:
    sim = Sim(
        10_000_000, DEADLINE, Decimal(100), PROVIDERS, changing_gpus, pacer=Pacer(200, smoothing_s=30.0)
    )
    result = sim.run()
    assert result.finished_s is not None
    assert abs(result.finished_s - DEADLINE) <= 0.10 * DEADLINE, result.finished_s / DEADLINE
    # Settled after the change (a few smoothing times in), the ceiling follows the GPUs.
    before = mean_ceiling(result.ceilings, 0.1 * DEADLINE, 0.3 * DEADLINE)
    slowed = mean_ceiling(result.ceilings, 0.35 * DEADLINE, 0.6 * DEADLINE)
    sped = mean_ceiling(result.ceilings, 0.65 * DEADLINE, 0.9 * DEADLINE)
    assert slowed > before * 1.3 and sped < before * 0.7, (before, slowed, sped)
    assert result.max_spent_over_budget <= 0


def test_paced_costs_less_than_flat_out() -> None:
    paced = Sim(10_000_000, DEADLINE, Decimal(100), PROVIDERS, changing_gpus, pacer=Pacer(200)).run()
    flat = Sim(10_000_000, DEADLINE, Decimal(100), PROVIDERS, changing_gpus, pacer=None).run()
    assert paced.finished_s is not None and flat.finished_s is not None
    assert flat.finished_s < paced.finished_s <= 1.1 * DEADLINE
    assert paced.spent < flat.spent * Decimal("0.5")
    assert paced.by_provider["dear"] < flat.by_provider["dear"]


def test_a_short_budget_is_never_overshot_and_is_spent_by_the_deadline() -> None:
    budget = Decimal(2)  # the run needs about $7.5 of OpenRouter to make the deadline
    pacer = Pacer(200, gpu_tokens_per_s=1000.0)
    result = Sim(10_000_000, DEADLINE, budget, PROVIDERS, changing_gpus, pacer=pacer).run()
    assert result.max_spent_over_budget <= 0 and result.spent <= budget
    assert result.spent >= budget * Decimal("0.95")  # what it could buy, it bought
    assert result.reasons[0].startswith(
        "deadline cannot be met within the budget: OpenRouter spends the $2.00"
    )
    assert "81% of the work by the deadline, all of it in 2h32m" in result.reasons[0]  # (7.2M + 0.91M) / 10M
    assert result.by_provider == {
        "cheap": result.openrouter_tokens,
        "mid": 0,
        "dear": 0,
    }  # paced: the cheap one


def test_a_run_that_fits_keeps_its_verdict_through_noise_and_a_real_slowdown_changes_it_once() -> None:
    """In the simulation, a budget 1.23x what OpenRouter's share costs: the live plan flips on the
    first noisy samples (before the GPUs' first rows), the verdict does not; the GPUs slowed to 40%
    mid-run is a real change, said once, within a few ticks."""

    def flips(verdicts: list[tuple[float, bool]]) -> list[tuple[float, bool]]:
        return [(t, now) for (_, was), (t, now) in itertools.pairwise(verdicts) if was != now]

    def run(gpus: Callable[[float], float], seed: int) -> list[tuple[float, bool, bool]]:
        pacer = Pacer(200, smoothing_s=30.0, gpu_tokens_per_s=1000.0)
        return (
            Sim(10_000_000, DEADLINE, Decimal("7.8"), PROVIDERS, gpus, noise=0.3, pacer=pacer, seed=seed)
            .run()
            .verdicts
        )

    steady = run(lambda t: 1000.0, 3)
    assert flips([(t, live) for t, live, _ in steady]), "the live plan follows the noise"
    assert not flips([(t, verdict) for t, _, verdict in steady]) and steady[0][2]
    slowed = run(lambda t: 1000.0 if t < 0.3 * DEADLINE else 400.0, 3)
    said = flips([(t, verdict) for t, _, verdict in slowed])
    assert len(said) == 1 and said[0][1] is False, said
    assert 0.3 * DEADLINE < said[0][0] < 0.3 * DEADLINE + 120, "within a couple of minutes of the slowdown"


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 5_000_000),
    st.floats(1.0, 50_000.0),
    st.floats(0.0, 2_000.0),
    st.floats(1.0, 100.0),
    st.integers(0, 10_000),
    st.integers(1, 500),
    st.one_of(st.none(), st.floats(1.0, 5_000.0)),
)
def test_the_ceiling_stays_within_the_concurrency_and_the_money(
    left: int, time_left: float, gpu: float, per_request: float, cents: int, most: int, rate: float | None
) -> None:
    budget = Decimal(cents) / 100
    providers = (
        RouteOffer(CHEAP.price, rate),
        RouteOffer(RoutePrice("dear", Decimal(0), Decimal(4) / PER_MILLION), None),
    )
    f = Facts(0.0, Work(left), gpu, per_request, 10, budget, time_left, providers)
    decision = Pacer(most).update(f)
    assert decision.ceiling is not None and 0 <= decision.ceiling <= most
    if decision.openrouter_tokens_per_s is not None and decision.aim.time_left_s is not None:
        asked = math.floor(decision.openrouter_tokens_per_s * decision.aim.time_left_s + 1e-6)
        assert (
            fill(Work(left), asked, providers, decision.aim.time_left_s).usd <= budget
        )  # never more than it can pay
