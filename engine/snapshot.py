"""The one builder of the snapshot (engine/schema.py) from the dispatcher, the ledger, the
statistics and the backend's view."""

from __future__ import annotations

import time
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from engine.backends.base import Backend
from engine.dispatch import Dispatcher
from engine.jobstate import DatasetState, JobState, Outcome
from engine.money import WASTE_CAUSES, Ledger
from engine.planner import DatasetNeed, plan, remaining_output_tokens
from engine.schema import DatasetView, MoneyView, Snapshot
from engine.settle import Settler
from engine.stats import JobStats, StatusRules, route_views

# The planner's answer changes slowly; recomputing it per snapshot would waste the loop's time.
PLAN_INTERVAL_S = 2.0


class SnapshotBuilder:
    """Folds the job's parts into a Snapshot; keeps the plan between a few snapshots."""

    def __init__(
        self,
        *,
        backend: Backend,
        dispatcher: Dispatcher,
        ledger: Ledger,
        settler: Settler,
        stats: JobStats,
        datasets: Mapping[str, DatasetState],
        rules: StatusRules,
        expected_output_tokens: int,
        started_mono: float,
    ) -> None:
        self.backend = backend
        self.dispatcher = dispatcher
        self.ledger = ledger
        self.settler = settler
        self.stats = stats
        self.datasets = datasets
        self.rules = rules
        self.expected_output_tokens = expected_output_tokens
        self.started_mono = started_mono
        self.spent_at_start = Decimal(0)
        self._plan: dict[str, Any] | None = None
        self._plan_at = float("-inf")

    def plan(self, now: float) -> dict[str, Any] | None:
        """The budget planner on live figures; recomputed every few seconds, not per snapshot."""
        if now - self._plan_at < PLAN_INTERVAL_S and self._plan is not None:
            return self._plan
        needs = []
        for name, state in self.datasets.items():
            done = state.done
            per_prompt = state.progress.output_tokens / done if done else float(self.expected_output_tokens)
            remaining = max(0, state.remaining)
            output = remaining_output_tokens(remaining, per_prompt, state.progress.output_tokens, state.token_budget)
            needs.append(DatasetNeed(name, remaining, output, int(remaining * state.prompt_tokens_mean)))
        budget = self.ledger.budget
        left = None if budget is None else budget - self.ledger.spent
        self._plan = None if left is None else plan(needs, self.backend.prices(), left)
        self._plan_at = now
        return self._plan

    def money(self, now: float, remaining: int, rows: int) -> MoneyView:
        ledger, breakdown = self.ledger, self.settler.breakdown
        estimates = ledger.estimates
        spent_here = float(ledger.spent - self.spent_at_start)
        per_row = spent_here / rows if rows else None
        per_m = float(breakdown.useful) / breakdown.useful_tokens * 1e6 if breakdown.useful_tokens else None
        headroom = ledger.headroom
        return {
            "unit": ledger.unit,
            "spent": float(ledger.spent),
            "confirmed": float(ledger.confirmed),
            "estimated": float(ledger.estimated),
            "pending": {"amount": float(estimates.pending), "requests": estimates.pending_count},
            "unknowable": {"amount": float(estimates.unknowable), "requests": estimates.unknowable_count},
            "reserved": float(ledger.reserved),
            "budget": None if ledger.budget is None else float(ledger.budget),
            "headroom": None if headroom is None else float(headroom),
            "blocked": self.dispatcher.budget_blocked,
            "burn_per_h": self.stats.spend_rate.rate(now, self.started_mono) * 3600,
            "projected_total": None if per_row is None else float(ledger.spent) + per_row * remaining,
            "useful": float(breakdown.useful),
            "useful_output_tokens": breakdown.useful_tokens,
            "useful_per_m": per_m,
            "waste": {
                cause: {"amount": float(breakdown.waste[cause]), "tokens": breakdown.waste_tokens[cause]}
                for cause in WASTE_CAUSES
            },
            "waste_total": float(sum(breakdown.waste.values(), Decimal(0))),
        }

    def build(self, state: JobState, outcome: Outcome | None, hosts: list[dict[str, Any]]) -> Snapshot:
        now = time.monotonic()
        started = self.started_mono
        elapsed = now - started
        dispatcher, stats = self.dispatcher, self.stats
        counters = stats.counters
        remaining = sum(max(0, s.remaining - s.failed) for s in self.datasets.values() if not s.budget_reached)
        rows_per_s = stats.rows_rate.rate(now, started)
        view = self.backend.view()
        providers = route_views(
            stats.routes,
            view["routes"],
            now=now,
            elapsed_s=elapsed,
            in_flight=dispatcher.in_flight_by_route(),
            route_id=self.backend.route_id,
            excluded=self.backend.excluded,
            rules=self.rules,
        )
        held = dispatcher.held_until
        outage = dispatcher.outage
        return {
            "state": state.value,
            "outcome": None if outcome is None else {"reason": outcome.reason.value, "message": outcome.message},
            "elapsed_s": elapsed,
            "model": view["model"],
            "backend": {
                "name": view["name"],
                "unit": view["unit"],
                "model": view["model"],
                "supports_exclude": view["supports_exclude"],
                "account": view["account"],
            },
            "in_flight": dispatcher.in_flight,
            "held_s": max(0.0, held - now) if held else None,
            "held_reason": outage.reason if outage is not None else dispatcher.held_reason,
            "outage_s": dispatcher.outage_s(now),
            "outage_total_s": dispatcher.outage_total_s + (dispatcher.outage_s(now) or 0.0),
            "concurrency": {"configured": dispatcher.limit.configured, "effective": dispatcher.limit.current},
            "rates": {
                "output_tokens_per_s": stats.tokens_rate.rate(now, started),
                "rows_per_s": rows_per_s,
                "attempts_per_s": stats.attempts_rate.rate(now, started),
            },
            "money": self.money(now, remaining, counters.rows),
            "plan": self.plan(now),
            "errors": dict(counters.errors),
            "rows": counters.rows,
            "attempts": counters.attempts,
            "quarantined": self.settler.quarantined,
            "eta_s": remaining / rows_per_s if rows_per_s > 0 else None,
            "excluded": view["excluded"],
            "allowed_precisions": view["allowed_precisions"],
            "datasets": [dataset_view(name, s) for name, s in self.datasets.items()],
            "providers": providers,
            "hosts": hosts,
        }


def dataset_view(name: str, s: DatasetState) -> DatasetView:
    return {
        "name": name,
        "total": s.total - s.invalid,
        "done": s.done,
        "ok": s.progress.ok,
        "truncated": s.progress.truncated,
        "failed": s.failed,
        "invalid": s.invalid,
        "in_flight": s.in_flight,
        "output_tokens": s.progress.output_tokens,
        "token_budget": s.token_budget,
        "state": s.state,
    }
