"""Pacing OpenRouter's share so the job finishes by the deadline at the least cost, not flat out.

The job's deadline control (engine/job/deadline_control.py) calls `Pacer.update` every few seconds
with what it measured; the answer, a `PaceDecision`, is OpenRouter's in-flight ceiling and a one-line
reason. The control law, its margin and its smoothing are in docs/fleets.md ("Pacing").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from decimal import Decimal

from regen.engine.durations import duration
from regen.engine.money.fleetplan.plan import FleetPlan, RouteOffer, Work, plan_fleets, tokens, usd


@dataclass(frozen=True, slots=True)
class Facts:
    """What the job measured, on one clock (seconds; the deadline on the same clock)."""

    now: float
    # The work at the start less what each backend has made since; tokens in flight count as left.
    work_left: Work
    gpu_tokens_per_s: float | None  # the GPU fleet's tokens/s over a recent window; None: no sample yet
    request_tokens_per_s: float | None  # OpenRouter's output tokens/s per request in flight; None: no sample
    in_flight: int  # OpenRouter requests in flight now
    # Dollars left: budget - spent (settled). Not less the reservations: the tokens in flight are in
    # work_left, so their cost is planned from this; the ledger's gate still holds their worst case.
    budget_left: Decimal | None  # None: no budget
    deadline: float | None  # the resolved deadline; None: no deadline
    offers: tuple[RouteOffer, ...] = ()  # the allowed providers: their prices and sustainable rates
    # The evidence the verdict rests on (docs/fleets.md, "The verdict"): the rows the work's mean
    # tokens per prompt is measured on, and the rows the GPU fleet has made in this run (None: no
    # GPUs in the job). None for `rows`: a caller that counts none; its rates are taken as measured.
    rows: int | None = None
    gpu_rows: int | None = None
    # The GPU fleet lands nothing with requests in flight (engine/job/stall.py): its rate is zero
    # from now on, outright, and the verdict is judged on the plan as it stands (docs/fleets.md).
    gpu_stalled: bool = False


@dataclass(frozen=True, slots=True)
class PaceDecision:
    """The pacer's answer for one tick."""

    ceiling: int | None  # OpenRouter's in-flight ceiling; 0: idle; None: no limit (flat out)
    reason: str  # one line for the operator
    plan: FleetPlan  # the live plan to the deadline, at the smoothed rates: what the operator sees
    aim: FleetPlan  # the plan the ceiling follows: to the target finish, a margin before the deadline
    openrouter_tokens_per_s: float | None  # the rate the ceiling aims at; None: flat out
    # The verdict: whether the deadline is within reach, changed only on evidence (docs/fleets.md,
    # "The verdict"); `plan.fits` is the live plan's own answer, which follows every noisy sample.
    fits: bool = True


# The least uncertainty a measured rate is given (the verdict's band, docs/fleets.md "The verdict"):
# with many rows the band narrows to this, so a plan within 5% of its edge does not flip the verdict.
BAND_FLOOR = 0.05


def band(rows: int) -> float:
    """The relative uncertainty of a rate or a mean measured on `rows` rows: 1/sqrt(n) (a count's
    relative standard error), at least BAND_FLOOR."""
    return max(BAND_FLOOR, 1.0 / math.sqrt(rows)) if rows > 0 else 1.0


def at_the_end(
    work: Work, gpu: float, offers: tuple[RouteOffer, ...], spread: float, *, hopeful: bool
) -> tuple[Work, float, tuple[RouteOffer, ...]]:
    """The plan's inputs at one end of their uncertainty `spread`: hopeful, the rates that much
    faster and the work that much smaller; else the rates slower and the work larger."""
    rate = 1.0 + spread if hopeful else max(0.0, 1.0 - spread)
    size = max(0.0, 1.0 - spread) if hopeful else 1.0 + spread
    bounded = Work(math.ceil(work.output_tokens * size), work.prompts, math.ceil(work.prompt_tokens * size))
    routes = tuple(
        RouteOffer(o.price, None if o.tokens_per_s is None else o.tokens_per_s * rate) for o in offers
    )
    return bounded, gpu * rate, routes


