"""The job's control server: a Unix socket in the run folder that consoles attach to.

Protocol (newline-delimited JSON, one object per line):
- the client opens with `{"hello": {"protocol": N, "readonly": bool}}`; the server answers
  `{"hello": {"protocol": N, "job": {...}}}`, or `{"error": ...}` and closes when the versions differ,
  so a console of another version says so instead of misreading;
- the server then sends `{"snapshot": {...}}` a few times a second, each carrying the events
  (operator actions, errors, state changes) that happened since the previous one, and
  `"events_dropped": n` when a client fell so far behind that n events could not be kept for it;
- the client sends `{"id": n, "command": name, "args": {...}}` and gets `{"id": n, "ok": bool,
  "message": str}`; a read-only client is refused every command; a message the server cannot
  use gets `{"error": why}` (or a refusal with its id) and the connection stays open;
- `{"bye": why}` is the last line before the server closes a connection.
The socket is mode 0600 and the server also checks the peer's uid: only the job's owner steers it.

Everything is written strictly (engine/control/wire.py). A snapshot that cannot be encoded is a bug
in the job: it is logged once with the path to the bad value, that broadcast is skipped, and the
consoles stay attached for the next one (an event that cannot be encoded is left out the same way).

A console that stops reading never slows the job nor grows its memory: each client has its own
sender task and bounded buffers, a slow one is sent the newest snapshot (never a queue of old
ones), and one that reads nothing for `max_missed` snapshots is disconnected and told why
(docs/faults.md, "A console that stops reading").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypedDict, cast

import orjson

from regen.engine.control.wire import LineReader, TooLong, encode, unencodable
from regen.engine.errors import RegenError
from regen.engine.schema import CommandAnswer, EventRecord, Hello, JobInfo, Snapshot

PROTOCOL_VERSION = 3  # 3: everything of one backend in its lane (engine/schema.py LaneView)
SOCKET_NAME = "control.sock"
SNAPSHOT_INTERVAL_S = 0.25
MAX_LINE = 1 << 20  # longest message a client may send
HELLO_TIMEOUT_S = 10.0
# The transport queues at most this much for a client before its sender waits (the kernel's
# socket buffer holds some more); a snapshot line is written whole, so the transport's buffer
# stays under this plus one snapshot.
WRITE_HIGH_WATER = 256 << 10
MAX_PENDING_EVENTS = 2000  # events kept for a client that has not taken its last snapshot
MAX_PENDING_REPLIES = 32  # replies queued before that client's commands wait to be read
MAX_MISSED_SNAPSHOTS = 240  # a minute at four a second without reading anything: disconnected
MAX_BAD_MESSAGES = 100  # malformed messages in a row before the client is disconnected
CLOSE_GRACE_S = 10.0  # how long a goodbye may wait for a client to read it
# Why a console was let go, as its header shows it (DISCONNECTED (...)): what happened and what to do.
JOB_ENDED = "the job has ended"
ENDED_WITHOUT_CLOSE = "the job stopped without closing its socket: it may have failed (its job.log says why)"
CONSOLE_LEFT = "this console's connection closed"  # the console hung up: it reads no goodbye

log = logging.getLogger(__name__)


class ControlError(RegenError, RuntimeError):
    """A control connection that cannot be used; the message is for the operator."""


CommandHandler = Callable[[str, Mapping[str, Any], str], Awaitable[str]]


def _peer_uid(writer: asyncio.StreamWriter) -> int | None:
    sock = writer.get_extra_info("socket")
    if sock is None or not hasattr(socket, "SO_PEERCRED"):
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def _line(message: Mapping[str, Any]) -> bytes:
    return encode(message) + b"\n"


class _Client:
    """One attached console: what is waiting to be sent to it, and the task that sends it."""

    def __init__(self, writer: asyncio.StreamWriter, readonly: bool) -> None:
        self.writer = writer
        self.readonly = readonly
        self.replies: deque[bytes] = deque()  # hello, replies and errors: never dropped
        self.snapshot: bytes | None = None  # the newest snapshot not yet sent (without events)
        self.events: deque[bytes] = deque()  # encoded events not yet sent
        self.events_bytes = 0
        self.events_dropped = 0
        self.missed = 0  # broadcasts since the sender last took a snapshot
        self.took_at = asyncio.get_running_loop().time()  # when it last took one
        self.sent_snapshots = 0
        self.wake = asyncio.Event()
        self.space = asyncio.Event()  # set while replies are under their bound
        self.space.set()
        self.gone: str | None = None  # why the server let this client go
        self.sender: asyncio.Task[None] | None = None

    def buffered_bytes(self) -> int:
        """Everything the server holds for this client: its transport's buffer and its queues."""
        transport = self.writer.transport
        held = transport.get_write_buffer_size() if not transport.is_closing() else 0
        held += sum(len(r) for r in self.replies) + self.events_bytes
        return held + (len(self.snapshot) if self.snapshot is not None else 0)

    def next_line(self) -> bytes | None:
        if self.replies:
            line = self.replies.popleft()
            if len(self.replies) < MAX_PENDING_REPLIES:
                self.space.set()
            return line
        if self.snapshot is None:
            return None
        body, self.snapshot = self.snapshot, None
        events, self.events = self.events, deque()
        dropped, self.events_dropped = self.events_dropped, 0
        self.events_bytes = 0
        self.missed = 0
        self.took_at = asyncio.get_running_loop().time()
        self.sent_snapshots += 1
        # The job's snapshot encoded once for every client, its events per client: splice them.
        tail = b'"events":[' + b",".join(events) + b"]"
        if dropped:
            tail += b',"events_dropped":' + str(dropped).encode()
        joint = b"," if len(body) > 2 else b""
        return b'{"snapshot":' + body[:-1] + joint + tail + b"}}\n"

    def offer(self, body: bytes, events: list[bytes], max_events: int) -> None:
        """A new snapshot replaces one not yet sent; events queue, the oldest dropped past the bound."""
        if self.snapshot is not None:
            # Still there: the sender is waiting for the client to read what it wrote before.
            self.missed += 1
        self.snapshot = body
        for event in events:
            self.events.append(event)
            self.events_bytes += len(event)
        while len(self.events) > max_events:
            self.events_bytes -= len(self.events.popleft())
            self.events_dropped += 1
        self.wake.set()

    def send_reply(self, message: Mapping[str, Any]) -> None:
        self.replies.append(_line(message))
        if len(self.replies) >= MAX_PENDING_REPLIES:
            self.space.clear()
        self.wake.set()


