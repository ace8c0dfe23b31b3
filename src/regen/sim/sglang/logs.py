"""The server's log, in SGLang's line format (docs/sglang.md, "Log lines").

Scheduler lines carry the TP rank (`[2026-02-26 16:41:05 TP0] ...`), the front end's lines none, and
uvicorn's its own `INFO:     ...` form. Each line goes to the stream at once (the operator's tail and
regen's readiness follower read it live) and into a bounded buffer tests read.

Each line has SGLang's logging level: `--log-level` (and `--log-level-http` for uvicorn's lines)
hides the ones below it, as the real server's loggers do. The startup phases and the ready line are
INFO, so `--log-level warning` hides them (docs/sglang.md §2); failures are ERROR and always shown.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TextIO

__all__ = ["LEVELS", "SimLog"]

# Python's logging levels, as SGLang's --log-level names them.
LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


class SimLog:
    def __init__(self, stream: TextIO | None = None, maxlen: int = 20_000) -> None:
        self.stream = stream
        self.lines: deque[str] = deque(maxlen=maxlen)
        self.level = "info"  # --log-level
        self.http_level: str | None = None  # --log-level-http; None: --log-level

    def _shown(self, level: str, threshold: str) -> bool:
        return LEVELS.get(level, 20) >= LEVELS.get(threshold.lower(), 20)

    def _write(self, line: str) -> None:
        self.lines.append(line)
        if self.stream is not None:
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError):  # a closed or broken log stream must not stop the server
                self.stream = None

    @staticmethod
    def _stamp() -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S")

    def main(self, message: str, level: str = "info") -> None:
        """A line of the HTTP front end and tokenizer manager."""
        if not self._shown(level, self.level):
            return
        for part in message.split("\n"):
            self._write(f"[{self._stamp()}] {part}" if part else "")

    def scheduler(self, message: str, rank: int = 0, level: str = "info") -> None:
        """A line of the scheduler process of TP rank `rank`."""
        if not self._shown(level, self.level):
            return
        for part in message.split("\n"):
            self._write(f"[{self._stamp()} TP{rank}] {part}" if part else "")

    def raw(self, message: str) -> None:
        """Text printed as is, whatever the level (tracebacks, uvicorn's error lines)."""
        for part in message.split("\n"):
            self._write(part)

    def uvicorn(self, message: str, level: str = "info") -> None:
        if not self._shown(level, self.http_level or self.level):
            return
        self._write(f"{level.upper() + ':':<9} {message}")

    def contains(self, text: str) -> bool:
        return any(text in line for line in self.lines)
