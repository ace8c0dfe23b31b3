"""The simulator's own routes under /_sim/: its state, and its config read or patched live (what
tests and the benchmarks steer it with)."""

from __future__ import annotations

from aiohttp import web
from pydantic import ValidationError

from regen.sim.sglang.config import patched, problems
from regen.sim.sglang.state import SGLangState
from regen.sim.sglang.wire import json_response, read_json_body

__all__ = ["config_get", "config_post", "state"]


async def state(sim: SGLangState, request: web.Request) -> web.StreamResponse:
    return json_response(sim.state())


async def config_get(sim: SGLangState, request: web.Request) -> web.StreamResponse:
    return json_response(sim.config.model_dump())


async def config_post(sim: SGLangState, request: web.Request) -> web.StreamResponse:
    patch = await read_json_body(request)
    if not isinstance(patch, dict):
        return json_response({"error": "the patch must be a JSON object"}, 400)
    try:
        new = patched(sim.config, patch)
    except ValidationError as exc:
        return json_response({"error": problems(exc)}, 400)
    sim.apply_config(new)
    return json_response({"ok": True, "config": new.model_dump()})
