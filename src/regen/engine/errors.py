"""The root of every failure regen tells an operator about, and the exit codes of the command line.

An engine part raises a `RegenError` (or a class of its own under it) whose message is what the
operator reads: one line, or a few, naming the file and line, the setting or the host, and never a
secret. The command line turns it into those lines on stderr and the class's `exit_code` in one place
(cli/edge.py), so no command keeps its own table of which error means which code. An error that is
not a `RegenError` is a bug and keeps its traceback.

Exit codes (README.md "Exit codes"): 0 done, 1 a failure the message explains, 2 bad usage or settings, 130 and
143 after SIGINT and SIGTERM.
"""

from __future__ import annotations

from typing import ClassVar, Final

__all__ = [
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_SIGINT",
    "EXIT_SIGTERM",
    "EXIT_USAGE",
    "RegenError",
    "UsageError",
]

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2
EXIT_SIGINT: Final = 130  # 128 + SIGINT, as a shell reports a process it interrupted
EXIT_SIGTERM: Final = 143  # 128 + SIGTERM


class RegenError(Exception):
    """A failure the message explains to the operator: the command exits `exit_code`."""

    exit_code: ClassVar[int] = EXIT_FAILURE


class UsageError(RegenError):
    """Bad usage or settings: what the operator typed or wrote must change before a rerun can work."""

    exit_code: ClassVar[int] = EXIT_USAGE
