"""The one builder of the snapshot (engine/schema.py) from the dispatcher's lanes (each with its
backend, ledger, settling and statistics) and the datasets: the job's own figures at the top, one
`LaneView` per backend under `lanes`."""

from __future__ import annotations

import functools
import math
import time
from collections import Counter
from collections.abc import Mapping

from regen.engine.job.deadline_control import DeadlineControl, remaining_needs
from regen.engine.job.dispatch import Dispatcher
from regen.engine.job.fidelity import FidelityMonitor
from regen.engine.job.lanes import Lane
from regen.engine.job.stats import StatusRules, route_views
from regen.engine.money.ledger import WASTE_CAUSES
from regen.engine.money.planner import plan
from regen.engine.run.state import DatasetState, JobState, Outcome
from regen.engine.schema import (
    BudgetPlanView,
    DatasetView,
    HostView,
    LaneView,
    MoneyView,
    ProviderView,
    RatesView,
    RouteView,
    Snapshot,
)

# The planner's answer changes slowly; recomputing it per snapshot would waste the loop's time.
PLAN_INTERVAL_S = 2.0


class SnapshotBuilder:
    """Folds the job's parts into a Snapshot; keeps the plan between a few snapshots."""

    def __init__(
        self,
        *,
        dispatcher: Dispatcher,
        datasets: Mapping[str, DatasetState],
        rules: StatusRules,
        expected_output_tokens: int,
        started_mono: float,
        deadline_control: DeadlineControl | None = None,
        fidelity: FidelityMonitor | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.datasets = datasets
        self.rules = rules
        self.expected_output_tokens = expected_output_tokens
        self.started_mono = started_mono
        self.deadline_control = deadline_control
        self.fidelity = fidelity
        self._plans: dict[str, tuple[float, BudgetPlanView]] = {}  # per lane: when, the answer

    def plan(self, lane: Lane, now: float) -> BudgetPlanView | None:
        """The budget planner on live figures for a lane with a budget (None without one);
        recomputed every few seconds, not per snapshot."""
        left = lane.ledger.left
        if left is None:
            return None
        kept = self._plans.get(lane.name)
        if kept is not None and now - kept[0] < PLAN_INTERVAL_S:
            return kept[1]
        needs = remaining_needs(self.datasets, self.expected_output_tokens)
        routes = lane.backend.routes
        answer = plan(needs, [] if routes is None else routes.prices(), left)
        self._plans[lane.name] = (now, answer)
        return answer

    def money(self, lane: Lane, now: float, remaining: int, rows: int) -> MoneyView:
        ledger, breakdown = lane.ledger, lane.settler.breakdown
        estimates = ledger.estimates
        spent_here = float(ledger.spent - lane.spent_at_start)
        per_row = spent_here / rows if rows else None
        headroom = ledger.headroom
        view: MoneyView = {
            "unit": ledger.unit,
            "spent": float(ledger.spent),
            "confirmed": float(ledger.confirmed),
            "estimated": float(ledger.estimated),
            "pending": {"amount": float(estimates.pending), "requests": estimates.pending_count},
            "unknowable": {"amount": float(estimates.unknowable), "requests": estimates.unknowable_count},
            "settling": lane.settler.settling,
            "reserved": float(ledger.reserved),
            "budget": None if ledger.budget is None else float(ledger.budget),
            "headroom": None if headroom is None else float(headroom),
            "blocked": lane.budget_blocked,
            "burn_per_h": lane.stats.spend_rate.rate(now, self.started_mono) * 3600,
            "projected_total": None if per_row is None else float(ledger.spent) + per_row * remaining,
            "useful": float(breakdown.useful),
            "useful_output_tokens": breakdown.useful_tokens,
            "useful_per_m": breakdown.useful_per_m,
            "waste": {
                cause: {"amount": float(breakdown.waste[cause]), "tokens": breakdown.waste_tokens[cause]}
                for cause in WASTE_CAUSES
            },
            "waste_total": float(breakdown.waste_total),
        }
        if estimates.bounded_by is not None:
            view["unknowable_bound"] = estimates.bounded_by
            view["unknowable_bound_wait_s"] = estimates.bound_waited_s
        return view

    def _providers(
        self, lane: Lane, view_routes: list[RouteView], now: float, elapsed: float
    ) -> list[ProviderView]:
        routes = lane.backend.routes
        return route_views(
            lane.stats.routes,
            view_routes,
            now=now,
            elapsed_s=elapsed,
            in_flight=self.dispatcher.in_flight_by_route(lane),
            # Without routes to exclude, a route is named by its name (SGLang's servers).
            route_id=str.strip if routes is None else routes.route_id,
            excluded=() if routes is None else routes.excluded,
            rules=self.rules,
            fidelity=None if self.fidelity is None else functools.partial(self.fidelity.view, lane.name),
        )

    def _rates(self, lane: Lane, now: float) -> RatesView:
        stats, started = lane.stats, self.started_mono
        return {
            "output_tokens_per_s": stats.tokens_rate.rate(now, started),
            "rows_per_s": stats.rows_rate.rate(now, started),
            "attempts_per_s": stats.attempts_rate.rate(now, started),
        }

    def remaining(self) -> int:
        """Prompts still to be made: not written, not given up, in datasets whose token budget is not spent."""
        return sum(max(0, s.remaining - s.failed) for s in self.datasets.values() if not s.budget_reached)

    def eta_s(self, now: float, remaining: int) -> float | None:
        """The work left at the rows per second measured now, every lane's together; None before a rate."""
        return eta(
            remaining, math.fsum(self._rates(lane, now)["rows_per_s"] for lane in self.dispatcher.lanes)
        )

    def _lane_view(self, lane: Lane, now: float, elapsed: float, remaining: int, job_rows: int) -> LaneView:
        counters = lane.stats.counters
        backend = lane.backend
        view = backend.view()
        routes, guard = backend.routes, backend.guard
        held = lane.held_until
        outage = lane.outage
        state, reason = lane_state(lane, now)
        ceilings = self.dispatcher.ceilings
        outage_s = lane.outage_s(now)
        return {
            "name": lane.name,
            "title": backend.title,
            "unit": lane.ledger.unit,
            "model": view["model"],
            "supports_exclude": routes is not None,
            "account": view["account"],
            "excluded": [] if routes is None else sorted(routes.excluded),
            "allowed_precisions": None if guard is None else guard.allowed_precisions,
            "state": state,
            "reason": reason,
            "held_s": max(0.0, held - now) if held else None,
            "held_reason": outage.reason if outage is not None else lane.held_reason,
            "outage_s": outage_s,
            "outage_total_s": lane.outage_total_s + (outage_s or 0.0),
            "rows": lane.rows,
            "rows_share": lane.rows / job_rows if job_rows else 0.0,
            "output_tokens": lane.output_tokens,
            "attempts": counters.attempts,
            "errors": dict(counters.errors),
            "in_flight": lane.in_flight,
            "concurrency": {"configured": lane.limit.configured, "effective": lane.limit.current},
            "suggested": lane.limit.suggested,
            "ceiling": None if ceilings is None else ceilings.lane_ceiling(lane.name),
            "rates": self._rates(lane, now),
            "money": self.money(lane, now, remaining, counters.rows),
            "plan": self.plan(lane, now),
            "providers": self._providers(lane, view["routes"], now, elapsed),
        }

    def build(self, state: JobState, outcome: Outcome | None, hosts: list[HostView]) -> Snapshot:
        now = time.monotonic()
        elapsed = now - self.started_mono
        dispatcher = self.dispatcher
        lanes = dispatcher.lanes
        remaining = self.remaining()
        # The whole job's counts: every lane's summed (one lane's own, for a single backend).
        rows = sum(lane.stats.counters.rows for lane in lanes)
        attempts = sum(lane.stats.counters.attempts for lane in lanes)
        errors: Counter[str] = Counter()
        for lane in lanes:
            errors.update(lane.stats.counters.errors)
        # Each backend's share is of the whole job's rows, as its money is (earlier runs included).
        views = [
            self._lane_view(lane, now, elapsed, remaining, sum(other.rows for other in lanes))
            for lane in lanes
        ]
        each = [view["rates"] for view in views]
        rates: RatesView = {
            "output_tokens_per_s": math.fsum(r["output_tokens_per_s"] for r in each),
            "rows_per_s": math.fsum(r["rows_per_s"] for r in each),
            "attempts_per_s": math.fsum(r["attempts_per_s"] for r in each),
        }
        rows_per_s = rates["rows_per_s"]
        snapshot: Snapshot = {
            "state": state.value,
            "outcome": None
            if outcome is None
            else {"reason": outcome.reason.value, "message": outcome.message},
            "elapsed_s": elapsed,
            "model": views[lanes.index(dispatcher.budget_lane)]["model"],
            "in_flight": dispatcher.in_flight,
            "rates": rates,
            "errors": dict(errors),
            "rows": rows,
            "attempts": attempts,
            "quarantined": sum(lane.settler.quarantined for lane in lanes),
            "eta_s": eta(remaining, rows_per_s),
            "datasets": [dataset_view(name, s) for name, s in self.datasets.items()],
            "hosts": hosts,
            "lanes": views,
        }
        control = self.deadline_control
        if control is not None and control.shown:
            snapshot["fleet"] = control.view()
        return snapshot


def eta(remaining: int, rows_per_s: float) -> float | None:
    return remaining / rows_per_s if rows_per_s > 0 else None


def lane_state(lane: Lane, now: float) -> tuple[str, str | None]:
    """A lane's state word (engine/schema.py LaneView.state) and why, at monotonic `now`."""
    held, outage = lane.held_until, lane.outage
    if lane.closed is not None:
        return "closed", lane.closed
    if lane.paused:
        return "paused", None
    if outage is not None:
        return "out", outage.reason
    if lane.stalled is not None:
        return "stalled", lane.stalled  # engine/job/stall.py: no new work until it answers again
    if held and held > now:
        return "held", lane.held_reason
    if lane.budget_blocked:
        return "budget", None
    return "running", None


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
