"""What every part of the OpenRouter simulator shares: the live config, the billing book, the
limits, the fault RNG, the sticky routes and the counters a test asserts on.

`OpenRouterSim` (server.py) is this state plus an HTTP server; the route modules (chat.py,
account.py, listing.py, admin.py) take it as their first argument, so none of them imports the
server back.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from typing import Any

from regen.sim.openrouter.billing import BillingBook
from regen.sim.openrouter.config import SimConfig
from regen.sim.openrouter.limits import Limits


class OpenRouterState:
    """`config` may be replaced or mutated at any time; it is read per request."""

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config: SimConfig = config if config is not None else SimConfig()
        self.billing = BillingBook(lambda: self.config)
        self.limits = Limits(lambda: self.config)
        # A bounded summary of every chat request, for tests to assert on.
        self.requests: deque[dict[str, Any]] = deque(maxlen=self.config.requests_maxlen)
        self.in_flight = 0
        self.peak_in_flight = 0
        self.total_requests = 0
        self.token_events = 0  # SSE events carrying tokens: what a client parses per request
        self.served: Counter[str] = Counter()
        self.faults_injected: Counter[str] = Counter()
        self.rng = random.Random(self.config.seed)
        # (model id, session id) -> the endpoint tag that served the session last (§2.3 stickiness).
        self.sticky: dict[tuple[str, str], str] = {}

    def state(self) -> dict[str, Any]:
        return {
            "ledger": self.billing.summary(),
            "counters": {
                "in_flight": self.in_flight,
                "peak_in_flight": self.peak_in_flight,
                "total_requests": self.total_requests,
                "token_events": self.token_events,
            },
            "served": dict(self.served),
            "faults_injected": dict(self.faults_injected),
            "limits": self.limits.summary(),
        }

    def apply_config(self, config: SimConfig) -> None:
        """Swap the whole config; reseeds the fault RNG when the seed changed."""
        if config.seed != self.config.seed:
            self.rng.seed(config.seed)
        if config.requests_maxlen != self.requests.maxlen:
            self.requests = deque(self.requests, maxlen=config.requests_maxlen)
        self.config = config
