"""The console's side of the control socket: a JobSource backed by a running job."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import orjson

from regen.engine.control.server import PROTOCOL_VERSION, ControlError, open_control
from regen.engine.schema import CommandAnswer, CommandReply, Hello, Snapshot


class SocketSource:
    """Snapshots from, and commands to, the job listening on `path`."""

    KEEP = 4  # snapshots kept for a console busy elsewhere; older ones are skipped

    def __init__(self, path: Path, *, readonly: bool = False, protocol: int = PROTOCOL_VERSION) -> None:
        self.path = path
        self.readonly = readonly
        self.protocol = protocol
        self.hello: Hello | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._ids = itertools.count(1)
        self._replies: dict[int, asyncio.Future[CommandAnswer]] = {}
        # The newest few snapshots not yet taken (None marks the end); see _keep.
        self._snapshots: deque[Snapshot | None] = deque()
        self._arrived = asyncio.Event()
        self._pump: asyncio.Task[None] | None = None
        self.closed_reason: str | None = None

    async def connect(self) -> Hello:
        try:
            self._reader, self._writer, hello = await open_control(
                self.path, readonly=self.readonly, protocol=self.protocol
            )
        except (OSError, ValueError) as exc:  # open_control words the usual ones (ControlError) itself
            raise ControlError(
                f"could not attach to the job on {self.path.parent} ({exc}); `regen attach` tries again"
            ) from None
        self._pump = asyncio.get_running_loop().create_task(self._read())
        self.hello = hello
        return hello

    async def _read(self) -> None:
        assert self._reader is not None
        try:
            while True:
                line = await self._reader.readline()
                if not line:
                    self.closed_reason = self.closed_reason or (
                        "the job went away without a goodbye (killed, or crashed: see job.log in "
                        f"{self.path.parent}); `regen attach` reconnects if it runs again"
                    )
                    break
                message = orjson.loads(line)
                if not isinstance(message, dict):
                    continue
                if "snapshot" in message:
                    # The job's own Snapshot: the hello made sure it speaks this console's protocol.
                    snap = cast("Snapshot", message["snapshot"])
                    dropped = snap.pop("events_dropped", 0)
                    if dropped:
                        # The job could not keep every event for this console: say so in the log.
                        snap["events"] = [
                            {"ts": time.time(), "event": "events_not_shown", "count": dropped},
                            *snap.get("events", []),
                        ]
                    self._keep(snap)
                elif "id" in message and message["id"] in self._replies:
                    self._replies.pop(message["id"]).set_result(cast("CommandAnswer", message))
                elif "bye" in message:
                    self.closed_reason = str(message["bye"])
                elif "error" in message:
                    self.closed_reason = str(message["error"])
        except (ConnectionError, asyncio.IncompleteReadError, orjson.JSONDecodeError, ValueError) as exc:
            self.closed_reason = f"the connection to the job broke ({exc}); `regen attach` reconnects"
        finally:
            for future in self._replies.values():
                if not future.done():
                    future.set_exception(ControlError(self.closed_reason or "connection closed"))
            self._replies.clear()
            self._snapshots.append(None)
            self._arrived.set()

    def _keep(self, snap: Snapshot) -> None:
        # Keep only the newest snapshots: a slow console skips, it never lags behind. The events
        # of a skipped one move on to the next one kept, in order, so none is lost.
        self._snapshots.append(snap)
        while len(self._snapshots) > self.KEEP:
            skipped = self._snapshots.popleft()
            head = self._snapshots[0]
            if skipped is not None and head is not None:
                head["events"] = [*skipped.get("events", []), *head.get("events", [])]
        self._arrived.set()

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        while True:
            while not self._snapshots:
                self._arrived.clear()
                await self._arrived.wait()
            snap = self._snapshots.popleft()
            if snap is None:
                return
            yield snap

    async def command(self, name: str, **args: Any) -> CommandReply:
        if self._writer is None or self._writer.is_closing():
            return {"ok": False, "message": self.closed_reason or "not connected"}
        request_id = next(self._ids)
        future: asyncio.Future[CommandAnswer] = asyncio.get_running_loop().create_future()
        self._replies[request_id] = future
        self._writer.write(orjson.dumps({"id": request_id, "command": name, "args": args}) + b"\n")
        await self._writer.drain()
        try:
            reply = await asyncio.wait_for(future, timeout=30)
        except (ControlError, TimeoutError) as exc:
            return {"ok": False, "message": str(exc) or "no answer from the job"}
        return {"ok": reply["ok"], "message": reply["message"]}

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(ConnectionError, BrokenPipeError):
                await self._writer.wait_closed()
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