class ControlServer:
    """Serves snapshots to every attached console and runs their commands on the job."""

    def __init__(
        self,
        path: Path,
        *,
        snapshot: Callable[[], Snapshot],
        events_since: Callable[[int], tuple[int, list[EventRecord]]],
        job_info: JobInfo,
        handle: CommandHandler,
        interval_s: float = SNAPSHOT_INTERVAL_S,
        max_missed: int = MAX_MISSED_SNAPSHOTS,
        min_stall_s: float | None = None,
        max_events: int = MAX_PENDING_EVENTS,
        hello_timeout_s: float = HELLO_TIMEOUT_S,
        close_grace_s: float = CLOSE_GRACE_S,
    ) -> None:
        self.path = path
        self._snapshot = snapshot
        self._events_since = events_since
        self._job_info = job_info
        self._handle = handle
        self.interval_s = interval_s
        self.max_missed = max_missed
        # Snapshots pushed after commands come faster than the timer's: a client is let go only
        # once it has also read nothing for this long (by default, max_missed timer ticks).
        self.min_stall_s = max_missed * interval_s if min_stall_s is None else min_stall_s
        self.max_events = max_events
        self.hello_timeout_s = hello_timeout_s
        self.close_grace_s = close_grace_s
        self._server: asyncio.AbstractServer | None = None
        self._clients: set[_Client] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._broadcaster: asyncio.Task[None] | None = None
        self._cursor = 0
        self._closing = False
        self.dropped_clients = 0
        self.broadcasts = 0
        self.skipped_broadcasts = 0  # snapshots that could not be encoded (each problem logged once)
        self._said: set[str] = set()  # problems already logged

    @property
    def clients(self) -> int:
        return len(self._clients)

    def client_stats(self) -> list[dict[str, Any]]:
        """Per attached client: bytes held for it, snapshots missed in a row and sent, events dropped."""
        return [
            {
                "buffered_bytes": c.buffered_bytes(),
                "missed": c.missed,
                "sent_snapshots": c.sent_snapshots,
                "events_dropped": c.events_dropped,
                "readonly": c.readonly,
            }
            for c in self._clients
        ]

    async def start(self) -> None:
        if self.path.exists() or self.path.is_symlink():
            # A socket left by a job that died; the run folder's lock says no live job owns it.
            self.path.unlink()
        old = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self._broadcaster = asyncio.get_running_loop().create_task(self._broadcast())

    async def close(self) -> None:
        """Say goodbye to every client and stop; never waits on a client longer than a moment."""
        self._closing = True
        if self._broadcaster is not None:
            self._broadcaster.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._broadcaster
        if self._server is not None:
            self._server.close()
        clients = list(self._clients)
        for client in clients:
            self._drop(client, JOB_ENDED, grace=False)
        # A client that reads gets its goodbye now; one that does not is cut off after a moment.
        waits = [asyncio.ensure_future(_closed(c.writer)) for c in clients]
        if waits:
            _, pending = await asyncio.wait(waits, timeout=min(2.0, self.close_grace_s))
            for task in pending:
                task.cancel()
        for client in clients:
            client.writer.transport.abort()
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
        self._broadcast_safely()

    # -- broadcasting ---------------------------------------------------------------------------

    async def _broadcast(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self._broadcast_safely()

    def _broadcast_safely(self) -> None:
        """A broadcast whose failure is logged (once per kind) and never ends the broadcasts, the
        connections or the job."""
        try:
            self._broadcast_once()
        except Exception as exc:
            self._say_once(f"{type(exc).__name__}: {exc}", "control: snapshot broadcast failed", exc)

    def _say_once(self, key: str, message: str, exc: BaseException | None = None) -> None:
        if key in self._said:
            return
        self._said.add(key)
        log.error("%s (said once)", message, exc_info=exc)

    def _encoded(self, what: str, value: Any) -> bytes | None:
        """`value` encoded, or None after logging (once per place) where it cannot be."""
        try:
            return encode(value)
        except TypeError as exc:
            where = unencodable(value)
            self._say_once(
                f"{what} {where}",
                f"control: {what} not sent to consoles: {where} cannot be encoded ({exc}); "
                "consoles stay attached and get the next one that can be",
            )
            return None

    def _broadcast_once(self) -> None:
        cursor = self._cursor
        self._cursor, events = self._events_since(cursor)
        if not self._clients:
            return
        self.broadcasts += 1
        snap = self._snapshot()
        snap.pop("events", None)
        body = self._encoded("a snapshot", snap)
        if body is None:
            # Skipped: the events since the last one wait for the next snapshot that can be sent.
            self._cursor = cursor
            self.skipped_broadcasts += 1
            return
        encoded = [line for line in (self._encoded("an event", e) for e in events) if line is not None]
        for client in list(self._clients):
            if client.writer.transport.is_closing():
                self._drop(client, CONSOLE_LEFT, flush=False)
                continue
            client.offer(body, encoded, self.max_events)
            idle = asyncio.get_running_loop().time() - client.took_at
            if client.missed > self.max_missed and idle >= self.min_stall_s:
                self._drop(
                    client,
                    f"disconnected: this console read nothing for {idle:.0f} s "
                    f"({client.missed} snapshots behind); attach again",
                    flush=False,
                    behind=True,
                )

    async def _send_loop(self, client: _Client) -> None:
        writer = client.writer
        try:
            while True:
                line = client.next_line()
                if line is None:
                    client.wake.clear()
                    await client.wake.wait()
                    continue
                writer.write(line)
                # Waits for this client only: every client has its own sender.
                await writer.drain()
        except (ConnectionError, RuntimeError):
            self._drop(client, CONSOLE_LEFT, flush=False)

    def _drop(
        self, client: _Client, reason: str, *, flush: bool = True, behind: bool = False, grace: bool = True
    ) -> None:
        """Let a client go with a goodbye it can read when it reads again.

        `flush` first hands the transport what was still queued (a last snapshot, replies);
        a client dropped for being `behind` gets only the goodbye. `grace` cuts the connection
        after close_grace_s if the client never reads it.
        """
        if client.gone is not None:
            return
        client.gone = reason
        self._clients.discard(client)
        if behind:
            self.dropped_clients += 1
        if client.sender is not None and client.sender is not asyncio.current_task():
            client.sender.cancel()
        transport = client.writer.transport
        if not transport.is_closing():
            while flush and (line := client.next_line()) is not None:
                transport.write(line)
            # Whatever part of a line the transport still holds goes first, so the goodbye is a
            # line of its own; close() sends what is buffered, then closes.
            transport.write(_line({"bye": reason}))
            transport.close()
            if grace:
                asyncio.get_running_loop().call_later(self.close_grace_s, transport.abort)
        client.replies.clear()
        client.events.clear()
        client.snapshot = None
        client.events_bytes = 0
        client.space.set()

    # -- one connection -------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        client: _Client | None = None
        lines = LineReader(reader, MAX_LINE)
        reason = CONSOLE_LEFT
        try:
            client = await self._greet(lines, writer)
            if client is not None:
                await self._commands(lines, client)
        except (ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            # The job's event loop is ending without close(): the job stopped on an error.
            reason = ENDED_WITHOUT_CLOSE
            raise
        except Exception:  # the job goes on whatever one connection did
            log.exception("control: connection failed")
            reason = "the job could not serve this console (its job.log says why); attach again"
        finally:
            if client is not None:
                self._drop(client, reason)
                if client.sender is not None:
                    client.sender.cancel()
            if not writer.transport.is_closing():
                writer.transport.close()
            if task is not None:
                self._tasks.discard(task)

    def _refuse(self, writer: asyncio.StreamWriter, reason: str) -> None:
        writer.transport.write(_line({"error": reason}))
        writer.transport.close()
        asyncio.get_running_loop().call_later(self.close_grace_s, writer.transport.abort)

    async def _greet(self, lines: LineReader, writer: asyncio.StreamWriter) -> _Client | None:
        uid = _peer_uid(writer)
        if uid is not None and uid != os.getuid():
            self._refuse(writer, "only the job's owner may attach")
            return None
        if self._closing:
            self._refuse(writer, "the job is ending")
            return None
        try:
            first = await asyncio.wait_for(lines.next(), timeout=self.hello_timeout_s)
        except TimeoutError:
            self._refuse(writer, f"no hello within {self.hello_timeout_s:g} s")
            return None
        if first is None:
            return None
        problem, readonly = _check_hello(first)
        if problem is not None:
            self._refuse(writer, problem)
            return None
        writer.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        client = _Client(writer, readonly)
        _, backlog = self._events_since(-100)
        hello: Hello = {
            "protocol": PROTOCOL_VERSION,
            "job": self._job_info,
            "readonly": readonly,
            "events": [e for e in backlog if self._encoded("an event", e) is not None],
        }
        client.send_reply({"hello": hello})
        snap = self._snapshot()
        snap.pop("events", None)
        body = self._encoded("a snapshot", snap)
        if body is not None:  # else the client waits for the next broadcast that can be sent
            client.offer(body, [], self.max_events)
        client.missed = 0
        client.sender = asyncio.get_running_loop().create_task(self._send_loop(client))
        self._clients.add(client)
        return client

    async def _commands(self, lines: LineReader, client: _Client) -> None:
        bad = 0
        while client.gone is None:
            line = await lines.next()
            if line is None or client.gone is not None:
                return
            reply = await self._answer(line, client)
            if reply is None:
                continue
            bad = bad + 1 if "error" in reply else 0
            client.send_reply(reply)
            if bad >= MAX_BAD_MESSAGES:
                self._drop(client, f"disconnected: {bad} malformed messages in a row", behind=True)
                return
            if "error" not in reply:
                self._broadcast_safely()
            # A client that sends commands but reads no replies waits here, alone.
            await client.space.wait()

    async def _answer(self, line: bytes | TooLong, client: _Client) -> CommandAnswer | WireError | None:
        if isinstance(line, TooLong):
            return {"error": f"message longer than {MAX_LINE} bytes"}
        if not line.strip():
            return None
        try:
            message = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            return {"error": f"not JSON ({str(exc)[:80]})"}
        if not isinstance(message, dict):
            return {"error": "a message is a JSON object"}
        request_id = message.get("id")
        if request_id is not None and type(request_id) not in (int, str):
            return {"error": "id must be a number or a string"}
        name = message.get("command")
        args = message.get("args")
        if not isinstance(name, str) or not name:
            return _reply(request_id, False, "command must be a non-empty string")
        if args is not None and not isinstance(args, dict):
            return _reply(request_id, False, "args must be an object")
        if client.readonly:
            return _reply(request_id, False, "this console is read-only")
        try:
            text = await self._handle(name, args or {}, "console")
        except KeyError as exc:
            return _reply(request_id, False, f"{name}: missing argument {exc}")
        except (TypeError, ValueError) as exc:
            return _reply(request_id, False, f"{name}: bad argument ({exc})")
        except Exception as exc:  # the operator sees why a command was refused, not a traceback
            return _reply(request_id, False, str(exc) or f"{name}: {type(exc).__name__}")
        return _reply(request_id, True, str(text))


class WireError(TypedDict):
    """A line the server could not take as a message, and why (the client is dropped after several)."""

    error: str


def _reply(request_id: int | str | None, ok: bool, message: str) -> CommandAnswer:
    return {"id": request_id, "ok": ok, "message": message}


def _check_hello(line: bytes | TooLong) -> tuple[str | None, bool]:
    """(why the first line is not a usable hello, or None; whether the client is read-only)."""
    if isinstance(line, TooLong):
        return f"expected a hello (message longer than {MAX_LINE} bytes)", True
    try:
        message = orjson.loads(line)
    except orjson.JSONDecodeError:
        return "expected a hello (not JSON)", True
    hello = message.get("hello") if isinstance(message, dict) else None
    if not isinstance(hello, dict):
        return "expected a hello", True
    version = hello.get("protocol")
    if version != PROTOCOL_VERSION:
        return f"this job speaks control protocol {PROTOCOL_VERSION}, the console speaks {version}", True
    readonly = hello.get("readonly", False)
    if not isinstance(readonly, bool):
        return "hello: readonly must be true or false", True
    return None, readonly


async def _closed(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        await writer.wait_closed()


async def open_control(
    path: Path, *, readonly: bool = False, protocol: int = PROTOCOL_VERSION
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Hello]:
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
    return reader, writer, cast(Hello, answer["hello"])  # of this protocol: the server checked it
