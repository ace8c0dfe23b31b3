"""Checkpoints (engine/run/checkpoint.py): a start from the last good checkpoint and the records after it
rebuilds what a full read of the journals and rows rebuilds, money to the last digit; a torn checkpoint
is passed over for the one before it; files that no longer hold what a checkpoint read are read whole.
(A real job SIGKILLed between checkpoints: tests/integration/cli/test_cli.py.)"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from regen.engine.run.checkpoint import CHECKPOINTS_DIR
from regen.engine.run.records import end_record, reconciled_record, route_event, start_event
from tests.support.runfolder import TS, Run, assert_same


def test_a_start_from_a_checkpoint_rebuilds_what_the_full_read_does(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.event(start_event(1, ["A"], Decimal(10), Decimal(0), 8, [], None, TS))
    for line in range(10):
        run.answered(line)
    run.failed(10)
    run.failed(11)
    estimated = run.open(12)  # in flight at the checkpoint, ended after it
    settled_by_row = run.open(13)  # its row is written before the checkpoint, its end never
    run.row(13)
    run.open(14, gen=False)  # cut before any id: crashed
    run.answered(15, "0.05", est=True)  # waits for its bill
    first = run.checkpointer()
    first.resume(run.prompts())
    first.write()

    # After the checkpoint: more work, the estimate reconciled, a duplicate row, an exclusion.
    run.journal(
        end_record(estimated, "A", 12, "g12", "openrouter", "ok", Decimal("0.0009"), False, TS, ctok=30)
    )
    run.row(12, status="truncated")
    run.journal(
        reconciled_record(
            f"A-{15:08d}#0", "openrouter", "g15", "ok", Decimal("0.0007"), Decimal("-0.0493"), TS
        )
    )
    for line in range(16, 25):
        run.answered(line)
    run.failed(10)
    run.row(3)
    run.event(route_event("exclude", "Bad", "operator", None, TS))
    run.open(30)

    again = run.checkpointer()
    resumed = again.resume(run.prompts())
    assert resumed.from_checkpoint
    assert_same(resumed, run.full())
    assert resumed.journals["openrouter"].attempts["A"] == {10: 2, 11: 1, 14: 1, 30: 1}
    assert {u.rid for u in resumed.journals["openrouter"].crashed} == {
        settled_by_row,
        "A-00000014#0",
        "A-00000030#0",
    }
    assert resumed.progress["A"].settling[13]["generation_id"] == "g13", (
        "the row before the checkpoint still settles its attempt"
    )


def test_a_torn_checkpoint_is_passed_over_for_the_one_before(tmp_path: Path) -> None:
    run = Run(tmp_path)
    for line in range(5):
        run.answered(line)
    older = run.checkpointer()
    older.resume(run.prompts())
    kept = older.write()
    for line in range(5, 9):
        run.answered(line)
    run.open(9)
    older.advance()  # reads on and writes the next checkpoint
    newest = sorted((run.run_dir / CHECKPOINTS_DIR).glob("*.ckpt"))[-1]
    assert newest != kept
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) - 40])  # torn: the write never finished

    later = run.checkpointer()
    assert later._load() is not None
    assert later.progress["A"].offset < run.dataset.results_path.stat().st_size, "the one before it"
    resumed = run.checkpointer().resume(run.prompts())
    assert resumed.from_checkpoint
    assert_same(resumed, run.full())


def test_files_that_no_longer_hold_what_a_checkpoint_read_are_read_whole(tmp_path: Path) -> None:
    run = Run(tmp_path)
    for line in range(6):
        run.answered(line)
    checkpoints = run.checkpointer()
    checkpoints.resume(run.prompts())
    checkpoints.write()
    # The results replaced by another run's (same length, other lines): the checkpoint's rows are not these.
    rows = run.dataset.results_path.read_bytes()
    run.dataset.results_path.write_bytes(
        rows.replace(b'"line":5', b'"line":7').replace(run.shas[5].encode(), run.shas[7].encode())
    )
    resumed = run.checkpointer().resume(run.prompts())
    assert not resumed.from_checkpoint
    assert 7 in resumed.progress["A"].done and 5 not in resumed.progress["A"].done
    assert_same(resumed, run.full())


def test_rows_rewritten_under_a_running_checkpointer_are_read_again(tmp_path: Path) -> None:
    run = Run(tmp_path)
    for line in range(8):
        run.answered(line)
    checkpoints = run.checkpointer()
    checkpoints.resume(run.prompts())
    checkpoints.write()
    # The file rewritten without the rows of lines 2 and 5 (taken back), then a new row appended.
    kept = [row for row in run.dataset.results_path.read_bytes().splitlines(keepends=True)
            if b'"line":2,' not in row and b'"line":5,' not in row]  # fmt: skip
    run.dataset.results_path.write_bytes(b"".join(kept))
    run.answered(9)
    checkpoints.advance()
    assert sorted(checkpoints.progress["A"].done) == [0, 1, 3, 4, 6, 7, 9]
    assert checkpoints.progress["A"].ok == 7


def test_reading_on_between_checkpoints_keeps_attempt_counts_only_for_prompts_without_their_row(
    tmp_path: Path,
) -> None:
    # A read counts an attempt for every prompt started since the one before and drops those with
    # their row at its end: the job reads on every few seconds (engine/job/job.py READ_ON_S), so what
    # a read holds stays small (BENCHMARKS.md "Soak": one read of five minutes held 375,000).
    run = Run(tmp_path, prompts=400)
    for line in range(100):
        run.answered(line)
    checkpointer = run.checkpointer()
    checkpointer.resume(run.prompts())
    checkpointer.write()
    for line in range(100, 300):
        run.answered(line)
    run.failed(300)
    run.failed(300)
    run.open(301)
    run.failed(302)
    run.answered(302)
    written = sorted((run.run_dir / CHECKPOINTS_DIR).glob("*.ckpt"))
    checkpointer.read_on()
    assert checkpointer.attempts_counted() == 2  # 300 (twice) and 301 (in flight)
    assert sorted((run.run_dir / CHECKPOINTS_DIR).glob("*.ckpt")) == written, "no checkpoint written"
    # What the next checkpoint writes is what a full read gives.
    checkpointer.advance()
    resumed = run.checkpointer().resume(run.prompts())
    assert_same(resumed, run.full())
    assert resumed.journals["openrouter"].attempts == {"A": {300: 2, 301: 1}}
