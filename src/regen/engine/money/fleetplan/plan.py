"""The two-fleet plan: GPUs first, OpenRouter for what they cannot make by the deadline, cheapest first.

Pure arithmetic on the work left, the time left and the measured (or configured) rates; the rules and
the proof that the greedy split is the cheapest are in docs/fleets.md ("The plan").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from decimal import ROUND_FLOOR, Decimal

from regen.engine.durations import duration
from regen.engine.money.ledger import RoutePrice
from regen.engine.money.planner import DatasetNeed, cost_of
from regen.engine.schema import FleetPlanView, ShareView

TOKENS_MAX = 10**15  # more output tokens than any job makes: where a capacity saturates


@dataclass(frozen=True, slots=True)
class Work:
    """The work left, summed over the datasets: what both fleets still have to make."""

    output_tokens: int
    prompts: int = 0
    prompt_tokens: int = 0  # billed by OpenRouter in proportion to the share of the output it makes

    @classmethod
    def of(cls, needs: Sequence[DatasetNeed]) -> Work:
        return cls(
            sum(n.output_tokens for n in needs),
            sum(n.remaining_prompts for n in needs),
            sum(n.prompt_tokens for n in needs),
        )

    def cost(self, price: RoutePrice, tokens: int) -> Decimal:
        """Dollars for `tokens` of this work's output at `price`, its share of the prompt tokens included."""
        # One rule for a share of the work's cost: engine/money/planner.py's, on the work as one need.
        need = DatasetNeed("work", self.prompts, self.output_tokens, self.prompt_tokens)
        return cost_of([need], price, tokens)

    def per_token(self, price: RoutePrice) -> Decimal:
        """The dollars one output token costs at `price`, its prompt share included: the greedy's key."""
        if self.output_tokens <= 0:
            return price.completion
        return price.completion + price.prompt * Decimal(self.prompt_tokens) / Decimal(self.output_tokens)


@dataclass(frozen=True, slots=True)
class RouteOffer:
    """What one allowed OpenRouter provider (a route) offers the plan: its prices and the tokens/s it
    sustains at the allowed concurrency."""

    price: RoutePrice
    tokens_per_s: float | None = None  # None: no known limit

    def capacity(self, seconds: float) -> int | None:
        """Output tokens it can carry in `seconds`; None when unbounded."""
        if self.tokens_per_s is None:
            return None
        return whole_tokens(self.tokens_per_s * max(0.0, seconds))


@dataclass(frozen=True, slots=True)
class Share:
    """What one provider carries in a plan."""

    route: str
    tokens: int
    usd: Decimal
    capacity: int | None  # what it could carry in the time; None: unbounded
    per_million: Decimal  # dollars per million output tokens, prompt share included

    def to_dict(self) -> ShareView:
        return {
            "provider": self.route,
            "tokens": self.tokens,
            "usd": float(self.usd),
            "capacity": self.capacity,
            "per_million": float(self.per_million),
        }


@dataclass(frozen=True, slots=True)
class Split:
    """A greedy fill: the shares, the tokens they carry, what they cost."""

    shares: tuple[Share, ...]
    tokens: int
    usd: Decimal


@dataclass(frozen=True, slots=True)
class FleetPlan:
    """The answer to "can the GPUs make it, what must OpenRouter carry, what does it cost, does it fit"."""

    output_tokens: int
    prompts: int
    time_left_s: float | None  # the deadline's time left; None: no deadline (planned flat out)
    horizon_s: float | None  # the time the plan fills: time_left_s, or the flat-out finish without one
    gpu_tokens_per_s: float
    gpu_alone_finish_s: float | None  # when the GPUs alone would finish; None: no GPU rate
    gpus_alone_meet: bool
    gpu_tokens: int  # what the GPUs make by the horizon
    openrouter_tokens: int  # what OpenRouter must carry by the horizon
    shares: tuple[Share, ...]  # cheapest first
    cost: Decimal
    budget_left: Decimal | None  # None: no budget
    reachable: bool  # the providers' rates can carry openrouter_tokens by the horizon
    affordable: bool  # the cost fits in the budget left
    earliest_s: float | None  # the earliest time left the work can be done in within the budget; None: never
    tokens_by_deadline: int  # what both fleets can make by the horizon within the budget
    share_by_deadline: float  # tokens_by_deadline / output_tokens
    reason: str

    @property
    def fits(self) -> bool:
        return self.reachable and self.affordable

    def to_dict(self) -> FleetPlanView:
        return {
            "output_tokens": self.output_tokens,
            "prompts": self.prompts,
            "time_left_s": self.time_left_s,
            "horizon_s": self.horizon_s,
            "gpu_tokens_per_s": self.gpu_tokens_per_s,
            "gpu_alone_finish_s": self.gpu_alone_finish_s,
            "gpus_alone_meet": self.gpus_alone_meet,
            "gpu_tokens": self.gpu_tokens,
            "openrouter_tokens": self.openrouter_tokens,
            "shares": [share.to_dict() for share in self.shares],
            "cost": float(self.cost),
            "budget_left": None if self.budget_left is None else float(self.budget_left),
            "reachable": self.reachable,
            "affordable": self.affordable,
            "fits": self.fits,
            "earliest_s": self.earliest_s,
            "tokens_by_deadline": self.tokens_by_deadline,
            "share_by_deadline": self.share_by_deadline,
            "reason": self.reason,
        }


