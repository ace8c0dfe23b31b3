"""Serving a routed chat request: the request's fault draw, then its candidate endpoints tried in
order, each with its provider's rate bucket and fault draw, until one serves (docs/openrouter.md
§2.3 step 5); the answer when none does."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from regen.sim.openrouter import faults as fault_bodies
from regen.sim.openrouter import refusals
from regen.sim.openrouter.billing import ProviderAttempt
from regen.sim.openrouter.catalog import SimEndpoint, SimModel
from regen.sim.openrouter.config import HTTP_FAULTS
from regen.sim.openrouter.limits import Hold
from regen.sim.openrouter.lookup import provider_rates
from regen.sim.openrouter.plan import make_plan, rand_id
from regen.sim.openrouter.routing import Prefs
from regen.sim.openrouter.serve_json import serve_json
from regen.sim.openrouter.serve_stream import serve_stream
from regen.sim.openrouter.state import OpenRouterState
from regen.sim.openrouter.views import endpoint_id
from regen.sim.openrouter.wire import cf_headers, json_response, wants_metadata

# The marker of an attempt refused by its provider's rate bucket, beside the fault classes.
_BUCKET_EMPTY = "upstream_rate_limited"


@dataclass(slots=True)
class Routed:
    """A chat request read, resolved and routed: what the tries over its endpoints need."""

    body: dict[str, Any]
    prefs: Prefs
    candidates: list[tuple[SimModel, SimEndpoint]]  # in the order they are tried
    prompt_tokens: int
    max_tokens: int | None
    session_id: Any
    requested: str  # the model the request named first


async def serve_candidates(
    sim: OpenRouterState, request: web.Request, summary: dict[str, Any], routed: Routed, hold: Hold | None
) -> web.StreamResponse:
    """Draw faults, then try the candidate endpoints in order until one serves (§2.3 step 5)."""
    primary_model, primary = routed.candidates[0]
    fault = fault_bodies.draw(sim.config.faults, sim.rng)
    if fault == "http_402_in_flight":
        return _fault_response(sim, fault, primary_model, primary, None, summary)
    if fault == "reset_before_headers":
        return _reset(sim, request, summary, fault)

    gen_id = f"gen-{int(time.time())}-{rand_id()}"
    summary["gen_id"] = gen_id
    if fault in HTTP_FAULTS:
        return _fault_response(sim, fault, primary_model, primary, gen_id, summary)
    return await _try_endpoints(sim, request, summary, routed, hold, gen_id, fault)


async def _try_endpoints(
    sim: OpenRouterState,
    request: web.Request,
    summary: dict[str, Any],
    routed: Routed,
    hold: Hold | None,
    gen_id: str,
    fault: str | None,
) -> web.StreamResponse:
    cfg = sim.config
    tried = routed.candidates if routed.prefs.allow_fallbacks else routed.candidates[:1]
    attempts: list[ProviderAttempt] = []
    last: tuple[str, SimModel, SimEndpoint] | None = None
    rate_waits: list[float] = []
    for model, ep in tried:
        wait = sim.limits.take_provider(model, ep)
        if wait > 0:
            # The provider's own limit: an upstream 429 for this attempt, then a fallback.
            attempts.append(_failed_attempt(model, ep, 429))
            rate_waits.append(wait)
            last = (_BUCKET_EMPTY, model, ep)
            continue
        pfault = fault_bodies.draw(provider_rates(cfg, ep), sim.rng)
        if pfault in HTTP_FAULTS:
            # Fails this attempt only; OpenRouter silently moves on (§2.3 step 5).
            status, _, _ = fault_bodies.http_fault(
                pfault,
                provider_name=ep.provider_name,
                model_id=model.id,
                retry_after_s=cfg.retry_after_s,
                user_id=cfg.user_id,
            )
            attempts.append(_failed_attempt(model, ep, status))
            last = (pfault, model, ep)
            sim.faults_injected[pfault] += 1
            continue
        if pfault == "reset_before_headers":
            return _reset(sim, request, summary, pfault)
        if pfault == "http_402_in_flight":
            return _fault_response(sim, pfault, model, ep, gen_id, summary)
        served = _Served(model, ep, fault or pfault, attempts)
        return await _serve(sim, request, summary, routed, hold, gen_id, served)
    assert last is not None
    pfault, model, ep = last
    if pfault == _BUCKET_EMPTY:
        # Retry-After only when every provider tried gave a retry hint (§6.6).
        hint = min(rate_waits) if len(rate_waits) == len(attempts) else None
        return _upstream_rate_limited(sim, model, ep, gen_id, summary, hint)
    return _fault_response(sim, pfault, model, ep, gen_id, summary, count=False)


@dataclass(slots=True)
class _Served:
    """The endpoint that serves, the fault that shapes its answer, the attempts that failed first."""

    model: SimModel
    ep: SimEndpoint
    fault: str | None
    attempts: list[ProviderAttempt]


async def _serve(
    sim: OpenRouterState,
    request: web.Request,
    summary: dict[str, Any],
    routed: Routed,
    hold: Hold | None,
    gen_id: str,
    served: _Served,
) -> web.StreamResponse:
    """Plan the generation on the endpoint that serves it, count it, and answer."""
    model, ep = served.model, served.ep
    plan = make_plan(
        sim.config,
        wants_metadata(request),
        routed.body,
        gen_id,
        model,
        ep,
        routed.prompt_tokens,
        routed.max_tokens,
        served.fault,
        served.attempts,
        [e for _, e in routed.candidates],
    )
    plan.session_id = str(routed.session_id) if routed.session_id else None
    plan.hold = hold
    plan.requested_model = routed.requested
    summary["served_by"] = ep.tag
    summary["fault"] = plan.fault
    if plan.fault:
        sim.faults_injected[plan.fault] += 1
    sim.served[ep.tag] += 1
    if plan.session_id and not routed.prefs.order:
        sim.sticky[(model.id, plan.session_id)] = ep.tag
    if plan.stream:
        return await serve_stream(sim, request, plan, summary)
    return await serve_json(sim, request, plan)


def _failed_attempt(model: SimModel, ep: SimEndpoint, status: int) -> ProviderAttempt:
    return ProviderAttempt(
        endpoint_id=endpoint_id(model, ep),
        provider_name=ep.provider_name,
        model_permaslug=model.canonical_slug,
        status=status,
        latency_ms=0,
        upstream_id="",
    )


def _upstream_rate_limited(
    sim: OpenRouterState,
    model: SimModel,
    ep: SimEndpoint,
    gen_id: str,
    summary: dict[str, Any],
    wait: float | None,
) -> web.Response:
    cfg = sim.config
    summary["error"] = _BUCKET_EMPTY
    headers = cf_headers(gen_id)
    if wait is not None and cfg.provider_rate_retry_after:
        headers["Retry-After"] = str(max(1, math.ceil(wait)))
    return json_response(
        429, refusals.upstream_rate_limited(ep.provider_name, model.id, cfg.user_id), headers
    )


def _fault_response(
    sim: OpenRouterState,
    fault: str,
    model: SimModel,
    ep: SimEndpoint,
    gen_id: str | None,
    summary: dict[str, Any],
    *,
    count: bool = True,
) -> web.Response:
    """The answer of an HTTP fault (faults.http_fault), counted unless already counted."""
    cfg = sim.config
    if count:
        sim.faults_injected[fault] += 1
    status, body, extra = fault_bodies.http_fault(
        fault,
        provider_name=ep.provider_name,
        model_id=model.id,
        retry_after_s=cfg.retry_after_s,
        user_id=cfg.user_id,
    )
    summary["error"] = fault
    summary["fault"] = fault
    headers = cf_headers(gen_id)
    headers.update(extra)
    return json_response(status, body, headers)


def _reset(sim: OpenRouterState, request: web.Request, summary: dict[str, Any], fault: str) -> web.Response:
    """The connection reset before any header (the client sees no status at all)."""
    sim.faults_injected[fault] += 1
    summary["error"] = fault
    summary["fault"] = fault
    summary["status"] = 0
    if request.transport is not None:
        request.transport.close()
    return web.Response(status=500)
