"""Spans of time at each precision (engine/durations.py): the status line's clock, the plan's fine
spans, the console's coarse ones, at the boundaries where a unit appears or a rounding turns."""

from __future__ import annotations

import math

import pytest

from regen.engine.durations import Precision, duration

DAY = 86_400.0
# Seconds, then what the clock, the fine and the coarse precision say of them.
BOUNDARIES: list[tuple[float, str, str, str]] = [
    (0, "00:00:00", "0s", "0s"),
    (59, "00:00:59", "59s", "59s"),
    (60, "00:01:00", "1m00s", "1m"),
    (61, "00:01:01", "1m01s", "1m"),
    (3599, "00:59:59", "59m59s", "59m"),
    (3600, "01:00:00", "1h00m", "1h"),
    (3601, "01:00:01", "1h01m", "1h"),
    (3 * 3600 + 10 * 60, "03:10:00", "3h10m", "3h10m"),
    (DAY, "24:00:00", "24h00m", "24h"),
    (100 * 3600 + 5, "100:00:05", "100h01m", "100h"),
]


@pytest.mark.parametrize(("seconds", "clock", "fine", "coarse"), BOUNDARIES)
def test_each_precision_says_a_whole_number_of_seconds_its_own_way(
    seconds: float, clock: str, fine: str, coarse: str
) -> None:
    assert (duration(seconds, "clock"), duration(seconds, "fine"), duration(seconds, "coarse")) == (
        clock,
        fine,
        coarse,
    )


def test_the_clock_cuts_to_the_second_that_has_passed() -> None:
    assert [duration(s, "clock") for s in (0.999, 59.999, 3599.999, DAY - 0.001)] == [
        "00:00:00",
        "00:00:59",
        "00:59:59",
        "23:59:59",
    ]


def test_the_fine_span_rounds_up_so_an_earliest_deadline_is_never_shown_earlier() -> None:
    # Up to the second under an hour, up to the minute from one.
    assert [duration(s, "fine") for s in (0.001, 59.001, 3599.001, 3600.001, 3660.001, DAY - 1)] == [
        "1s",
        "1m00s",
        "1h00m",
        "1h01m",
        "1h02m",
        "24h00m",
    ]


def test_the_coarse_span_rounds_to_the_nearest_second_then_drops_what_it_does_not_show() -> None:
    # An exact half goes to even, as Python's round does; the minutes are whole minutes of that.
    assert [duration(s, "coarse") for s in (0.5, 1.5, 59.4, 59.5, 119.6, 3599.4, 3599.5)] == [
        "0s",
        "2s",
        "59s",
        "1m",
        "2m",
        "59m",
        "1h",
    ]


def test_a_negative_span_is_zero_when_fine_unknown_when_coarse_and_signed_on_the_clock() -> None:
    assert duration(-1, "fine") == "0s"
    assert duration(-1, "coarse") == "-"
    assert duration(-5, "clock") == "-00:00:05"
    assert duration(-(3600 + 61), "clock") == "-01:01:01"
    # Less than a second either side of zero is no second at all.
    assert duration(-0.5, "clock") == "00:00:00"
    assert duration(-0.5, "fine") == "0s"


@pytest.mark.parametrize(
    ("precision", "unknown", "endless"),
    [
        ("clock", "--:--:--", "--:--:--"),
        ("fine", "-", "forever"),
        ("coarse", "-", "-"),
    ],
)
def test_an_unknown_or_endless_span_has_its_own_word(
    precision: Precision, unknown: str, endless: str
) -> None:
    assert duration(None, precision) == unknown
    assert duration(math.inf, precision) == endless
    assert duration(math.nan, precision) == endless
