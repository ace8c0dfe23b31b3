"""The event log: operator actions and state changes to events.jsonl, and the recent ones consoles read.

Errors are remembered for consoles but not journaled: the attempt journal already holds each one.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from regen.engine.data.jsonl import JsonlAppender, WriteFailed
from regen.engine.schema import EventRecord

RECENT_EVENTS = 1000
EVENTS_FILE = "events.jsonl"


def _seen(future: Any) -> None:
    if not future.cancelled():
        future.exception()


class EventLog:
    """events.jsonl plus a ring of recent events, each with a sequence number consoles resume from."""

    def __init__(self) -> None:
        self._file: JsonlAppender | None = None
        self._recent: deque[EventRecord] = deque(maxlen=RECENT_EVENTS)
        self._seq = 0

    async def open(
        self, run_dir: Path, commit_interval_s: float, on_failure: Callable[[WriteFailed], None]
    ) -> None:
        self._file = await JsonlAppender.open(
            run_dir / EVENTS_FILE, commit_interval_s=commit_interval_s, on_failure=on_failure
        )

    def event(self, name: str, /, **fields: Any) -> None:
        """Journal an event (once the log is open) and show it to consoles.

        Once events.jsonl cannot be written (its failure was reported when it happened), events
        still reach consoles.
        """
        self.write({"ts": time.time(), "event": name, **fields})

    def write(self, record: Mapping[str, Any]) -> None:
        """Journal a whole event record (one made by a writer of engine/run/records.py) and show it
        to consoles, as `event` does."""
        file = self._file
        if file is not None and not file.closed and not file.failed:
            file.append(record).add_done_callback(_seen)
        self.remember(record)

    def remember(self, record: Mapping[str, Any]) -> None:
        """Show a record to consoles without journaling it."""
        self._seq += 1
        self._recent.append({"seq": self._seq, **record})

    def since(self, cursor: int) -> tuple[int, list[EventRecord]]:
        """Events after `cursor` (or the last -cursor events when negative), and the new cursor."""
        if cursor < 0:
            return self._seq, list(self._recent)[cursor:]
        return self._seq, [e for e in self._recent if e["seq"] > cursor]

    async def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(WriteFailed):
                await self._file.close()
