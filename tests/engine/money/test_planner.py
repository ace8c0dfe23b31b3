"""The budget planner, with the story's numbers as the reference case."""

from __future__ import annotations

from decimal import Decimal

from regen.engine.money.ledger import PER_MILLION, RoutePrice
from regen.engine.money.planner import DatasetNeed, cost_of, max_token_cap, plan, remaining_output_tokens


def endpoint(name: str, completion_per_m: str, prompt_per_m: str = "0") -> RoutePrice:
    return RoutePrice(name, Decimal(prompt_per_m) / PER_MILLION, Decimal(completion_per_m) / PER_MILLION)


STORY = [DatasetNeed(f"B{i}", 10_000, 10_000_000, 0) for i in range(1, 7)]
PROVIDERS = [endpoint("Cheap", "2.20"), endpoint("Mid", "2.50"), endpoint("Dear", "3.00")]


def test_the_story_is_132_dollars_over_a_100_dollar_budget() -> None:
    result = plan(STORY, PROVIDERS, Decimal(100))
    assert result["cost"]["cheapest"] == {"provider": "Cheap", "usd": 132.0}
    assert result["cost"]["median"]["usd"] == 150.0 and result["cost"]["dearest"]["usd"] == 180.0
    assert result["fits"] is False and result["over_by_usd"] == 32.0
    way = result["ways_out"]["token_budget"]
    assert way["dataset_token_budget"] == 7_575_757 and way["suggested"] == 7_500_000
    assert result["ways_out"]["run_until_spent"]["share_of_work"] == 100 / 132


def test_seven_million_per_dataset_fits_and_ten_does_not() -> None:
    cheap = PROVIDERS[0]
    assert cost_of(STORY, cheap, 7_000_000) == Decimal("92.4")
    assert cost_of(STORY, cheap, 7_000_000) <= 100 < cost_of(STORY, cheap, 10_000_000)
    capped = [DatasetNeed(n.name, n.remaining_prompts, 7_000_000, 0) for n in STORY]
    assert plan(capped, PROVIDERS, Decimal(100))["fits"] is True


def test_prompt_tokens_count_and_scale_with_the_cap() -> None:
    needs = [DatasetNeed("A", 1000, 1_000_000, 2_000_000)]
    priced = endpoint("P", "2", "0.5")
    assert cost_of(needs, priced) == Decimal("3")  # 1M x $2/M + 2M x $0.5/M
    assert cost_of(needs, priced, 500_000) == Decimal("1.5")
    assert max_token_cap(needs, priced, Decimal("1.5")) == 500_000


def test_remaining_tokens_respect_the_dataset_budget() -> None:
    assert remaining_output_tokens(100, 2000.0, 0, None) == 200_000
    assert remaining_output_tokens(100, 2000.0, 150_000, 200_000) == 50_000
    assert remaining_output_tokens(100, 2000.0, 250_000, 200_000) == 0
