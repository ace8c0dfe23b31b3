"""The folded snapshot of a job that consoles and the headless line read a few times a second."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from engine.planner import DatasetNeed, plan, remaining_output_tokens
from engine.stats import provider_views

if TYPE_CHECKING:
    from engine.job import Job

# The planner's answer changes slowly; recomputing it per snapshot would waste the loop's time.
PLAN_INTERVAL_S = 2.0


def current_plan(job: Job, now: float) -> dict[str, Any] | None:
    """The budget planner on live figures; recomputed every few seconds, not per snapshot."""
    if now - job.plan_at < PLAN_INTERVAL_S and job.plan_cache is not None:
        return job.plan_cache
    needs = []
    for name, state in job.datasets.items():
        done = state.done
        per_prompt = (
            state.progress.output_tokens / done if done else float(job.settings.stats.expected_output_tokens)
        )
        remaining = max(0, state.remaining)
        needs.append(
            DatasetNeed(
                name,
                remaining,
                remaining_output_tokens(
                    remaining, per_prompt, state.progress.output_tokens, state.token_budget
                ),
                int(remaining * state.prompt_tokens_mean),
            )
        )
    job.plan_cache = plan(needs, job.allowed(), job.ledger.budget - job.ledger.spent)
    job.plan_at = now
    return job.plan_cache


def build_snapshot(job: Job) -> dict[str, Any]:
    """A folded view of the job for the console and the headless line."""
    now = time.monotonic()
    elapsed = now - job.started_mono
    remaining = sum(max(0, s.remaining - s.failed) for s in job.datasets.values() if not s.budget_reached)
    rows_per_s = job.rows_rate.rate(now, job.started_mono)
    slugs = {}
    for name in job.providers:
        endpoint = job.endpoint_named(name)
        slugs[name] = endpoint.slug if endpoint is not None else name.lower()
    providers = provider_views(
        job.providers,
        now=now,
        elapsed_s=elapsed,
        in_flight=job.in_flight_by_provider(),
        excluded_names={name for name, slug in slugs.items() if slug in job.excluded},
        slugs=slugs,
        rules=job.rules,
    )
    burn_per_h = job.spend_rate.rate(now, job.started_mono) * 3600
    spent_here = float(job.ledger.spent - job.spent_at_start)
    per_row = spent_here / job.counters.rows if job.counters.rows else None
    money = {
        "spent": float(job.ledger.spent),
        "spent_estimated": float(job.ledger.spent_estimated),
        "reserved": float(job.ledger.reserved),
        "budget": float(job.ledger.budget),
        "headroom": float(job.ledger.headroom),
        "budget_blocked": job.budget_blocked,
        "burn_usd_per_h": burn_per_h,
        "projected_total_usd": None if per_row is None else float(job.ledger.spent) + per_row * remaining,
        **job.breakdown.view(),
    }
    return {
        "state": job.state.value,
        "outcome": None
        if job.outcome is None
        else {"reason": job.outcome.reason.value, "message": job.outcome.message},
        "elapsed_s": elapsed,
        "model": job.settings.openrouter.model,
        "in_flight": job.in_flight,
        "held_s": max(0.0, job.held_until - now) if job.held_until else None,
        "held_reason": job.held_reason,
        "concurrency": {"configured": job.limit.configured, "effective": job.limit.effective},
        "rates": {
            "output_tokens_per_s": job.tokens_rate.rate(now, job.started_mono),
            "rows_per_s": rows_per_s,
            "attempts_per_s": job.attempts_rate.rate(now, job.started_mono),
        },
        "money": money,
        "credits": job.credits,
        "plan": current_plan(job, now),
        "errors": dict(job.counters.errors),
        "rows": job.counters.rows,
        "attempts": job.counters.attempts,
        "quarantined": job.quarantined,
        "eta_s": remaining / rows_per_s if rows_per_s > 0 else None,
        "excluded": sorted(job.excluded),
        "allowed_precisions": job.routing.quantizations,
        "datasets": [
            {
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
            for name, s in job.datasets.items()
        ],
        "providers": providers,
        "hosts": job.hosts.view(),  # GPU hosts (engine/host/monitor.py)
    }
