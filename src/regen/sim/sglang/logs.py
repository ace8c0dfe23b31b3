"""The server's log, in SGLang's line format (docs/sglang.md, "Log lines").

Scheduler lines carry the TP rank (`[2026-02-26 16:41:05 TP0] ...`), the front end's lines none, and
uvicorn's its own `INFO:     ...` form. Each line goes to the stream at once (the operator's tail and
regen's readiness follower read it live) and into a bounded buffer tests read.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TextIO

__all__ = ["SimLog"]


class SimLog:
    def __init__(self, stream: TextIO | None = None, maxlen: int = 20_000) -> None:
        self.stream = stream
        self.lines: deque[str] = deque(maxlen=maxlen)

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

    def main(self, message: str) -> None:
        """A line of the HTTP front end and tokenizer manager."""
        for part in message.split("\n"):
            self._write(f"[{self._stamp()}] {part}" if part else "")

    def scheduler(self, message: str, rank: int = 0) -> None:
        """A line of the scheduler process of TP rank `rank`."""
        for part in message.split("\n"):
            self._write(f"[{self._stamp()} TP{rank}] {part}" if part else "")

    def raw(self, message: str) -> None:
        """Text printed as is (tracebacks, uvicorn's own lines)."""
        for part in message.split("\n"):
            self._write(part)

    def uvicorn(self, message: str) -> None:
        self._write(f"INFO:     {message}")

    def contains(self, text: str) -> bool:
        return any(text in line for line in self.lines)
