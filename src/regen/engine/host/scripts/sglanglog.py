"""SGLang's startup log read as phases and failure signatures (docs/sglang.md §2).

Standard library only: the host script scans a server's log with it (``regen sglang status``), and
regen follows a launch with it line by line (``regen sglang start``), so both read the log alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Phases in the order a healthy start reaches them; each is entered by a line holding its marker.
# 0.5.23 captures "target decode", or with speculative decoding "target verify" then the draft's
# "draft decode"/"draft extend" graphs, and may capture a "target prefill" graph first
# (`Capture <role> CUDA graph begin`); 0.5.9 says `Capture cuda graph begin`.
PHASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("weights", ("Load weight begin",)),
    ("weights loaded", ("Load weight end",)),
    ("kv pool", ("KV Cache is allocated",)),
    ("cuda graphs", ("CUDA graph begin", "Capture cuda graph begin")),
    ("cuda graphs captured", ("CUDA graph end", "Capture cuda graph end")),
    ("scheduler", ("max_total_num_tokens=",)),
    ("http", ("Uvicorn running on",)),
    ("ready", ("The server is fired up and ready to roll!",)),
)
PHASE_NAMES = tuple(name for name, _ in PHASES)
READY = "ready"

# Lines that mean the server is dying or dead, with where it happened (docs/sglang.md §2). The first
# one found names the failure; a process that exits without one is reported by its log's last lines.
FAILURES: tuple[tuple[str, str], ...] = (
    ("Capture cuda graph failed", "cuda graphs"),
    ("Not enough memory. Please try to increase --mem-fraction-static", "kv pool"),
    ("torch.OutOfMemoryError", "weights"),
    ("error while attempting to bind on address", "http"),
    ("Initialization failed. warmup error", "warmup"),
    ("Scheduler watchdog timeout", "running"),
    ("Watchdog timeout (", "running"),
    ("Decode out of memory", "running"),
    ("Scheduler hit an exception", "scheduler"),
    ("scheduler died during initialization", "scheduler"),
    ("TokenizerManager hit an exception", "a child process"),
    ("DetokenizerManager hit an exception", "a child process"),
    ("DataParallelController hit an exception", "a child process"),
    ("error: unrecognized arguments", "command line"),
    ("error: the following arguments are required", "command line"),
    ("error: ambiguous option", "command line"),
    ("does not appear to have a file named config.json", "model folder"),
    ("is not a local folder and is not a valid model identifier", "model folder"),
    ("Received sigquit from a child process", "a child process"),
)
# A line holding a failure marker that is no failure: the soft watchdog (--soft-watchdog-timeout)
# prints the hard one's words with `self.soft=True` and lets the server run on (utils/watchdog.py).
NOT_FAILURES = ("self.soft=True",)
# Logged while running; not fatal, but worth a count (too much in flight).
RETRACTION = "KV cache pool is full. Retract requests"


@dataclass(slots=True)
class LogState:
    """What the lines seen so far say: the latest phase, the failure if any, retractions."""

    phase: str | None = None
    failure: str | None = None  # the line holding the first failure signature
    failure_where: str | None = None
    retractions: int = 0
    lines: int = 0

    def feed(self, line: str) -> str | None:
        """Read one line; returns the phase it enters, if it enters one."""
        self.lines += 1
        said = strip_prefix(line)
        hit = _match(said)
        if self.failure is None:
            if hit is not None:
                self.failure, self.failure_where = said[:400], hit
        elif self.failure_where in _HEADLINES and _is_error_line(said):
            # "Scheduler hit an exception" is less telling than the error line under it.
            self.failure = said[:400]
            if hit is not None and hit not in _HEADLINES:
                self.failure_where = hit
        if RETRACTION in line:
            self.retractions += 1
        for name, markers in PHASES:
            if any(m in line for m in markers):
                self.phase = name
                return name
        return None

    @property
    def ready(self) -> bool:
        return self.phase == READY


_HEADLINES = ("scheduler", "a child process")
# "[2026-02-26 16:41:05 TP0] " before scheduler lines, "[2026-02-26 16:41:05] " before the front end's.
_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d [^\]]*\]\s?")


def strip_prefix(line: str) -> str:
    """The line without its timestamp (and TP rank) prefix."""
    return _PREFIX.sub("", line.strip(), count=1).strip()


def _match(line: str) -> str | None:
    if any(marker in line for marker in NOT_FAILURES):
        return None
    for marker, where in FAILURES:
        if marker in line:
            return where
    return None


def _is_error_line(line: str) -> bool:
    head = line.strip().split(":", 1)[0]
    return head.endswith(("Error", "Exception")) and " " not in head


def scan(text: str) -> LogState:
    state = LogState()
    for line in text.splitlines():
        state.feed(line)
    return state


__all__ = ["FAILURES", "NOT_FAILURES", "PHASES", "PHASE_NAMES", "READY", "RETRACTION", "LogState", "scan"]
