"""A discrete-time simulation of one job over both fleets, with engine/money/fleetplan's pacer in the loop.

Not the real job: a fluid GPU fleet and whole OpenRouter requests on a simulated clock (no sleeping),
so tests and bench/fleet_plan.py can replay hours in a second. What it models:

- the GPU fleet makes `gpu_rate(t)` tokens/s, times seeded lognormal noise each step;
- OpenRouter requests of `request_tokens` output tokens stream at `request_tokens_per_s` each (noisy
  per request); OpenRouter routes a new request to the cheapest provider with room under its
  concurrency cap (its sustainable rate);
- a request starts only while the in-flight count is under the pacer's ceiling and the ledger's
  gate holds (spent + reserved + its worst case <= budget), as engine/job/dispatch.py's does;
- lowering the ceiling cancels nothing: requests above it drain as they finish;
- the pacer is fed every `tick_s` with the rates measured over the last `window_s`.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal

from regen.engine.money.fleetplan import RouteOffer, Work
from regen.engine.money.fleetplan.pacing import Facts, Pacer
from regen.engine.money.ledger import PER_MILLION, RoutePrice


@dataclass(frozen=True)
class SimProvider:
    route: str
    usd_per_m: Decimal
    max_in_flight: int | None  # its concurrency cap; None: none


@dataclass
class _Request:
    """An OpenRouter request in flight; settled (billed) at its end."""

    route: str
    left: int  # tokens still to stream
    done: int  # tokens streamed
    rate: float  # its tokens/s


@dataclass
class SimResult:
    finished_s: float | None  # when the last token was made; None: not within the run's limit
    spent: Decimal
    gpu_tokens: int
    openrouter_tokens: int
    by_provider: dict[str, int]
    ceilings: list[tuple[float, int | None]]  # (time, ceiling) at each tick
    max_spent_over_budget: Decimal  # the largest spent + reserved - budget seen (<= 0: never over)
    reasons: list[str] = field(default_factory=list)
    made_at_record: int | None = None  # tokens made by `record_at`
    # At each tick: (time, the live plan's fits, the pacer's verdict), docs/fleets.md "The verdict".
    verdicts: list[tuple[float, bool, bool]] = field(default_factory=list)


@dataclass
class Sim:
    work_tokens: int
    deadline_s: float | None
    budget: Decimal | None
    providers: list[SimProvider]
    gpu_rate: Callable[[float], float]
    request_tokens: int = 1_000
    request_tokens_per_s: float = 30.0
    max_in_flight: int = 200
    noise: float = 0.10
    dt_s: float = 5.0
    tick_s: float = 5.0
    window_s: float = 60.0
    seed: int = 1
    pacer: Pacer | None = None  # None: no pacer, OpenRouter flat out at max_in_flight
    limit_s: float = 10 * 86_400.0
    record_at: float | None = None  # when to note the tokens made so far (e.g. at the deadline)

    def sustainable(self) -> list[RouteOffer]:
        """The providers as the plan sees them: price and cap x per-request rate."""
        return [
            RouteOffer(
                RoutePrice(p.route, Decimal(0), p.usd_per_m / PER_MILLION),
                None if p.max_in_flight is None else p.max_in_flight * self.request_tokens_per_s,
            )
            for p in self.providers
        ]

    def run(self) -> SimResult:
        rng = random.Random(self.seed)
        prices = {p.route: p.usd_per_m / PER_MILLION for p in self.providers}
        dearest = max(prices.values(), default=Decimal(0))
        order = sorted(self.providers, key=lambda p: (p.usd_per_m, p.route))
        offers = tuple(self.sustainable())
        flying: list[_Request] = []
        undispatched = self.work_tokens
        gpu_made = or_made = 0
        spent = Decimal(0)
        worst_over = Decimal("-Infinity")
        by_provider = {p.route: 0 for p in self.providers}
        gpu_window: deque[tuple[float, int]] = deque()
        or_window: deque[tuple[float, int, int]] = deque()  # (time, tokens streamed, in flight)
        ceiling: int | None = self.max_in_flight if self.pacer is None else None
        ceilings: list[tuple[float, int | None]] = []
        reasons: list[str] = []
        verdicts: list[tuple[float, bool, bool]] = []
        gpu_carry = 0.0
        t, next_tick = 0.0, 0.0
        made_at: int | None = None
        while t < self.limit_s:
            if self.record_at is not None and made_at is None and t >= self.record_at:
                made_at = gpu_made + or_made
            if t >= next_tick:
                next_tick += self.tick_s
                if self.pacer is not None:
                    decision = self.pacer.update(
                        self._facts(
                            t,
                            gpu_made,
                            or_made,
                            gpu_window,
                            or_window,
                            len(flying),
                            spent,
                            flying,
                            dearest,
                            offers,
                        )
                    )
                    ceiling = decision.ceiling
                    reasons.append(decision.reason)
                    verdicts.append((t, decision.plan.fits, decision.fits))
                ceilings.append((t, ceiling))
            # Dispatch up to the ceiling, through the ledger's gate, cheapest provider with room.
            limit = self.max_in_flight if ceiling is None else min(ceiling, self.max_in_flight)
            while len(flying) < limit and undispatched > 0:
                reserved = self._reserved(flying, dearest)
                size = min(self.request_tokens, undispatched)
                if self.budget is not None and spent + reserved + size * dearest > self.budget:
                    break
                route = self._route(order, flying)
                if route is None:
                    break
                rate = self.request_tokens_per_s * math.exp(rng.gauss(0.0, self.noise))
                flying.append(_Request(route, size, 0, rate))
                undispatched -= size
            # The GPUs take from the same queue.
            gpu_carry += self.gpu_rate(t) * math.exp(rng.gauss(0.0, self.noise)) * self.dt_s
            made = min(undispatched, int(gpu_carry))
            gpu_carry -= int(gpu_carry)
            undispatched -= made
            gpu_made += made
            gpu_window.append((t, made))
            streamed = 0
            still: list[_Request] = []
            for request in flying:
                step = min(request.left, max(1, round(request.rate * self.dt_s)))
                request.left, request.done = request.left - step, request.done + step
                streamed += step
                if request.left == 0:
                    cost = Decimal(request.done) * prices[request.route]
                    spent += cost
                    by_provider[request.route] += request.done
                else:
                    still.append(request)
            or_made += streamed
            or_window.append((t, streamed, len(flying)))
            flying = still
            if self.budget is not None:
                reserved = self._reserved(flying, dearest)
                worst_over = max(worst_over, spent + reserved - self.budget)
            t += self.dt_s
            while gpu_window and gpu_window[0][0] <= t - self.window_s:
                gpu_window.popleft()
            while or_window and or_window[0][0] <= t - self.window_s:
                or_window.popleft()
            if undispatched == 0 and not flying:
                if self.record_at is not None and made_at is None:
                    made_at = gpu_made + or_made
                return SimResult(
                    t, spent, gpu_made, or_made, by_provider, ceilings, worst_over, reasons, made_at, verdicts
                )
        return SimResult(
            None, spent, gpu_made, or_made, by_provider, ceilings, worst_over, reasons, made_at, verdicts
        )

    @staticmethod
    def _reserved(flying: list[_Request], dearest: Decimal) -> Decimal:
        """Each request in flight holds its worst case until it settles: its whole size at the dearest price."""
        return sum((Decimal(r.left + r.done) * dearest for r in flying), Decimal(0))

    def _route(self, order: list[SimProvider], flying: list[_Request]) -> str | None:
        for provider in order:
            busy = sum(1 for r in flying if r.route == provider.route)
            if provider.max_in_flight is None or busy < provider.max_in_flight:
                return provider.route
        return None

    def _facts(
        self,
        t: float,
        gpu_made: int,
        or_made: int,
        gpu_window: deque[tuple[float, int]],
        or_window: deque[tuple[float, int, int]],
        in_flight: int,
        spent: Decimal,
        flying: list[_Request],
        dearest: Decimal,
        offers: tuple[RouteOffer, ...],
    ) -> Facts:
        span = len(gpu_window) * self.dt_s
        gpu_rate = sum(m for _, m in gpu_window) / span if span else None
        busy = sum(n for _, _, n in or_window) * self.dt_s  # request-seconds in the window
        per_request = sum(s for _, s, _ in or_window) / busy if busy else None
        budget_left = None if self.budget is None else self.budget - spent
        left = self.work_tokens - gpu_made - or_made
        return Facts(
            now=t,
            work_left=Work(left, math.ceil(left / self.request_tokens), 0),
            gpu_tokens_per_s=gpu_rate,
            request_tokens_per_s=per_request,
            in_flight=in_flight,
            budget_left=budget_left,
            deadline=self.deadline_s,
            offers=offers,
            # A row per request's worth of tokens: the evidence the verdict waits for.
            rows=(gpu_made + or_made) // self.request_tokens,
            gpu_rows=gpu_made // self.request_tokens,
        )
