"""The dollar ledger: spent, reserved for requests in flight, and the budget gate.

DESIGN.md, Money: a request is dispatched only while spent + reserved + its own reservation stays
within the budget, each reservation being that request's worst case at the most expensive provider
still allowed. So the requests in flight can never push spend past the budget.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from engine.backends.openrouter.catalog import Endpoint

# Byte-level BPE never makes more tokens than bytes, so utf-8 bytes bound a message's tokens; the
# chat template adds role markers per message and a default system prompt. Generous on purpose:
# a reservation that is too high only slows dispatch near the end of the budget.
TEMPLATE_TOKENS_PER_MESSAGE = 16
TEMPLATE_TOKENS_FIXED = 64


def prompt_token_bound(messages: Sequence[dict[str, Any]]) -> int:
    """An upper bound on the prompt tokens any provider bills for these messages."""
    total = TEMPLATE_TOKENS_FIXED
    for message in messages:
        content = message.get("content")
        total += TEMPLATE_TOKENS_PER_MESSAGE
        if isinstance(content, str):
            total += len(content.encode("utf-8"))
    return total


def to_dollars(value: float | int | str | Decimal) -> Decimal:
    """Exact Decimal of a JSON cost: the shortest repr of the float, as the server printed it."""
    return value if isinstance(value, Decimal) else Decimal(str(value))


@dataclass(frozen=True, slots=True)
class PriceCeiling:
    """The most expensive per-token prices among the providers still allowed."""

    prompt: Decimal
    completion: Decimal

    @classmethod
    def of(cls, endpoints: Iterable[Endpoint]) -> PriceCeiling:
        endpoints = list(endpoints)
        if not endpoints:
            return cls(Decimal(0), Decimal(0))
        return cls(max(e.prompt_price for e in endpoints), max(e.completion_price for e in endpoints))

    def reservation(self, prompt_tokens: int, max_tokens: int) -> Decimal:
        return prompt_tokens * self.prompt + max_tokens * self.completion

    def estimate(self, prompt_tokens: int, completion_tokens: int) -> Decimal:
        return prompt_tokens * self.prompt + completion_tokens * self.completion


class Ledger:
    """Money in Decimal dollars; the single place the budget rule lives."""

    def __init__(self, budget: Decimal) -> None:
        self.budget = budget
        self.spent = Decimal(0)
        self.spent_estimated = Decimal(0)
        self.reserved = Decimal(0)

    def fits(self, reservation: Decimal) -> bool:
        return self.spent + self.reserved + reservation <= self.budget

    def reserve(self, amount: Decimal) -> None:
        self.reserved += amount

    def release(self, amount: Decimal) -> None:
        self.reserved -= amount

    def charge(self, cost: Decimal, *, estimated: bool = False) -> None:
        self.spent += cost
        if estimated:
            self.spent_estimated += cost

    @property
    def headroom(self) -> Decimal:
        return self.budget - self.spent - self.reserved


WASTE_CAUSES = ("retries", "truncated", "quarantined", "crash", "cancelled")


def spend_cause(outcome: str) -> str | None:
    """Which waste an attempt's dollars belong to; None for a usable (ok) row."""
    if outcome == "ok":
        return None
    if outcome in ("truncated", "quarantined", "cancelled"):
        return outcome
    if outcome == "lost_at_crash":
        return "crash"
    return "retries"


class SpendBreakdown:
    """Useful spend against waste by cause, in dollars and output tokens."""

    def __init__(self) -> None:
        self.useful_usd = Decimal(0)
        self.useful_tokens = 0
        self.waste_usd: dict[str, Decimal] = dict.fromkeys(WASTE_CAUSES, Decimal(0))
        self.waste_tokens: dict[str, int] = dict.fromkeys(WASTE_CAUSES, 0)

    def add(self, outcome: str, usd: Decimal, tokens: int = 0) -> None:
        cause = spend_cause(outcome)
        if cause is None:
            self.useful_usd += usd
            self.useful_tokens += tokens
        else:
            self.waste_usd[cause] += usd
            self.waste_tokens[cause] += tokens

    def view(self) -> dict[str, Any]:
        per_m = float(self.useful_usd) / self.useful_tokens * 1e6 if self.useful_tokens else None
        return {
            "useful_usd": float(self.useful_usd),
            "useful_output_tokens": self.useful_tokens,
            "useful_usd_per_m": per_m,
            "waste": {
                cause: {"usd": float(self.waste_usd[cause]), "tokens": self.waste_tokens[cause]}
                for cause in WASTE_CAUSES
            },
            "waste_usd": float(sum(self.waste_usd.values(), Decimal(0))),
        }
