"""Folded statistics: rates over a sliding window, counters per provider and per error class.

The job folds every settled attempt in here; snapshots read the folds a few times a second, so
no consumer ever sees one event per token or per response.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any


class RateMeter:
    """Sums per whole second over the last `window_s` seconds."""

    def __init__(self, window_s: int = 30) -> None:
        self.window_s = window_s
        self._buckets: deque[list[float]] = deque()  # [second, amount]

    def add(self, amount: float, now: float | None = None) -> None:
        second = float(int(time.monotonic() if now is None else now))
        if self._buckets and self._buckets[-1][0] == second:
            self._buckets[-1][1] += amount
        else:
            self._buckets.append([second, amount])
            self._trim(second)

    def _trim(self, now_second: float) -> None:
        while self._buckets and self._buckets[0][0] <= now_second - self.window_s:
            self._buckets.popleft()

    def rate(self, now: float | None = None, started: float | None = None) -> float:
        """Per-second rate over the window (or since `started` when the job is younger)."""
        now = time.monotonic() if now is None else now
        self._trim(float(int(now)))
        total = sum(amount for _, amount in self._buckets)
        span = float(self.window_s)
        if started is not None:
            span = min(span, max(now - started, 1.0))
        return total / span


def percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


@dataclass(slots=True)
class ProviderStats:
    """What one upstream provider did in this run."""

    name: str
    requests: int = 0
    ok: int = 0
    in_flight: int = 0
    output_tokens: int = 0
    spent: Decimal = Decimal(0)
    errors: Counter[str] = field(default_factory=Counter)
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=512))
    ttfts: deque[float] = field(default_factory=lambda: deque(maxlen=512))

    def view(self, total_requests: int) -> dict[str, Any]:
        lat = sorted(self.latencies)
        ttft = sorted(self.ttfts)
        return {
            "name": self.name,
            "requests": self.requests,
            "ok": self.ok,
            "share": self.requests / total_requests if total_requests else 0.0,
            "output_tokens": self.output_tokens,
            "spent": float(self.spent),
            "errors": dict(self.errors),
            "latency_p50_s": percentile(lat, 0.5),
            "latency_p95_s": percentile(lat, 0.95),
            "ttft_p50_s": percentile(ttft, 0.5),
        }
