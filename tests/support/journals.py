"""A run's JSONL journals read back as tests read them (attempts.jsonl, events.jsonl)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson


def journal(path: Path, *, complete_only: bool = False) -> list[dict[str, Any]]:
    """The journal's records in order; none while the file is not there yet. With `complete_only`,
    only whole lines: another process may be in the middle of writing the last one."""
    if not path.exists():
        return []
    data = path.read_bytes()
    if complete_only:
        data = data[: data.rfind(b"\n") + 1]
    return [orjson.loads(line) for line in data.splitlines()]
