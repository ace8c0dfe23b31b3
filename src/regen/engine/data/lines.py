"""A prompts file's lines, read in fixed-size chunks: memory stays flat whatever the file's size.

Files can hold millions of lines, so nothing here keeps a whole file in memory: ``read_lines``
reads fixed-size chunks and splits lines at ``\\n`` bytes; a line longer than ``MAX_LINE_BYTES`` is
never held. Used by every pass over a dataset (data/scan.py) and by the survey on the GPU host
(engine/host/scripts/survey.py); standard library only, as data/datasets.py says.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from regen.engine.data.datasets import DatasetError

__all__ = ["MAX_LINE_BYTES", "OVERLONG", "Tap", "open_file", "read_lines"]

# Big enough that the per-chunk Python overhead vanishes, small enough to stay cache friendly.
_CHUNK = 1 << 20
# The longest prompt line read (docs/inputs.md). A whole Kimi K2.5 context (256k tokens) is about
# 1 MiB of text; a longer line is reported invalid without ever being held whole in memory.
MAX_LINE_BYTES = 16 << 20


def open_file(path: Path) -> Any:
    # Opened eagerly, so a missing file fails where the caller asked, not at first iteration.
    try:
        return open(path, "rb", buffering=0)  # read_lines closes it
    except FileNotFoundError:
        raise DatasetError(f"{path}: file not found") from None
    except OSError as e:
        raise DatasetError(f"{path}: cannot read ({e.strerror or e})") from None


class Tap:
    """Sees every chunk read: the file's sha256, size and last byte come free with the scan."""

    __slots__ = ("hash", "last", "size")

    def __init__(self) -> None:
        self.hash = hashlib.sha256()
        self.size = 0
        self.last = b""

    def update(self, chunk: bytes) -> None:
        self.hash.update(chunk)
        self.size += len(chunk)
        self.last = chunk[-1:]


class _Overlong(bytes):
    """Stands for a line longer than MAX_LINE_BYTES, which is never held."""

    __slots__ = ()


OVERLONG = _Overlong()


def read_lines(f: Any, path: Path, tap: Tap | None = None) -> Iterator[bytes]:
    """Every line of the file without its ``\\n``; a last line with no newline still counts.

    Reads fixed-size chunks so memory stays flat whatever the file size. A line longer than
    ``MAX_LINE_BYTES`` comes out as ``OVERLONG`` (its bytes are skipped as they are read, so it
    costs one chunk of memory, not its length). Closes ``f``.
    """
    limit = MAX_LINE_BYTES
    with f:
        # The start of a line that spans chunks, gathered in one growing buffer (joining the
        # pieces pairwise would copy a long line once per chunk).
        pending = bytearray()
        skipping = False  # inside a line already known to be too long
        while True:
            try:
                chunk = f.read(_CHUNK)
            except OSError as e:
                raise DatasetError(f"{path}: read failed ({e.strerror or e})") from None
            if not chunk:
                break
            if tap is not None:
                tap.update(chunk)
            start = 0
            if pending or skipping:
                nl = chunk.find(b"\n")
                if nl < 0:
                    if not skipping and len(pending) + len(chunk) > limit:
                        skipping = True
                        pending = bytearray()
                    elif not skipping:
                        pending += chunk
                    continue
                if skipping or len(pending) + nl > limit:
                    yield OVERLONG
                else:
                    pending += chunk[:nl]
                    yield bytes(pending)
                skipping = False
                pending = bytearray()
                start = nl + 1
            parts = (chunk[start:] if start else chunk).split(b"\n")
            tail = parts.pop()
            if limit >= _CHUNK:
                yield from parts  # a part of one chunk cannot be too long
            else:
                for part in parts:
                    yield part if len(part) <= limit else OVERLONG
            if len(tail) > limit:
                skipping = True
            elif tail:
                pending += tail
        if skipping:
            yield OVERLONG
        elif pending:
            yield bytes(pending)
