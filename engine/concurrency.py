"""The in-flight limit: set by the operator, lowered by the job itself under a throttling storm.

Multiplicative decrease on 429/503/in-flight-402 (at most once per `cooldown_s`, so one storm is
one step, not two thousand), multiplicative recovery after `quiet_s` without throttling.
"""

from __future__ import annotations

import time


class AdaptiveLimit:
    """How many requests may be in flight now."""

    def __init__(
        self,
        configured: int,
        *,
        minimum: int,
        adaptive: bool,
        ceiling: int,
        decrease: float = 0.7,
        increase: float = 1.25,
        cooldown_s: float = 1.0,
        quiet_s: float = 5.0,
    ) -> None:
        self.ceiling = ceiling
        self.configured = min(configured, ceiling)
        self.minimum = min(minimum, self.configured)
        self.adaptive = adaptive
        self.effective = self.configured
        self.decrease = decrease
        self.increase = increase
        self.cooldown_s = cooldown_s
        self.quiet_s = quiet_s
        self._last_throttle = float("-inf")
        self._last_change = float("-inf")
        self.backoffs = 0

    def set_configured(self, value: int) -> int:
        """Operator change; clamped to the connection pool the job was started with."""
        self.configured = max(1, min(value, self.ceiling))
        self.minimum = min(self.minimum, self.configured)
        self.effective = self.configured
        return self.configured

    def on_throttle(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._last_throttle = now
        if not self.adaptive or now - self._last_change < self.cooldown_s:
            return
        lowered = max(self.minimum, int(self.effective * self.decrease))
        if lowered < self.effective:
            self.effective = lowered
            self.backoffs += 1
            self._last_change = now

    def on_success(self, now: float | None = None) -> None:
        if self.effective >= self.configured:
            return
        now = time.monotonic() if now is None else now
        if now - self._last_throttle < self.quiet_s or now - self._last_change < self.cooldown_s:
            return
        self.effective = min(self.configured, max(self.effective + 1, int(self.effective * self.increase)))
        self._last_change = now
