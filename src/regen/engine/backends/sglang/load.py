"""A server's load from its `/metrics`, and the concurrency that keeps the servers healthy.

docs/sglang.md §6 has the metric names; §11.6 the rule: keep the requests waiting in the servers'
queues between `healthy_queue_min` and `healthy_queue_max`, and the queue short while KV usage is at
or above `healthy_kv_usage_max` or the scheduler retracts requests (too much in flight).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from regen.engine.net.sglang_metrics import ServerLoad, parse_metrics

__all__ = ["Health", "ServerLoad", "next_ceiling", "parse_metrics"]


@dataclass(frozen=True, slots=True)
class Health:
    """The healthy-load targets (settings [sglang])."""

    queue_min: int
    queue_max: int
    kv_usage_max: float


def next_ceiling(
    loads: Iterable[tuple[ServerLoad, int]],
    in_flight: int,
    ceiling: int | None,
    configured: int,
    health: Health,
) -> tuple[int | None, str]:
    """The in-flight ceiling to suggest next, and why; None when the servers want more than the
    operator allows (no opinion). `loads` pairs each server's scrape with the retractions since the
    previous one."""
    queued = 0.0
    kv = 0.0
    retracted = 0
    for load, new_retractions in loads:
        queued += load.queued
        kv = max(kv, load.kv_usage)
        retracted += new_retractions
    queued_n = int(queued)
    if retracted > 0 or kv >= health.kv_usage_max:
        why = f"{retracted} retracted" if retracted > 0 else f"KV usage {kv:.2f}"
        if queued_n <= health.queue_min:
            # More would only wait in the queue: hold, do not grow.
            return ceiling, f"{why}, {queued_n} queued: holding"
        target, reason = health.queue_min, f"{why}: keep the queue short"
    elif queued_n > health.queue_max:
        target, reason = health.queue_max, f"{queued_n} queued, above {health.queue_max}"
    elif queued_n < health.queue_min:
        target, reason = health.queue_min, f"{queued_n} queued, below {health.queue_min}"
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
    if lowered is None or lowered >= configured:
        return None, reason
    return lowered, reason
