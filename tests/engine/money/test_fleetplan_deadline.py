"""job.deadline: a time of day or a duration, one clear line for anything else, one instant for a restart."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from regen.engine.money.fleetplan import DeadlineError, Duration, TimeOfDay, parse_deadline, resolve_deadline

UTC = dt.UTC
PLUS2 = dt.timezone(dt.timedelta(hours=2))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("12h", 43_200),
        ("90m", 5_400),
        ("1h30m", 5_400),
        ("45s", 45),
        ("2d", 172_800),
        (" 12H ", 43_200),
        ("1d2h3m4s", 93_784),
        ("0h5m", 300),
    ],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_deadline(text) == Duration(seconds)


@pytest.mark.parametrize(
    ("text", "clock"),
    [
        ("06:30", dt.time(6, 30)),
        ("06:30:00", dt.time(6, 30)),
        ("6:05", dt.time(6, 5)),
        ("23:59:59", dt.time(23, 59, 59)),
        ("00:00", dt.time(0, 0)),
    ],
)
def test_times_of_day(text: str, clock: dt.time) -> None:
    assert parse_deadline(text) == TimeOfDay(clock)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "  ",
        "12",
        "12x",
        "h",
        "1h30",
        "25:00",
        "06:60",
        "06:30:61",
        "6:30pm",
        "12h 30m",
        "-1h",
        "0h",
        "0s",
        "1.5h",
        "30m1h",
        "06:3",
        "tomorrow",
    ],
)
def test_anything_else_is_one_line_naming_the_setting(text: str) -> None:
    with pytest.raises(DeadlineError) as caught:
        parse_deadline(text)
    message = str(caught.value)
    assert message.startswith(f"job.deadline = {text!r}: ")
    assert "\n" not in message and "12h" in message  # says what is expected
    assert isinstance(caught.value, ValueError)  # the settings layer's validators turn it into their message


def test_a_duration_counts_from_the_first_start() -> None:
    start = dt.datetime(2026, 12, 1, 14, 30, tzinfo=UTC)
    assert resolve_deadline(Duration(43_200), start) == dt.datetime(2026, 12, 2, 2, 30, tzinfo=UTC)


def test_a_time_of_day_is_its_next_occurrence_across_midnight() -> None:
    evening = dt.datetime(2026, 12, 1, 23, 0, tzinfo=PLUS2)
    morning = resolve_deadline(TimeOfDay(dt.time(6, 30)), evening, PLUS2)
    assert morning == dt.datetime(2026, 12, 2, 6, 30, tzinfo=PLUS2)
    early = dt.datetime(2026, 12, 1, 5, 0, tzinfo=PLUS2)
    assert resolve_deadline(TimeOfDay(dt.time(6, 30)), early, PLUS2) == dt.datetime(
        2026, 12, 1, 6, 30, tzinfo=PLUS2
    )
    exactly = dt.datetime(2026, 12, 1, 6, 30, tzinfo=PLUS2)  # now is not "by 06:30": tomorrow's
    assert resolve_deadline(TimeOfDay(dt.time(6, 30)), exactly, PLUS2) == dt.datetime(
        2026, 12, 2, 6, 30, tzinfo=PLUS2
    )


def test_the_time_of_day_is_read_in_the_given_zone_whatever_the_start_is_written_in() -> None:
    start = dt.datetime(2026, 12, 1, 22, 0, tzinfo=UTC)  # 00:00 on the 2nd at +02:00
    resolved = resolve_deadline(TimeOfDay(dt.time(1, 0)), start, PLUS2)
    assert resolved == dt.datetime(2026, 12, 2, 1, 0, tzinfo=PLUS2)
    assert resolved - start == dt.timedelta(hours=1)


def test_local_time_by_default() -> None:
    start = dt.datetime.now(UTC)
    resolved = resolve_deadline(TimeOfDay(dt.time(6, 30)), start)
    assert resolved.tzinfo is not None and resolved > start
    assert resolved.astimezone().time().replace(microsecond=0) == dt.time(6, 30)


def test_a_naive_start_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        resolve_deadline(Duration(60), dt.datetime(2026, 12, 1, 12, 0))


@given(
    st.integers(0, 23),
    st.integers(0, 59),
    st.integers(0, 59),
    st.datetimes(min_value=dt.datetime(2000, 1, 1), max_value=dt.datetime(2100, 1, 1)),
    st.integers(-12, 14),
)
def test_the_next_occurrence_is_within_a_day_and_on_the_clock(
    hour: int, minute: int, second: int, when: dt.datetime, offset: int
) -> None:
    zone = dt.timezone(dt.timedelta(hours=offset))
    start = when.replace(tzinfo=zone)
    clock = dt.time(hour, minute, second)
    resolved = resolve_deadline(parse_deadline(clock.isoformat()), start, zone)
    assert start < resolved <= start + dt.timedelta(days=1)
    assert resolved.astimezone(zone).time() == clock


def test_the_resolved_instant_does_not_move_when_resolved_again_later() -> None:
    """A restart reads the journaled instant; resolving the text again at the restart would move it."""
    first = dt.datetime(2026, 12, 1, 14, 0, tzinfo=UTC)
    journaled = resolve_deadline(parse_deadline("12h"), first)
    restart = first + dt.timedelta(hours=3)
    assert resolve_deadline(parse_deadline("12h"), restart) != journaled  # why the instant is journaled
    assert journaled - restart == dt.timedelta(hours=9)
