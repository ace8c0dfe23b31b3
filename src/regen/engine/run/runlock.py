"""The run folder's lock: one job per run folder, and the pid of the one that holds it."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from regen.engine.errors import RegenError

LOCK_NAME = "job.lock"


class RunLocked(RegenError, RuntimeError):
    """Another job holds the run folder; the message names it."""


class RunLock:
    """An flock on `<run dir>/job.lock`, released by close or by the process ending (even SIGKILL)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_NAME
        self._fd: int | None = None

    def take(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise RunLocked(
                f"{self.path.parent}: another regen job is running on this run folder (pid {other})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def holder(run_dir: Path) -> int | None:
    """The pid of the job that holds the run folder now, else None: a reader's question
    (`regen report`), answered from the kernel's lock table without taking the lock (a reader that
    took it, even for an instant, could refuse a job starting at that instant)."""
    try:
        st = os.stat(run_dir / LOCK_NAME)
    except FileNotFoundError:
        return None
    with open("/proc/locks", encoding="ascii", errors="replace") as table:
        return held_by(table.read(), st.st_dev, st.st_ino)


def held_by(table: str, dev: int, ino: int) -> int | None:
    """The pid holding an flock on the file `dev`:`ino` in a /proc/locks text, else None. A line:
    ``1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF`` (``->`` before a waiter's lock type)."""
    want = f"{os.major(dev):02x}:{os.minor(dev):02x}:{ino}"
    for line in table.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "->":
            continue  # a process waiting for the lock, not holding it
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == want and fields[4].isdigit():
            return int(fields[4])
    return None
