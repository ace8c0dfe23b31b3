"""The report's charts, drawn with matplotlib (its Agg canvas, never pyplot: no display, no global
figures) from engine/run/report_data.py's
`ReportData`: each one an SVG for the page and a PNG beside it (docs/report.md).

matplotlib is imported here only, and this module only by `regen report`, so every other command
starts without it.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import matplotlib
import matplotlib.dates as mdates
import matplotlib.ticker as mticker
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from regen.engine.money.ledger import WASTE_CAUSES
from regen.engine.run.report_data import ATTEMPTS, ROWS, SPENT, TOKENS, Latency, ReportData
from regen.engine.units import DOLLARS, UNITS, Unit, per_hour, unit_name

# Text as text in the SVG (the page's fonts), not as paths: smaller, and searchable.
matplotlib.rcParams["svg.fonttype"] = "none"
matplotlib.rcParams["svg.hashsalt"] = "regen-report"  # the same data gives the same file
# The most points a line is drawn with: the bins are summed into groups above that. Errors are
# rarer than rows, so their bins are wider (fewer), or each would hold a count of 0 or 1.
MAX_POINTS = 400
ERROR_POINTS = 120
LANE_COLOURS = {"openrouter": "#3b7dd8", "sglang": "#2ca25f"}
OTHER_COLOURS = ("#8e6bbf", "#e6862e", "#c94a5a", "#6b8e23")
SPAN_COLOURS = {"outage": "#d62728", "hold": "#ff9f1c", "pause": "#9e9e9e"}
WIDTH, HEIGHT = 10.0, 3.6


@dataclass(frozen=True, slots=True)
class Chart:
    """One chart: its file name (no suffix), title, caption, SVG text and PNG bytes."""

    name: str
    title: str
    caption: str
    svg: str
    png: bytes


def lane_colour(name: str, index: int) -> str:
    return LANE_COLOURS.get(name, OTHER_COLOURS[index % len(OTHER_COLOURS)])


def draw(data: ReportData) -> list[Chart]:
    """Every chart the data has something for, in the page's order."""
    charts: list[Chart] = []
    makers: Sequence[Callable[[ReportData], Chart | None]] = (
        _throughput,
        _rows,
        _spend,
        _latency,
        _errors,
        _waste,
    )
    for make in makers:
        chart = make(data)
        if chart is not None:
            charts.append(chart)
    return charts


# -- helpers -----------------------------------------------------------------------------------


# Epoch seconds as matplotlib's dates (days since its epoch, 1970-01-01 UTC by default), shown in
# the local time zone as the rest of regen shows instants.
DAY_S = 86400.0
LOCAL = datetime.now().astimezone().tzinfo


def _day(ts: float) -> float:
    return ts / DAY_S


def _when(ts: Sequence[float]) -> list[float]:
    return [t / DAY_S for t in ts]


def _grouped(
    starts: list[float], values: list[float], width: float, points: int = MAX_POINTS
) -> tuple[list[float], list[float], float]:
    """The bins summed in groups so that at most `points` remain: (starts, sums, group width)."""
    if len(starts) <= points:
        return starts, values, width
    k = math.ceil(len(starts) / points)
    return (
        starts[::k],
        [math.fsum(values[i : i + k]) for i in range(0, len(values), k)],
        width * k,
    )


def _cumulative(starts: list[float], values: list[float], width: float) -> tuple[list[float], list[float]]:
    """The running total at each bin's end (from 0 at the first bin's start), as matplotlib dates."""
    if not starts:
        return [], []
    total, out = 0.0, [0.0]
    for value in values:
        total += value
        out.append(total)
    return _when([starts[0], *(start + width for start in starts)]), out


def _time_axis(ax: Axes) -> None:
    ax.xaxis_date(LOCAL)
    locator = mdates.AutoDateLocator(minticks=3, maxticks=8, tz=LOCAL)  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=LOCAL))  # type: ignore[no-untyped-call]
    ax.grid(True, alpha=0.25)


def _marks(ax: Axes, data: ReportData, *, legend: bool = True) -> None:
    """Outages, holds and pauses shaded; each start of the job after the first and the deadline
    as vertical lines."""
    shown: set[str] = set()
    for span in data.spans:
        label = None if span.kind in shown else f"{span.kind}s"
        shown.add(span.kind)
        ax.axvspan(
            _day(span.start),
            _day(max(span.end, span.start + 0.5)),
            color=SPAN_COLOURS.get(span.kind, "#bbbbbb"),
            alpha=0.18,
            lw=0,
            label=label,
        )
    for i, ts in enumerate(data.starts[1:]):
        ax.axvline(_day(ts), color="#555555", ls=":", lw=1, label="restarts" if i == 0 else None)
    if data.deadline is not None and data.first_ts is not None and data.last_ts is not None:
        # Only when the deadline is near enough to the run to be worth the axis it stretches.
        stretch = max(data.last_ts - data.first_ts, 60.0)
        if data.deadline <= data.last_ts + stretch:
            ax.axvline(_day(data.deadline), color="#d62728", ls="--", lw=1.2, label="deadline")
    if legend:
        _legend(ax)


