"""The job's control server: a Unix socket in the run folder that consoles attach to.

Protocol (newline-delimited JSON, one object per line):
- the client opens with `{"hello": {"protocol": N, "readonly": bool}}`; the server answers
  `{"hello": {"protocol": N, "job": {...}}}`, or `{"error": ...}` and closes when the versions differ,
  so a console of another version says so instead of misreading;
- the server then sends `{"snapshot": {...}}` a few times a second, each carrying the events
  (operator actions, errors, state changes) that happened since the previous one;
- the client sends `{"id": n, "command": name, "args": {...}}` and gets `{"id": n, "ok": bool,
  "message": str}`; a read-only client is refused every command.
The socket is mode 0600 and the server also checks the peer's uid: only the job's owner steers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import orjson

from engine.schema import JobInfo, Snapshot

PROTOCOL_VERSION = 2
SOCKET_NAME = "control.sock"
SNAPSHOT_INTERVAL_S = 0.25
MAX_LINE = 1 << 20


class ControlError(RuntimeError):
    """A control connection that cannot be used; the message is for the operator."""


CommandHandler = Callable[[str, Mapping[str, Any], str], Awaitable[str]]


def _peer_uid(writer: asyncio.StreamWriter) -> int | None:
    sock = writer.get_extra_info("socket")
    if sock is None or not hasattr(socket, "SO_PEERCRED"):
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


class ControlServer:
    """Serves snapshots to every attached console and runs their commands on the job."""

    def __init__(
        self,
        path: Path,
        *,
        snapshot: Callable[[], Snapshot],
        events_since: Callable[[int], tuple[int, list[dict[str, Any]]]],
        job_info: JobInfo,
        handle: CommandHandler,
        interval_s: float = SNAPSHOT_INTERVAL_S,
    ) -> None:
        self.path = path
        self._snapshot = snapshot
        self._events_since = events_since
        self._job_info = job_info
        self._handle = handle
        self.interval_s = interval_s
        self._server: asyncio.AbstractServer | None = None
        self._clients: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._broadcaster: asyncio.Task[None] | None = None

    @property
    def clients(self) -> int:
        return len(self._clients)

    async def start(self) -> None:
        if self.path.exists() or self.path.is_symlink():
            # A socket left by a job that died; the run folder's lock says no live job owns it.
            self.path.unlink()
        old = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=str(self.path), limit=MAX_LINE)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self._broadcaster = asyncio.get_running_loop().create_task(self._broadcast())

    async def close(self) -> None:
        if self._broadcaster is not None:
            self._broadcaster.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._broadcaster
        if self._server is not None:
            self._server.close()
        for writer in list(self._clients):
            await self._send(writer, {"bye": "the job has ended"})
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def push_now(self) -> None:
        """Send a snapshot at once (after a command), so the console sees its effect immediately."""
        await self._broadcast_once()

    async def _broadcast(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self._broadcast_once()

    async def _broadcast_once(self) -> None:
        if not self._clients:
            self._cursor = self._events_since(getattr(self, "_cursor", 0))[0]
            return
        cursor, events = self._events_since(getattr(self, "_cursor", 0))
        self._cursor = cursor
        snap = self._snapshot()
        snap["events"] = events
        line = orjson.dumps({"snapshot": snap}, default=str) + b"\n"
        for writer in list(self._clients):
            if writer.is_closing():
                self._clients.discard(writer)
                continue
            # A console on a slow link must not hold the job back: drop it if its buffer swells.
            transport = writer.transport
            if transport.get_write_buffer_size() > 8 * MAX_LINE:
                writer.close()
                self._clients.discard(writer)
                continue
            writer.write(line)

    async def _send(self, writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
        if writer.is_closing():
            return
        writer.write(orjson.dumps(message, default=str) + b"\n")
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await self._session(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            self._clients.discard(writer)
            writer.close()
            if task is not None:
                self._tasks.discard(task)

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        uid = _peer_uid(writer)
        if uid is not None and uid != os.getuid():
            await self._send(writer, {"error": "only the job's owner may attach"})
            return
        first = await asyncio.wait_for(reader.readline(), timeout=10)
        try:
            hello = orjson.loads(first).get("hello") or {}
        except (orjson.JSONDecodeError, AttributeError):
            await self._send(writer, {"error": "expected a hello"})
            return
        version = hello.get("protocol")
        if version != PROTOCOL_VERSION:
            await self._send(
                writer,
                {
                    "error": f"this job speaks control protocol {PROTOCOL_VERSION}, the console speaks {version}"
                },
            )
            return
        readonly = bool(hello.get("readonly"))
        _, backlog = self._events_since(-100)
        await self._send(
            writer,
            {
                "hello": {
                    "protocol": PROTOCOL_VERSION,
                    "job": self._job_info,
                    "readonly": readonly,
                    "events": backlog,
                }
            },
        )
        snap = self._snapshot()
        snap["events"] = []
        await self._send(writer, {"snapshot": snap})
        self._clients.add(writer)
        while True:
            line = await reader.readline()
            if not line:
                return
            try:
                message = orjson.loads(line)
            except orjson.JSONDecodeError:
                await self._send(writer, {"error": "not JSON"})
                continue
            request_id = message.get("id")
            name = str(message.get("command", ""))
            if readonly:
                reply = {"id": request_id, "ok": False, "message": "this console is read-only"}
            else:
                try:
                    text = await self._handle(name, message.get("args") or {}, "console")
                    reply = {"id": request_id, "ok": True, "message": text}
                except Exception as exc:  # the operator sees why a command was refused
                    reply = {"id": request_id, "ok": False, "message": str(exc)}
            await self._send(writer, reply)
            await self.push_now()


async def open_control(
    path: Path, *, readonly: bool = False, protocol: int = PROTOCOL_VERSION
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, dict[str, Any]]:
    """Connect and greet; returns the streams and the job's hello. Raises ControlError with the reason."""
    if not path.exists():
        raise ControlError(f"no job is running on {path.parent} (no {path.name})")
    try:
        reader, writer = await asyncio.open_unix_connection(str(path), limit=MAX_LINE * 16)
    except (ConnectionRefusedError, FileNotFoundError):
        raise ControlError(f"no job is running on {path.parent} (its socket does not answer)") from None
    except PermissionError:
        raise ControlError(f"{path}: permission denied (only the job's owner may attach)") from None
    writer.write(orjson.dumps({"hello": {"protocol": protocol, "readonly": readonly}}) + b"\n")
    await writer.drain()
    line = await reader.readline()
    if not line:
        raise ControlError(f"the job on {path.parent} closed the connection")
    answer = orjson.loads(line)
    if "error" in answer:
        writer.close()
        raise ControlError(str(answer["error"]))
    return reader, writer, answer["hello"]
