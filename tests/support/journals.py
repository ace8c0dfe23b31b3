"""A run's JSONL journals read back as tests read them (attempts.jsonl, events.jsonl)."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal
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


def spend_by_backend(attempts: Path) -> dict[str, Decimal]:
    """Each backend's spend summed straight from the attempt journal: end costs plus reconciled
    corrections, each attempt put on the backend its start record names."""
    owner: dict[str, str] = {}
    spent: dict[str, Decimal] = defaultdict(Decimal)
    for rec in journal(attempts):
        rid: str = rec.get("rid", "")  # every start, end and reconciled record has one
        if rec["k"] == "start":
            owner[rid] = rec["be"]
        elif rec["k"] == "end":
            assert rec["be"] == owner[rid], "an attempt's end names the backend its start did"
            spent[owner[rid]] += Decimal(rec["cost"])
        elif rec["k"] == "reconciled":
            spent[owner[rid]] += Decimal(rec["delta"])
    return dict(spent)


def reconciled_before_end(attempts: Path) -> list[str]:
    """The attempts whose bill (`reconciled`) was journaled before the `end` it corrects: a replay
    reads such an estimate as still pending (engine/job/settle.py looks a bill up only once the end
    record is queued)."""
    ended: set[str] = set()
    early: list[str] = []
    for rec in journal(attempts):
        if rec["k"] == "end":
            ended.add(rec["rid"])
        elif rec["k"] == "reconciled" and rec["rid"] not in ended:
            early.append(rec["rid"])
    return early
