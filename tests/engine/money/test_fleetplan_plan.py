"""The two-fleet plan: the story's numbers, the cheapest split against brute force, what fits when nothing does."""

from __future__ import annotations

import itertools
import json
from decimal import Decimal
from fractions import Fraction

from hypothesis import example, given, settings
from hypothesis import strategies as st

from regen.engine.money.fleetplan import RouteOffer, Work, earliest_seconds, fill, plan_fleets
from regen.engine.money.ledger import PER_MILLION, RoutePrice
from regen.engine.money.planner import DatasetNeed

HOUR = 3600.0
STORY = Work(60_000_000, 60_000, 0)  # 6 datasets x 10M output tokens


def provider(route: str, per_m: str, rate: float | None, prompt_per_m: str = "0") -> RouteOffer:
    return RouteOffer(
        RoutePrice(route, Decimal(prompt_per_m) / PER_MILLION, Decimal(per_m) / PER_MILLION), rate
    )


def test_the_story_gpus_make_43m_in_12_hours_and_openrouter_buys_the_rest() -> None:
    p = plan_fleets(STORY, 12 * HOUR, 1000.0, [provider("cheap", "2.20", None)], Decimal(100))
    assert p.gpu_tokens == 43_200_000 and p.openrouter_tokens == 16_800_000
    assert p.cost == Decimal("36.96")  # 16.8M x $2.20/M, exactly
    assert p.fits and not p.gpus_alone_meet and p.gpu_alone_finish_s == 60_000
    assert p.share_by_deadline == 1.0 and p.tokens_by_deadline == 60_000_000
    assert "OpenRouter must carry 16.8M tokens for $36.96" in p.reason


def test_cheapest_first_each_capped_by_its_rate_times_the_time() -> None:
    providers = [
        provider("dear", "3.00", None),
        provider("mid", "2.50", 400.0),
        provider("cheap", "2.20", 300.0),
    ]
    p = plan_fleets(STORY, 12 * HOUR, 1000.0, providers, Decimal(100))
    assert [(s.route, s.tokens, s.capacity) for s in p.shares] == [
        ("cheap", 12_960_000, 12_960_000),
        ("mid", 3_840_000, 17_280_000),
        ("dear", 0, None),
    ]
    assert p.cost == Decimal("28.512") + Decimal("9.6")


def test_prompt_tokens_count_in_the_order_and_the_cost() -> None:
    # B is dearer per output token but charges nothing for prompts; A's prompt price makes it the dearer.
    work = Work(1_000_000, 1_000, 4_000_000)  # 4 prompt tokens per output token
    a = provider("A", "2.00", None, prompt_per_m="0.50")  # 2 + 4 x 0.5 = $4 per M output
    b = provider("B", "3.00", None)
    p = plan_fleets(work, 100.0, 0.0, [a, b], None)
    assert [s.route for s in p.shares] == ["B", "A"] and p.shares[0].tokens == 1_000_000
    assert p.cost == Decimal(3)
    only_a = plan_fleets(work, 100.0, 0.0, [a], None)
    assert only_a.cost == Decimal(4) and only_a.shares[0].per_million == Decimal(4)


def test_the_gpus_alone_make_a_long_deadline() -> None:
    p = plan_fleets(STORY, 24 * HOUR, 1000.0, [provider("cheap", "2.20", None)], Decimal(100))
    assert p.gpus_alone_meet and p.openrouter_tokens == 0 and p.cost == 0 and p.fits
    assert p.reason.startswith("the GPUs alone finish in 16h40m") and "not needed" in p.reason


def test_over_the_budget_the_earliest_deadline_and_the_share_that_fit() -> None:
    p = plan_fleets(STORY, 12 * HOUR, 1000.0, [provider("cheap", "2.20", None)], Decimal(30))
    assert not p.affordable and p.reachable and not p.fits
    # $30 buys 13,636,363 tokens at $2.20/M; the GPUs must make the other 46,363,637 at 1000/s.
    assert p.earliest_s == 46_364
    assert p.tokens_by_deadline == 43_200_000 + 13_636_363
    assert p.share_by_deadline == (43_200_000 + 13_636_363) / 60_000_000
    assert "over the budget" in p.reason and "12h53m" in p.reason and "95% of the work" in p.reason


def test_providers_too_slow_for_the_deadline() -> None:
    p = plan_fleets(STORY, 12 * HOUR, 1000.0, [provider("cheap", "2.20", 100.0)], Decimal(1000))
    assert not p.reachable and p.affordable and not p.fits
    assert p.shares[0].tokens == 4_320_000  # all it can carry in 12 hours
    assert p.earliest_s == 54_546  # 60M / 1100 tokens/s, to the second above
    assert "carry only 4.3M tokens" in p.reason


def test_no_providers_the_gpus_alone() -> None:
    p = plan_fleets(STORY, 12 * HOUR, 1000.0, [], Decimal(100))
    assert not p.reachable and p.shares == () and p.cost == 0
    assert p.earliest_s == 60_000 and p.share_by_deadline == 0.72


