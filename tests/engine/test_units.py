"""Amounts as the operator reads them (engine/units.py): each precision said one way, for both units."""

from __future__ import annotations

from decimal import Decimal

import pytest

from regen.engine.units import (
    DOLLARS,
    GPU_SECONDS,
    UNITS,
    Precision,
    Unit,
    amount,
    is_unit,
    per_hour,
    unit_name,
)

HOUR = 3600.0


@pytest.mark.parametrize(
    ("value", "unit", "precision", "said"),
    [
        # exact: what a bill is checked against (the headless money line, the report's totals)
        (0.0042, DOLLARS, "exact", "$0.0042"),
        (Decimal("1234.5"), DOLLARS, "exact", "$1234.5000"),
        (4.32, GPU_SECONDS, "exact", "0.0012 GPU-h"),
        # plain: budgets and rates in the same lines
        (12.345, DOLLARS, "plain", "$12.35"),
        (1.23 * HOUR, GPU_SECONDS, "plain", "1.23 GPU-h"),
        # cents: the console's panes
        (12.345, DOLLARS, "cents", "$12.35"),
        (1234.5, DOLLARS, "cents", "$1,234.50"),
        (12_345, DOLLARS, "cents", "$12,345"),
        (12.0, GPU_SECONDS, "cents", "12.0 GPU-s"),  # tiny amounts stay readable
        (2 * HOUR, GPU_SECONDS, "cents", "2.00 GPU-h"),
        (12_345 * HOUR, GPU_SECONDS, "cents", "12,345 GPU-h"),
        # whole: where the cells are few
        (1234.5, DOLLARS, "whole", "$1,234"),
        (12.4 * HOUR, GPU_SECONDS, "whole", "12 GPU-h"),
        # short: at most seven cells
        (5.5, DOLLARS, "short", "$5.50"),
        (123.4, DOLLARS, "short", "$123"),
        (1234, DOLLARS, "short", "$1,234"),
        (123_456, DOLLARS, "short", "$123k"),
        (12_345_678, DOLLARS, "short", "$12.3M"),
        (166_667 * HOUR, GPU_SECONDS, "short", "167kh"),
        (5, GPU_SECONDS, "short", "5s"),
        (9000, GPU_SECONDS, "short", "2.50h"),
        (1234 * HOUR, GPU_SECONDS, "short", "1,234h"),
    ],
)
def test_an_amount_is_said_one_way_at_each_precision(
    value: float, unit: Unit, precision: Precision, said: str
) -> None:
    assert amount(value, unit, precision) == said


@pytest.mark.parametrize("unit", UNITS)
@pytest.mark.parametrize("precision", ["exact", "plain", "cents", "whole", "short"])
def test_an_amount_not_known_is_a_dash(unit: Unit, precision: Precision) -> None:
    assert amount(None, unit, precision) == "-"


def test_short_amounts_fit_seven_cells() -> None:
    for unit in UNITS:
        for value in (0, 0.004, 5.5, 99.99, 123.4, 9_999, 99_999, 123_456, 9_999_999):
            scaled = value if unit == DOLLARS else value * 60
            assert len(amount(scaled, unit, "short")) <= 7, (unit, value)


def test_the_units_by_name_axis_and_family() -> None:
    assert [unit_name(u) for u in UNITS] == ["dollars", "GPU-hours"]
    assert [unit_name(u, metric=True) for u in UNITS] == ["dollars", "gpu_seconds"]
    assert per_hour(DOLLARS) == 1.0 and per_hour(GPU_SECONDS) == 1 / HOUR
    assert is_unit("usd") and is_unit("gpu_s") and not is_unit("eur") and not is_unit(None)
