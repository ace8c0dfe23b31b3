"""`SGLangSim`: a real aiohttp server speaking SGLang's native HTTP API on loopback.

One process, one event loop: the HTTP handlers, the scheduler task, the watchdog and the startup
sequence. The listening socket is bound at `start()` (so port 0 gets its number at once) but only
listens from the HTTP phase on, so a client connecting earlier is refused, as with the real server
before uvicorn is up. `crashed` resolves with the exit status the process must end with when the
server dies (a startup failure, the watchdog): the standalone runner ends the process with it; a
test holding the server in its own process just awaits it. What the parts share is in state.py;
the routes are in generate.py, health.py, info.py, metrics.py, control.py and admin.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from aiohttp import web

from regen.sim.sglang import admin, control, generate, health, info, metrics
from regen.sim.sglang.config import SimSGLangConfig
from regen.sim.sglang.logs import SimLog
from regen.sim.sglang.startup import run_startup
from regen.sim.sglang.state import EXIT_KILLED, SIGQUIT_LINE, SGLangState
from regen.sim.sglang.tokens import SimTokenizer
from regen.sim.sglang.wire import json_response, not_found

__all__ = ["SGLangSim"]

_OPEN_PATHS = ("/health", "/ready", "/metrics", "/_sim/")


class SGLangSim(SGLangState):
    """The simulated server. `config` may be replaced at any time (apply_config); it is read live."""

    def __init__(
        self,
        config: SimSGLangConfig | None = None,
        tokenizer: SimTokenizer | None = None,
        *,
        log: SimLog | None = None,
    ) -> None:
        if tokenizer is None:
            raise ValueError("SGLangSim needs a tokenizer (SimTokenizer)")
        super().__init__(
            config if config is not None else SimSGLangConfig(),
            tokenizer,
            log if log is not None else SimLog(),
            self._on_watchdog,
        )
        self.on_listening: Callable[[str], None] | None = None
        self.defer_bind_errors = False
        self._runner: web.AppRunner | None = None
        self._sock: socket.socket | None = None
        self._tasks: list[asyncio.Task[Any]] = []

    # --- lifecycle -----------------------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Bind the port and begin the startup phases; returns at once (await `wait_ready`)."""
        self._host = host
        self.crashed = asyncio.get_running_loop().create_future()
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            if not self.defer_bind_errors:
                raise
            # SGLang finds a taken port only when uvicorn starts: the HTTP phase fails then.
            self.bind_error = exc
            self._port = port
        else:
            self._sock = sock
            self._port = int(sock.getsockname()[1])
        # uvicorn closes a keep-alive connection idle for SGLANG_TIMEOUT_KEEP_ALIVE (5 s): a client
        # pool that keeps connections longer races the close (docs/sglang.md §3).
        self._runner = web.AppRunner(
            self.make_app(),
            access_log=None,
            handler_cancellation=False,
            shutdown_timeout=1.0,
            keepalive_timeout=self.config.timeout_keep_alive,
        )
        await self._runner.setup()
        self.scheduler.start()
        self._tasks.append(asyncio.create_task(run_startup(self, self.listen), name="sglang-sim-startup"))
        self._tasks.append(asyncio.create_task(generate.sweep_clients(self), name="sglang-sim-sweeper"))

    async def listen(self) -> None:
        """The HTTP phase: start accepting connections on the bound socket."""
        assert self._runner is not None and self._sock is not None
        site = web.SockSite(self._runner, self._sock, backlog=4096)
        await site.start()
        self.site = site
        if self.on_listening is not None:
            self.on_listening(self.base_url)

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Until the ready line; raises RuntimeError if the server died first."""
        assert self.crashed is not None
        ready: asyncio.Future[Any] = asyncio.ensure_future(self.ready.wait())
        waiting: list[asyncio.Future[Any]] = [ready, self.crashed]
        try:
            done, _ = await asyncio.wait(waiting, timeout=timeout, return_when="FIRST_COMPLETED")
        finally:
            ready.cancel()
        if self.crashed.done():
            raise RuntimeError(f"the simulated server died (exit status {self.crashed.result()})")
        if not done:
            raise TimeoutError(f"the simulated server was not ready within {timeout} s (phase {self.phase})")

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        await self.scheduler.close()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        self.site = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def __aenter__(self) -> SGLangSim:
        if self._runner is None:
            await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _on_watchdog(self) -> None:
        cfg = self.config
        self.log.scheduler(
            level="error",
            message=f"Scheduler watchdog timeout (self.watchdog_timeout={cfg.watchdog_timeout:g}, self.soft=False)",
        )
        self._tasks.append(asyncio.create_task(self._watchdog_kill(), name="sglang-sim-watchdog-kill"))

    async def _watchdog_kill(self) -> None:
        # SGLang waits 5 s so the parent can print the error, then signals it with SIGQUIT.
        await asyncio.sleep(5.0 * self.config.time_scale)
        await self.crash(EXIT_KILLED, [SIGQUIT_LINE])

    # --- the app -------------------------------------------------------------------------------------
    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024, middlewares=[self._auth_middleware])
        r = app.router
        r.add_post("/generate", partial(generate.generate, self))
        r.add_put("/generate", partial(generate.generate, self))
        r.add_get("/health", partial(health.health, self))
        r.add_get("/health_generate", partial(health.health, self))
        r.add_get("/ready", partial(health.ready, self))
        r.add_get("/get_model_info", partial(info.get_model_info_route, self))
        r.add_get("/get_server_info", partial(info.get_server_info_route, self))
        r.add_get("/model_info", partial(info.model_info_route, self))
        r.add_get("/server_info", partial(info.server_info_route, self))
        r.add_get("/v1/models", partial(info.models_route, self))
        r.add_get("/v1/models/{model:.+}", partial(info.model_card_route, self))
        r.add_get("/metrics", partial(metrics.metrics, self))
        r.add_post("/abort_request", partial(control.abort_request, self))
        r.add_get("/flush_cache", partial(control.flush_cache, self))
        r.add_post("/flush_cache", partial(control.flush_cache, self))
        r.add_post("/pause_generation", partial(control.pause_generation, self))
        r.add_post("/continue_generation", partial(control.continue_generation, self))
        r.add_get("/slow_down", partial(control.slow_down, self))
        r.add_post("/slow_down", partial(control.slow_down, self))
        r.add_get("/_sim/state", partial(admin.state, self))
        r.add_get("/_sim/config", partial(admin.config_get, self))
        r.add_post("/_sim/config", partial(admin.config_post, self))
        r.add_route("*", "/{tail:.*}", not_found)
        return app

    @web.middleware
    async def _auth_middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        self.saw(request.transport)
        key = self.config.api_key
        if key and not request.path.startswith(_OPEN_PATHS):
            scheme, _, given = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or given.strip() != key:
                return json_response({"error": "Unauthorized"}, 401)
        if self.config.access_log:
            response = await handler(request)
            peer = request.transport.get_extra_info("peername") if request.transport else None
            where = f"{peer[0]}:{peer[1]}" if peer else "-"
            self.log.uvicorn(f'{where} - "{request.method} {request.path} HTTP/1.1" {response.status}')
            return response
        return await handler(request)
