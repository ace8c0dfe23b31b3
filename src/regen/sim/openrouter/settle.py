"""Billing one generation when it ends (completed, errored or cancelled): its record in the
billing book, its in-flight hold settled, the cost split usage reports (docs/openrouter.md §1.4, §7)."""

from __future__ import annotations

import asyncio
import time

from regen.sim.openrouter.billing import GenerationRecord, ProviderAttempt
from regen.sim.openrouter.plan import Plan
from regen.sim.openrouter.state import OpenRouterState
from regen.sim.openrouter.stream import costs
from regen.sim.openrouter.views import endpoint_id


def bill(
    sim: OpenRouterState,
    plan: Plan,
    completion: int,
    reasoning: int,
    finish: str | None,
    native: str | None,
    *,
    cancelled: bool,
    first_token_at: float | None,
) -> tuple[float, float, float]:
    """Debit the billing book once per generation; returns (cost, prompt part, completion part)."""
    cfg = sim.config
    insured = cfg.zero_completion_insurance and (finish == "error" or (completion == 0 and finish is None))
    if insured:
        cost = prompt_cost = completion_cost = 0.0
    else:
        cost, prompt_cost, completion_cost = costs(plan.ep, plan.prompt_tokens, completion)
    upstream = cost
    if cfg.byok:
        upstream, cost = cost, 0.0
    now_loop = asyncio.get_running_loop().time()
    latency = (first_token_at if first_token_at is not None else now_loop) - plan.started
    attempts = [
        *plan.attempts,
        ProviderAttempt(
            endpoint_id=endpoint_id(plan.model, plan.ep),
            provider_name=plan.ep.provider_name,
            model_permaslug=plan.model.canonical_slug,
            status=200,
            latency_ms=int(latency * 1000),
            upstream_id="chatcmpl-" + plan.gen_id[-20:].lower(),
        ),
    ]
    sim.billing.record(
        GenerationRecord(
            id=plan.gen_id,
            request_id=plan.request_id,
            upstream_id="chatcmpl-" + plan.gen_id[-20:].lower(),
            model=plan.model.canonical_slug,
            provider_name=plan.ep.provider_name,
            tag=plan.ep.tag,
            prompt_tokens=plan.prompt_tokens,
            completion_tokens=completion,
            reasoning_tokens=reasoning,
            cost=cost,
            upstream_inference_cost=upstream if cfg.byok else 0.0,
            streamed=plan.stream,
            cancelled=cancelled,
            finish_reason=finish,
            native_finish_reason=native,
            created_at=plan.started_wall,
            completed_at=time.time(),
            latency_ms=int(latency * 1000),
            generation_time_ms=int((now_loop - plan.started) * 1000),
            is_byok=cfg.byok,
            session_id=plan.session_id,
            attempts=attempts,
        )
    )
    sim.limits.settle(plan.hold, cost)
    return cost, prompt_cost, completion_cost


def bill_cancel(sim: OpenRouterState, plan: Plan, produced: int, first_token_at: float | None) -> None:
    """§1.4: cancellation stops billing only at providers that support it."""
    if plan.ep.supports_cancellation:
        bill(
            sim,
            plan,
            produced,
            min(produced, plan.reasoning_tokens),
            None,
            None,
            cancelled=True,
            first_token_at=first_token_at,
        )
    else:
        bill(
            sim,
            plan,
            plan.completion_tokens,
            plan.reported_reasoning,
            plan.finish_reason,
            plan.native_finish_reason,
            cancelled=True,
            first_token_at=first_token_at,
        )
