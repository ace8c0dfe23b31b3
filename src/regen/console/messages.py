"""Messages the snapshot and command workers post to the app; widgets change only in their handlers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.message import Message

from regen.engine.schema import Hello, Snapshot


@dataclass
class Connected(Message):
    """The job answered the hello."""

    hello: Hello


@dataclass
class SnapshotArrived(Message):
    """A new snapshot; a newer one replaces it in the queue, so the UI never lags behind the job."""

    snapshot: Snapshot
    received_at: float

    def can_replace(self, message: Message) -> bool:
        return type(message) is SnapshotArrived


@dataclass
class SourceEnded(Message):
    """The snapshot stream ended: the job went away, or the connection failed."""

    reason: str
    failed: bool = False


@dataclass
class CommandDone(Message):
    """The job's answer to an operator command."""

    name: str
    args: dict[str, Any]
    ok: bool
    message: str


@dataclass
class ExportDone(Message):
    """Snapshot files written by `e`."""

    paths: list[str]
