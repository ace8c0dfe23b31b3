"""Amounts in a ledger's unit as the operator reads them: two units, one formatter, five precisions.

A lane's ledger counts in the unit of its backend (docs/money.md): OpenRouter's in US dollars
(`DOLLARS`, "usd"), SGLang's in GPU-seconds (`GPU_SECONDS`, "gpu_s"). The unit travels as its string
on disk and on the wire (a row's `gpu_s` key, the snapshot's `unit`); this module is the one place
that string is named or compared. Each precision is said one way everywhere:

- ``"exact"``: ``$0.0042``, ``0.0012 GPU-h``: four decimals, what a bill is checked against. The
  headless money line and summary (engine/control/headless.py), the report's totals.
- ``"plain"``: ``$12.34``, ``1.23 GPU-h``: two decimals. Budgets and rates in the same lines.
- ``"cents"``: ``$12.34`` (``$1,234`` from $10,000), ``12.5 GPU-s`` while under a hundredth of a
  GPU-hour, ``1.23 GPU-h`` (``12,345 GPU-h`` from 10,000): the console's panes (console/format.py).
- ``"whole"``: ``$1,234``, ``12 GPU-h``: no fractions, where the cells are few.
- ``"short"``: at most seven cells, for the console's narrow columns: ``$12.34``, ``$1,234``,
  ``$123k``, ``$12.3M``; ``45s``, ``1.23h``, ``1,234h``, ``167kh``.

``-`` for an amount not known (None). A base module of pure arithmetic: the job, the console and the
report import it (pyproject.toml's contracts).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Final, Literal

__all__ = [
    "DOLLARS",
    "GPU_SECONDS",
    "UNITS",
    "Precision",
    "Unit",
    "amount",
    "is_unit",
    "per_hour",
    "unit_name",
]

Unit = Literal["usd", "gpu_s"]
DOLLARS: Final = "usd"
GPU_SECONDS: Final = "gpu_s"
UNITS: Final[tuple[Unit, ...]] = (DOLLARS, GPU_SECONDS)

Precision = Literal["exact", "plain", "cents", "whole", "short"]

_DASH = "-"
# What a chart's axis and a metric family's name call each unit, and the factor from the ledger's
# amount to it (GPU time is counted in seconds and read in hours).
_NAMES: Final[dict[Unit, tuple[str, str, float]]] = {
    DOLLARS: ("dollars", "dollars", 1.0),
    GPU_SECONDS: ("GPU-hours", "gpu_seconds", 1 / 3600),
}


def is_unit(text: object) -> bool:
    """Whether `text` names a unit (a snapshot's or a journal's string)."""
    return text in UNITS


def unit_name(unit: Unit, *, metric: bool = False) -> str:
    """The unit as a chart's axis names it ("dollars", "GPU-hours"), or as a Prometheus family's
    suffix does (``metric``: "dollars", "gpu_seconds", docs/metrics.md)."""
    axis, family, _ = _NAMES[unit]
    return family if metric else axis


def per_hour(unit: Unit) -> float:
    """The factor from the ledger's amount to what a chart plots: 1 for dollars, 1/3600 for GPU time."""
    return _NAMES[unit][2]


def amount(value: float | Decimal | None, unit: Unit, precision: Precision) -> str:
    """``value`` of ``unit`` at ``precision`` (this module's docstring says each one)."""
    if value is None:
        return _DASH
    value = float(value)
    if unit == DOLLARS:
        return _dollars(value, precision)
    return _gpu(value, precision)


def _dollars(value: float, precision: Precision) -> str:
    if precision == "exact":
        return f"${value:.4f}"
    if precision == "plain":
        return f"${value:.2f}"
    if precision == "whole":
        return f"${value:,.0f}"
    if precision == "short" and abs(value) >= 1_000_000:
        return f"${value / 1_000_000:,.1f}M"
    if precision == "short" and abs(value) >= 100_000:
        return f"${value / 1000:,.0f}k"
    if abs(value) >= (100 if precision == "short" else 10_000):
        return f"${value:,.0f}"
    return f"${value:,.2f}"


def _gpu(seconds: float, precision: Precision) -> str:
    hours = seconds / 3600
    if precision == "exact":
        return f"{hours:.4f} GPU-h"
    if precision == "plain":
        return f"{hours:.2f} GPU-h"
    if precision == "whole":
        return f"{hours:,.0f} GPU-h"
    if precision == "short":
        if abs(hours) < 0.01:
            return f"{seconds:.0f}s"
        if abs(hours) >= 100_000:
            return f"{hours / 1000:,.0f}kh"
        return f"{hours:.2f}h" if abs(hours) < 100 else f"{hours:,.0f}h"
    if abs(hours) < 0.01:
        return f"{seconds:,.1f} GPU-s"
    return f"{hours:,.2f} GPU-h" if abs(hours) < 10_000 else f"{hours:,.0f} GPU-h"
