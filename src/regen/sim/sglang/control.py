"""SGLang's control routes (docs/sglang.md, "Control"): /abort_request, /flush_cache,
/pause_generation, /continue_generation and /slow_down, acting on the scheduler."""

from __future__ import annotations

from aiohttp import web

from regen.sim.sglang.state import SGLangState
from regen.sim.sglang.wire import json_response, read_json_body, validation_error

__all__ = ["abort_request", "continue_generation", "flush_cache", "pause_generation", "slow_down"]


async def abort_request(sim: SGLangState, request: web.Request) -> web.StreamResponse:
    body = await read_json_body(request)
    if not isinstance(body, dict):
        return validation_error("Input should be a valid dictionary or object")
    rid = body.get("rid")
    abort_all = body.get("abort_all") is True
    if rid is not None and not isinstance(rid, str):
        return validation_error("rid: Input should be a valid string")
    if sim.config.record_ids:
        sim.abort_requests.append(rid)
    sim.scheduler.abort(rid, abort_all=abort_all)
    return web.Response(status=200)


async def flush_cache(sim: SGLangState, request: web.Request) -> web.StreamResponse:
    sched = sim.scheduler
    ok = not sched.waiting and not sched.running
    if ok:
        sched.cache.flush()
        sim.log.scheduler("Cache flushed successfully!")
    else:
        sim.log.scheduler(
            "Cache not flushed because there are pending requests. "
            f"#queue-req: {len(sched.waiting)}, #running-req: {len(sched.running)}"
        )
    return web.Response(
        status=200 if ok else 400,
        text="Cache flushed.\nPlease check backend logs for more details. (When there are running or "
        "waiting requests, the operation will not be performed.)\n",
    )


async def pause_generation(sim: SGLangState, request: web.Request) -> web.StreamResponse:
    sim.scheduler.paused = True
    sim.log.scheduler("Paused generation in place")
    return json_response({"message": "Generation paused successfully.", "status": "ok"})


async def continue_generation(sim: SGLangState, request: web.Request) -> web.StreamResponse:
    sim.scheduler.paused = False
    sim.scheduler.wake()
    sim.log.scheduler("Generation continued")
    return json_response({"message": "Generation continued successfully.", "status": "ok"})


async def slow_down(sim: SGLangState, request: web.Request) -> web.StreamResponse:
    body = await read_json_body(request)
    value = body.get("forward_sleep_time") if isinstance(body, dict) else None
    if value is not None and (not isinstance(value, int | float) or isinstance(value, bool) or value < 0):
        return validation_error("forward_sleep_time: Input should be a non-negative number")
    sim.apply_config(sim.config.model_copy(update={"forward_sleep_s": float(value or 0.0)}))
    return web.Response(status=200)
