"""The simulated account's billing book: what the simulator billed, to whom, and what is left.

Debits happen when a generation completes (or is cancelled), never at dispatch, so concurrent
requests can overshoot the balance or key limit just as they do at OpenRouter (docs/openrouter.md §7.3).
`billed_total` sums the exact float values reported as `usage.cost`, through Decimal(repr(x)), so a
client's ledger can be compared with it to the micro-dollar.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from regen.sim.openrouter.config import SimConfig


@dataclass(slots=True)
class ProviderAttempt:
    """One entry of /generation's provider_responses (failed fallbacks included)."""

    endpoint_id: str
    provider_name: str
    model_permaslug: str
    status: int
    latency_ms: int
    upstream_id: str


@dataclass(slots=True)
class GenerationRecord:
    id: str
    request_id: str
    upstream_id: str
    model: str  # canonical slug that served
    provider_name: str  # display name
    tag: str
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cost: float  # exactly the float reported (or that would have been) as usage.cost
    upstream_inference_cost: float
    streamed: bool
    cancelled: bool
    finish_reason: str | None
    native_finish_reason: str | None
    created_at: float  # unix seconds when the request arrived
    completed_at: float  # unix seconds when billing happened
    latency_ms: int  # time to first token
    generation_time_ms: int
    is_byok: bool = False
    session_id: str | None = None
    attempts: list[ProviderAttempt] = field(default_factory=list)


class BillingBook:
    """The simulated account's bills: balance, key limit and usage, read live from the simulator's
    current config. (Not the job's ledger, engine/money/ledger.py: this is the truth it is checked against.)"""

    def __init__(self, config: Callable[[], SimConfig]) -> None:
        self._config = config
        self.billed_total: Decimal = Decimal(0)
        self.records: list[GenerationRecord] = []
        self._by_id: dict[str, GenerationRecord] = {}
        self.cancelled_count = 0

    # --- balances --------------------------------------------------------------------------
    @property
    def credits(self) -> float:
        return self._config().credits

    @property
    def key_limit(self) -> float | None:
        return self._config().key_limit

    @property
    def usage(self) -> float:
        return float(self.billed_total)

    @property
    def balance(self) -> float:
        return float(Decimal(repr(self.credits)) - self.billed_total)

    @property
    def limit_remaining(self) -> float | None:
        limit = self.key_limit
        if limit is None:
            return None
        return float(Decimal(repr(limit)) - self.billed_total)

    def usage_as_of(self, when: float) -> Decimal:
        """Usage billed up to wall-clock `when`: what a lagging /key or /credits reports (§7.1).

        Records are appended as they are billed, so only the ones newer than `when` are walked.
        """
        total = self.billed_total
        for rec in reversed(self.records):
            if rec.completed_at <= when:
                break
            total -= Decimal(repr(rec.cost))
        return total

    def affordable(self) -> tuple[float, str]:
        """Money a new request may still use, and which cap binds: "credits" or "key_limit"."""
        remaining = self.balance
        source = "credits"
        key_left = self.limit_remaining
        if key_left is not None and key_left < remaining:
            remaining, source = key_left, "key_limit"
        return remaining, source

    # --- records ---------------------------------------------------------------------------
    def record(self, rec: GenerationRecord) -> None:
        """Debit a finished generation; zero-cost ones are kept too, for /generation."""
        if not rec.completed_at:
            rec.completed_at = time.time()
        self.billed_total += Decimal(repr(rec.cost))
        self.records.append(rec)
        self.cancelled_count += rec.cancelled
        self._by_id[rec.id] = rec

    def get(self, gen_id: str) -> GenerationRecord | None:
        return self._by_id.get(gen_id)

    def summary(self) -> dict[str, Any]:
        return {
            "credits": self.credits,
            "usage": self.usage,
            "balance": self.balance,
            "key_limit": self.key_limit,
            "limit_remaining": self.limit_remaining,
            "billed_total": str(self.billed_total),
            "records": len(self.records),
            "cancelled": self.cancelled_count,
        }
