"""The budget planner: what the remaining work costs, whether the budget covers it, and if not, the ways out.

The story in docs/money.md is the reference case: 6 datasets x 10M output tokens at the cheapest
$2.20/M is $132 against a $100 budget; either each dataset's token budget drops (7M fits), or the
job runs until the money is spent and resumes later.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal

from regen.engine.money.ledger import RoutePrice
from regen.engine.schema import BudgetPlanView


@dataclass(frozen=True, slots=True)
class DatasetNeed:
    """The work left in one dataset."""

    name: str
    remaining_prompts: int
    output_tokens: int  # output tokens still to generate (capped by the dataset's token budget)
    prompt_tokens: int  # prompt tokens the remaining prompts will be billed for


def remaining_output_tokens(
    remaining_prompts: int, expected_per_prompt: float, produced: int, token_budget: int | None
) -> int:
    """Expected output tokens still to come, never past the dataset's token budget."""
    expected = int(remaining_prompts * expected_per_prompt)
    if token_budget is not None:
        expected = min(expected, max(0, token_budget - produced))
    return expected


def cost_of(needs: Sequence[DatasetNeed], price: RoutePrice, token_cap: int | None = None) -> Decimal:
    """Dollars to finish `needs` at one route's prices, each dataset capped at `token_cap` tokens."""
    total = Decimal(0)
    for need in needs:
        tokens = need.output_tokens if token_cap is None else min(need.output_tokens, token_cap)
        # Prompts are billed only for the share of the dataset the cap lets through.
        share = Decimal(tokens) / Decimal(need.output_tokens) if need.output_tokens else Decimal(1)
        total += tokens * price.completion + need.prompt_tokens * share * price.prompt
    return total


def _round_down_2sig(value: int) -> int:
    """7,575,757 -> 7,500,000: a token budget an operator can type and that still fits."""
    if value < 100:
        return value
    digits = len(str(value)) - 2
    return int((Decimal(value) / Decimal(10**digits)).to_integral_value(ROUND_FLOOR)) * int(10**digits)


def max_token_cap(needs: Sequence[DatasetNeed], price: RoutePrice, money: Decimal) -> int:
    """The largest per-dataset output-token budget whose cost at `price` fits in `money`."""
    high = max((n.output_tokens for n in needs), default=0)
    if cost_of(needs, price, high) <= money:
        return high
    low = 0
    while low < high:
        middle = (low + high + 1) // 2
        if cost_of(needs, price, middle) <= money:
            low = middle
        else:
            high = middle - 1
    return low


def plan(needs: Sequence[DatasetNeed], prices: Sequence[RoutePrice], budget_left: Decimal) -> BudgetPlanView:
    """Costs at the cheapest, median and dearest allowed route; fit; the two ways out."""
    if not prices:
        return {"fits": None, "reason": "no allowed provider"}
    priced = sorted(((cost_of(needs, p), p) for p in prices), key=lambda pair: pair[0])
    cheapest_cost, cheapest = priced[0]
    median_cost, median = priced[(len(priced) - 1) // 2]
    dearest_cost, dearest = priced[-1]
    total_tokens = sum(n.output_tokens for n in needs)
    fits = cheapest_cost <= budget_left
    result: BudgetPlanView = {
        "budget_left": float(budget_left),
        "output_tokens": total_tokens,
        "remaining_prompts": sum(n.remaining_prompts for n in needs),
        "cost": {
            "cheapest": {"provider": cheapest.route, "usd": float(cheapest_cost)},
            "median": {"provider": median.route, "usd": float(median_cost)},
            "dearest": {"provider": dearest.route, "usd": float(dearest_cost)},
        },
        "fits": fits,
        "fits_at": {
            "cheapest": cheapest_cost <= budget_left,
            "median": median_cost <= budget_left,
            "dearest": dearest_cost <= budget_left,
        },
        "tokens_covered_per_dataset": {need.name: need.output_tokens for need in needs},
    }
    per_token = cheapest.completion
    if not fits:
        cap = max_token_cap(needs, cheapest, budget_left)
        covered = float(budget_left / cheapest_cost) if cheapest_cost > 0 else 1.0
        result["tokens_covered_per_dataset"] = {n.name: min(n.output_tokens, cap) for n in needs}
        result["over_by_usd"] = float(cheapest_cost - budget_left)
        result["ways_out"] = {
            "token_budget": {
                "dataset_token_budget": cap,
                "suggested": _round_down_2sig(cap),
                "text": f"set job.dataset_token_budget to at most {cap:,} (e.g. {_round_down_2sig(cap):,})",
            },
            "run_until_spent": {
                "share_of_work": covered,
                "output_tokens": int(budget_left / per_token) if per_token > 0 else total_tokens,
                "text": f"run until the budget is spent (about {covered:.0%} of the work) and resume later",
            },
        }
    return result
