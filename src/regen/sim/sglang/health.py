"""GET /health (and /health_generate) and /ready (docs/sglang.md, "Health and information"):
/health sends a one-token probe through the scheduler and answers 200 only if the scheduler
produces output within `health_check_timeout_s`; 503 while starting or shutting down."""

from __future__ import annotations

import asyncio
import contextlib
import time

from aiohttp import web

from regen.sim.sglang.request import Sampling
from regen.sim.sglang.state import SGLangState

__all__ = ["health", "ready"]


async def health(sim: SGLangState, request: web.Request) -> web.StreamResponse:
    if sim.shutting_down:
        sim.log.main("Health check request received during shutdown. Returning 503.")
        return web.Response(status=503)
    if sim.phase != "ready":
        return web.Response(status=503)
    cfg = sim.config
    sched = sim.scheduler
    tic = time.monotonic()
    wall = time.time()
    probe = sim.new_req(
        f"HEALTH_CHECK_{wall}",
        [0],
        Sampling(max_new_tokens=1, temperature=0.0),
        log_metrics=False,
        internal=True,
    )
    sched.submit(probe)
    deadline = tic + cfg.health_check_timeout_s * cfg.time_scale
    try:
        while sched.last_output_at <= tic:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                last = time.strftime("%H:%M:%S", time.localtime(wall - (tic - sched.last_output_at)))
                sim.log.main(
                    level="error",
                    message="Health check failed. Server couldn't get a response from detokenizer for last "
                    f"{cfg.health_check_timeout_s:g} seconds. tic start time: "
                    f"{time.strftime('%H:%M:%S', time.localtime(wall))}. last_heartbeat time: {last}",
                )
                return web.Response(status=503)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(sched.output_event.wait(), min(remaining, 1.0))
        return web.Response(status=200)
    finally:
        sched.abort_req(probe)


async def ready(sim: SGLangState, request: web.Request) -> web.StreamResponse:
    return web.Response(status=200 if sim.phase in ("warmup", "ready") else 503)
