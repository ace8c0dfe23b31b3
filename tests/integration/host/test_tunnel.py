"""The tunnel over a real sshd on loopback: forwards, comes back on the same port after the SSH
connection drops, and refuses connections while nothing listens on the host's port."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from regen.engine.host.ssh import HostConnection
from regen.engine.host.tunnel import LISTEN_BACKLOG, Tunnel
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


def listen_backlog(port: int) -> int | None:
    """The kernel's backlog of this process's socket listening on 127.0.0.1:`port` (TCP_INFO of a
    listener holds it in tcpi_sacked, as `ss -lt` shows it), or None where none listens."""
    for name in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        with sock:
            try:
                if sock.family != socket.AF_INET or sock.type != socket.SOCK_STREAM:
                    continue  # a Unix socket's name is a path, not (host, port)
                if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    continue
                if sock.getsockname()[1] != port:
                    continue
                info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
            except OSError:
                continue
            # struct tcp_info: eight u8 fields, then u32 rto, ato, snd_mss, rcv_mss, unacked, sacked.
            return int(struct.unpack_from("8B6I", info)[13])
    return None


async def test_the_tunnel_queues_a_whole_pool_of_connections_opened_at_once(
    own_sshd: SshServer, own_tree: dict[str, Path], make_host: HostFactory, server: Server
) -> None:
    """asyncssh listens with a backlog of 100; a job opens 512 connections at once, and those past
    the queue waited a second for the SYN retry (engine/host/tunnel.py LISTEN_BACKLOG)."""
    conn = HostConnection(make_host(own_sshd, own_tree), backoff_base_s=0.05)
    tunnel = Tunnel(conn, server.port, probe_interval_s=0.1)
    try:
        await tunnel.open()
        assert listen_backlog(tunnel.local_port) == min(LISTEN_BACKLOG, somaxconn())
        # And again after the connection drops and the tunnel listens anew.
        assert own_sshd.kill_sessions() == 1
        await until(lambda: tunnel.state == "open" and tunnel.reopens == 1)
        assert listen_backlog(tunnel.local_port) == min(LISTEN_BACKLOG, somaxconn())
        assert await get(tunnel.url) == "hello"
    finally:
        await tunnel.close()
        await conn.close()


def somaxconn() -> int:
    return int(Path("/proc/sys/net/core/somaxconn").read_text())
