"""The tunnel over a real sshd on loopback: forwards, comes back on the same port after the SSH
connection drops, and refuses connections while nothing listens on the host's port."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from regen.engine.host.ssh import HostConnection
from regen.engine.host.tunnel import Tunnel
from tests.support.hosts import HostFactory
from tests.support.processes import free_port
from tests.support.sshd import SshServer


class Server:
    """A small HTTP server on the "host's" 127.0.0.1 that can be stopped and started on its port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.runner: web.AppRunner | None = None

    async def start(self) -> None:
        async def hello(request: web.Request) -> web.Response:
            return web.Response(text="hello")

        app = web.Application()
        app.router.add_get("/hello", hello)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    made = Server()
    await made.start()
    try:
        yield made
    finally:
        await made.stop()


async def get(url: str) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.get(url + "/hello", timeout=aiohttp.ClientTimeout(total=5)) as r,
    ):
        return await r.text()


def refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


async def until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_the_tunnel_forwards_and_comes_back_after_a_drop(
    own_sshd: SshServer, own_tree: dict[str, Path], make_host: HostFactory, server: Server
) -> None:
    conn = HostConnection(make_host(own_sshd, own_tree), backoff_base_s=0.05)
    reopened: list[str] = []
    tunnel = Tunnel(conn, server.port, on_reopen=lambda t: reopened.append(t.url), probe_interval_s=0.1)
    try:
        url = await tunnel.open()
        assert url.startswith("http://127.0.0.1:") and tunnel.state == "open"
        assert await get(url) == "hello"
        port = tunnel.local_port
        # The host's sshd child for this connection dies: the tunnel is gone, then back on the same port.
        assert own_sshd.kill_sessions() == 1
        await until(lambda: tunnel.drops == 1)
        await until(lambda: tunnel.state == "open" and tunnel.reopens == 1)
        assert tunnel.local_port == port and reopened == [url]
        assert await get(url) == "hello"
        assert conn.retries >= 1
        # The server goes away: the local port stops listening (refused, not accepted and cut) ...
        await server.stop()
        await until(lambda: tunnel.state == "no server")
        assert refused(port)
        # ... and listens again once something answers on the host's port.
        await server.start()
        await until(lambda: tunnel.state == "open" and tunnel.reopens == 2)
        assert await get(url) == "hello"
    finally:
        await tunnel.close()
        await conn.close()
    assert tunnel.state == "closed" and refused(port)