def _legend(ax: Axes, columns: int = 1) -> None:
    """Beside the plot, never over its lines."""
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, ncols=columns, frameon=False)


def _new(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _figure(rows: int = 1) -> tuple[Figure, list[Axes]]:
    fig = _new(WIDTH, HEIGHT * rows)
    axes = fig.subplots(rows, 1, squeeze=False)
    return fig, [row[0] for row in axes]


def _chart(fig: Figure, name: str, title: str, caption: str) -> Chart:
    svg, png = io.StringIO(), io.BytesIO()
    fig.savefig(svg, format="svg", metadata={"Date": None})
    fig.savefig(png, format="png", dpi=110)
    text = svg.getvalue()
    # The page holds the SVG inline: the XML prolog and doctype belong to a file, not to HTML.
    start = text.find("<svg")
    return Chart(name, title, caption, text[start:], png.getvalue())


def _lane_series(data: ReportData, lane: str, what: int) -> tuple[list[float], list[float], float]:
    starts, values = data.bins.series(data.column(lane, what))
    return _grouped(starts, values, data.bins.width_s)


# -- the charts --------------------------------------------------------------------------------


def _throughput(data: ReportData) -> Chart | None:
    if not data.bins.bins:
        return None
    fig, (tokens, rows) = _figure(2)
    for i, lane in enumerate(data.lane_order):
        colour = lane_colour(lane, i)
        starts, values, width = _lane_series(data, lane, TOKENS)
        tokens.plot(
            _when(starts), [v / width for v in values], color=colour, lw=1.2, label=f"{lane} tokens/s"
        )
        starts, values, width = _lane_series(data, lane, ROWS)
        rows.plot(_when(starts), [v / width for v in values], color=colour, lw=1.2, label=f"{lane} rows/s")
        starts, values, width = _lane_series(data, lane, ATTEMPTS)
        rows.plot(
            _when(starts),
            [v / width for v in values],
            color=colour,
            lw=0.8,
            ls="--",
            label=f"{lane} attempts/s",
        )
    tokens.set_ylabel("output tokens / s")
    rows.set_ylabel("per second")
    for ax in (tokens, rows):
        _time_axis(ax)
        ax.set_ylim(bottom=0)
    _marks(tokens, data)
    _marks(rows, data)
    return _chart(
        fig,
        "throughput",
        "Throughput",
        "Output tokens, rows and attempts per second, per backend; outages, holds and pauses shaded.",
    )


def _rows(data: ReportData) -> Chart | None:
    if not data.bins.bins:
        return None
    fig, (ax,) = _figure()
    stack: list[list[float]] = []
    labels, colours = [], []
    when: list[float] = []
    for i, lane in enumerate(data.lane_order):
        starts, values = data.bins.series(data.column(lane, ROWS))
        when, running = _cumulative(starts, values, data.bins.width_s)
        stack.append(running)
        totals = data.lanes.get(lane)
        labels.append(f"{lane} ({totals.rows if totals else int(sum(values))} rows)")
        colours.append(lane_colour(lane, i))
    ax.stackplot(when, *stack, labels=labels, colors=colours, alpha=0.75)
    ax.set_ylabel("rows written")
    _time_axis(ax)
    _marks(ax, data)
    return _chart(
        fig,
        "rows",
        "Rows over time: the fleets' split",
        "Rows written so far, stacked by backend (GPUs and OpenRouter); the deadline as a dashed line.",
    )


def _spend(data: ReportData) -> Chart | None:
    units: dict[str, Unit] = {}
    for lane in data.lane_order:
        totals = data.lanes.get(lane)
        units[lane] = totals.unit if totals is not None else DOLLARS
    by_unit = sorted(set(units.values()), key=UNITS.index)
    if not data.bins.bins or not by_unit:
        return None
    fig, axes = _figure(len(by_unit))
    for ax, unit in zip(axes, by_unit, strict=True):
        scale = per_hour(unit)
        for i, lane in enumerate(data.lane_order):
            if units[lane] != unit:
                continue
            starts, values = data.bins.series(data.column(lane, SPENT))
            when, running = _cumulative(starts, values, data.bins.width_s)
            ax.plot(
                when,
                [v * scale for v in running],
                color=lane_colour(lane, i),
                lw=1.5,
                label=f"{lane} spent",
            )
        if unit == DOLLARS and data.budget:
            _budget_line(ax, data)
        ax.set_ylabel(unit_name(unit))
        ax.set_ylim(bottom=0)
        _time_axis(ax)
        _marks(ax, data)
    return _chart(
        fig,
        "spend",
        "Spend against the budget",
        "What each backend spent so far, in its ledger's unit (dollars; GPU-hours), and the dollar budget.",
    )


def _budget_line(ax: Axes, data: ReportData) -> None:
    end = max(data.last_ts or data.generated_at, data.budget[-1][0])
    xs: list[float] = []
    ys: list[float] = []
    for i, (ts, amount) in enumerate(data.budget):
        until = data.budget[i + 1][0] if i + 1 < len(data.budget) else end
        if amount is None:
            continue
        xs += [_day(ts), _day(until)]
        ys += [float(amount), float(amount)]
    if xs:
        ax.plot(xs, ys, color="#d62728", lw=1.2, ls="-.", label="budget")


def _latency(data: ReportData) -> Chart | None:
    routes = [(key, lat) for key, lat in sorted(data.latency.items()) if lat.count]
    if not routes:
        return None
    fig = _new(WIDTH, max(2.4, 0.45 * len(routes) + 1.4))
    axes = fig.subplots(1, 2, sharey=True)
    names = [f"{lane}: {route}" for (lane, route), _ in routes]
    for ax, which, title in ((axes[0], "e2e", "end to end"), (axes[1], "ttft", "time to first token")):
        stats: list[dict[str, Any]] = []
        for name, (_, lat) in zip(names, routes, strict=True):
            histogram = lat.e2e if which == "e2e" else lat.ttft
            q = [Latency.quantile(histogram, p) for p in (0.05, 0.25, 0.5, 0.75, 0.95)]
            if q[2] is None:
                stats.append(
                    {
                        "label": name,
                        "whislo": math.nan,
                        "q1": math.nan,
                        "med": math.nan,
                        "q3": math.nan,
                        "whishi": math.nan,
                        "fliers": [],
                    }
                )
                continue
            lo, q1, med, q3, hi = (v or 0.0 for v in q)
            stats.append(
                {"label": name, "whislo": lo, "q1": q1, "med": med, "q3": q3, "whishi": hi, "fliers": []}
            )
        ax.bxp(
            stats,
            orientation="horizontal",
            showfliers=False,
            patch_artist=True,
            boxprops={"facecolor": "#cfe0f5"},
        )
        ax.set_xscale("log")
        # Seconds as numbers (0.5, 2, 10), not powers of ten; no labels on the minor ticks.
        ax.xaxis.set_major_locator(mticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(mticker.FuncFormatter(lambda value, _: f"{value:g}"))
        ax.xaxis.set_minor_formatter(mticker.NullFormatter())
        ax.set_xlabel(f"{title}, seconds (p5, p25, p50, p75, p95)")
        ax.grid(True, axis="x", alpha=0.25)
    return _chart(
        fig,
        "latency",
        "Latency by route",
        "Each route's rows: end-to-end time and time to the first token, p5 to p95 (read from log-spaced histograms, within about 6%).",
    )


def _errors(data: ReportData) -> Chart | None:
    if not data.error_columns:
        return None
    fig, (ax,) = _figure()
    bins = data.error_bins
    stack, labels = [], []
    when: list[float] = []
    width = bins.width_s
    for column, (lane, error) in sorted(enumerate(data.error_columns), key=lambda c: c[1]):
        starts, values = bins.series(column)
        starts, values, width = _grouped(starts, values, bins.width_s, ERROR_POINTS)
        when = _when(starts)
        stack.append([v / width * 60 for v in values])
        labels.append(f"{error}" if len(data.lane_order) == 1 else f"{lane}: {error}")
    palette = matplotlib.colormaps["tab20"]
    colours = [palette(i % 20) for i in range(len(stack))]
    ax.stackplot(when, *stack, labels=labels, colors=colours, step="post", alpha=0.85)
    ax.set_ylabel("errors / minute")
    _time_axis(ax)
    _marks(ax, data, legend=False)
    _legend(ax, columns=1 if len(labels) <= 12 else 2)
    return _chart(
        fig,
        "errors",
        "Errors by class",
        f"Failed attempts per minute by error class (bins of {width:g} s); outages, holds and pauses shaded.",
    )


def _waste(data: ReportData) -> Chart | None:
    lanes = [t for t in data.lanes.values() if t.attempts or t.spent]
    if not lanes:
        return None
    fig = _new(WIDTH, 3.0)
    axes = fig.subplots(1, len(lanes), squeeze=False)
    for ax, totals in zip(axes[0], lanes, strict=True):
        scale = per_hour(totals.unit)
        names = ["useful", *WASTE_CAUSES]
        values = [float(totals.breakdown.useful) * scale] + [
            float(totals.breakdown.waste[c]) * scale for c in WASTE_CAUSES
        ]
        colours = ["#2ca25f"] + ["#d62728"] * len(WASTE_CAUSES)
        ax.barh(names, values, color=colours)
        ax.invert_yaxis()
        ax.set_title(f"{totals.name} ({unit_name(totals.unit)})", fontsize=10)
        ax.grid(True, axis="x", alpha=0.25)
    return _chart(
        fig,
        "waste",
        "Useful spend and waste by cause",
        "Each backend's money: rows kept (useful) against what retries, truncated rows, the guard's quarantine, crashes and cancels cost.",
    )
