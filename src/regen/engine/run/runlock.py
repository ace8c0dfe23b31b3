"""The run folder's lock: one job per run folder, and the pid of the one that holds it."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = "job.lock"


class RunLocked(RuntimeError):
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
    (`regen report`), answered without taking the lock from anyone or writing anything."""
    try:
        fd = os.open(run_dir / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            said = os.pread(fd, 32, 0).decode(errors="replace").strip()
            return int(said) if said.isdigit() else 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
