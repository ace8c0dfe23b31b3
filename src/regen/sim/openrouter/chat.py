"""POST /chat/completions: read and check the request, resolve its models, route over their
endpoints, pass the account's gates, then serve (attempts.py) (docs/openrouter.md §2, §3)."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from regen.sim.openrouter.admission import admit
from regen.sim.openrouter.attempts import Routed, serve_candidates
from regen.sim.openrouter.catalog import SimEndpoint, SimModel
from regen.sim.openrouter.config import SimConfig
from regen.sim.openrouter.lookup import find_model, model_endpoints
from regen.sim.openrouter.routing import (
    NoEndpoints,
    Prefs,
    RequestError,
    filter_endpoints,
    order_endpoints,
    parse_prefs,
)
from regen.sim.openrouter.state import OpenRouterState
from regen.sim.openrouter.wire import authorize, cf_headers, error_response, json_response

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_INVALID = {"error_type": "invalid_request"}


def estimate_prompt_tokens(messages: list[Any]) -> int:
    """Deterministic stand-in for the native tokenizer: utf-8 bytes // 4 + 4 per message."""
    n = 0
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            n += len(content.encode())
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    n += len(part["text"].encode())
    return n // 4 + 4 * len(messages)


async def chat_completions(sim: OpenRouterState, request: web.Request) -> web.StreamResponse:
    """Count the request and keep its summary in `sim.requests` while it is answered."""
    sim.total_requests += 1
    sim.in_flight += 1
    if sim.in_flight > sim.peak_in_flight:
        sim.peak_in_flight = sim.in_flight
    summary: dict[str, Any] = {
        "model": None,
        "provider": None,
        "max_tokens": None,
        "stream": None,
        "served_by": None,
        "error": None,
        "fault": None,
        "status": None,
        "gen_id": None,
        "cancelled": False,
    }
    sim.requests.append(summary)
    try:
        resp = await _answer(sim, request, summary)
        if summary["status"] is None:
            summary["status"] = resp.status
        return resp
    finally:
        sim.in_flight -= 1


async def _answer(sim: OpenRouterState, request: web.Request, summary: dict[str, Any]) -> web.StreamResponse:
    cfg = sim.config
    auth = authorize(cfg, request)
    if isinstance(auth, web.Response):
        summary["error"] = "unauthorized"
        return auth
    body = await _read_body(request, summary)
    if isinstance(body, web.Response):
        return body
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_completion_tokens")
    summary["max_tokens"] = max_tokens
    try:
        prefs = parse_prefs(body.get("provider"))
    except RequestError as exc:
        summary["error"] = "bad_request"
        return error_response(400, str(exc), metadata=_INVALID)
    requested = body.get("model") or cfg.default_model
    resolved = _resolve(sim, requested, body, summary)
    if isinstance(resolved, web.Response):
        return resolved
    messages: list[Any] = body["messages"]
    prompt_tokens = estimate_prompt_tokens(messages)
    session_id = body.get("session_id") or request.headers.get("x-session-id")
    routed = Routed(body, prefs, [], prompt_tokens, max_tokens, session_id, requested)
    refused = _route(sim, cfg, resolved, routed, summary)
    if refused is not None:
        return refused
    primary_model, primary = routed.candidates[0]
    refused, hold = admit(
        sim, summary, primary_model, primary, prompt_tokens, max_tokens, free=resolved[0][1] == "free"
    )
    if refused is not None:
        return refused
    try:
        return await serve_candidates(sim, request, summary, routed, hold)
    finally:
        # A request that ended unbilled (a fault, a reset) has no cost to settle.
        sim.limits.release(hold)


async def _read_body(request: web.Request, summary: dict[str, Any]) -> dict[str, Any] | web.Response:
    """The request's JSON object, checked (validate), its summary filled in; or the 400."""
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        summary["error"] = "bad_request"
        return error_response(400, "Invalid JSON in request body", metadata=_INVALID)
    if not isinstance(body, dict):
        summary["error"] = "bad_request"
        return error_response(400, "Request body must be a JSON object", metadata=_INVALID)
    summary["model"] = body.get("model")
    summary["provider"] = body.get("provider")
    summary["stream"] = body.get("stream") is True
    bad = validate(body)
    if bad is not None:
        summary["error"] = "bad_request"
        return error_response(400, bad, metadata=_INVALID)
    return body


def validate(body: dict[str, Any]) -> str | None:
    """What is wrong with a chat request's fields, or None."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "Invalid request parameters: 'messages' is required and must be a non-empty array"
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            return "Invalid request parameters: each message needs a valid 'role'"
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        return "Invalid request parameters: 'model' must be a string"
    models = body.get("models")
    if models is not None and (not isinstance(models, list) or not all(isinstance(m, str) for m in models)):
        return "Invalid request parameters: 'models' must be an array of strings"
    for key in ("max_tokens", "max_completion_tokens"):
        v = body.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            return f"Invalid request parameters: '{key}' must be an integer >= 1"
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        return "Invalid request parameters: 'stream' must be a boolean"
    return None


def _resolve(
    sim: OpenRouterState, requested: str, body: dict[str, Any], summary: dict[str, Any]
) -> list[tuple[SimModel, str | None]] | web.Response:
    """Each model the request names (`model`, then `models`) with its variant; or the 400 of the
    first unknown one."""
    names = [requested, *[m for m in body.get("models") or [] if m != requested]]
    resolved: list[tuple[SimModel, str | None]] = []
    for name in names:
        model, variant = find_model(sim.config, name)
        if model is None:
            summary["error"] = "model_not_found"
            return error_response(
                400,
                f"{name} is not a valid model ID",
                metadata=_INVALID,
                availability={
                    "code": "model_not_found",
                    "retryable": False,
                    "requested_models": [name],
                    "docs_url": "https://openrouter.ai/docs/errors#model_not_found",
                },
            )
        resolved.append((model, variant))
    return resolved


def _route(
    sim: OpenRouterState,
    cfg: SimConfig,
    resolved: list[tuple[SimModel, str | None]],
    routed: Routed,
    summary: dict[str, Any],
) -> web.Response | None:
    """Fill `routed.candidates`: each model's ordered endpoints, in model order; or the 404 of
    the first model with none left."""
    prefs: Prefs = routed.prefs
    first_404: NoEndpoints | None = None
    for model, variant in resolved:
        try:
            eps: list[SimEndpoint] = filter_endpoints(
                model,
                model_endpoints(sim.config, model, variant),
                prefs,
                routed.body,
                routed.prompt_tokens,
                routed.max_tokens,
                cfg.rogue_providers,
            )
        except NoEndpoints as exc:
            first_404 = first_404 or exc
            continue
        sticky = None
        if routed.session_id and not prefs.order:
            sticky = sim.sticky.get((model.id, str(routed.session_id)))
        model_sort = {"nitro": "throughput", "floor": "price"}.get(variant or "")
        ordered = order_endpoints(eps, prefs, sim.rng, model_sort, sticky)
        routed.candidates.extend((model, e) for e in ordered)
    if not routed.candidates:
        assert first_404 is not None
        summary["error"] = "no_endpoints"
        return json_response(404, first_404.body, cf_headers())
    return None