def test_gpu_rate_zero_or_absent_openrouter_carries_everything() -> None:
    for rate in (0.0, None):
        p = plan_fleets(STORY, 12 * HOUR, rate, [provider("cheap", "2.20", None)], Decimal(200))
        assert p.gpu_tokens == 0 and p.openrouter_tokens == 60_000_000 and p.cost == Decimal(132)
        assert p.gpu_alone_finish_s is None and not p.gpus_alone_meet and p.fits
        assert p.earliest_s == 0  # an unbounded provider could do it at once


def test_gpu_rate_zero_and_the_budget_short_no_deadline_fits() -> None:
    p = plan_fleets(STORY, 12 * HOUR, 0.0, [provider("cheap", "2.20", 2000.0)], Decimal(100))
    assert p.earliest_s is None and "no deadline fits the budget" in p.reason
    assert p.tokens_by_deadline == 45_454_545  # $100 at $2.20/M
    assert earliest_seconds(STORY, 0.0, [], Decimal(100)) is None


def test_no_deadline_both_flat_out_gpus_first() -> None:
    providers = [provider("cheap", "2.20", 300.0), provider("mid", "2.50", 700.0)]
    p = plan_fleets(STORY, None, 1000.0, providers, Decimal(100))
    assert p.horizon_s == 30_000.0  # 60M at 2000 tokens/s
    assert p.gpu_tokens == 30_000_000 and [s.tokens for s in p.shares] == [9_000_000, 21_000_000]
    assert p.reason.startswith("no deadline: both fleets flat out, GPUs first, done in about 8h20m")


