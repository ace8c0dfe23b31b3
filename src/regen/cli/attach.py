"""Starting a detached job, and attaching to a running one (the console, or status lines without a TTY)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from regen.console.client import SocketSource
from regen.engine.control.headless import status_line
from regen.engine.control.server import SOCKET_NAME, ControlError, open_control
from regen.engine.errors import EXIT_FAILURE, EXIT_OK, EXIT_SIGINT, EXIT_SIGTERM
from regen.engine.schema import Snapshot

OUTCOME_EXIT = {"done": EXIT_OK, "sigint": EXIT_SIGINT, "sigterm": EXIT_SIGTERM}
JOB_LOG = "job.log"


def outcome_exit_code(snapshot: Snapshot | None) -> int:
    outcome = None if snapshot is None else snapshot["outcome"]
    return EXIT_OK if outcome is None else OUTCOME_EXIT.get(outcome["reason"], EXIT_FAILURE)


def start_detached(run_dir: Path, job_args: list[str], *, timeout_s: float = 600.0) -> tuple[int, str]:
    """Start the job in its own session (it outlives this terminal and SSH), wait for its socket.

    Returns (0, "") once the socket answers, or (exit code, what the job said) if it ended first.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / JOB_LOG
    with open(log_path, "ab") as log:
        start_offset = log.tell()
        proc = subprocess.Popen(
            [sys.executable, "-m", "regen", *job_args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    socket_path = run_dir / SOCKET_NAME
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            with open(log_path, "rb") as log:
                log.seek(start_offset)
                said = log.read().decode(errors="replace").strip()
            return code, said
        if socket_path.exists() and _answers(socket_path):
            return 0, ""
        time.sleep(0.1)
    return 1, f"the job did not open {socket_path} within {timeout_s:.0f} s (see {log_path})"


def _answers(path: Path) -> bool:
    async def probe() -> bool:
        try:
            _, writer, _ = await open_control(path, readonly=True)
        except (ControlError, OSError):
            return False
        writer.close()
        return True

    return asyncio.run(probe())


async def follow_lines(source: SocketSource, *, out: Any = sys.stdout, interval_s: float = 2.0) -> int:
    """Without a terminal: a status line every `interval_s` and every event, until the job ends."""
    last: Snapshot | None = None
    printed = 0.0
    async for snap in source.snapshots():
        last = snap
        for event in snap.get("events", []):
            name = event.get("event")
            detail = " ".join(f"{k}={v}" for k, v in event.items() if k not in ("seq", "ts", "event"))
            print(f"event {name} {detail}".rstrip(), file=out, flush=True)
        now = time.monotonic()
        if now - printed >= interval_s:
            print(status_line(snap), file=out, flush=True)
            printed = now
    if last is not None:
        print(status_line(last), file=out, flush=True)
    reason = source.closed_reason or "connection closed"
    print(f"detached: {reason}", file=out, flush=True)
    return outcome_exit_code(last)
