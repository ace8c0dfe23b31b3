"""The run folder's lock (src/regen/engine/run/runlock.py): one job per folder, and a reader that
asks who holds it without taking it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from regen.engine.run.runlock import LOCK_NAME, RunLock, RunLocked, held_by, holder


def test_a_reader_sees_the_holder_and_never_takes_the_lock(tmp_path: Path) -> None:
    assert holder(tmp_path) is None, "no lock file: nobody"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from regen.engine.run.runlock "
            "import RunLock; RunLock(Path(sys.argv[1])).take(); print('held', flush=True); time.sleep(60)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        for _ in range(200):  # a job starting while readers ask is never refused by them
            assert holder(tmp_path) == child.pid
        with pytest.raises(RunLocked, match=f"pid {child.pid}"):
            RunLock(tmp_path).take()
    finally:
        child.kill()
        child.wait()
    assert holder(tmp_path) is None, "the lock ends with its process, even by SIGKILL"
    lock = RunLock(tmp_path)
    lock.take()
    try:
        assert holder(tmp_path) == os.getpid()
    finally:
        lock.release()


def test_the_lock_table_is_read_for_that_file_only_and_not_its_waiters(tmp_path: Path) -> None:
    (tmp_path / LOCK_NAME).write_text("")
    st = os.stat(tmp_path / LOCK_NAME)
    mine = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    other = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino + 1}"
    table = (
        f"1: POSIX  ADVISORY  WRITE 11 {mine} 0 EOF\n"
        f"2: FLOCK  ADVISORY  WRITE 22 {other} 0 EOF\n"
        f"3: FLOCK  ADVISORY  WRITE 33 {mine} 0 EOF\n"
        f"3: -> FLOCK  ADVISORY  WRITE 44 {mine} 0 EOF\n"
    )
    assert held_by(table, st.st_dev, st.st_ino) == 33
    assert (
        held_by(table.replace(" 33 ", " 55 ").replace("3: FLOCK", "3: POSIX"), st.st_dev, st.st_ino) is None
    )
