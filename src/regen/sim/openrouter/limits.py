"""Admission bookkeeping: the in-flight spending budget, free-model request counts and per-provider
token buckets (docs/openrouter.md §6.5, §7.3, §13.9, §13.10, §13.24).

Each structure is plain state plus a clock, so the server decides *when* to ask and these decide
*what* the answer is; every limit reads the live config per request, like the rest of the simulator.
All three are off unless their config switch is set.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from regen.sim.openrouter import refusals
from regen.sim.openrouter.catalog import SimEndpoint, SimModel
from regen.sim.openrouter.config import SimConfig
from regen.sim.openrouter.routing import matches

_MINUTE_S = 60.0
_DAY_S = 86400
_FREE_CREDITS_THRESHOLD = 10.0  # FREE_MODEL_CREDITS_THRESHOLD, USD ever bought


@dataclass(slots=True)
class Refusal:
    """A request turned away before routing commits: what goes on the wire, and a label for tests."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    label: str = ""


def preflight_estimate(
    model: SimModel, ep: SimEndpoint, prompt_tokens: int, max_tokens: int | None
) -> tuple[int, float, float]:
    """(completion tokens assumed, prompt-side cost, completion price per token) of §13.8: without
    max_tokens the endpoint's or the model's maximum output is assumed, as OpenRouter does."""
    wanted = max_tokens or ep.max_completion_tokens or model.default_max_completion_tokens
    prompt_cost = float(ep.pricing.prompt) * prompt_tokens + float(ep.pricing.request)
    return wanted, prompt_cost, float(ep.pricing.completion)


@dataclass(slots=True)
class Hold:
    amount: float
    done: bool = False


