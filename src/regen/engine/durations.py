"""Spans of time as the operator reads them: one formatter, three precisions.

The job's status lines, the fleet plan's reasons and the console's panes all say how long something
takes, lasts or is left; each precision is said one way everywhere:

- ``"clock"``: ``01:02:05``, whole seconds passed (cut, never rounded up: a second shows once it has
  gone), hours as many as it takes; ``--:--:--`` when unknown or endless. The headless status line
  and summary (engine/control/headless.py).
- ``"fine"``: ``45s``, ``4m05s`` under an hour, ``12h53m`` from one; rounded UP, so an earliest
  deadline is never shown earlier than it is; ``forever`` when endless, ``0s`` for a span already
  run out. The fleet plan's reasons (engine/money/fleetplan/).
- ``"coarse"``: ``45s``, ``20m`` under an hour, ``3h`` or ``3h10m`` from one; to the nearest (an
  exact half to even, as Python's ``round``); ``-`` when unknown, endless or negative. The console's
  plans and deadlines (console/format.py, console/widgets/fleets.py).

A base module of pure arithmetic: both the job and the console import it (pyproject.toml's contracts).
"""

from __future__ import annotations

import math
from typing import Literal

__all__ = ["Precision", "duration"]

Precision = Literal["clock", "fine", "coarse"]

# What each precision shows for a span it cannot say (None: not known).
_UNKNOWN: dict[Precision, str] = {"clock": "--:--:--", "fine": "-", "coarse": "-"}


def duration(seconds: float | None, precision: Precision) -> str:
    """``seconds`` at ``precision`` (this module's docstring says each one)."""
    if seconds is None:
        return _UNKNOWN[precision]
    if precision == "clock":
        return _clock(seconds)
    if precision == "fine":
        return _fine(seconds)
    return _coarse(seconds)


def _clock(seconds: float) -> str:
    if not math.isfinite(seconds):
        return _UNKNOWN["clock"]
    whole = int(seconds)
    # Callers say "passed ... ago" for a span gone by, so a negative one only keeps its sign.
    sign, whole = ("-", -whole) if whole < 0 else ("", whole)
    return f"{sign}{whole // 3600:02d}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def _fine(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "forever"
    whole = max(0, math.ceil(seconds))
    if whole >= 3600:
        hours, minutes = divmod(math.ceil(whole / 60), 60)
        return f"{hours}h{minutes:02d}m"
    minutes, secs = divmod(whole, 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _coarse(seconds: float) -> str:
    if seconds < 0 or not math.isfinite(seconds):
        return _UNKNOWN["coarse"]
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m"
    hours, minutes = divmod(whole // 60, 60)
    return f"{hours}h{minutes:02d}m" if minutes else f"{hours}h"
