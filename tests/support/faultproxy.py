"""A TCP proxy on loopback that stages network faults in front of a real server (the simulator).

    proxy = FaultProxy("127.0.0.1", sim.port)
    await proxy.start()                 # listens on proxy.port; the client talks to proxy.base_url
    proxy.cut_after = 2000              # each connection is cut after 2000 response bytes
    proxy.stall = True                  # nothing moves, connections stay open (a hung middlebox)
    proxy.rate = 50                     # responses trickle at 50 bytes/s per connection
    proxy.refuse = True                 # connections are accepted and reset at once
    await proxy.stop()                  # the port is closed: connection refused (an outage)
    await proxy.restart()               # listening again on the same port

Faults are read for every chunk, so a test may switch them while requests are in flight.
`ThreadedFaultProxy` runs one on its own loop in a thread, with plain methods, for tests whose
client is another process (`regen run --headless`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")
CHUNK = 1 << 16


class FaultProxy:
    """Forwards TCP connections to (target_host, target_port), staging the faults it is told to."""

    def __init__(self, target_host: str, target_port: int, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.target = (target_host, target_port)
        self.host = host
        self.port = port
        self.cut_after: int | None = None  # response bytes per connection before it is cut
        self.cut_with_reset = False  # cut with a TCP reset instead of an orderly close
        self.stall = False
        self.rate: float | None = None  # response bytes per second per connection
        self.refuse = False
        self.connections = 0
        self.refused = 0
        self.cuts = 0
        self.bytes_down = 0
        self.bytes_up = 0
        self._server: asyncio.AbstractServer | None = None
        self._live: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/api/v1"

    @property
    def listening(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.host, self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def restart(self) -> None:
        """Listen again on the same port after `stop`."""
        if self._server is None:
            await self.start()

    async def stop(self) -> None:
        """Stop listening (new connections are refused) and cut every open connection."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            _reset(writer)
        for task in list(self._live):
            task.cancel()
        if self._live:
            await asyncio.gather(*self._live, return_exceptions=True)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._live.add(task)
        self.connections += 1
        try:
            if self.refuse:
                self.refused += 1
                _reset(client_w)
                return
            try:
                up_r, up_w = await asyncio.open_connection(*self.target)
            except OSError:
                _reset(client_w)
                return
            self._writers.update((client_w, up_w))
            state = {"down": 0}
            upward = asyncio.ensure_future(self._pump(client_r, up_w, state, down=False))
            downward = asyncio.ensure_future(self._pump(up_r, client_w, state, down=True))
            try:
                done, pending = await asyncio.wait({upward, downward}, return_when=asyncio.FIRST_COMPLETED)
                if pending and all(
                    not t.cancelled() and t.exception() is None and t.result() == "eof" for t in done
                ):
                    # One side finished sending (a half close): the other ends in its own time.
                    await asyncio.wait(pending)
            finally:
                for pump in (upward, downward):
                    pump.cancel()
                await asyncio.gather(upward, downward, return_exceptions=True)
                for writer in (client_w, up_w):
                    self._writers.discard(writer)
                    writer.close()
        finally:
            self._live.discard(task)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: dict[str, int], *, down: bool
    ) -> str:
        """Copy one direction; "eof" when its sender finished, "cut" when a fault ended it."""
        while True:
            data = await reader.read(CHUNK)
            if not data:
                with contextlib.suppress(OSError):
                    if writer.can_write_eof():
                        writer.write_eof()
                return "eof"
            while self.stall:
                await asyncio.sleep(0.01)
            if not down:
                self.bytes_up += len(data)
                writer.write(data)
                await writer.drain()
                continue
            if self.cut_after is not None and state["down"] + len(data) >= self.cut_after:
                keep = max(0, self.cut_after - state["down"])
                await self._send(writer, data[:keep], state)
                self.cuts += 1
                if self.cut_with_reset:
                    _reset(writer)
                else:
                    writer.close()
                return "cut"
            await self._send(writer, data, state)

    async def _send(self, writer: asyncio.StreamWriter, data: bytes, state: dict[str, int]) -> None:
        rate = self.rate
        if rate is None:
            writer.write(data)
            state["down"] += len(data)
            self.bytes_down += len(data)
            await writer.drain()
            return
        # A few writes a second at most, each of the bytes the rate allows meanwhile.
        step = max(1, int(rate / 20))
        for i in range(0, len(data), step):
            while self.stall:
                await asyncio.sleep(0.01)
            piece = data[i : i + step]
            writer.write(piece)
            state["down"] += len(piece)
            self.bytes_down += len(piece)
            await writer.drain()
            await asyncio.sleep(len(piece) / (self.rate or rate))


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset: SO_LINGER 0, as a crashed middlebox or a killed server does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class ThreadedFaultProxy:
    """A FaultProxy on its own event loop in a thread; every method is a plain call."""

    def __init__(self, target_host: str, target_port: int, *, port: int = 0) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        self.proxy = FaultProxy(target_host, target_port, port=port)

    def _call(self, make: Callable[[], Awaitable[T]]) -> T:
        async def run() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=30)

    def start(self) -> ThreadedFaultProxy:
        self._call(self.proxy.start)
        return self

    def stop(self) -> None:
        self._call(self.proxy.stop)

    def restart(self) -> None:
        self._call(self.proxy.restart)

    def set(self, **faults: Any) -> None:
        """Switch faults (cut_after=, stall=, rate=, refuse=, cut_with_reset=) on the proxy's loop."""

        async def apply() -> None:
            for name, value in faults.items():
                if not hasattr(self.proxy, name):
                    raise AttributeError(f"FaultProxy has no fault {name!r}")
                setattr(self.proxy, name, value)

        self._call(apply)

    @property
    def port(self) -> int:
        return self.proxy.port

    @property
    def base_url(self) -> str:
        return self.proxy.base_url

    def close(self) -> None:
        self._call(self.proxy.stop)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> ThreadedFaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
