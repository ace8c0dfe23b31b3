"""Every snapshot a real job builds is what engine/schema.py says, and the control socket can write it:
for each backend and both fleets in one job, through every failure the simulators can stage.

The job runs against the simulators over loopback (tests/support/real_jobs.py: faults on every
request, a failing provider, a provider serving outside the allowlist, a platform hold, an outage,
a closed lane, and the console's commands). Each snapshot is checked as the job built it (exact types:
a backend's StrEnum member is not a str, tests/support/schema_check.py) and encoded as the control
server encodes it (engine/control/wire.py, no fallback); what the console received is checked
again as it arrived, and every record the journals were handed is JSON's own types.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from regen.engine.backends.base import Disposition, Failure
from regen.engine.backends.sglang.errors import ErrorClass
from regen.engine.control.wire import encode, unencodable
from regen.engine.data import jsonl
from regen.engine.schema import CommandReply, Hello, Snapshot
from tests.support.real_jobs import KINDS, Run, play
from tests.support.schema_check import json_problems, problems


def test_a_failure_s_error_class_is_a_plain_str_whoever_builds_it() -> None:
    failure = Failure(Disposition.RETRY, ErrorClass.ABORT, "aborted", streak_hint=ErrorClass.ABORT)
    assert type(failure.error_class) is str and failure.error_class == "abort"
    assert type(failure.streak_hint) is str and type(failure.message) is str
    encode({failure.error_class: 1})


def test_the_checker_finds_what_the_wire_would_break_or_hide() -> None:
    lane_errors: Any = {ErrorClass.ABORT: 1}
    found = problems({"x": 1, "errors": lane_errors, "elapsed_s": float("nan")}, Snapshot)
    assert "errors.abort: a key of type ErrorClass, not str" in found
    assert "elapsed_s: nan, which the wire turns into null" in found
    assert "x: not a key" in found and "state: missing (required by Snapshot)" in found
    assert "rows: bool True, expected int" in problems({"rows": True}, Snapshot)


@pytest.fixture
def journaled(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """What every journal (attempts, events, results, quarantine) is handed, checked as it is written."""
    found: list[str] = []
    append, append_many = jsonl.JsonlAppender.append, jsonl.JsonlAppender.append_many

    def checked_append(self: jsonl.JsonlAppender, obj: Any) -> Any:
        found.extend(f"{self.path.name}: {p}" for p in json_problems(obj))
        return append(self, obj)

    def checked_append_many(self: jsonl.JsonlAppender, objs: Any) -> Any:
        objs = list(objs)
        for obj in objs:
            found.extend(f"{self.path.name}: {p}" for p in json_problems(obj))
        return append_many(self, objs)

    monkeypatch.setattr(jsonl.JsonlAppender, "append", checked_append)
    monkeypatch.setattr(jsonl.JsonlAppender, "append_many", checked_append_many)
    yield found


@pytest.mark.parametrize("kind", KINDS)
async def test_every_snapshot_of_a_real_job_is_the_schemas_and_encodes(
    kind: str, tmp_path: Path, journaled: list[str]
) -> None:
    built: list[str] = []
    count = 0

    def check(snap: Snapshot) -> None:
        nonlocal count
        count += 1
        built.extend(problems(snap, Snapshot))
        try:
            encode(snap)
        except TypeError:
            built.append(f"cannot be encoded: {unencodable(snap)}")

    try:
        run = await play(kind, tmp_path, on_snapshot=check)
    finally:
        # A snapshot that breaks the schema says so first, whatever the run did next.
        assert not built, f"{len(set(built))} problems in the snapshots built:\n" + "\n".join(
            sorted(set(built))
        )
    assert count > 50
    assert not journaled, "\n".join(sorted(set(journaled)))
    check_what_arrived(run)
    check_what_was_staged(run)


def check_what_arrived(run: Run) -> None:
    lines = [got.message for got in run.console.lines]
    hello = lines[0]["hello"]
    found = problems(hello, Hello, "hello")
    snapshots = [m["snapshot"] for m in lines if "snapshot" in m]
    for index, snap in enumerate(snapshots):
        found += problems(snap, Snapshot, f"snapshot {index}")
    assert not found, "\n".join(sorted(set(found)))
    replies = [m["reply"] for m in lines if "command" in m]
    assert replies and not [p for r in replies for p in problems(r, CommandReply, "reply")]
    assert {r["ok"] for r in replies} == {True, False}, "commands the job took and ones it refused"
    assert lines[-1] == {"bye": "the job has ended"}
    # Nothing was skipped: every broadcast reached the console (about four a second).
    span = run.console.lines[-1].at - run.console.lines[0].at
    assert len(snapshots) >= span * 3, f"{len(snapshots)} snapshots in {span:.0f} s"


def check_what_was_staged(run: Run) -> None:
    """The failures were staged and seen, so that a change to the script cannot quietly drop one."""
    snapshots = [got.message["snapshot"] for got in run.console.lines if "snapshot" in got.message]
    lanes = [lane for snap in snapshots for lane in snap["lanes"]]
    states = Counter((lane["name"], lane["state"]) for lane in lanes)
    errors = {cls for lane in lanes for cls in lane["errors"]}
    statuses = {p["status"] for lane in lanes for p in lane["providers"]}
    events = {e["event"] for snap in snapshots for e in snap.get("events", [])}
    if run.kind in ("openrouter", "fleets"):
        assert {"rate_limited", "server", "stream_error", "network"} <= errors, errors
        assert max(snap["quarantined"] for snap in snapshots) > 0 and "quarantine" in events
        assert "FAIL" in statuses and "EXCL" in statuses, statuses
    if run.kind in ("sglang", "fleets"):
        assert "abort" in errors and {"network", "overloaded"} & errors, errors
    if run.kind == "openrouter":
        assert states["openrouter", "held"] and states["openrouter", "out"], states
        assert {"hold", "hold_end", "outage", "outage_end", "usage_bound"} <= events, events
    if run.kind == "sglang":
        assert states["sglang", "out"] and {"outage", "outage_end"} <= events, events
    if run.kind == "fleets":
        assert all(len(snap["lanes"]) == 2 and "fleet" in snap for snap in snapshots)
        assert states["openrouter", "closed"] and states["sglang", "paused"] and "credits" in errors
        assert {"steer", "deadline", "lane_closed"} <= events, events
