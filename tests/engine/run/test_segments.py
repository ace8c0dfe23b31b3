"""Journal compaction (engine/run/segments.py): at a start the grown attempt journal becomes a compressed
segment a resume never reads; a resume from the checkpoint, a full read of the history and a spend
audit all give what the uncompacted journal gives, to the last digit, crash states included. (A real
job stopped and resumed over compactions: tests/integration/job/test_job.py.)"""

from __future__ import annotations

import os
import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest

from regen.engine.data.jsonl import iter_lines
from regen.engine.run import checkpoint, segments
from regen.engine.run.checkpoint import CHECKPOINTS_DIR, Resumed
from regen.engine.run.records import end_record
from regen.engine.run.recovery import journal_spend, read_journals
from regen.engine.run.segments import SEGMENTS_DIR, compress, history
from tests.support.runfolder import TS, Run, assert_same


def start(run: Run) -> Resumed:
    """What Job.prepare() does with the files: resume, then the start's checkpoint."""
    checkpoints = run.checkpointer()
    resumed = checkpoints.resume(run.prompts())
    checkpoints.write()
    return resumed


def test_a_compacted_journal_gives_the_same_money_as_the_whole_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(segments, "COMPACT_FROM", 1)  # every start rotates
    run = Run(tmp_path)
    whole = tmp_path / "whole.jsonl"  # the same records, never compacted
    for step in range(3):
        for line in range(step * 10, step * 10 + 8):
            run.answered(line, "0.000731" if line % 2 else "0.0012", est=line % 7 == 0)
        run.failed(step * 10 + 8)
        run.open(step * 10 + 9, gen=step != 1)
        with whole.open("ab") as f:
            f.write(run.attempts.read_bytes() if run.attempts.exists() else b"")
        resumed = start(run)
        assert resumed.from_checkpoint == (step > 0)
        assert not run.attempts.exists(), "rotated: a resume reads only what comes after"
        assert_same(resumed, run.full())
        assert start(run).from_checkpoint, "the rotated journal's checkpoint"
    assert [p.name for p in history(run.attempts)][:3] == [f"attempts.{n:06d}.jsonl" for n in (1, 2, 3)]
    assert compress(run.attempts) == 3 and compress(run.attempts) == 0
    parts = history(run.attempts)
    assert [p.name for p in parts] == [f"attempts.{n:06d}.jsonl.gz" for n in (1, 2, 3)] + ["attempts.jsonl"]
    assert sum(p.stat().st_size for p in parts[:3]) < whole.stat().st_size / 3

    full = read_journals(whole, run.events, backend="openrouter", default="openrouter")
    compacted = read_journals(run.attempts, run.events, backend="openrouter", default="openrouter")
    assert compacted.spent == full.spent and compacted.spent > Decimal("0.02")
    assert (compacted.estimates, compacted.crashed, compacted.attempts) == (
        full.estimates,
        full.crashed,
        full.attempts,
    )
    assert journal_spend(run.attempts) == journal_spend(whole)
    # No checkpoint (another regen, all damaged): the whole history is read, segments first.
    shutil.rmtree(run.run_dir / CHECKPOINTS_DIR)
    resumed = run.checkpointer().resume(run.prompts())
    assert not resumed.from_checkpoint
    assert_same(resumed, run.full())


def test_a_crash_while_compressing_leaves_the_history_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(segments, "COMPACT_FROM", 1)
    run = Run(tmp_path)
    for line in range(6):
        run.answered(line)
    start(run)
    for line in range(6, 9):
        run.answered(line)
    want = read_journals(run.attempts, run.events).spent
    folder = run.run_dir / SEGMENTS_DIR
    plain = folder / "attempts.000001.jsonl"
    # Killed after the compressed copy was renamed, before the plain segment was removed; and a
    # temporary of an earlier try left behind.
    compress(run.attempts)
    shutil.copy(folder / "attempts.000001.jsonl.gz", folder / ".attempts.000001.jsonl.gz.tmp")
    import gzip

    plain.write_bytes(gzip.decompress((folder / "attempts.000001.jsonl.gz").read_bytes()))
    assert read_journals(run.attempts, run.events).spent == want, (
        "a segment both plain and compressed counts once"
    )
    assert compress(run.attempts) == 1 and sorted(p.name for p in folder.iterdir()) == [
        "attempts.000001.jsonl.gz"
    ]
    assert read_journals(run.attempts, run.events).spent == want


class Killed(BaseException):
    """A SIGKILL at this point: nothing after it runs, no handler sees it."""


def heads(run: Run) -> list[dict[str, Any]]:
    return [
        orjson.loads(p.read_bytes().split(b"\n")[0]) for p in (run.run_dir / CHECKPOINTS_DIR).glob("*.ckpt")
    ]


