"""The control socket's lines: JSON written strictly (and where a value cannot be written, the path to
it), and lines read in bounded memory.

No `default=` fallback: a type the wire does not know (a Decimal, a set, a key that is a str
subclass such as a backend's StrEnum member) is a bug in what the job builds, and turning it into a
string here would hide it from the tests that check the snapshot (tests/integration/job/test_snapshot_schema.py).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import orjson


def encode(value: Any) -> bytes:
    """`value` as one line of JSON (without the newline); raises TypeError where it is not JSON."""
    return orjson.dumps(value)


def unencodable(value: Any, path: str = "") -> str:
    """Where in `value` encoding fails, as `lanes[0].errors.abort: a key of type ErrorClass` (the
    first such place in order); call it after `encode` raised."""
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{key}" if path else str(key)
            if not _writes({key: None}):
                return f"{here}: a key of type {type(key).__name__}, not str"
            if not _writes(item):
                return unencodable(item, here)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            if not _writes(item):
                return unencodable(item, f"{path}[{index}]")
    return f"{path or '(the value)'}: {type(value).__name__}"


def _writes(value: Any) -> bool:
    try:
        orjson.dumps(value)
    except TypeError:
        return False
    return True


class TooLong:
    """What `LineReader.next` returns for a line over MAX_LINE (its bytes are skipped)."""


TOO_LONG = TooLong()


class LineReader:
    """Lines of at most `limit` bytes from a stream; a longer one is reported once and skipped
    as it arrives, so a client cannot make the server hold more than `limit` for it."""

    def __init__(self, reader: asyncio.StreamReader, limit: int) -> None:
        self._reader = reader
        self._limit = limit
        self._pending = bytearray()
        self._ready: deque[bytes | TooLong] = deque()
        self._skipping = False
        self._eof = False

    async def next(self) -> bytes | TooLong | None:
        """The next line without its newline, TOO_LONG, or None at the end of the stream."""
        while not self._ready:
            if self._eof:
                return None
            chunk = await self._reader.read(1 << 16)
            if not chunk:
                self._eof = True  # a last line without its newline is not a message
                continue
            self._split(chunk)
        return self._ready.popleft()

    def _split(self, chunk: bytes) -> None:
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            end = len(chunk) if nl < 0 else nl
            if not self._skipping:
                if len(self._pending) + end - start > self._limit:
                    self._skipping = True
                    self._pending = bytearray()
                    self._ready.append(TOO_LONG)
                else:
                    self._pending += chunk[start:end]
            if nl < 0:
                return
            if not self._skipping:
                self._ready.append(bytes(self._pending))
            self._pending = bytearray()
            self._skipping = False
            start = nl + 1
