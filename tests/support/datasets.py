"""Dataset folders for tests: prompts written, rows read back, one row per prompt checked."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson


def write_dataset(
    root: Path, name: str, prompts: list[list[dict[str, Any]]] | int, *, raw: list[bytes] | None = None
) -> Path:
    """A dataset folder; `prompts` is message lists, or a count of generated single-turn prompts."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(prompts, int):
        prompts = [
            [{"role": "user", "content": f"{name} question {i}: explain topic {i % 17}."}]
            for i in range(prompts)
        ]
    lines = raw if raw is not None else [orjson.dumps({"messages": m}) for m in prompts]
    (folder / "prompts.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
    return folder


def read_rows(folder: Path) -> list[dict[str, Any]]:
    """The dataset's rows (raw_responses.jsonl), none before the first."""
    path = folder / "raw_responses.jsonl"
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def rows_written(folder: Path) -> int:
    """How many whole rows a running job has written so far. A reader of a file being appended to can
    see a write(2) half done (Linux copies it in page by page), so its last line may have no end yet:
    parsing it would fail where the file is sound."""
    path = folder / "raw_responses.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def one_row_per_prompt(folder: Path, expected: int) -> list[dict[str, Any]]:
    """The rows, asserting exactly one for each of the dataset's `expected` prompt lines."""
    rows = read_rows(folder)
    lines = Counter(row["line"] for row in rows)
    assert len(rows) == expected and set(lines) == set(range(expected)), (
        f"{len(rows)} rows for {expected} prompts"
    )
    assert max(lines.values()) == 1
    return rows
