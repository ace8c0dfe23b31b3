"""The account-level gates a chat request passes before any provider is tried (docs/openrouter.md
§6.5): a negative balance, the free-model counts, the pre-flight estimate, the in-flight budget."""

from __future__ import annotations

import math
from typing import Any

from aiohttp import web

from regen.sim.openrouter import refusals
from regen.sim.openrouter.catalog import SimEndpoint, SimModel
from regen.sim.openrouter.limits import Hold, Refusal, preflight_estimate
from regen.sim.openrouter.state import OpenRouterState
from regen.sim.openrouter.wire import cf_headers, json_response


def admit(
    sim: OpenRouterState,
    summary: dict[str, Any],
    model: SimModel,
    ep: SimEndpoint,
    prompt_tokens: int,
    max_tokens: int | None,
    *,
    free: bool,
) -> tuple[web.Response | None, Hold | None]:
    """The account-level gates, in order: a negative balance refuses everything (free models
    too, §6.5 item 3), then the free-model counts, the pre-flight estimate and, for paid
    non-BYOK requests, the in-flight budget, whose hold the caller must settle or release."""
    if sim.billing.balance < 0:
        summary["error"] = "negative_balance"
        return json_response(402, refusals.negative_balance(sim.config.user_id), cf_headers()), None
    if free:
        refusal = sim.limits.admit_free()
        if refusal is not None:
            return _refuse(refusal, summary), None
    preflight = _preflight(sim, model, ep, prompt_tokens, max_tokens)
    if preflight is not None:
        summary["error"] = "payment_required"
        return preflight, None
    if free or sim.config.byok or not sim.config.in_flight_budget:
        # The in-flight budget covers neither free models nor BYOK requests (§6.5 item 2).
        return None, None
    wanted, prompt_cost, per_token = preflight_estimate(model, ep, prompt_tokens, max_tokens)
    refusal, hold = sim.limits.admit_budget(prompt_cost + wanted * per_token, sim.billing.balance)
    if refusal is not None:
        return _refuse(refusal, summary), None
    return None, hold


def _refuse(refusal: Refusal, summary: dict[str, Any]) -> web.Response:
    summary["error"] = refusal.label
    headers = cf_headers()
    headers.update(refusal.headers)
    return json_response(refusal.status, refusal.body, headers)


def _preflight(
    sim: OpenRouterState, model: SimModel, ep: SimEndpoint, prompt_tokens: int, max_tokens: int | None
) -> web.Response | None:
    """Refuse what the balance or key limit cannot cover at worst case (§6.5 item 1)."""
    remaining, source = sim.billing.affordable()
    wanted, prompt_cost, per_token = preflight_estimate(model, ep, prompt_tokens, max_tokens)
    if prompt_cost + wanted * per_token <= remaining:
        return None
    can = max(0, math.floor((remaining - prompt_cost) / per_token)) if per_token > 0 else 0
    if source == "key_limit":
        tail = (
            "To increase, visit https://openrouter.ai/settings/keys and create a key "
            "with a higher monthly limit"
        )
    else:
        tail = "To increase, visit https://openrouter.ai/settings/credits and upgrade to a paid account"
    body = {
        "error": {
            "message": (
                f"This request requires more credits, or fewer max_tokens. You "
                f"requested up to {wanted} tokens, but can only afford {can}. {tail}"
            ),
            "code": 402,
            "metadata": {"provider_name": None},
        },
        "user_id": sim.config.user_id,
    }
    return json_response(402, body, cf_headers())
