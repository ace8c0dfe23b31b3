"""`job.deadline`: a time of day or a duration, parsed once and resolved to one absolute instant.

The rules are in docs/fleets.md ("The deadline"). The resolved instant, not the text, is what a job
journals at its first start: a restart reads it back, so "12h" or "06:30" does not move when the job
is resumed later.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from regen.engine.errors import UsageError

SETTING = "job.deadline"

_UNITS = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}
_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
_TIME_OF_DAY = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}))?")


class DeadlineError(UsageError, ValueError):
    """A `job.deadline` that is neither a time of day nor a duration; str() is the one-line message."""

    def __init__(self, text: str, why: str) -> None:
        self.text = text
        self.why = why
        # Without the setting's name, for the settings layer that prefixes its own.
        self.detail = (
            f"{why}; expected a time of day (06:30, 06:30:00) or a duration (12h, 90m, 1h30m, 45s, 2d)"
        )
        super().__init__(f"{SETTING} = {text!r}: {self.detail}")


@dataclass(frozen=True, slots=True)
class TimeOfDay:
    """The next occurrence of a local wall-clock time, e.g. "06:30"."""

    time: dt.time

    def __str__(self) -> str:
        return self.time.isoformat()


@dataclass(frozen=True, slots=True)
class Duration:
    """A span from the job's first start, e.g. "1h30m"."""

    seconds: int

    def __str__(self) -> str:
        return f"{self.seconds}s"


Deadline = TimeOfDay | Duration


def parse_deadline(text: str) -> Deadline:
    """Parses `job.deadline`; raises DeadlineError (naming the setting) for anything else."""
    value = text.strip().lower()
    if not value:
        raise DeadlineError(text, "empty")
    clock = _TIME_OF_DAY.fullmatch(value)
    if clock is not None:
        hour, minute, second = int(clock[1]), int(clock[2]), int(clock[3] or 0)
        if hour > 23 or minute > 59 or second > 59:
            raise DeadlineError(text, "not a time of day (hours 0-23, minutes and seconds 0-59)")
        return TimeOfDay(dt.time(hour, minute, second))
    span = _DURATION.fullmatch(value)
    if span is None or not any(span.groups()):
        raise DeadlineError(text, "not a time of day or a duration")
    seconds = sum(
        int(amount) * _UNITS[unit] for amount, unit in zip(span.groups(), "dhms", strict=True) if amount
    )
    if seconds <= 0:
        raise DeadlineError(text, "a duration must be longer than 0 seconds")
    return Duration(seconds)


def resolve_deadline(deadline: Deadline, start: dt.datetime, tz: dt.tzinfo | None = None) -> dt.datetime:
    """The deadline's instant (timezone-aware) for a job first started at `start` (aware).

    A time of day means its next occurrence after `start` in `tz` (None: the machine's local time),
    so "06:30" set at 23:00 is tomorrow morning and at exactly 06:30 it is tomorrow's. This instant
    is what gets journaled; a restart uses the journaled one and never resolves the text again.
    """
    if start.tzinfo is None or start.utcoffset() is None:
        raise ValueError("resolve_deadline needs a timezone-aware start")
    if isinstance(deadline, Duration):
        return start + dt.timedelta(seconds=deadline.seconds)
    local = start.astimezone(tz)
    day = local.date()
    for _ in range(3):  # today, tomorrow, and the day after when a DST gap swallows tomorrow's time
        candidate = _local_instant(day, deadline.time, tz)
        if candidate > start:
            return candidate
        day += dt.timedelta(days=1)
    raise AssertionError("a time of day always recurs within three days")


def _local_instant(day: dt.date, time: dt.time, tz: dt.tzinfo | None) -> dt.datetime:
    naive = dt.datetime.combine(day, time)
    if tz is None:
        return naive.astimezone()  # the machine's local rules, DST included
    return naive.replace(tzinfo=tz)
