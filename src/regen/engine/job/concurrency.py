"""The in-flight limit: set by the operator, lowered by the job itself under a throttling storm.

A storm is throttling (429, 503, in-flight 402) on a noticeable share of recent attempts, not the
odd 429 any busy provider returns. Under a storm the limit shrinks multiplicatively, at most once
per `cooldown_s` (one storm is one step, not two thousand); after `quiet_s` without a storm it grows
back multiplicatively to what the operator set.

A backend that can see its servers' load (SGLang's slots, queue and KV usage) may also suggest a
ceiling; `current`, the limit dispatch obeys, is the lower of the two. `minimum` bounds the backoff
only: the servers' ceiling is obeyed as given (a server that runs two at once gets about two, not
`minimum`; docs/sglang.md §11.6).
"""

from __future__ import annotations

import time
from collections import deque


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
        window_s: float = 5.0,
        storm_share: float = 0.1,
        storm_min_events: int = 3,
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
        self.window_s = window_s
        self.storm_share = storm_share
        self.storm_min_events = storm_min_events
        self._recent: deque[tuple[float, bool]] = deque()  # (when, throttled)
        self._throttled_in_window = 0
        self._last_storm = float("-inf")
        self._last_change = float("-inf")
        self.backoffs = 0
        self.suggested: int | None = None  # the backend's ceiling, None when it has no opinion

    @property
    def current(self) -> int:
        """The limit dispatch obeys now: the adaptive limit, under the backend's ceiling if any."""
        suggested = self.suggested
        if suggested is None or suggested >= self.effective:
            return self.effective
        return suggested

    def suggest(self, ceiling: int | None) -> None:
        """The backend's ceiling (None lifts it)."""
        self.suggested = None if ceiling is None else max(1, ceiling)

    def set_configured(self, value: int) -> int:
        """Operator change; clamped to the connection pool the job was started with."""
        self.configured = max(1, min(value, self.ceiling))
        self.minimum = min(self.minimum, self.configured)
        self.effective = self.configured
        return self.configured

    def _record(self, now: float, throttled: bool) -> None:
        self._recent.append((now, throttled))
        self._throttled_in_window += throttled
        horizon = now - self.window_s
        while self._recent and self._recent[0][0] < horizon:
            _, old = self._recent.popleft()
            self._throttled_in_window -= old

    @property
    def storming(self) -> bool:
        throttled = self._throttled_in_window
        return throttled >= self.storm_min_events and throttled >= self.storm_share * len(self._recent)

    def on_throttle(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._record(now, True)
        if not self.adaptive or not self.storming:
            return
        self._last_storm = now
        if now - self._last_change < self.cooldown_s:
            return
        lowered = max(self.minimum, int(self.effective * self.decrease))
        if lowered < self.effective:
            self.effective = lowered
            self.backoffs += 1
            self._last_change = now

    def on_success(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._record(now, False)
        if self.effective >= self.configured:
            return
        if now - self._last_storm < self.quiet_s or now - self._last_change < self.cooldown_s:
            return
        self.effective = min(self.configured, max(self.effective + 1, int(self.effective * self.increase)))
        self._last_change = now
