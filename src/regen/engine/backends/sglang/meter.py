"""GPU time per attempt: each server's GPUs shared equally among the attempts in flight on it.

docs/money.md, "GPU time": while n attempts are in flight on a server with g GPUs, each one is
charged g/n GPU-seconds per second. The meter keeps that as a virtual clock, S(t) = ∫ g/n(t) dt over
the time with at least one attempt in flight, so an attempt's charge is S(end) - S(start) and the
charges of all attempts sum to g x the time the server was busy with the job: the GPU-hours the
fleet was held, split by who held it.
"""

from __future__ import annotations

import time


class ShareMeter:
    """One server's GPUs, shared by the attempts in flight on it."""

    __slots__ = ("_before", "_last", "busy_s", "gpus", "in_flight", "shared")

    def __init__(self, gpus: int, now: float | None = None) -> None:
        self.gpus = gpus
        self.in_flight = 0
        self.shared = 0.0  # S(t): GPU-seconds per attempt in flight, accumulated
        self.busy_s = 0.0  # wall seconds with at least one attempt in flight
        self._before = 0.0  # GPU-seconds held before the last resize
        self._last = time.monotonic() if now is None else now

    def _advance(self, now: float) -> None:
        elapsed = now - self._last
        if elapsed > 0 and self.in_flight:
            self.shared += elapsed * self.gpus / self.in_flight
            self.busy_s += elapsed
        self._last = max(self._last, now)

    def enter(self, now: float | None = None) -> float:
        """An attempt starts; returns the mark its charge is measured from."""
        self._advance(time.monotonic() if now is None else now)
        self.in_flight += 1
        return self.shared

    def leave(self, mark: float, now: float | None = None) -> float:
        """An attempt ends; returns its GPU-seconds."""
        self._advance(time.monotonic() if now is None else now)
        self.in_flight -= 1
        return self.shared - mark

    def busy_gpu_s(self, now: float | None = None) -> float:
        """GPU-seconds the server was held by the job so far (the sum of every attempt's share)."""
        self._advance(time.monotonic() if now is None else now)
        return self._before + self.busy_s * self.gpus

    def resize(self, gpus: int, now: float | None = None) -> None:
        """The server behind this meter now has ``gpus`` GPUs (the router's fleet grew or shrank):
        the time so far is charged at the old count, from now on at the new one."""
        self._before = self.busy_gpu_s(now)
        self.busy_s = 0.0
        self.gpus = gpus
