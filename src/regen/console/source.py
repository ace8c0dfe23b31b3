"""Where the console's data comes from: the `JobSource` protocol.

The app only ever talks to a `JobSource`: a running job behind its Unix socket
(`regen.console.client.SocketSource`), or in the console's tests a real job's recording replayed
(tests/support/replay.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol, runtime_checkable

from regen.engine.schema import CommandReply, Hello, Snapshot


@runtime_checkable
class JobSource(Protocol):
    """A job the console watches and steers."""

    readonly: bool
    closed_reason: str | None
    """Why the snapshots ended (the job's goodbye, or what broke), in words the operator can act on."""

    async def connect(self) -> Hello:
        """Greet the job; returns the hello: {"protocol": 1, "job": {...}, "events": [...]}."""
        ...

    def snapshots(self) -> AsyncIterator[Snapshot]:
        """Folded snapshots (`Job.snapshot()` plus "events" since the last one); ends when the job goes."""
        ...

    async def command(self, name: str, **args: Any) -> CommandReply:
        """Send one command; returns {"ok": bool, "message": str} and never raises for a refusal."""
        ...

    async def close(self) -> None:
        """Let go of the job (it keeps running)."""
        ...
