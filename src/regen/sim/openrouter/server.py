"""`OpenRouterSim`: a real aiohttp server on loopback speaking OpenRouter's wire format.

One process, one event loop. Each request is served by its own aiohttp handler task; a stream wakes
every `chunk_interval_s` and flushes all tokens produced since its last flush in one write, so cost
scales with chunks, never with tokens (serve_stream.py). Money truth lives in `billing` (the
simulated account's billing book); `requests` keeps a bounded summary of every chat request for
tests to assert on. The routes are in chat.py, account.py, listing.py and admin.py, each taking
the simulator's state (state.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from functools import partial

from aiohttp import web

from regen.sim.openrouter import account, admin, chat, listing
from regen.sim.openrouter.config import SimConfig
from regen.sim.openrouter.state import OpenRouterState


class OpenRouterSim(OpenRouterState):
    """The simulator. `config` may be replaced or mutated at any time; it is read per request."""

    def __init__(self, config: SimConfig | None = None) -> None:
        super().__init__(config)
        self._runner: web.AppRunner | None = None
        self._host = "127.0.0.1"
        self._port: int | None = None

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_post("/api/v1/chat/completions", partial(chat.chat_completions, self))
        r.add_get("/api/v1/key", partial(account.key, self))
        r.add_get("/api/v1/auth/key", partial(account.key, self))
        r.add_get("/api/v1/credits", partial(account.credits, self))
        r.add_get("/api/v1/generation", partial(account.generation, self))
        r.add_get("/api/v1/models", partial(listing.models, self))
        r.add_get("/api/v1/models/{author}/{slug}/endpoints", partial(listing.endpoints, self))
        r.add_get("/_sim/state", partial(admin.state, self))
        r.add_get("/_sim/ledger", partial(admin.bills, self))
        r.add_get("/_sim/config", partial(admin.config_get, self))
        r.add_post("/_sim/config", partial(admin.config_post, self))
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        # handler_cancellation off: a non-stream request keeps running (and is billed) after
        # the client leaves, as at OpenRouter (§1.4).
        runner = web.AppRunner(
            self.make_app(), access_log=None, handler_cancellation=False, shutdown_timeout=1.0
        )
        await runner.setup()
        # A deep backlog: 2000 clients connect at once and SYN retries would cost seconds.
        site = web.TCPSite(runner, host, port, backlog=4096, reuse_address=True)
        await site.start()
        self._runner = runner
        self._host = host
        self._port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("simulator not started")
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://{self._host}:{self.port}/api/v1"

    async def __aenter__(self) -> OpenRouterSim:
        if self._runner is None:
            await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def serve_forever(config: SimConfig, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve until SIGINT/SIGTERM, after printing one "listening" line to stdout."""
    sim = OpenRouterSim(config)
    await sim.start(host, port)
    print(f"regen sim openrouter listening on http://{host}:{sim.port}/api/v1", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    try:
        await stop.wait()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        await sim.stop()


__all__ = ["OpenRouterSim", "serve_forever"]