def by_price(work: Work, offers: Sequence[RouteOffer]) -> list[RouteOffer]:
    """Cheapest per output token first (prompt share included); ties by route, so plans are deterministic."""
    return sorted(offers, key=lambda p: (work.per_token(p.price), p.price.route))


def fill(
    work: Work, tokens: int, offers: Sequence[RouteOffer], seconds: float, money: Decimal | None = None
) -> Split:
    """Up to `tokens` output tokens, cheapest provider first, each up to its capacity in `seconds`,
    never past `money` (None: no limit). The cheapest way to carry them (docs/fleets.md, "Why cheapest
    first is optimal"), and with money binding, the most tokens the money buys."""
    shares: list[Share] = []
    left, spent = tokens, Decimal(0)
    for offer in by_price(work, offers):
        capacity = offer.capacity(seconds)
        take = left if capacity is None else min(left, capacity)
        unit = work.per_token(offer.price)
        if money is not None and take > 0:
            purse = money - spent
            most = take
            if unit > 0:
                take = min(take, int((purse / unit).to_integral_value(ROUND_FLOOR)))
            # The division above rounds (either way: the unit price is itself rounded); the cost is the rule.
            while take > 0 and work.cost(offer.price, take) > purse:
                take -= 1
            while take < most and work.cost(offer.price, take + 1) <= purse:
                take += 1
        usd = work.cost(offer.price, take) if take > 0 else Decimal(0)
        shares.append(Share(offer.price.route, take, usd, capacity, unit * 1_000_000))
        left -= take
        spent += usd
    return Split(tuple(shares), tokens - left, spent)


def flat_out_seconds(work: Work, gpu_tokens_per_s: float, offers: Sequence[RouteOffer]) -> float | None:
    """When both fleets flat out finish the work, from the known rates (a provider without one does not
    shorten it: it takes what the others cannot carry); 0 when only such providers are left; None with
    no fleet at all."""
    if work.output_tokens <= 0:
        return 0.0
    rate = gpu_tokens_per_s + sum(p.tokens_per_s or 0.0 for p in offers)
    if rate > 0 and math.isfinite(work.output_tokens / rate):
        return work.output_tokens / rate
    return 0.0 if any(p.tokens_per_s is None for p in offers) else None


def gpu_share(work: Work, gpu_tokens_per_s: float, seconds: float) -> int:
    return whole_tokens(gpu_tokens_per_s * max(0.0, seconds), work.output_tokens)


def whole_tokens(amount: float, most: int | None = None) -> int:
    """floor(amount) as tokens, at most `most`; huge or infinite amounts (a rate x a long time) saturate."""
    limit = float(TOKENS_MAX if most is None else most)
    if not amount > 0:
        return 0
    return int(limit) if amount >= limit else math.floor(amount)


def _covers(work: Work, gpu_tokens_per_s: float, offers: Sequence[RouteOffer], seconds: float) -> bool:
    """Whether both fleets' capacities in `seconds` carry the whole work, money aside."""
    need = work.output_tokens - gpu_share(work, gpu_tokens_per_s, seconds)
    return fill(work, need, offers, seconds).tokens == need


def _meets(
    work: Work, gpu_tokens_per_s: float, offers: Sequence[RouteOffer], seconds: float, budget: Decimal | None
) -> bool:
    need = work.output_tokens - gpu_share(work, gpu_tokens_per_s, seconds)
    split = fill(work, need, offers, seconds)
    return split.tokens == need and (budget is None or split.usd <= budget)


def earliest_seconds(
    work: Work, gpu_tokens_per_s: float, offers: Sequence[RouteOffer], budget: Decimal | None
) -> float | None:
    """The least time left in which both fleets finish the work within the budget (to the second); None: never.

    Meeting is monotone in the time (more time: fewer tokens to buy, more capacity at the cheap
    providers), so bisection finds the edge."""
    if work.output_tokens <= 0:
        return 0.0
    # An upper end that fits, if any: the cheapest useful provider carrying everything (the least cost
    # OpenRouter can reach), else the GPUs alone (for nothing).
    ends: list[float] = []
    useful = [p for p in by_price(work, offers) if p.tokens_per_s is None or p.tokens_per_s > 0]
    if useful:
        rate = useful[0].tokens_per_s
        ends.append(0.0 if rate is None else work.output_tokens / rate)
    if gpu_tokens_per_s > 0:
        ends.append(work.output_tokens / gpu_tokens_per_s)
    fitting = [
        e for e in ends if math.isfinite(e) and _meets(work, gpu_tokens_per_s, offers, math.ceil(e), budget)
    ]
    if not fitting:
        return None
    high = math.ceil(min(fitting))
    low = 0
    if _meets(work, gpu_tokens_per_s, offers, low, budget):
        return 0.0
    while high - low > 1:
        middle = (low + high) // 2
        if _meets(work, gpu_tokens_per_s, offers, middle, budget):
            high = middle
        else:
            low = middle
    return float(high)


