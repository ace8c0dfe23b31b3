"""A server's load from its `/metrics`, and the concurrency that keeps the servers healthy.

docs/sglang.md §6 has the metric names; §11.6 the rule: never more in flight than the servers'
running slots plus a short queue (a quarter of the slots, at least one per server, at most
`healthy_queue_max`); within that, keep the requests waiting in the servers' queues between
`healthy_queue_min` and `healthy_queue_max`, and the queue short while KV usage is at or above
`healthy_kv_usage_max` or the scheduler retracts requests (too much in flight).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from regen.engine.net.sglang_metrics import ServerLoad, parse_metrics

__all__ = ["Capacity", "Health", "ServerLoad", "capacity", "next_ceiling", "parse_metrics"]

# The queue a server may hold besides its running slots, as a share of them: enough to refill the
# batch as requests end (regen sends the next one at once), not enough to hold work another fleet
# could finish sooner (docs/fleets.md, "The GPU lane's queue").
QUEUE_PER_SLOT = 0.25


@dataclass(frozen=True, slots=True)
class Health:
    """The healthy-load targets (settings [sglang])."""

    queue_min: int
    queue_max: int
    kv_usage_max: float


@dataclass(frozen=True, slots=True)
class Capacity:
    """What the servers can run at once in all, and the queue they may hold besides."""

    slots: int
    queue: int

    def most(self, health: Health) -> int:
        """The most the job may have in flight on these servers: their slots and a short queue."""
        return self.slots + min(self.queue, health.queue_max)


def capacity(slots: Iterable[int | None]) -> Capacity | None:
    """The servers' capacity from each one's running slots; None while one server's are unknown."""
    total = queue = 0
    for n in slots:
        if n is None or n <= 0:
            return None
        total += n
        queue += max(1, math.ceil(n * QUEUE_PER_SLOT))
    return Capacity(total, queue) if total else None


def next_ceiling(
    loads: Iterable[tuple[ServerLoad, int]],
    in_flight: int,
    ceiling: int | None,
    configured: int,
    health: Health,
    servers: Capacity | None = None,
) -> tuple[int | None, str]:
    """The in-flight ceiling to suggest next, and why; None when the servers want more than the
    operator allows (no opinion). `loads` pairs each server's scrape with the retractions since the
    previous one; `servers` is their capacity where known, which bounds the ceiling."""
    lowered, reason = _by_queue(loads, in_flight, ceiling, health)
    if servers is not None:
        most = servers.most(health)
        if lowered is None or lowered > most:
            lowered = most
            reason = f"{reason}; the servers run {servers.slots} at once: at most {most} in flight"
    if lowered is None or lowered >= configured:
        return None, reason
    return lowered, reason


def _by_queue(
    loads: Iterable[tuple[ServerLoad, int]],
    in_flight: int,
    ceiling: int | None,
    health: Health,
) -> tuple[int | None, str]:
    """The ceiling that keeps the queue in its band (None: no opinion), and why."""
    queued = 0.0
    kv = 0.0
    retracted = 0
    for load, new_retractions in loads:
        queued += load.queued
        kv = max(kv, load.kv_usage)
        retracted += new_retractions
    queued_n = int(queued)
    queue_min, queue_max = health.queue_min, health.queue_max
    if retracted > 0 or kv >= health.kv_usage_max:
        why = f"{retracted} retracted" if retracted > 0 else f"KV usage {kv:.2f}"
        if queued_n <= queue_min:
            # More would only wait in the queue: hold, do not grow.
            return ceiling, f"{why}, {queued_n} queued: holding"
        target, reason = queue_min, f"{why}: keep the queue short"
    elif queued_n > queue_max:
        target, reason = queue_max, f"{queued_n} queued, above {queue_max}"
    elif queued_n < queue_min:
        target, reason = queue_min, f"{queued_n} queued, below {queue_min}"
    else:
        return ceiling, f"{queued_n} queued: healthy"
    proposed = max(1, in_flight + target - queued_n)
    if ceiling is None:
        lowered = proposed if target < queued_n else None
    elif target < queued_n:
        lowered = min(ceiling, proposed)
    else:
        # Growing: at most half again per scrape (the gauges lag), never below where it was.
        lowered = max(ceiling, min(proposed, ceiling + max(1, ceiling // 2)))
    return lowered, reason
