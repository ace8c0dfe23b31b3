"""The rules of a row that hold whoever made it (docs/data-contract.md §3-4): the schema version,
timestamps, and the quality flags a row carries."""

from __future__ import annotations

import functools
import time

SCHEMA_VERSION = 1


@functools.lru_cache(maxsize=8)
def _utc_second(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


def utc_iso(ts: float) -> str:
    """2026-09-20T10:11:12.345Z. Rows come thousands a second, so the formatted second is cached."""
    ms = int(ts * 1000)
    return f"{_utc_second(ms // 1000)}.{ms % 1000:03d}Z"


def is_degenerate(content: str) -> bool:
    """Content made of one repeated character: Kimi's `!!!!` failure (docs/data-contract.md §4)."""
    stripped = content.strip()
    # str.count runs in C; a set of every character of a long answer does not.
    return len(stripped) > 1 and stripped.count(stripped[0]) == len(stripped)


def quality_flags(content: str, reasoning: str) -> list[str]:
    """Flags that docs/data-contract.md §4 asks for: kept, but not trusted blindly."""
    flags = []
    if not content:
        flags.append("empty_content")
    elif is_degenerate(content):
        flags.append("degenerate_content")
    if not reasoning:
        flags.append("empty_reasoning")
    return flags
