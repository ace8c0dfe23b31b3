"""The command line's one edge: where an operator-facing failure becomes lines and an exit code.

Every command runs inside `guarded`: a `RegenError` (engine/errors.py) prints its message, each line
prefixed `regen: `, and exits its class's code; an `OSError` names its file; Ctrl-C exits 130 with
no traceback. Anything else is a bug and keeps its traceback. Commands report a failure by raising,
or by `fail` where they have printed a part of their answer already.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from regen.engine.errors import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_SIGINT,
    EXIT_USAGE,
    RegenError,
    UsageError,
)

__all__ = [
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_SIGINT",
    "EXIT_USAGE",
    "RegenError",
    "UsageError",
    "fail",
    "guarded",
    "say",
]


def say(message: str) -> None:
    """A message for the operator on stderr, each line as `regen: ...`."""
    for line in message.splitlines() or [message]:
        print(f"regen: {line}", file=sys.stderr)


def fail(message: str, code: int = EXIT_FAILURE) -> int:
    """`say` the message; the exit code, for the command to return."""
    say(message)
    return code


def guarded(command: Callable[[], int]) -> int:
    """The command's exit code, with its operator-facing failures said as one line each."""
    try:
        return command()
    except RegenError as exc:
        return fail(str(exc), exc.exit_code)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        return fail(f"{where}{exc.strerror or exc}", EXIT_FAILURE)
    except KeyboardInterrupt:
        return EXIT_SIGINT
