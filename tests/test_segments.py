"""Journal compaction (engine/run/segments.py): at a start the grown attempt journal becomes a compressed
segment a resume never reads; a resume from the checkpoint, a full read of the history and a spend
audit all give what the uncompacted journal gives, to the last digit, crash states included. (A real
job stopped and resumed over compactions: tests/test_job.py.)"""

from __future__ import annotations

import shutil
from decimal import Decimal
from pathlib import Path

import pytest

from regen.engine.run import segments
from regen.engine.run.checkpoint import CHECKPOINTS_DIR, Resumed
from regen.engine.run.recovery import journal_spend, read_journals
from regen.engine.run.segments import SEGMENTS_DIR, compress, history
from tests.support.runfolder import Run, assert_same


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