@pytest.mark.parametrize("crash", ["before the rename", "between the renames", "none", "rename refused"])
def test_a_rotation_while_running_keeps_the_history_whole_at_every_crash_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash: str
) -> None:
    """engine/run/checkpoint.py rotate_attempts, as the job's appender runs it between two batches."""
    monkeypatch.setattr(segments, "COMPACT_FROM", 1 << 30)
    run = Run(tmp_path)
    for line in range(4):
        run.answered(line)
    running = run.checkpointer()
    running.resume(run.prompts())
    running.write()
    run.answered(4, "0.0011")
    run.open(5)  # open across the rotation: ended in the fresh file
    running.advance()
    run.failed(6)  # not read by any checkpoint yet
    monkeypatch.setattr(segments, "COMPACT_FROM", 1)
    with monkeypatch.context() as m:
        renames = []

        def rename(src: Path, dst: Path) -> None:
            renames.append(src)
            if crash == "rename refused":
                raise OSError(18, "Invalid cross-device link")
            if crash == "between the renames" and len(renames) == 2:
                raise Killed
            os.replace(src, dst)

        m.setattr(os, "rename", rename)
        if crash == "before the rename":
            m.setattr(checkpoint, "rotate_live", lambda path: (_ for _ in ()).throw(Killed()))
        if crash == "rename refused":
            with pytest.raises(OSError, match="cross-device"):
                running.rotate_attempts()
            # Put back: the journal goes on, read on from where it was, no checkpoint left for it.
            assert not segments.segments(run.attempts) and len(list(run.run_dir.glob(".*"))) == 0
            assert all(head["segments"] == 0 for head in heads(run))
            run.journal(end_record(f"A-{5:08d}#0", "A", 5, "g5", "openrouter", "ok", Decimal("0.0009"), False, TS, ctok=30))  # fmt: skip
            run.row(5)
            running.advance()
        elif crash == "none":
            fd = running.rotate_attempts()
            assert fd is not None
            os.close(fd)
            assert run.attempts.stat().st_size == 0 and len(segments.segments(run.attempts)) == 1
            # The job's writer goes on in the fresh file.
            run.journal(end_record(f"A-{5:08d}#0", "A", 5, "g5", "openrouter", "ok", Decimal("0.0009"), False, TS, ctok=30))  # fmt: skip
            run.row(5)
        else:
            with pytest.raises(Killed):
                running.rotate_attempts()
    # The next start (not rotating itself): a whole history (segments + file), read from a
    # checkpoint that matches it.
    monkeypatch.setattr(segments, "COMPACT_FROM", 1 << 30)
    resumed = run.checkpointer().resume(run.prompts())
    assert resumed.from_checkpoint, crash
    assert_same(resumed, run.full())
    assert not list(run.run_dir.glob(".attempts*")), "a fresh file a crash left is cleared"
    assert all(head["segments"] <= segments.last_segment(run.attempts) for head in heads(run)), (
        "a checkpoint for a rotation that never happened is gone before another can match it"
    )
    # Each record counted once (a full read agreeing with a resume would not see one read twice).
    ended = Decimal("0.0009") if crash in ("none", "rename refused") else 0
    assert read_journals(run.attempts, run.events).spent == Decimal("0.0040") + ended


def _lines(path: Path, numbers: range) -> None:
    with open(path, "ab") as f:
        f.write(b"".join(orjson.dumps({"n": n}) + b"\n" for n in numbers))


def _rotated_with(path: Path, numbers: range) -> None:
    """What a job's rotation does to the journal (segments.rotate_live): the file becomes the next
    segment, a fresh one takes its name, and the job writes on there."""
    assert segments.rotate(path, 0) is not None
    _lines(path, numbers)


@pytest.mark.parametrize("when", ["while the live file is read", "between the listing and the open"])
def test_a_reader_beside_the_job_reads_each_record_once_in_order_while_the_journal_rotates(
    tmp_path: Path, when: str
) -> None:
    path = tmp_path / "attempts.jsonl"
    _lines(path, range(3))
    assert segments.rotate(path, 0) is not None
    _lines(path, range(3, 6))
    seen: list[int] = []
    rotated = False

    def read(part: Path, shown: Path, start: int, first: int) -> tuple[int, int]:
        nonlocal rotated
        offset, lines = start, first
        for n, line in iter_lines(part, start=start, first=first):
            seen.append(orjson.loads(line)["n"])
            offset, lines = offset + len(line), n + 1
        if rotated:
            return offset, lines
        if when == "while the live file is read" and shown == path:
            # The job wrote on after the reader's last line, then rotated; the segment is even
            # compressed (its plain file gone) before the reader looks again.
            rotated = True
            _lines(path, range(6, 8))
            _rotated_with(path, range(8, 10))
            assert compress(path) == 2  # both segments: the one read before, and this file
        elif when == "between the listing and the open" and part.name.startswith("attempts.000001"):
            rotated = True
            _rotated_with(path, range(6, 10))
        return offset, lines

    segments.read_live(path, read)
    assert rotated and seen == list(range(10))
