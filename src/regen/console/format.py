"""Numbers as the console prints them: fixed widths, "-" for what the job did not report."""

from __future__ import annotations

import time
from typing import Any

from regen.engine.durations import duration
from regen.engine.units import amount as amount  # the one formatter of amounts, as fmt.amount

DASH = "-"


def clock(seconds: float | None) -> str:
    """Elapsed or remaining time as H:MM:SS (or "-")."""
    if seconds is None or seconds < 0:
        return DASH
    whole = int(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def short_duration(seconds: float | None) -> str:
    """A compact duration: 45s, 12m05s, 3h20m (or "-")."""
    if seconds is None or seconds < 0:
        return DASH
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def count(n: float | None) -> str:
    """A count with a k/M suffix once it is large."""
    if n is None:
        return DASH
    if abs(n) >= 1e9:
        return f"{n / 1e9:.2f}G"
    if abs(n) >= 1e6:
        return f"{n / 1e6:.2f}M"
    if abs(n) >= 1e4:
        return f"{n / 1e3:.1f}k"
    if n == int(n) or abs(n) >= 100:
        return f"{n:.0f}"
    return f"{n:.1f}"


def rate(n: float | None) -> str:
    """A per-second rate: one decimal below 100, a count above."""
    if n is None:
        return DASH
    return f"{n:.1f}" if abs(n) < 100 else count(n)


def seconds(value: float | None) -> str:
    """A latency: 850ms, 1.25s, 42s."""
    if value is None:
        return DASH
    if value < 1:
        return f"{value * 1000:.0f}ms"
    if value < 10:
        return f"{value:.2f}s"
    return f"{value:.0f}s"


def percent(fraction: float | None, digits: int = 0) -> str:
    """A fraction as a percentage."""
    if fraction is None:
        return DASH
    return f"{fraction * 100:.{digits}f}%"


def wall_time(ts: float) -> str:
    """A wall-clock timestamp as local HH:MM:SS."""
    return time.strftime("%H:%M:%S", time.localtime(ts))


def number(value: Any) -> float | None:
    """A snapshot field as a float, None when absent or not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def against_deadline(eta_s: float | None, time_left_s: float | None) -> tuple[str, bool]:
    """The ETA beside the deadline: ("ETA 3h10m, 20m before the deadline", False), or ... after it, True."""
    if eta_s is None:
        return "ETA -: no rate measured yet", False
    if time_left_s is None:
        return f"ETA {duration(eta_s, 'coarse')}", False
    gap = time_left_s - eta_s
    if gap >= 0:
        return f"ETA {duration(eta_s, 'coarse')}, {duration(gap, 'coarse')} before the deadline", False
    return f"ETA {duration(eta_s, 'coarse')}, {duration(-gap, 'coarse')} after the deadline", True