class InFlightBudget:
    """Running holds at their estimates plus settling holds at their real cost, until they expire.

    Totals are kept incrementally (2000 requests in flight must not mean a 2000-term sum per
    request) and snapped back to zero whenever nothing is held, so float drift cannot accumulate.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.running = 0
        self._running_total = 0.0
        self._settling: list[tuple[float, int, float]] = []  # (expires, seq, cost), a heap
        self._settling_total = 0.0
        self._seq = 0

    def _expire(self) -> None:
        now = self._clock()
        while self._settling and self._settling[0][0] <= now:
            self._settling_total -= heapq.heappop(self._settling)[2]
        if not self._settling:
            self._settling_total = 0.0

    @property
    def held(self) -> float:
        self._expire()
        return max(0.0, self._running_total + self._settling_total)

    @property
    def settling(self) -> int:
        self._expire()
        return len(self._settling)

    def hold(self, amount: float) -> Hold:
        self.running += 1
        self._running_total += amount
        return Hold(amount)

    def _unhold(self, hold: Hold) -> None:
        hold.done = True
        self.running -= 1
        self._running_total -= hold.amount
        if self.running == 0:
            self._running_total = 0.0

    def settle(self, hold: Hold, cost: float, window_s: float) -> None:
        """The request ended and was billed `cost`: that replaces its estimate for `window_s`."""
        if hold.done:
            return
        self._unhold(hold)
        if window_s > 0 and cost > 0:
            self._seq += 1
            heapq.heappush(self._settling, (self._clock() + window_s, self._seq, cost))
            self._settling_total += cost

    def release(self, hold: Hold) -> None:
        """The request ended unbilled (refused upstream, reset): nothing is left to settle."""
        if not hold.done:
            self._unhold(hold)

    def retry_after(self, fallback_s: int) -> int:
        """Seconds until the earliest settling hold expires; with only running holds, the fallback."""
        self._expire()
        if not self._settling:
            return max(1, fallback_s)
        return max(1, math.ceil(self._settling[0][0] - self._clock()))


class FreeModelCounter:
    """Requests admitted to `:free` variants: a sliding minute and a UTC calendar day."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._minute: deque[float] = deque()
        self._day = -1
        self.day_count = 0

    def _roll(self, now: float) -> None:
        while self._minute and self._minute[0] <= now - _MINUTE_S:
            self._minute.popleft()
        day = int(now // _DAY_S)
        if day != self._day:
            self._day, self.day_count = day, 0

    def admit(self, rpm: int, rpd: int) -> tuple[str, int, int] | None:
        """Count the request, or say which limit refuses it: ("min"|"day", limit, reset epoch ms).

        Refused requests are not counted, so a client that waits for the reset gets through.
        """
        now = self._clock()
        self._roll(now)
        if self.day_count >= rpd:
            return "day", rpd, (self._day + 1) * _DAY_S * 1000
        if len(self._minute) >= rpm:
            return "min", rpm, int((self._minute[0] + _MINUTE_S) * 1000)
        self._minute.append(now)
        self.day_count += 1
        return None

    def used_today(self) -> int:
        self._roll(self._clock())
        return self.day_count


class ProviderBuckets:
    """One token bucket per (model, endpoint tag): a provider's capacity for a model's deployment."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[tuple[str, str], list[float]] = {}  # key -> [tokens, last refill]
        self.refused: Counter[str] = Counter()  # by endpoint tag

    def take(self, key: tuple[str, str], rate: float, burst_s: float) -> float:
        """0.0 when a request may go; otherwise the seconds until the bucket holds one token."""
        now = self._clock()
        depth = max(1.0, rate * burst_s)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = [depth, now]
        tokens = min(depth, bucket[0] + (now - bucket[1]) * rate)
        bucket[1] = now
        if tokens >= 1.0:
            bucket[0] = tokens - 1.0
            return 0.0
        bucket[0] = tokens
        self.refused[key[1]] += 1
        return (1.0 - tokens) / rate


def provider_rate(ep: SimEndpoint, rates: dict[str, float]) -> float | None:
    """The configured requests/s for an endpoint; later matching keys win, as in endpoint_overrides."""
    found: float | None = None
    for name, rate in rates.items():
        if matches(ep, name):
            found = float(rate)
    return found


class Limits:
    """The simulator's admission checks, reading the live config on every call."""

    def __init__(self, config: Callable[[], SimConfig]) -> None:
        self._config = config
        self.budget = InFlightBudget()
        self.free = FreeModelCounter()
        self.buckets = ProviderBuckets()

    def free_daily_limit(self) -> int:
        cfg = self._config()
        bought = cfg.free_model_credits_bought
        if bought is None:
            bought = cfg.credits >= _FREE_CREDITS_THRESHOLD
        return cfg.free_model_rpd_with_credits if bought else cfg.free_model_rpd_no_credits

    def admit_free(self) -> Refusal | None:
        """§7.3: the platform limits of `:free` variants, when switched on."""
        cfg = self._config()
        if not cfg.free_model_limits:
            return None
        refused = self.free.admit(cfg.free_model_rpm, self.free_daily_limit())
        if refused is None:
            return None
        which, limit, reset_ms = refused
        body, headers = refusals.free_model_limited(
            which, limit, reset_ms, cfg.user_id, retry_after=cfg.free_model_retry_after
        )
        return Refusal(429, body, headers, f"free_model_per_{which}")

    def admit_budget(self, estimate: float, balance: float) -> tuple[Refusal | None, Hold | None]:
        """§6.5 item 2: hold `estimate` if the budget has room. Callers skip free and BYOK requests,
        which the in-flight budget does not cover."""
        cfg = self._config()
        if not cfg.in_flight_budget:
            return None, None
        threshold = cfg.in_flight_balance_threshold
        if threshold is not None and balance >= threshold:
            return None, None
        budget = min(cfg.in_flight_budget_fraction * max(balance, 0.0), cfg.in_flight_budget_ceiling)
        if estimate > budget:
            body = refusals.weight_exceeds_budget(estimate, budget)
            return Refusal(402, body, {}, "weight_exceeds_budget"), None
        if self.budget.held + estimate > budget:
            headers = {"Retry-After": str(self.budget.retry_after(cfg.retry_after_s))}
            return Refusal(402, refusals.in_flight_exhausted(), headers, "in_flight_budget_exhausted"), None
        return None, self.budget.hold(estimate)

    def settle(self, hold: Hold | None, cost: float) -> None:
        if hold is not None:
            self.budget.settle(hold, cost, self._config().in_flight_settlement_s)

    def release(self, hold: Hold | None) -> None:
        if hold is not None:
            self.budget.release(hold)

    def take_provider(self, model: SimModel, ep: SimEndpoint) -> float:
        """0.0 when the endpoint accepts one more request now; else seconds until it would."""
        cfg = self._config()
        if not cfg.provider_rate_limits:
            return 0.0
        rate = provider_rate(ep, cfg.provider_rate_limits)
        if rate is None:
            return 0.0
        return self.buckets.take((model.id, ep.tag), rate, cfg.provider_rate_burst_s)

    def summary(self) -> dict[str, Any]:
        return {
            "in_flight_held": self.budget.held,
            "in_flight_holds_running": self.budget.running,
            "in_flight_holds_settling": self.budget.settling,
            "free_requests_today": self.free.used_today(),
            "provider_rate_refusals": dict(self.buckets.refused),
        }