@given(
    st.integers(1, 10**8),
    st.floats(1.0, 5_000.0),
    st.lists(st.floats(1.0, 5_000.0), min_size=1, max_size=4),
)
def test_without_a_deadline_flat_out_always_carries_the_work(
    work: int, gpu: float, rates: list[float]
) -> None:
    # Each fleet's share is floored to whole tokens: at the exact flat-out finish they can fall a few
    # tokens short, which once read as "does not fit" with no deadline to miss.
    providers = [provider(f"p{i}", str(2 + i / 10), rate) for i, rate in enumerate(rates)]
    p = plan_fleets(Work(work, work // 100, work // 3), None, gpu, providers, None)
    assert p.reachable and p.fits and p.gpu_tokens + sum(s.tokens for s in p.shares) == work
    assert (
        p.horizon_s is not None
        and p.horizon_s == int(p.horizon_s)
        and p.horizon_s >= work / (gpu + sum(rates))
    )


def test_the_floors_at_the_flat_out_finish_found_by_the_console() -> None:
    providers = [provider("a", "2.20", 333.3, "0.50"), provider("b", "2.50", 777.7, "0.50")]
    p = plan_fleets(Work(1_000_003, 1000, 300_000), None, 249.1, providers, Decimal(50))
    assert p.reachable and p.fits and p.horizon_s == 736.0


def test_no_work_nothing_to_do() -> None:
    p = plan_fleets(Work(0), 10.0, 0.0, [], Decimal(0))
    assert p.fits and p.share_by_deadline == 1.0 and p.reason == "nothing left to make"


def test_the_plan_goes_into_the_snapshot_as_json() -> None:
    p = plan_fleets(STORY, 12 * HOUR, 1000.0, [provider("cheap", "2.20", 300.0)], Decimal(30))
    data = json.loads(json.dumps(p.to_dict()))
    assert (
        data["cost"] == float(p.cost) and data["fits"] is False and data["shares"][0]["provider"] == "cheap"
    )
    assert data["earliest_s"] == p.earliest_s and data["reason"] == p.reason


def test_work_sums_the_planners_dataset_needs() -> None:
    needs = [DatasetNeed("A", 10, 1_000, 500), DatasetNeed("B", 5, 2_000, 100)]
    assert Work.of(needs) == Work(3_000, 15, 600)


# Brute force: every integer split of the tokens over the providers, each within its capacity.

prices = st.integers(1, 50)  # micro-dollars per output token
capacities = st.one_of(st.none(), st.integers(0, 40))


@st.composite
def instances(draw: st.DrawFn) -> tuple[Work, list[RouteOffer], int]:
    count = draw(st.integers(1, 3))
    providers = [
        RouteOffer(
            RoutePrice(
                f"p{i}", Decimal(draw(st.integers(0, 5))) / PER_MILLION, Decimal(draw(prices)) / PER_MILLION
            ),
            None if (cap := draw(capacities)) is None else float(cap),
        )
        for i in range(count)
    ]
    output = draw(st.integers(1, 40))
    work = Work(output, 1, draw(st.integers(0, 80)))
    return work, providers, draw(st.integers(0, output))


def exact_cost(work: Work, p: RouteOffer, tokens: int) -> Fraction:
    share = Fraction(tokens, work.output_tokens)
    return tokens * Fraction(p.price.completion) + work.prompt_tokens * share * Fraction(p.price.prompt)


def brute_cheapest(work: Work, providers: list[RouteOffer], need: int) -> Fraction | None:
    best: Fraction | None = None
    ranges = [
        range(need + 1 if p.tokens_per_s is None else min(need, int(p.tokens_per_s)) + 1) for p in providers
    ]
    for split in itertools.product(*ranges):
        if sum(split) != need:
            continue
        cost = sum((exact_cost(work, p, x) for p, x in zip(providers, split, strict=True)), Fraction(0))
        best = cost if best is None or cost < best else best
    return best


def brute_most_tokens(work: Work, providers: list[RouteOffer], need: int, money: Fraction) -> int:
    ranges = [
        range(need + 1 if p.tokens_per_s is None else min(need, int(p.tokens_per_s)) + 1) for p in providers
    ]
    most = 0
    for split in itertools.product(*ranges):
        total = sum(split)
        if total <= need and total > most:
            cost = sum((exact_cost(work, p, x) for p, x in zip(providers, split, strict=True)), Fraction(0))
            if cost <= money:
                most = total
    return most


CLOSE = Fraction(1, 10**18)  # Decimal's 28 digits against exact fractions


@settings(max_examples=300, deadline=None)
@given(instances())
def test_cheapest_first_is_the_cheapest_split(instance: tuple[Work, list[RouteOffer], int]) -> None:
    work, providers, need = instance
    split = fill(work, need, providers, 1.0)  # one second: capacity = rate
    best = brute_cheapest(work, providers, need)
    if best is None:
        assert split.tokens < need  # the greedy finds it infeasible too
    else:
        assert split.tokens == need
        assert abs(Fraction(split.usd) - best) <= CLOSE


@settings(max_examples=200, deadline=None)
@given(instances(), st.integers(0, 2000))
# Found by hypothesis: 9 tokens cost exactly the money, but the rounded unit price divides to 8.99...
@example(
    (
        Work(output_tokens=30, prompts=1, prompt_tokens=35),
        [RouteOffer(RoutePrice("p0", Decimal("0.000004"), Decimal("0.000019")), None)],
        9,
    ),
    213,
)
def test_cheapest_first_buys_the_most_tokens_the_money_allows(
    instance: tuple[Work, list[RouteOffer], int], micro_dollars: int
) -> None:
    work, providers, need = instance
    money = Decimal(micro_dollars) / PER_MILLION
    split = fill(work, need, providers, 1.0, money)
    assert split.usd <= money
    assert split.tokens == brute_most_tokens(work, providers, need, Fraction(money))


@settings(max_examples=150, deadline=None)
@given(instances(), st.integers(0, 5), st.integers(0, 3000))
def test_the_earliest_deadline_is_the_first_second_that_fits(
    instance: tuple[Work, list[RouteOffer], int], gpu: int, micro_dollars: int
) -> None:
    work, providers, _ = instance
    budget = Decimal(micro_dollars) / PER_MILLION

    def meets(seconds: int) -> bool:
        need = work.output_tokens - min(work.output_tokens, gpu * seconds)
        caps = [
            RouteOffer(p.price, None if p.tokens_per_s is None else p.tokens_per_s * seconds)
            for p in providers
        ]
        best = brute_cheapest(work, caps, need)
        return best is not None and best <= Fraction(budget)

    first = next((s for s in range(0, 41) if meets(s)), None)
    found = earliest_seconds(work, float(gpu), providers, budget)
    if first is None:
        assert found is None or found > 40
    else:
        assert found == first


rates = st.one_of(st.none(), st.floats(0.0, 1e6), st.sampled_from([5e-324, 1e-300]))


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 10**9),
    st.one_of(st.none(), st.floats(0.0, 1e7)),
    st.one_of(st.none(), st.floats(0.0, 1e6), st.just(5e-324)),
    st.lists(st.tuples(st.integers(0, 100), rates), max_size=3),
    st.one_of(st.none(), st.integers(0, 10**4)),
)
def test_any_inputs_give_a_consistent_plan(
    output: int,
    time_left: float | None,
    gpu: float | None,
    offers: list[tuple[int, float | None]],
    dollars: int | None,
) -> None:
    providers = [
        RouteOffer(RoutePrice(f"p{i}", Decimal(0), Decimal(c) / 10 / PER_MILLION), r)
        for i, (c, r) in enumerate(offers)
    ]
    budget = None if dollars is None else Decimal(dollars)
    p = plan_fleets(Work(output, 1, 0), time_left, gpu, providers, budget)
    assert p.gpu_tokens + p.openrouter_tokens == output
    assert sum(s.tokens for s in p.shares) <= p.openrouter_tokens
    assert 0.0 <= p.share_by_deadline <= 1.0 and p.reason and "\n" not in p.reason
    if p.fits:
        assert budget is None or p.cost <= budget
        assert p.tokens_by_deadline == output
    json.dumps(p.to_dict())
