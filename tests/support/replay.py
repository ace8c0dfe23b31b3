"""A `JobSource` that replays what a console received from a real job (tests/support/recordings.py).

The console cannot tell it from a job: it gets the recorded hello, then the recorded snapshots in
order, and a command gets the job's recorded reply. Played `count` frames at once, then it holds
until a test releases more (`advance`) or sends a command, so tests wait on `idle()` instead of
sleeping, and a screen taken at frame N is the same every time.

A command jumps to where the recording sent the same command (name and arguments) next, answers
with the job's reply, and releases the frame the job pushed after it; the frames jumped over (and
their events) are a part of the story this console did not take. A command the recording does not
hold from here is refused, saying so: a test that needs it needs the script in
tests/support/real_jobs.py to send it (then `make recordings`).

Its `now` is the time the newest frame it gave arrived at: the console's clock in tests, so ages
and times of day read as they did when it was recorded.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

from regen.engine.schema import CommandReply, Hello, Snapshot
from tests.support.recordings import Recording, load

READONLY_REFUSAL = "this console is read-only"  # the control server's words (engine/control/server.py)


class ReplaySource:
    """A recorded job, played frame by frame on demand; every command the console sent is kept."""

    def __init__(
        self,
        recording: Recording | str,
        *,
        count: int | None = 20,
        readonly: bool = False,
        edit: Callable[[Snapshot], None] | None = None,
    ) -> None:
        """`count` frames are released at once (None: all of them); `edit` changes each frame as it
        is played (for a part no recording can hold, such as a GPU host's view)."""
        self.recording = load(recording) if isinstance(recording, str) else recording
        self.readonly = readonly
        self.edit = edit
        self.commands: list[tuple[str, dict[str, Any]]] = []
        self.closed_reason: str | None = None
        self.connected = False
        self.closed = False
        self._at = 0  # the next entry to play
        self._allowance = len(self.recording.entries) if count is None else count
        self._now = float(self.recording.hello.get("job", {}).get("started_at") or 0.0)
        self._ended = False
        self._playing = False  # a console is taking the stream
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()

    def now(self) -> float:
        """When the newest frame played arrived (epoch seconds)."""
        return self._now

    async def connect(self) -> Hello:
        self.connected = True
        hello = cast(Hello, copy.deepcopy(self.recording.hello))  # a real job's, as it came
        hello["readonly"] = self.readonly
        return hello

    def _next_frame(self) -> Snapshot | None:
        """The next recorded snapshot from here (commands and their replies stepped over), or None
        at the end, where the recorded goodbye becomes the reason the stream ended."""
        entries = self.recording.entries
        while self._at < len(entries):
            entry = entries[self._at]
            self._at += 1
            if "snapshot" in entry:
                self._now = float(entry["at"])
                frame: Snapshot = copy.deepcopy(entry["snapshot"])
                if self.edit is not None:
                    self.edit(frame)
                return frame
            if "bye" in entry or "error" in entry:
                self.closed_reason = str(entry.get("bye") or entry.get("error"))
        self._ended = True
        return None

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        self._playing = True
        try:
            async for frame in self._play():
                yield frame
        finally:
            self._playing = False
            self._idle.set()

    async def _play(self) -> AsyncIterator[Snapshot]:
        while not (self._ended or self.closed):
            if self._allowance <= 0:
                self._idle.set()
                await self._wake.wait()
                self._wake.clear()
                continue
            self._allowance -= 1
            frame = self._next_frame()
            if frame is not None:
                yield frame

    async def command(self, name: str, **args: Any) -> CommandReply:
        self.commands.append((name, dict(args)))
        if self.readonly:
            return {"ok": False, "message": READONLY_REFUSAL}
        entries = self.recording.entries
        for index in range(self._at, len(entries)):
            sent = entries[index].get("command")
            if sent is not None and sent["name"] == name and sent["args"] == args:
                self._at = index + 1
                self.advance(1)  # the snapshot the job pushed after it
                reply = entries[index]["reply"]
                return {"ok": reply["ok"], "message": reply["message"]}
        return {
            "ok": False,
            "message": f"the {self.recording.kind} recording holds no {name} {args} from here (make recordings)",
        }

    def advance(self, frames: int = 1) -> None:
        """Release `frames` more frames (past the end of the recording, nothing more comes)."""
        self._allowance += frames
        self._wake_player()

    def finish(self) -> None:
        """End the stream here, as a job that goes away without a goodbye does."""
        if not self._ended:
            self.closed_reason = self.closed_reason or "the job closed the connection"
            self._ended = True
            self._wake_player()

    def _wake_player(self) -> None:
        if self._playing:  # idle again once the stream has taken what it was given
            self._idle.clear()
        self._wake.set()

    async def idle(self) -> None:
        """Wait until every released frame has been taken by the console."""
        await self._idle.wait()

    async def close(self) -> None:
        self.closed = True
        self._wake.set()


def frames(kind: str, count: int) -> list[Snapshot]:
    """The first `count` snapshots of a recording, copied (for the panes' own tests)."""
    return [snap for _, snap in timed_frames(kind, count)]


def timed_frames(kind: str, count: int) -> list[tuple[float, Snapshot]]:
    """The first `count` snapshots of a recording with the time each arrived, copied."""
    played = [(float(e["at"]), e["snapshot"]) for e in load(kind).entries if "snapshot" in e]
    return [(at, copy.deepcopy(snap)) for at, snap in played[:count]]
