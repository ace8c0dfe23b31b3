"""The ledger: spent, reserved for requests in flight, and the budget gate, in one unit.

docs/money.md: a request is dispatched only while spent + reserved + its own reservation stays
within the budget, each reservation being that request's worst case at the most expensive route
still allowed. So the requests in flight can never push spend past the budget. The rule is the same
for every backend; only the unit differs (US dollars for OpenRouter, GPU-seconds for SGLang, whose
ledger has no budget).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from regen.engine.units import DOLLARS, Unit

# Byte-level BPE never makes more tokens than bytes, so utf-8 bytes bound a message's tokens; the
# chat template adds role markers per message and a default system prompt. Generous on purpose:
# a reservation that is too high only slows dispatch near the end of the budget.
TEMPLATE_TOKENS_PER_MESSAGE = 16
TEMPLATE_TOKENS_FIXED = 64
PER_MILLION = Decimal(1_000_000)


def prompt_token_bound(messages: Sequence[dict[str, Any]]) -> int:
    """An upper bound on the prompt tokens any provider bills for these messages."""
    total = TEMPLATE_TOKENS_FIXED
    for message in messages:
        content = message.get("content")
        total += TEMPLATE_TOKENS_PER_MESSAGE
        if isinstance(content, str):
            total += len(content.encode("utf-8"))
    return total


def planning_prompt_tokens(content_chars: Sequence[int]) -> float:
    """Mean prompt tokens for planning: about four characters a token plus the template.

    Only the planner uses it; reservations use the strict `prompt_token_bound`.
    """
    if not len(content_chars):
        return 0.0
    return sum(content_chars) / len(content_chars) / 4 + TEMPLATE_TOKENS_FIXED


def to_dollars(value: float | int | str | Decimal) -> Decimal:
    """Exact Decimal of a JSON cost: the shortest repr of the float, as the server printed it."""
    return value if isinstance(value, Decimal) else Decimal(str(value))


@dataclass(frozen=True, slots=True)
class RoutePrice:
    """One route's per-token prices, in the ledger's unit."""

    route: str
    prompt: Decimal
    completion: Decimal


@dataclass(frozen=True, slots=True)
class PriceCeiling:
    """The most expensive per-token prices among the routes still allowed."""

    prompt: Decimal
    completion: Decimal

    @classmethod
    def of(cls, prices: Iterable[RoutePrice]) -> PriceCeiling:
        prices = list(prices)
        if not prices:
            return cls(Decimal(0), Decimal(0))
        return cls(max(p.prompt for p in prices), max(p.completion for p in prices))

    def reservation(self, prompt_tokens: int, max_tokens: int) -> Decimal:
        return prompt_tokens * self.prompt + max_tokens * self.completion

    def estimate(self, prompt_tokens: int, completion_tokens: int) -> Decimal:
        return prompt_tokens * self.prompt + completion_tokens * self.completion


@dataclass(slots=True)
class Estimates:
    """Spend counted at an estimate, in two kinds the operator must tell apart.

    `pending`: attempts whose bill can still be looked up (their handle is known); the estimate errs
    high and is replaced by the billed amount. `unknowable`: attempts cut before any handle arrived
    (a crash, a cancel before the headers); nobody can say what they cost, so their worst case stays,
    unless the account's own usage bounds it (`Ledger.bound_by_usage`).
    """

    pending: Decimal = Decimal(0)
    pending_count: int = 0
    unknowable: Decimal = Decimal(0)
    unknowable_count: int = 0
    # The unknowable money by its attempts' outcome, so that lowering it lowers the waste it was
    # counted under (SpendBreakdown) and useful + waste stays equal to spent.
    unknowable_by: dict[str, Decimal] = field(default_factory=dict)
    bounded_by: str | None = None  # what bounded the unknowable money ("key_usage"), if anything
    bound_waited_s: float | None = None  # how long this run's end waited for that figure to settle

    @property
    def total(self) -> Decimal:
        return self.pending + self.unknowable

    def add(self, amount: Decimal, *, knowable: bool, outcome: str = "lost_at_crash") -> None:
        if knowable:
            self.pending += amount
            self.pending_count += 1
        else:
            self.unknowable += amount
            self.unknowable_count += 1
            self.unknowable_by[outcome] = self.unknowable_by.get(outcome, Decimal(0)) + amount

    def settle(self, estimate: Decimal, *, knowable: bool = True, outcome: str = "lost_at_crash") -> None:
        """An estimate replaced by the bill (or, for one that never left, by nothing)."""
        if knowable:
            self.pending -= estimate
            self.pending_count -= 1
        else:
            self.unknowable -= estimate
            self.unknowable_count -= 1
            self.unknowable_by[outcome] = self.unknowable_by.get(outcome, Decimal(0)) - estimate

    def cuts_to(self, cap: Decimal) -> dict[str, Decimal]:
        """How much of the unknowable money to take off, by outcome, to bring it down to `cap`
        (never up): outcomes in name order, each down to zero before the next, so it is exact."""
        excess = self.unknowable - max(cap, Decimal(0))
        cuts: dict[str, Decimal] = {}
        for outcome in sorted(self.unknowable_by):
            if excess <= 0:
                break
            cut = min(excess, self.unknowable_by[outcome])
            if cut > 0:
                cuts[outcome] = cut
                excess -= cut
        return cuts

    def lower(self, cuts: Mapping[str, Decimal]) -> None:
        """Take `cuts` (from `cuts_to`, or read back from the journal) off the unknowable money; the
        attempts stay counted as unknowable, at less."""
        for outcome, cut in cuts.items():
            self.unknowable -= cut
            self.unknowable_by[outcome] = self.unknowable_by.get(outcome, Decimal(0)) - cut


class Ledger:
    """Spend in one unit; the single place the budget rule lives. A budget of None never blocks."""

    def __init__(self, budget: Decimal | None, unit: Unit = DOLLARS) -> None:
        self.unit = unit
        self.budget = budget
        self.spent = Decimal(0)
        self.estimates = Estimates()
        self.reserved = Decimal(0)

    def fits(self, reservation: Decimal) -> bool:
        return self.budget is None or self.spent + self.reserved + reservation <= self.budget

    def reserve(self, amount: Decimal) -> None:
        self.reserved += amount

    def release(self, amount: Decimal) -> None:
        self.reserved -= amount

    def charge(
        self, cost: Decimal, *, estimated: bool = False, knowable: bool = True, outcome: str = "lost_at_crash"
    ) -> None:
        self.spent += cost
        if estimated:
            self.estimates.add(cost, knowable=knowable, outcome=outcome)

    def confirm(
        self, estimate: Decimal, billed: Decimal, *, knowable: bool = True, outcome: str = "lost_at_crash"
    ) -> Decimal:
        """Replace an estimate with what was billed; returns the correction."""
        delta = billed - estimate
        self.spent += delta
        self.estimates.settle(estimate, knowable=knowable, outcome=outcome)
        return delta

    def usage_cuts(self, billed_since_base: Decimal) -> dict[str, Decimal]:
        """What the account's usage allows to take off the unknowable money (docs/money.md,
        "Bounded by the key's usage"): the job's own bills since the base are at most
        `billed_since_base`, and the confirmed ones are among them, so the unknowable ones are at
        most `billed_since_base - confirmed`. Pending estimates are not subtracted: their bills may
        come out lower, and the bound must stay above the truth whatever they turn out to be."""
        return self.estimates.cuts_to(billed_since_base - self.confirmed)

    def lower_unknowable(self, cuts: Mapping[str, Decimal], bounded_by: str) -> Decimal:
        """Apply `usage_cuts`' answer; returns how much spend went down."""
        self.estimates.lower(cuts)
        self.estimates.bounded_by = bounded_by
        cut = sum(cuts.values(), Decimal(0))
        self.spent -= cut
        return cut

    @property
    def estimated(self) -> Decimal:
        return self.estimates.total

    @property
    def confirmed(self) -> Decimal:
        return self.spent - self.estimates.total

    @property
    def headroom(self) -> Decimal | None:
        return None if self.budget is None else self.budget - self.spent - self.reserved

    @property
    def left(self) -> Decimal | None:
        """The money left to plan the remaining work with (docs/money.md, "What is left"): the
        budget less what was billed, the worst cases no bill can name, and the bills still coming
        at their estimate until they are looked up (within seconds of OpenRouter answering, also
        after an outage). The requests in flight are not taken off: they are part of the remaining
        work the planners price. None: no budget."""
        return None if self.budget is None else self.budget - self.spent


