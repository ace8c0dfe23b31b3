"""Rows taken back after the fact (docs/fidelity.md): a route found to serve another model.

Taking a row back is three durable steps, in this order, so a crash between any two loses nothing:

1. the row is appended to quarantine.jsonl, with why (it is never deleted);
2. a `requeued` record (engine/run/records.py) is appended to attempts.jsonl: from here on its money
   is waste with cause `fidelity`, and the prompt is not done;
3. the compaction rewrites the dataset's raw_responses.jsonl without it (a new file renamed over the
   old one), at once offline, or when the job ends or next starts while a job runs. Until then the
   prompt's new row may stand beside the old one; the compaction keeps exactly one row per prompt.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import orjson

from regen.engine.data.datasets import Dataset
from regen.engine.data.jsonl import repair_torn_tail
from regen.engine.data.row import BadRow, QuarantinedRow, Row, read_row, row_amount
from regen.engine.run.records import RequeuedRecord, requeued_record
from regen.engine.run.recovery import read_journals

CAUSE = "fidelity"


def route_rows(results_path: Path, route: str, since: float | None = None) -> Iterator[Row]:
    """The rows of one raw_responses.jsonl that `route` served (the row's `provider`, in any case),
    created at or after `since` (epoch seconds). A line still being written is passed over, and so is
    one no reader can read (engine/data/row.py `read_row`; `regen verify` names it)."""
    if not results_path.exists():
        return
    wanted = route.strip().lower()
    with open(results_path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break  # the job is still writing it
            try:
                row = read_row(orjson.loads(raw))
            except (orjson.JSONDecodeError, BadRow):
                continue
            provider = row.get("provider")
            if not isinstance(provider, str) or provider.lower() != wanted:
                continue
            if since is not None and _created(row) < since:
                continue
            yield row


def _created(row: Row) -> float:
    """A row's created_at (docs/data-contract.md §3: ISO 8601 in UTC, milliseconds) in epoch seconds."""
    text = str(row.get("created_at") or "")
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def taken_back(row: Row, why: str, ts: float) -> tuple[QuarantinedRow, RequeuedRecord]:
    """What steps 1 and 2 write for one row: its quarantine line and its journal record."""
    record = requeued_record(
        row["dataset"],
        row["line"],
        row.get("generation_id"),
        row.get("backend") or "",
        row.get("provider"),
        row.get("status") or "ok",
        Decimal(str(row_amount(row) or 0)),
        row["usage"].get("completion_tokens") or 0,
        CAUSE,
        why,
        ts,
    )
    quarantined = cast(QuarantinedRow, {**row, "quarantine_reason": f"{CAUSE}: {why}", "requeued": True})
    return quarantined, record


def compact(results_path: Path, revoked: set[tuple[int, str | None]]) -> int:
    """Rewrite raw_responses.jsonl without the rows taken back (by line and generation id); how many
    left. The new file is made durable beside the old, then renamed over it."""
    if not revoked or not results_path.exists():
        return 0
    dropped = 0
    tmp = results_path.with_name(results_path.name + ".compact")
    try:
        with open(results_path, "rb") as src, open(tmp, "wb") as out:
            for raw in src:
                row = _parsed(raw)
                if row is not None and (row.get("line"), row.get("generation_id")) in revoked:
                    dropped += 1
                    continue
                out.write(raw)
            if not dropped:
                return 0
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, results_path)
        fd = os.open(results_path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return dropped


def requeue_route(
    run_dir: Path, datasets: Iterable[Dataset], route: str, since: float | None, why: str
) -> tuple[int, Decimal]:
    """`regen quarantine --route`: every row `route` served (since `since`) taken back while no job
    runs (the caller holds the run lock): the three steps at once. How many rows, and their money."""
    journal = read_journals(run_dir / "attempts.jsonl", run_dir / "events.jsonl")
    chosen = list(datasets)
    found: list[Row] = []
    for dataset in chosen:
        already = journal.requeued.get(dataset.name, set())
        found.extend(
            row
            for row in route_rows(dataset.results_path, route, since)
            if (row["line"], row.get("generation_id")) not in already
        )
    now = time.time()
    pairs = [taken_back(row, why, now) for row in found]
    _append_durably(run_dir / "quarantine.jsonl", [q for q, _ in pairs])
    _append_durably(run_dir / "attempts.jsonl", [r for _, r in pairs])
    revoked: dict[str, set[tuple[int, str | None]]] = {}
    for row in found:
        revoked.setdefault(row["dataset"], set()).add((row["line"], row.get("generation_id")))
    compact_all(chosen, [journal.requeued, revoked])
    return len(found), sum((Decimal(r["cost"]) for _, r in pairs), Decimal(0))


def _append_durably(path: Path, records: list[Any]) -> None:
    if not records:
        return
    repair_torn_tail(path)  # a crashed job's last line, cut before anything follows it
    with open(path, "ab") as f:
        f.write(b"".join(orjson.dumps(record) + b"\n" for record in records))
        f.flush()
        os.fsync(f.fileno())


def compact_all(
    datasets: Iterable[Dataset], requeued: Iterable[Mapping[str, set[tuple[int, str | None]]]]
) -> int:
    """Every dataset's raw_responses.jsonl without the rows taken back, whichever lane took them."""
    taken = list(requeued)
    dropped = 0
    for dataset in datasets:
        revoked: set[tuple[int, str | None]] = set()
        for lane in taken:
            revoked |= lane.get(dataset.name, set())
        dropped += compact(dataset.results_path, revoked)
    return dropped


def _parsed(raw: bytes) -> dict[str, Any] | None:
    try:
        row = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return row if isinstance(row, dict) else None
