"""The SGLang simulator keeping what it served for every rid: the server's own record that the
SGLang backend's rows are compared with (tests/integration/backends/sglang/)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
from aiohttp import web

from regen.sim.sglang.config import SimSGLangConfig
from regen.sim.sglang.logs import SimLog
from regen.sim.sglang.request import Req
from regen.sim.sglang.server import SGLangSim
from regen.sim.sglang.tokens import SimTokenizer
from tests.support.sglang_sim import fast_config

SERVED = "kimi-k2.5"


class RecordingSim(SGLangSim):
    """The simulator, keeping what it received and generated for every client request by rid: the
    server's own record that rows are compared with."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.served: dict[str, dict[str, Any]] = {}
        self.abort_calls: list[str | None] = []  # the rid of every /abort_request, in order
        # Whether /server_info leaves out how many requests the server runs at once, as a server
        # that does not say would (docs/sglang.md §11.6: regen then learns it from /metrics).
        self.hide_slots = False

    def make_app(self) -> web.Application:
        app = super().make_app()
        app.middlewares.append(self._record_abort)  # inside the key check, as the route is
        app.middlewares.append(self._hide_slots)
        return app

    @web.middleware
    async def _hide_slots(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        response = await handler(request)
        if not self.hide_slots or request.path not in ("/server_info", "/get_server_info"):
            return response
        assert isinstance(response, web.Response) and response.body is not None
        info = orjson.loads(bytes(response.body))  # type: ignore[arg-type]
        info["max_running_requests"] = None
        info.pop("internal_states", None)
        return web.json_response(info, dumps=lambda v: orjson.dumps(v).decode())

    @web.middleware
    async def _record_abort(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.method == "POST" and request.path == "/abort_request":
            body = orjson.loads(await request.read() or b"{}")  # aiohttp keeps the body for the handler
            self.abort_calls.append(body.get("rid") if isinstance(body, dict) else None)
        return await handler(request)

    def _on_finish(self, req: Req) -> None:
        super()._on_finish(req)
        if not req.internal:
            self.served[req.rid] = {
                "prompt_ids": list(req.prompt_ids),
                "output_ids": list(req.output_ids),
                "finish": req.finish,
            }


@asynccontextmanager
async def recording_sim(
    config: SimSGLangConfig, tokenizer: SimTokenizer, log: SimLog | None = None, port: int = 0
) -> AsyncIterator[RecordingSim]:
    sim = RecordingSim(config, tokenizer, log=log)
    await sim.start(port=port)
    try:
        await sim.wait_ready(30)
        yield sim
    finally:
        await sim.stop()


def sim_config(**overrides: Any) -> SimSGLangConfig:
    return fast_config(served_model_name=SERVED, **overrides)


def slow_config(**overrides: Any) -> SimSGLangConfig:
    """Real time at 40 tokens/s per request: a 64-token answer stays in flight for 1.6 s."""
    quick_start = {
        f"startup_{phase}_s": 0.01 for phase in ("weights", "kv_pool", "cuda_graph", "http", "warmup")
    }
    return sim_config(time_scale=1.0, output_len_min=200, output_len_max=300, **quick_start, **overrides)
