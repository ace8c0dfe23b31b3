"""The simulator's own routes under /_sim/: its state, every bill, and its config read or patched
live (what tests and the benchmarks steer it with)."""

from __future__ import annotations

import orjson
from aiohttp import web
from pydantic import ValidationError

from regen.sim.configs import patched
from regen.sim.openrouter.state import OpenRouterState
from regen.sim.openrouter.wire import json_response


async def state(sim: OpenRouterState, request: web.Request) -> web.StreamResponse:
    return json_response(200, sim.state(), {})


async def bills(sim: OpenRouterState, request: web.Request) -> web.StreamResponse:
    """/_sim/ledger: every billed generation (id, provider, cost), what a test compares a client's
    ledger with."""
    records = [
        {"id": rec.id, "provider": rec.provider_name, "cost": rec.cost, "cancelled": rec.cancelled}
        for rec in sim.billing.records
    ]
    return json_response(200, {"billed_total": str(sim.billing.billed_total), "records": records}, {})


async def config_get(sim: OpenRouterState, request: web.Request) -> web.StreamResponse:
    return json_response(200, sim.config.model_dump(), {})


async def config_post(sim: OpenRouterState, request: web.Request) -> web.StreamResponse:
    try:
        patch = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return json_response(400, {"error": "body is not JSON"}, {})
    if not isinstance(patch, dict):
        return json_response(400, {"error": "patch must be a JSON object"}, {})
    try:
        new = patched(sim.config, patch)
    except ValidationError as exc:
        return json_response(400, {"error": str(exc)}, {})
    sim.apply_config(new)
    return json_response(200, {"ok": True, "config": new.model_dump()}, {})