def plan_fleets(
    work: Work,
    time_left_s: float | None,
    gpu_tokens_per_s: float | None,
    offers: Sequence[RouteOffer],
    budget_left: Decimal | None,
) -> FleetPlan:
    """The plan for `work` with `time_left_s` to the deadline (None: none), per docs/fleets.md."""
    gpu = max(0.0, gpu_tokens_per_s or 0.0)
    total = work.output_tokens
    alone = (total / gpu if gpu > 0 and math.isfinite(total / gpu) else None) if total > 0 else 0.0
    horizon = flat_out_seconds(work, gpu, offers) if time_left_s is None else max(0.0, time_left_s)
    if time_left_s is None and horizon is not None:
        # To the second above, as earliest_s: each fleet's share is floored to whole tokens, so at
        # the exact flat-out finish they would fall a few tokens short of a plan that must fit.
        horizon = float(math.ceil(horizon))
        for _ in range(64):  # a second adds a token per fleet at any rate above 1 token/s
            if _covers(work, gpu, offers, horizon):
                break
            horizon += 1.0
    seconds = 0.0 if horizon is None else horizon
    gpu_tokens = gpu_share(work, gpu, seconds) if horizon is not None else 0
    need = total - gpu_tokens
    split = fill(work, need, offers, seconds)
    reachable = horizon is not None and split.tokens == need
    affordable = budget_left is None or split.usd <= budget_left
    earliest = earliest_seconds(work, gpu, offers, budget_left)
    if reachable and affordable:
        done = total
    else:
        bought = fill(work, need, offers, seconds, budget_left)
        done = gpu_tokens + bought.tokens
    meet = time_left_s is not None and alone is not None and alone <= time_left_s
    result = FleetPlan(
        output_tokens=total,
        prompts=work.prompts,
        time_left_s=time_left_s,
        horizon_s=horizon,
        gpu_tokens_per_s=gpu,
        gpu_alone_finish_s=alone,
        gpus_alone_meet=meet,
        gpu_tokens=gpu_tokens,
        openrouter_tokens=need,
        shares=split.shares,
        cost=split.usd,
        budget_left=budget_left,
        reachable=reachable,
        affordable=affordable,
        earliest_s=earliest,
        tokens_by_deadline=done,
        share_by_deadline=done / total if total > 0 else 1.0,
        reason="",
    )
    return _with_reason(result, split)


def _with_reason(p: FleetPlan, split: Split) -> FleetPlan:
    return replace(p, reason=explain(p, split.tokens))


def explain(p: FleetPlan, carried: int) -> str:
    """The plan in one line for the operator."""
    if p.output_tokens <= 0:
        return "nothing left to make"
    money = "" if p.budget_left is None else f", budget left {usd(p.budget_left)}"
    if p.time_left_s is None:
        if p.horizon_s is None:
            return "no deadline, and no GPU rate or OpenRouter provider to make the work with"
        head = "no deadline: both fleets flat out, GPUs first, done in about " + duration(p.horizon_s, "fine")
        if p.openrouter_tokens == 0:
            return head
        if not p.affordable:
            return (
                f"{head}; OpenRouter's {tokens(p.openrouter_tokens)} would cost {usd(p.cost)}{money}: "
                f"the budget buys {p.share_by_deadline:.0%} of the work"
            )
        return f"{head}; OpenRouter carries {tokens(p.openrouter_tokens)} for {usd(p.cost)}{money}"
    if p.gpus_alone_meet:
        return (
            f"the GPUs alone finish in {duration(p.gpu_alone_finish_s or 0.0, 'fine')}, within the deadline "
            f"({duration(p.time_left_s, 'fine')}): OpenRouter not needed"
        )
    head = (
        f"the GPUs make {tokens(p.gpu_tokens)} of {tokens(p.output_tokens)} by the deadline "
        f"({duration(p.time_left_s, 'fine')}); OpenRouter must carry {tokens(p.openrouter_tokens)}"
    )
    if p.fits:
        return f"{head} for {usd(p.cost)}{money}: fits"
    outs = []
    if p.earliest_s is not None:
        outs.append(f"the earliest deadline that fits is {duration(p.earliest_s, 'fine')} from now")
    else:
        outs.append("no deadline fits the budget")
    outs.append(f"by this deadline {p.share_by_deadline:.0%} of the work")
    if not p.reachable:
        return f"{head} but its providers' rates carry only {tokens(carried)} in the time; " + ", ".join(outs)
    left = "" if p.budget_left is None else f" left {usd(p.budget_left)}"
    return f"{head} for {usd(p.cost)}, over the budget{left}; " + ", ".join(outs)


def tokens(n: int) -> str:
    if abs(n) >= 1_000_000:
        return f"{n / 1_000_000:.1f}M tokens"
    if abs(n) >= 1_000:
        return f"{n / 1_000:.1f}k tokens"
    return f"{n} tokens"


def usd(amount: Decimal) -> str:
    return f"${amount:,.2f}"