# fidelity: rows taken back from a route that served another model; audit: the canary audit's
# requests (docs/fidelity.md); taken_back: attempts taken back from a stalled fleet, their prompts
# sent again elsewhere (docs/fleets.md, "Work taken back").
WASTE_CAUSES = (
    "retries",
    "truncated",
    "quarantined",
    "crash",
    "cancelled",
    "fidelity",
    "audit",
    "taken_back",
)


def spend_cause(outcome: str) -> str | None:
    """Which waste an attempt's dollars belong to; None for a usable (ok) row."""
    if outcome == "ok":
        return None
    if outcome in ("truncated", "quarantined", "cancelled", "fidelity", "audit", "taken_back"):
        return outcome
    if outcome == "lost_at_crash":
        return "crash"
    return "retries"


class SpendBreakdown:
    """Useful spend against waste by cause, in the ledger's unit and output tokens."""

    def __init__(self) -> None:
        self.useful = Decimal(0)
        self.useful_tokens = 0
        self.waste: dict[str, Decimal] = dict.fromkeys(WASTE_CAUSES, Decimal(0))
        self.waste_tokens: dict[str, int] = dict.fromkeys(WASTE_CAUSES, 0)

    def add(self, outcome: str, amount: Decimal, tokens: int = 0) -> None:
        cause = spend_cause(outcome)
        if cause is None:
            self.useful += amount
            self.useful_tokens += tokens
        else:
            self.waste[cause] += amount
            self.waste_tokens[cause] += tokens

    @property
    def waste_total(self) -> Decimal:
        return sum(self.waste.values(), Decimal(0))

    @property
    def useful_per_m(self) -> float | None:
        """What a million useful output tokens cost, in the ledger's unit; None before the first."""
        return float(self.useful) / self.useful_tokens * 1e6 if self.useful_tokens else None
