"""Processes regen starts end with it: a SIGKILLed job leaves no tokenizer worker or router behind.

Linux's parent-death signal (prctl PR_SET_PDEATHSIG) is delivered to a child when the process
that started it ends, however it ends; elsewhere the call is a no-op and a killed job's children
outlive it as any process's do (docs/architecture.md, "Processes").
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int | None = None, signum: int = signal.SIGTERM) -> None:
    """Called in the child: `signum` arrives when the parent ends. `parent` (the parent's pid as
    the parent knew it) closes the race of a parent that ended before this call."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signum)
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signum)
