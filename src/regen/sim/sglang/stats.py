"""What the simulated server has counted: the numbers behind /metrics and /_sim/state."""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

__all__ = ["Histogram", "Stats"]

# Bucket bounds of SGLang's own histograms (seconds).
# fmt: off
TTFT_BUCKETS = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0
)
E2E_BUCKETS = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0,
    800.0
)
ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4,
    0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0
)
TPOT_BUCKETS = (
    0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
    0.5, 0.75, 1.0, 2.5
)
QUEUE_BUCKETS = (
    0.0, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0,
    90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 1200.0, 1800.0, 2400.0
)
# fmt: on


@dataclass(slots=True)
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.total += value * n
        self.count += n

    def cumulative(self) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        running = 0
        for bound, c in zip(self.bounds, self.counts, strict=False):
            running += c
            out.append((repr(float(bound)), running))
        out.append(("+Inf", self.count))
        return out


@dataclass(slots=True)
class Stats:
    started_at: float = field(default_factory=time.monotonic)
    started_wall: float = field(default_factory=time.time)
    ready_at: float | None = None
    startup_phases: dict[str, float] = field(default_factory=dict)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0
    requests: int = 0
    aborted: int = 0
    retracted_total: int = 0
    last_retracted: int = 0
    gen_throughput: float = 0.0
    finish_counts: dict[str, int] = field(default_factory=dict)
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    tpot: Histogram = field(default_factory=lambda: Histogram(TPOT_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(QUEUE_BUCKETS))

    def observe_queue(self, seconds: float) -> None:
        self.queue.observe(seconds)

    def retracted(self, n: int) -> None:
        self.retracted_total += n
        self.last_retracted = n
