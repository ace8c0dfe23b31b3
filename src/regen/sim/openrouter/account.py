"""The account's read routes: GET /key (and /auth/key), /credits and /generation (docs/openrouter.md
§7.1, §8). Usage lags by `account_staleness_s`; a generation is found only a while after it ends."""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

from aiohttp import web

from regen.sim.openrouter.state import OpenRouterState
from regen.sim.openrouter.views import generation_body
from regen.sim.openrouter.wire import authorize, cf_headers, error_response, json_response


async def key(sim: OpenRouterState, request: web.Request) -> web.StreamResponse:
    auth = authorize(sim.config, request)
    if isinstance(auth, web.Response):
        return auth
    cfg = sim.config
    usage, limit_remaining = account_figures(sim)
    is_mgmt = auth == cfg.management_key
    data: dict[str, Any] = {
        "label": auth[:9] + "..." + auth[-3:] if len(auth) > 12 else auth,
        "limit": cfg.key_limit,
        "limit_remaining": limit_remaining,
        "limit_reset": cfg.key_limit_reset,
        "include_byok_in_limit": False,
        "usage": usage,
        "usage_daily": usage,
        "usage_weekly": usage,
        "usage_monthly": usage,
        "byok_usage": 0.0,
        "byok_usage_daily": 0.0,
        "byok_usage_weekly": 0.0,
        "byok_usage_monthly": 0.0,
        "is_free_tier": False,
        "is_management_key": is_mgmt,
        "is_provisioning_key": is_mgmt,
        "creator_user_id": cfg.user_id,
        "expires_at": None,
        "rate_limit": {
            "interval": "1h",
            "note": "This field is deprecated and safe to ignore.",
            "requests": -1,
        },
    }
    if cfg.free_model_limits:
        # Newer docs add the free-model day count to /key (§7.1).
        used, limit = sim.limits.free.used_today(), sim.limits.free_daily_limit()
        data["free_model_daily_requests"] = {
            "used": used,
            "limit": limit,
            "remaining": max(0, limit - used),
        }
    return json_response(200, {"data": data}, cf_headers())


def account_figures(sim: OpenRouterState) -> tuple[float, float | None]:
    """(usage, limit_remaining) as /key and /credits report them: `account_staleness_s` old."""
    used = sim.billing.usage_as_of(time.time() - sim.config.account_staleness_s)
    limit = sim.config.key_limit
    if limit is None:
        return float(used), None
    return float(used), float(Decimal(repr(limit)) - used)


async def credits(sim: OpenRouterState, request: web.Request) -> web.StreamResponse:
    auth = authorize(sim.config, request)
    if isinstance(auth, web.Response):
        return auth
    cfg = sim.config
    if cfg.credits_require_management_key and auth != cfg.management_key:
        return error_response(403, "Only management keys can perform this operation")
    data = {"total_credits": cfg.credits, "total_usage": account_figures(sim)[0]}
    return json_response(200, {"data": data}, cf_headers())


async def generation(sim: OpenRouterState, request: web.Request) -> web.StreamResponse:
    auth = authorize(sim.config, request)
    if isinstance(auth, web.Response):
        return auth
    gen_id = request.query.get("id")
    headers = cf_headers()
    headers["cache-control"] = "private, no-store"
    if not gen_id:
        return json_response(
            400, {"error": {"code": 400, "message": "Missing required parameter: id"}}, headers
        )
    rec = sim.billing.get(gen_id)
    if rec is None or time.time() < rec.completed_at + sim.config.generation_lookup_delay_s:
        # Eventual consistency: unknown until a while after completion (§8 Lag).
        return json_response(
            404, {"error": {"message": f"Generation {gen_id} not found", "code": 404}}, headers
        )
    return json_response(200, {"data": generation_body(rec, request.headers.get("User-Agent"))}, headers)
