"""A local port forwarded over a host's SSH connection to a server on the host's 127.0.0.1.

``Tunnel`` listens on 127.0.0.1 here (a port chosen once, kept for its life) and forwards each
connection over the host's one ``HostConnection`` (asyncssh ``forward_local_port``). When the SSH
connection drops, asyncssh closes the listener and every forwarded connection with it: requests in
flight fail as transport errors, new ones are refused (the backend counts that as an outage). A
watcher then opens the connection again (with the connection's own backoff), listens on the same
port again and calls ``on_reopen``, so the backend can abort the rids the drop cut off
(docs/gpu-host.md, "The tunnel").
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import time
from collections.abc import Callable

import asyncssh

from regen.engine.host.errors import HostError, HostUnreachable
from regen.engine.host.ssh import HostConnection, backoff_s
from regen.engine.schema import TunnelView

LOCAL_HOST = "127.0.0.1"
# Listening on the same port again can briefly fail while the old listener's sockets close.
REBIND_TRIES = 20
REBIND_WAIT_S = 0.1
# Between rounds of reconnect tries once the connection's own tries are spent.
DOWN_RETRY_MAX_S = 30.0
# The local listener's queue of connections not yet accepted. asyncssh listens with asyncio's default
# (100), and a job opens its whole pool at once (512 for SGLang): past the hundredth the kernel
# dropped the handshake, and the client tried again a second later. That second was the tunnel's p95
# time to first token at 512 in flight (BENCHMARKS.md, "SGLang backend through the SSH tunnel").
LISTEN_BACKLOG = 4096
# How often the tunnel checks that the host's port still has a listener, and how long one check may take.
PROBE_INTERVAL_S = 1.0
PROBE_TIMEOUT_S = 10.0


class Tunnel:
    """``http://127.0.0.1:<local_port>`` here is ``127.0.0.1:<remote_port>`` on the host."""

    def __init__(
        self,
        conn: HostConnection,
        remote_port: int,
        *,
        local_port: int = 0,
        on_reopen: Callable[[Tunnel], None] | None = None,
        on_change: Callable[[Tunnel], None] | None = None,
        probe_interval_s: float = PROBE_INTERVAL_S,
    ) -> None:
        self.probe_interval_s = probe_interval_s
        self.conn = conn
        self.remote_port = remote_port
        self.local_port = local_port
        self.on_reopen = on_reopen
        self.on_change = on_change
        self.state = "closed"
        self.error: str | None = None
        self.reopens = 0  # times the tunnel came back after a drop
        self.drops = 0
        self.opened_at: float | None = None
        self.connections = 0  # forwarded connections accepted, over the tunnel's life
        self._listener: asyncssh.SSHListener | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def name(self) -> str:
        return self.conn.name

    @property
    def url(self) -> str:
        return f"http://{LOCAL_HOST}:{self.local_port}"

    def _set(self, state: str, error: str | None = None) -> None:
        self.state = state
        self.error = error
        if self.on_change is not None:
            self.on_change(self)

    def _accept(self, host: str, port: int) -> bool:
        self.connections += 1
        return True

    async def _listen(self) -> asyncssh.SSHClientConnection:
        """Open the connection if needed and listen; the port stays the one chosen first."""
        ssh = await self.conn.connect()
        if ssh.is_closed():
            # The drop was seen here before the connection object heard of it.
            self.conn.forget(ssh)
            ssh = await self.conn.connect()
        tries = 0
        while True:
            try:
                listener = await ssh.forward_local_port(
                    LOCAL_HOST, self.local_port, LOCAL_HOST, self.remote_port, accept_handler=self._accept
                )
                break
            except OSError as exc:
                tries += 1
                if exc.errno != errno.EADDRINUSE or not self.local_port or tries >= REBIND_TRIES:
                    raise HostError(
                        f"{self.name}: cannot listen on {LOCAL_HOST}:{self.local_port} for the tunnel to "
                        f"port {self.remote_port}: {exc.strerror or exc}"
                    ) from None
                await asyncio.sleep(REBIND_WAIT_S)
        _deepen_backlog(listener, LISTEN_BACKLOG)
        self._listener = listener
        self.local_port = listener.get_port()
        self.opened_at = time.time()
        self._set("open")
        return ssh

    async def open(self) -> str:
        """Listen and start watching the connection; returns the URL. Raises HostError."""
        if self._closed:
            raise HostError(f"{self.name}: the tunnel is closed")
        self._set("opening")
        try:
            ssh = await self._listen()
        except HostError as exc:
            self._set(exc.state, str(exc))
            raise
        self._watcher = asyncio.get_running_loop().create_task(self._watch(ssh), name=f"tunnel-{self.name}")
        return self.url

    async def _probe(self, ssh: asyncssh.SSHClientConnection) -> bool:
        """Whether something listens on the host's port: a channel opened there and closed at once."""
        try:
            chan, _ = await asyncio.wait_for(
                ssh.create_connection(asyncssh.SSHTCPSession, LOCAL_HOST, self.remote_port),
                PROBE_TIMEOUT_S,
            )
        except asyncssh.ChannelOpenError:
            return False
        chan.close()
        return True

    def _unlisten(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()

    async def _watch(self, ssh: asyncssh.SSHClientConnection) -> None:
        """Keep the tunnel honest for as long as it is open.

        Every ``probe_interval_s`` a channel is opened to the host's port. While nothing listens there
        (the server died or was stopped) the local port is closed too, so a request is refused at
        connect (an outage, nothing sent) instead of being accepted and cut; when the server is back,
        the port listens again. When the SSH connection drops, the connection is opened again and the
        port listens again. Either way ``on_reopen`` is called once the tunnel carries requests again.
        """
        failures = 0
        while not self._closed:
            await asyncio.sleep(self.probe_interval_s)
            if self.closed:
                return
            if not ssh.is_closed():
                try:
                    there = await self._probe(ssh)
                except (asyncssh.Error, OSError, TimeoutError):
                    there = None  # the connection itself is in trouble: the next round sees it closed
                if there is None:
                    continue
                if there and self._listener is None:
                    try:
                        await self._listen()
                    except HostError as exc:
                        self._set("down", str(exc))
                        continue
                    self._reopened()
                elif not there and self._listener is not None:
                    self._unlisten()
                    self._set("no server", f"nothing listens on the host's port {self.remote_port}")
                continue
            self.drops += 1
            self._unlisten()
            self._set("reopening", "the SSH connection dropped")
            while not self._closed:
                try:
                    ssh = await self._listen()
                except HostUnreachable as exc:
                    failures += 1
                    delay = min(DOWN_RETRY_MAX_S, backoff_s(failures, 1.0, DOWN_RETRY_MAX_S))
                    self._set("down", f"{exc}; trying again in {delay:.0f} s")
                    await asyncio.sleep(delay)
                    continue
                except HostError as exc:
                    # A refused key or a port taken here: retrying soon will not help, later may.
                    failures += 1
                    self._set("down", str(exc))
                    await asyncio.sleep(DOWN_RETRY_MAX_S)
                    continue
                failures = 0
                self._reopened()
                break

    def _reopened(self) -> None:
        self.reopens += 1
        if self.on_reopen is not None:
            self.on_reopen(self)

    async def close(self) -> None:
        self._closed = True
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watcher
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(listener.wait_closed(), 2.0)
        self._set("closed")

    def view(self) -> TunnelView:
        return {
            "host": self.name,
            "url": self.url,
            "remote_port": self.remote_port,
            "state": self.state,
            "error": self.error,
            "drops": self.drops,
            "reopens": self.reopens,
            "connections": self.connections,
        }


def _deepen_backlog(listener: asyncssh.SSHListener, backlog: int) -> None:
    """Listen again on the listener's sockets with a deeper queue: Linux takes a second listen() on a
    listening socket as its new backlog. asyncssh does not take a backlog, and keeps its servers in
    `_servers` (tests/integration/host/test_tunnel.py reads the kernel's backlog, so a release that moves them
    fails there, not silently in a job)."""
    for server in getattr(listener, "_servers", ()):
        for sock in server.sockets:
            with contextlib.suppress(OSError), socket.socket(fileno=os.dup(sock.fileno())) as again:
                again.listen(backlog)


__all__ = ["Tunnel"]