class Pacer:
    """OpenRouter's in-flight ceiling from measured rates: deterministic, fed one tick at a time."""

    def __init__(
        self,
        max_in_flight: int,
        *,
        gpu_tokens_per_s: float | None = None,
        request_tokens_per_s: float = 30.0,
        smoothing_s: float = 60.0,
        margin: float = 0.05,
        deadband: float = 0.05,
    ) -> None:
        """`gpu_tokens_per_s` and `request_tokens_per_s` are the settings used until there are samples;
        `smoothing_s` the time constant of the rate averages, `margin` the share of the time left the
        target finish sits before the deadline, `deadband` the relative change a new ceiling must make."""
        if max_in_flight < 0 or request_tokens_per_s <= 0 or smoothing_s <= 0:
            raise ValueError("max_in_flight >= 0, request_tokens_per_s > 0 and smoothing_s > 0")
        if not 0 <= margin < 1 or deadband < 0:
            raise ValueError("0 <= margin < 1 and deadband >= 0")
        self.max_in_flight = max_in_flight
        self.smoothing_s = smoothing_s
        self.margin = margin
        self.deadband = deadband
        self._gpu: float | None = gpu_tokens_per_s
        self._gpu_sampled = False
        self._request = request_tokens_per_s
        self._request_sampled = False
        self._last_now: float | None = None
        self._stalled = False
        self.ceiling: int | None = None
        self.last: PaceDecision | None = None
        # The verdict standing (docs/fleets.md, "The verdict"); None: none yet, the next plan's is taken.
        self.verdict: bool | None = None

    @property
    def gpu_tokens_per_s(self) -> float:
        """The smoothed GPU rate the pacer plans with."""
        return self._gpu or 0.0

    @property
    def request_tokens_per_s(self) -> float:
        """The smoothed per-request OpenRouter rate the pacer plans with."""
        return self._request

    def _smooth(self, facts: Facts) -> None:
        step = 0.0 if self._last_now is None else max(0.0, facts.now - self._last_now)
        self._last_now = facts.now
        weight = 1.0 - math.exp(-step / self.smoothing_s)
        if facts.gpu_stalled:
            # Silence is a fact, not noise: not averaged in. The first sample after it replaces it.
            self._gpu, self._gpu_sampled = 0.0, False
        elif facts.gpu_tokens_per_s is not None:
            sample = max(0.0, facts.gpu_tokens_per_s)
            if not self._gpu_sampled or self._gpu is None:
                self._gpu, self._gpu_sampled = sample, True
            else:
                self._gpu += weight * (sample - self._gpu)
        # A per-request rate means something only with requests in flight to measure it on.
        if facts.request_tokens_per_s is not None and facts.request_tokens_per_s > 0 and facts.in_flight > 0:
            sample = facts.request_tokens_per_s
            if not self._request_sampled:
                self._request, self._request_sampled = sample, True
            else:
                self._request += weight * (sample - self._request)

    def update(self, facts: Facts) -> PaceDecision:
        """The ceiling for the next few seconds, per docs/fleets.md ("Pacing")."""
        self._smooth(facts)
        decision = self._decide(facts)
        decision = replace(decision, fits=self._judge(facts, decision.plan))
        self.ceiling = decision.ceiling
        self.last = decision
        return decision

    def _judge(self, facts: Facts, live: FleetPlan) -> bool:
        """The verdict: the live plan's, but changed only on evidence (docs/fleets.md, "The verdict").
        Until the first rows (the GPUs' among them) there is none; after, the live plan must hold
        at the far end of the rates' and the work's uncertainty: a verdict of "fits" falls only when
        even the hopeful end does not fit, and "cannot" lifts only when even the doubtful end fits."""
        standing = self.verdict
        turned = facts.gpu_stalled != self._stalled
        self._stalled = facts.gpu_stalled
        if (
            standing is None
            or turned  # a fleet stalled or answering again: a fact, judged at once
            or facts.gpu_stalled  # while it lasts the plan rests on no measurement to doubt
            or facts.deadline is None
            or facts.deadline <= facts.now
            or facts.work_left.output_tokens <= 0
        ):
            self.verdict = live.fits
            return live.fits
        if live.fits == standing:
            return standing
        evidence = [n for n in (facts.rows, facts.gpu_rows) if n is not None]
        if any(n <= 0 for n in evidence):
            return standing  # nothing measured yet: the settings' plan stands
        spread = band(min(evidence)) if evidence else BAND_FLOOR
        work, gpu, offers = at_the_end(
            facts.work_left, self.gpu_tokens_per_s, facts.offers, spread, hopeful=standing
        )
        if plan_fleets(work, facts.deadline - facts.now, gpu, offers, facts.budget_left).fits == standing:
            return standing  # within the uncertainty: not yet a real change
        self.verdict = live.fits
        return live.fits

    def _decide(self, facts: Facts) -> PaceDecision:
        work, gpu, offers = facts.work_left, self.gpu_tokens_per_s, facts.offers
        if facts.deadline is None:
            live = plan_fleets(work, None, gpu, offers, facts.budget_left)
            return PaceDecision(None, "no deadline: both fleets flat out, GPUs first", live, live, None)
        time_left = facts.deadline - facts.now
        if work.output_tokens <= 0:
            live = plan_fleets(work, max(0.0, time_left), gpu, offers, facts.budget_left)
            return PaceDecision(0, "nothing left to make: OpenRouter idle", live, live, 0.0)
        if time_left <= 0:
            live = plan_fleets(work, 0.0, gpu, offers, facts.budget_left)
            return PaceDecision(
                self.max_in_flight,
                f"deadline passed: OpenRouter flat out ({self.max_in_flight} in flight) within the budget",
                live,
                live,
                None,
            )
        shown = plan_fleets(work, time_left, gpu, offers, facts.budget_left)
        # Aim a little before the deadline; the lead shrinks with the time left, so the run lands on it.
        # When the money or the rates leave no room for the lead, aim at the deadline itself.
        aim_s = time_left * (1.0 - self.margin)
        aim = plan_fleets(work, aim_s, gpu, offers, facts.budget_left)
        if not aim.fits and shown.fits:
            aim, aim_s = shown, time_left
        if aim.openrouter_tokens <= 0:
            return PaceDecision(
                0, self._moved(0, "GPUs alone make the deadline: OpenRouter idle"), shown, aim, 0.0
            )
        if not aim.reachable:
            note = f"deadline cannot be met at OpenRouter's rates: flat out; {_out(shown)}"
            return PaceDecision(self.max_in_flight, self._moved(self.max_in_flight, note), shown, aim, None)
        # Over the budget, what the budget buys is spread to the deadline: the most work done by then.
        carry = aim.openrouter_tokens if aim.affordable else aim.tokens_by_deadline - aim.gpu_tokens
        rate = carry / aim_s
        wanted = min(self.max_in_flight, math.ceil(rate / self.request_tokens_per_s))
        ceiling = self._damped(wanted)
        detail = f"{rate:,.0f} tokens/s for {tokens(carry)} by the deadline in {duration(time_left, 'fine')}"
        if aim.affordable:
            note = self._moved(ceiling, detail, direction=True)
        else:
            spend = aim.budget_left if aim.budget_left is not None else Decimal(0)
            note = self._moved(
                ceiling,
                f"deadline cannot be met within the budget: OpenRouter spends the {usd(spend)} left, "
                f"{detail}; {_out(shown)}",
            )
        return PaceDecision(ceiling, note, shown, aim, rate)

    def _damped(self, wanted: int) -> int:
        """The new ceiling, unless it is within the deadband of the current one (noise, not news)."""
        current = self.ceiling
        if current is None or wanted == 0 or current == 0:
            return wanted
        if abs(wanted - current) < self.deadband * current:
            return current
        return wanted

    def _moved(self, ceiling: int, note: str, direction: bool = False) -> str:
        current = self.ceiling
        if direction:
            if current is None or current == ceiling:
                return f"on track: OpenRouter {ceiling} in flight, {note}"
            side = "GPUs ahead" if ceiling < current else "GPUs behind"
            return f"{side}: OpenRouter {current} -> {ceiling} in flight, {note}"
        if current is None or current == ceiling:
            return f"{note} ({ceiling} in flight)"
        return f"{note} (OpenRouter {current} -> {ceiling} in flight)"


def verdict_words(fits: bool, plan: FleetPlan, eta_s: float | None, time_left_s: float | None) -> str:
    """The verdict as the operator reads it beside the plan's figures (docs/fleets.md, "The verdict"):
    never "fits" next to a cost over the budget left or an ETA past the deadline. A verdict of "fits"
    standing while the live figures say otherwise (within their uncertainty) is "at risk" and says
    which figure; "cannot" says why."""
    late = eta_s is not None and time_left_s is not None and time_left_s > 0 and eta_s > time_left_s
    if fits:
        if not plan.affordable:
            return "at risk: over the budget"
        if not plan.reachable:
            return "at risk: too slow"
        return "at risk: ETA past the deadline" if late else "fits"
    if not plan.reachable:
        return "too slow"
    if not plan.affordable:
        return "over the budget"
    # The verdict waits for evidence: the plan may fit before it says so.
    return "not yet within reach"


def _out(live: FleetPlan) -> str:
    if live.earliest_s is None:
        return f"{live.share_by_deadline:.0%} of the work by the deadline; no deadline fits the budget"
    all_of_it = duration(live.earliest_s, "fine")
    return f"{live.share_by_deadline:.0%} of the work by the deadline, all of it in {all_of_it}"
