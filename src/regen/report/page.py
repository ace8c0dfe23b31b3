"""The report as one self-contained HTML file: the charts inline as SVG, the style inline, no
script or font or image from anywhere else, so it opens offline and pastes into a message as it is
(docs/report.md). The totals table is worded as the headless summary words money
(engine/control/headless.py `amount`)."""

from __future__ import annotations

import html
import time
from collections.abc import Mapping, Sequence

from regen.engine.durations import duration
from regen.engine.money.ledger import WASTE_CAUSES
from regen.engine.run.report_data import LaneTotals, Latency, ReportData
from regen.engine.units import DOLLARS, amount
from regen.report.charts import Chart

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1100px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
p.meta { color: #555; margin: 0.2em 0; }
.state { font-weight: 600; padding: 0.1em 0.5em; border-radius: 4px; background: #eee; }
.state.running { background: #dbeafe; } .state.finished { background: #dcfce7; }
.state.cut { background: #fee2e2; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.92em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f6f6f6; }
figure { margin: 0.8em 0 1.6em 0; }
figure svg { width: 100%; height: auto; }
figcaption { color: #555; font-size: 0.9em; }
"""

# Counts the charts the browser laid out (a chart with no size did not render), for whoever opens
# the page to check it: the report's own test loads it in headless Chromium (tests/integration/cli/test_report.py).
CHECK = """
(function () {
  var figures = document.querySelectorAll("figure svg"), drawn = 0;
  for (var i = 0; i < figures.length; i++) {
    var box = figures[i].getBoundingClientRect();
    if (box.width > 0 && box.height > 0) { drawn++; }
  }
  document.body.setAttribute("data-charts-drawn", String(drawn));
  console.info("regen report: " + drawn + " of " + figures.length + " charts drawn");
})();
"""


def _e(text: object) -> str:
    return html.escape(str(text))


def _when(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(ts))


def _table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    out = ["<table>", "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"]
    out += ["<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows]
    out.append("</table>")
    return "\n".join(out)


def _money(totals: LaneTotals, value: float) -> str:
    return amount(value, totals.unit, "exact")


def totals_rows(data: ReportData) -> list[tuple[str, list[str]]]:
    """The totals table, one row per figure and a column per backend (the summary's figures)."""
    lanes = list(data.lanes.values())
    all_rows = sum(t.rows for t in lanes)
    figures: list[tuple[str, list[str]]] = []

    def each(label: str, cell: object) -> None:
        figures.append((label, [str(cell(t)) if callable(cell) else str(cell) for t in lanes]))

    each("rows", lambda t: f"{t.rows} ({t.ok} ok, {t.truncated} truncated)")
    each("share of rows", lambda t: f"{t.rows / all_rows * 100:.1f}%" if all_rows else "-")
    each("output tokens", lambda t: t.output_tokens)
    each("attempts settled", lambda t: t.attempts)
    each("errors", lambda t: sum(t.errors.values()))
    each("attempts open (in flight, or cut by a crash)", lambda t: t.open_attempts)
    each("spent", lambda t: _money(t, float(t.spent)))
    each("  confirmed", lambda t: _money(t, float(t.confirmed)))
    each(
        "  pending (bills to look up)",
        lambda t: f"{_money(t, float(t.estimates.pending))} for {t.estimates.pending_count}",
    )
    each(
        "  unknowable (worst cases)",
        lambda t: f"{_money(t, float(t.estimates.unknowable))} for {t.estimates.unknowable_count}",
    )
    each("useful", lambda t: _money(t, float(t.breakdown.useful)))
    each(
        "useful per million output tokens",
        lambda t: (
            "-" if t.breakdown.useful_per_m is None else amount(t.breakdown.useful_per_m, t.unit, "plain")
        ),
    )
    for cause in WASTE_CAUSES:
        each(f"waste: {cause}", lambda t, c=cause: _money(t, float(t.breakdown.waste[c])))
    each("waste total", lambda t: _money(t, float(t.breakdown.waste_total)))
    return figures


def _latency_rows(data: ReportData) -> list[list[str]]:
    rows = []
    for (lane, route), lat in sorted(data.latency.items()):
        if not lat.count:
            continue
        cells = [f"{lane}: {route}", str(lat.count)]
        for histogram in (lat.e2e, lat.ttft):
            for q in (0.5, 0.95):
                value = Latency.quantile(histogram, q)
                cells.append("-" if value is None else f"{value:.2f} s")
        rows.append(cells)
    return rows


def render(data: ReportData, charts: Sequence[Chart], png_names: Mapping[str, str]) -> str:
    """The whole page; `png_names`: each chart's PNG file beside it, by the chart's name."""
    state_class = {"running": "running", "finished": "finished", "cut short": "cut"}.get(data.state, "")
    span = None if data.first_ts is None or data.last_ts is None else data.last_ts - data.first_ts
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>regen report: {_e(data.run_dir.name)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>regen report: {_e(data.run_dir)}</h1>",
        f'<p class="meta"><span class="state {state_class}">{_e(data.state)}</span> {_e(data.state_detail)}</p>',
        f'<p class="meta">from {_e(_when(data.first_ts))} to {_e(_when(data.last_ts))}'
        f" ({_e(duration(span, 'clock'))}); {len(data.starts)} start(s) of the job; written {_e(_when(data.generated_at))}</p>",
    ]
    if data.deadline is not None:
        parts.append(
            f'<p class="meta">deadline {_e(_when(data.deadline))} (set {_e(_when(data.deadline_set_at))})</p>'
        )
    if data.budget and data.budget[-1][1] is not None:
        parts.append(f'<p class="meta">budget {_e(amount(float(data.budget[-1][1]), DOLLARS, "plain"))}</p>')
    parts.append("<h2>Totals</h2>")
    parts.append(_table(["", *data.lanes], [[label, *cells] for label, cells in totals_rows(data)]))
    spans = [s for s in data.spans if s.kind in ("outage", "hold")]
    if spans:
        parts.append("<h2>Outages and holds</h2>")
        parts.append(
            _table(
                ["kind", "backend", "from", "lasted", "why"],
                [
                    [s.kind, s.lane or "-", _when(s.start), duration(s.end - s.start, "clock"), s.reason]
                    for s in spans
                ],
            )
        )
    for chart in charts:
        parts.append(f'<h2 id="{_e(chart.name)}">{_e(chart.title)}</h2>')
        png = png_names.get(chart.name, "")
        parts.append(
            f"<figure>{chart.svg}<figcaption>{_e(chart.caption)} ({_e(png)} beside this file)</figcaption></figure>"
        )
        if chart.name == "latency":
            parts.append(
                _table(["route", "rows", "e2e p50", "e2e p95", "TTFT p50", "TTFT p95"], _latency_rows(data))
            )
    parts.append(f"<script>{CHECK}</script>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
