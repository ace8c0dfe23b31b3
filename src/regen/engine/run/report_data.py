"""What `regen report` shows, read from a run folder's journals alone (docs/report.md).

One streamed pass over attempts.jsonl and events.jsonl (engine/run/recovery.py `read_lanes`, read
only: the job may be appending now, and a torn last line is passed over): each lane's money as
recovery rebuilds it at a start, so the totals are the summary's by the same rules (the ledger's
`SpendBreakdown` and `Estimates`, engine/money/ledger.py), and beside it the records binned by time
(the bins widen as the run gets longer, so memory stays bounded however long it ran), the routes'
latency histograms, and the spans of holds, outages and pauses from the events.

Nothing here draws: the command line renders this (src/regen/cli/report.py).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from regen.engine.data.jsonl import iter_jsonl
from regen.engine.money.ledger import Estimates, SpendBreakdown, spend_cause
from regen.engine.run.events import EVENTS_FILE
from regen.engine.run.records import (
    EndRecord,
    Handler,
    Raw,
    ReconciledRecord,
    StartRecord,
    on,
    read_end,
    read_reconciled,
    read_start,
)
from regen.engine.run.recovery import JournalState, ledger_unit, read_lanes
from regen.engine.run.results import ATTEMPTS_FILE
from regen.engine.run.runlock import holder
from regen.engine.units import Unit

__all__ = ["ROW_OUTCOMES", "Bins", "LaneTotals", "Latency", "ReportData", "Span", "read_report"]

# An end record's outcome that is a row (the row and its end record are committed together:
# engine/run/results.py); every other outcome is an attempt that made none.
ROW_OUTCOMES = frozenset({"ok", "truncated"})
# The finest time bin, and the most bins a series keeps: past that the bins double in width, so an
# hour is binned by the second and a week by a few minutes, in the same memory.
FINEST_BIN_S = 1.0
MAX_BINS = 1500
# Latency histograms: log-spaced bins from 1 ms to about 3 hours, 20 a decade (about 12% wide, so
# a percentile read from them is within 6% of the exact one).
LATENCY_FLOOR_S = 0.001
LATENCY_PER_DECADE = 20
LATENCY_BINS = 7 * LATENCY_PER_DECADE
# Per lane and bin: rows, output tokens of rows, attempts settled, amount spent (in its unit).
ROWS, TOKENS, ATTEMPTS, SPENT = range(4)
FIELDS = 4


def is_error(outcome: str) -> bool:
    """An attempt that failed: the outcomes the ledger counts as the waste of retries, which are
    the failures' classes (engine/money/ledger.py `spend_cause`)."""
    return spend_cause(outcome) == "retries"


class Bins:
    """Amounts summed into time bins of one width, which doubles whenever the bins would span more
    than MAX_BINS: bounded memory for a run of any length, in one pass."""

    def __init__(self, width: int) -> None:
        self.width_s = FINEST_BIN_S
        self.columns = width  # values per bin
        self.origin: float | None = None  # the first instant seen, the bins' zero
        self.bins: dict[int, list[float]] = {}
        self.low = 0
        self.high = 0
        self._since, self._until, self._last = math.inf, -math.inf, [0.0]  # the last bin `row` gave

    def index(self, ts: float) -> int:
        origin = self.origin
        if origin is None:
            self.origin = origin = ts
            self.low = self.high = 0
        at = math.floor((ts - origin) / self.width_s)
        if at < self.low or at > self.high:
            self.low, self.high = min(self.low, at), max(self.high, at)
            while self.high - self.low >= MAX_BINS:
                self._widen()
                at //= 2
        return at

    def row(self, ts: float) -> list[float]:
        """The bin of instant `ts`: a value per column, to add to."""
        # The journal's instants mostly follow one another: the last bin asked for is usually the one.
        if self._since <= ts < self._until:
            return self._last
        at = self.index(ts)
        row = self.bins.get(at)
        if row is None:
            row = self.bins[at] = [0.0] * self.columns
        elif len(row) < self.columns:
            row.extend([0.0] * (self.columns - len(row)))
        assert self.origin is not None
        self._since = self.origin + at * self.width_s
        self._until = self._since + self.width_s
        self._last = row
        return row

    def add(self, ts: float, column: int, amount: float) -> None:
        self.row(ts)[column] += amount

    def grow(self, columns: int) -> None:
        self.columns = max(self.columns, columns)
        self._since, self._until = math.inf, -math.inf  # its bin is short of the new columns

    def _widen(self) -> None:
        merged: dict[int, list[float]] = {}
        for at, row in self.bins.items():
            into = merged.get(at // 2)
            if into is None:
                merged[at // 2] = row
                continue
            if len(into) < len(row):
                into.extend([0.0] * (len(row) - len(into)))
            for i, value in enumerate(row):
                into[i] += value
        self.bins = merged
        self._since, self._until = math.inf, -math.inf
        self.width_s *= 2
        self.low //= 2
        self.high //= 2

    def series(self, column: int) -> tuple[list[float], list[float]]:
        """(bin starts as epoch seconds, the column's amount per bin), every bin from the first to
        the last, empty ones as 0."""
        if self.origin is None or not self.bins:
            return [], []
        starts, values = [], []
        for at in range(self.low, self.high + 1):
            row = self.bins.get(at)
            starts.append(self.origin + at * self.width_s)
            values.append(row[column] if row is not None and column < len(row) else 0.0)
        return starts, values


_LOG_FLOOR = math.log10(LATENCY_FLOOR_S)


def _latency_bin(seconds: float, log10: Any = math.log10) -> int:
    """The histogram bin of a time in seconds (per journal line: kept to one log and a compare)."""
    if seconds <= LATENCY_FLOOR_S:
        return 0
    at = int((log10(seconds) - _LOG_FLOOR) * LATENCY_PER_DECADE)
    return at if at < LATENCY_BINS else LATENCY_BINS - 1


@dataclass(slots=True)
class Latency:
    """One route's end-to-end and first-token times of its rows, as log-spaced histograms."""

    e2e: list[int] = field(default_factory=lambda: [0] * LATENCY_BINS)
    ttft: list[int] = field(default_factory=lambda: [0] * LATENCY_BINS)
    count: int = 0

    @staticmethod
    def bin(seconds: float) -> int:
        return _latency_bin(seconds)

    @staticmethod
    def edge(index: float) -> float:
        """The lower edge of bin `index` (a fraction: that far into it), in seconds."""
        return LATENCY_FLOOR_S * 10 ** (index / LATENCY_PER_DECADE)

    @staticmethod
    def quantile(histogram: list[int], q: float) -> float | None:
        """The `q` quantile (0..1) read from a histogram (the geometric middle of its bin)."""
        total = sum(histogram)
        if not total:
            return None
        goal = q * total
        seen = 0
        for index, count in enumerate(histogram):
            seen += count
            if seen >= goal and count:
                return Latency.edge(index + 0.5)
        return Latency.edge(LATENCY_BINS - 0.5)


@dataclass(frozen=True, slots=True)
class Span:
    """An interval the report shades: a hold, an outage or a pause of one lane."""

    kind: str  # "hold" | "outage" | "pause"
    lane: str | None  # the lane (None: the job's only one)
    start: float  # epoch seconds
    end: float
    reason: str


@dataclass(slots=True)
class LaneTotals:
    """One lane's totals over the whole run: its money as recovery rebuilds it (the ledger's
    rules), its rows, tokens, attempts and errors counted from its end records."""

    name: str
    unit: Unit
    spent: Decimal
    estimates: Estimates
    breakdown: SpendBreakdown
    rows: int = 0
    ok: int = 0
    truncated: int = 0
    output_tokens: int = 0
    attempts: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    open_attempts: int = 0  # started, not ended: in flight now, or cut by a crash

    @property
    def confirmed(self) -> Decimal:
        return self.spent - self.estimates.total


@dataclass(slots=True)
class ReportData:
    """Everything the report shows, for one run folder, as of `generated_at`."""

    run_dir: Path
    generated_at: float
    state: str  # "running" | "finished" | "cut short" | "not started"
    state_detail: str
    first_ts: float | None
    last_ts: float | None
    lanes: dict[str, LaneTotals]
    bins: Bins  # per lane index (lane_order) FIELDS columns
    lane_order: list[str]
    error_bins: Bins  # one column per (lane, error class): error_columns
    error_columns: list[tuple[str, str]]
    latency: dict[tuple[str, str], Latency]  # (lane, route) -> histograms
    spans: list[Span]
    starts: list[float]  # every start of a job on this folder
    budget: list[tuple[float, Decimal | None]]  # the dollar budget from each instant on
    deadline: float | None  # the last deadline set, epoch seconds
    deadline_set_at: float | None
    end_reason: str | None
    end_message: str | None

    def column(self, lane: str, what: int) -> int:
        return self.lane_order.index(lane) * FIELDS + what


class _Binner:
    """The attempt journal's records into per-lane bins and latency histograms (one pass, beside
    recovery's own replay of the same records). Runs once per journal line: kept lean."""

    def __init__(self, lanes: list[str], default: str, totals: dict[str, LaneTotals]) -> None:
        self.default = default
        self.order = list(lanes)
        self.totals = totals
        self.bins = Bins(FIELDS * len(lanes))
        self.errors = Bins(0)
        self.error_columns: dict[tuple[str, str], int] = {}
        self.latency: dict[tuple[str, str], Latency] = {}
        self.base = {lane: i * FIELDS for i, lane in enumerate(lanes)}  # lane -> its first column
        # rid -> backend, of attempts in flight whose start named one: the end records of journals
        # written before ends named their backend belong to their start's (docs/architecture.md).
        self.owner: dict[str, str] = {}
        self.first: float | None = None
        self.last: float | None = None

    def handlers(self) -> dict[str, Handler]:
        return {
            "start": on(read_start, self.start),
            "end": on(read_end, self.end),
            "reconciled": on(read_reconciled, self.reconciled),
        }

    def _base(self, lane: str) -> int:
        base = self.base.get(lane)
        if base is None:  # a backend no start event named (the settings' default changed since)
            self.order.append(lane)
            base = self.base[lane] = (len(self.order) - 1) * FIELDS
            self.bins.grow(FIELDS * len(self.order))
        return base

    def _seen(self, ts: float) -> None:
        if self.first is None or ts < self.first:
            self.first = ts
        if self.last is None or ts > self.last:
            self.last = ts

    def start(self, rec: StartRecord) -> None:
        be = rec.get("be")
        if be is not None:
            self.owner[rec["rid"]] = be
        if self.first is None:
            ts = rec.get("ts")
            if isinstance(ts, int | float):
                self.first = float(ts)

    def end(self, rec: EndRecord) -> None:
        owned = self.owner.pop(rec["rid"], None)
        lane = rec.get("be") or owned or self.default
        outcome = rec.get("outcome") or "None"
        row = outcome in ROW_OUTCOMES
        error = not row and is_error(outcome)
        tokens = rec.get("ctok") or 0
        if type(tokens) is not int:  # older journals hold the API's value as it came
            tokens = 0
        totals = self.totals.get(lane)
        if totals is not None:
            totals.attempts += 1
            if row:
                totals.rows += 1
                totals.output_tokens += tokens
                if outcome == "truncated":
                    totals.truncated += 1
                else:
                    totals.ok += 1
            elif error:
                totals.errors[outcome] += 1
        ts = rec.get("ts")
        if not isinstance(ts, int | float):
            return
        if self.last is None or ts > self.last:
            self.last = ts
        base = self._base(lane)
        bin_ = self.bins.row(ts)
        bin_[base + ATTEMPTS] += 1
        cost = rec.get("cost")
        if cost is not None:
            bin_[base + SPENT] += float(cost)
        if row:
            bin_[base + ROWS] += 1
            bin_[base + TOKENS] += tokens
            route = rec.get("provider") or "(unnamed)"
            latency = self.latency.get((lane, route))
            if latency is None:
                latency = self.latency[(lane, route)] = Latency()
            e2e, ttft = rec.get("e2e"), rec.get("ttft")
            if type(e2e) is float or type(e2e) is int:
                latency.e2e[_latency_bin(e2e)] += 1
                latency.count += 1
            if type(ttft) is float or type(ttft) is int:
                latency.ttft[_latency_bin(ttft)] += 1
        elif error:
            key = (lane, outcome)
            column = self.error_columns.get(key)
            if column is None:
                column = self.error_columns[key] = len(self.error_columns)
                self.errors.grow(len(self.error_columns))
            self.errors.row(ts)[column] += 1

    def reconciled(self, rec: ReconciledRecord) -> None:
        lane = rec.get("be") or self.owner.get(rec["rid"]) or self.default
        ts, delta = rec.get("ts"), rec.get("delta")
        if isinstance(ts, int | float) and delta is not None:
            self._seen(float(ts))
            self.bins.row(ts)[self._base(lane) + SPENT] += float(delta)


class _Events:
    """The events a report draws: starts and ends, holds, outages, pauses, the budget, the deadline,
    and the key's usage taking unknowable money off (a drop in spend at that instant)."""

    def __init__(self, binner: _Binner, only: str) -> None:
        self.binner = binner
        self.only = only  # the lane of events that name none (a single-backend job's)
        self.starts: list[float] = []
        self.spans: list[Span] = []
        self.open: dict[tuple[str, str | None], tuple[float, str]] = {}  # (kind, lane) -> since, why
        self.budget: list[tuple[float, Decimal | None]] = []
        self.deadline: float | None = None
        self.deadline_set_at: float | None = None
        self.end: Mapping[str, Any] | None = None
        self.last: float | None = None

    def handlers(self) -> dict[str, Handler]:
        names = (
            "start",
            "end",
            "hold",
            "outage",
            "outage_end",
            "pause",
            "resume",
            "budget",
            "deadline",
            "usage_bound",
        )
        return {name: on(_as_is, self.event) for name in names}

    def event(self, raw: Raw) -> None:
        ts = raw.get("ts")
        if not isinstance(ts, int | float):
            return
        ts = float(ts)
        self.last = ts if self.last is None else max(self.last, ts)
        name = raw["event"]
        lane = raw.get("backend")
        lane = lane if isinstance(lane, str) else None
        if name == "start":
            self._close_all(ts)
            self.starts.append(ts)
            self.end = None
            self._budget(ts, raw.get("budget"))
        elif name == "end":
            self._close_all(ts)
            self.end = raw
        elif name == "hold":
            seconds = raw.get("seconds")
            if isinstance(seconds, int | float):
                self.spans.append(Span("hold", lane, ts, ts + float(seconds), str(raw.get("reason") or "")))
        elif name in ("outage", "pause"):
            # A pause of the whole job names no lane; one lane's pause names it.
            why = (
                raw.get("reason") if name == "outage" else f"paused by {raw.get('source') or 'the operator'}"
            )
            self.open.setdefault((name, lane), (ts, str(why or name)))
        elif name == "outage_end":
            self._close("outage", lane, ts)
        elif name == "resume":
            self._close("pause", lane, ts)
        elif name == "budget":
            self._budget(ts, raw.get("value"))
        elif name == "deadline":
            at = raw.get("at")
            self.deadline = float(at) if isinstance(at, int | float) else None
            self.deadline_set_at = ts
        elif name == "usage_bound":
            self._usage_bound(ts, raw)

    def _budget(self, ts: float, value: object) -> None:
        try:
            amount = None if value in (None, "None") else Decimal(str(value))
        except ArithmeticError:
            return
        self.budget.append((ts, amount))

    def _usage_bound(self, ts: float, raw: Raw) -> None:
        cuts = raw.get("cuts")
        if not isinstance(cuts, dict):
            return
        lane = raw.get("backend")
        name = lane if isinstance(lane, str) else self.only
        cut = sum((float(str(v)) for v in cuts.values()), 0.0)
        binner = self.binner
        binner.bins.add(ts, binner._base(name) + SPENT, -cut)

    def _close(self, kind: str, lane: str | None, ts: float) -> None:
        began = self.open.pop((kind, lane), None)
        if began is not None:
            self.spans.append(Span(kind, lane, began[0], ts, began[1]))

    def _close_all(self, ts: float) -> None:
        """Spans still open end where the job that opened them ended (or now, while it runs)."""
        for (kind, lane), (since, reason) in list(self.open.items()):
            self.spans.append(Span(kind, lane, since, ts, reason))
        self.open.clear()

    def finish(self, now: float) -> None:
        self._close_all(now)


def _as_is(raw: Raw) -> Raw:
    return raw


def _lanes(events_path: Path, default: str) -> list[str]:
    """The job's lanes in order: those its start events name (a job on several backends), else
    the one backend its records belong to by default."""
    lanes: list[str] = []
    for _, raw in iter_jsonl(events_path):
        if raw.get("event") == "start":
            named = raw.get("backends")
            if isinstance(named, list):
                lanes.extend(name for name in named if isinstance(name, str) and name not in lanes)
    return lanes or [default]


def read_report(run_dir: Path, default: str, *, now: float | None = None) -> ReportData:
    """The report's data from `run_dir`'s journals, as they are now; `default`: the backend of
    records that name none (`job.backend`: a single-backend run's before lanes).

    Raises RecoveryError naming file:line for a complete line regen cannot have written.
    """
    at = time.time() if now is None else now
    attempts_path, events_path = run_dir / ATTEMPTS_FILE, run_dir / EVENTS_FILE
    lanes = _lanes(events_path, default) if events_path.exists() else [default]
    totals: dict[str, LaneTotals] = {}
    for lane in lanes:
        totals[lane] = LaneTotals(lane, ledger_unit(lane), Decimal(0), Estimates(), SpendBreakdown())
    binner = _Binner(lanes, default, totals)
    events = _Events(binner, lanes[0])
    states = read_lanes(
        attempts_path,
        events_path,
        lanes,
        default,
        attempts_seen=binner.handlers(),
        events_seen=events.handlers(),
    )
    running = holder(run_dir)
    last = max((ts for ts in (binner.last, events.last) if ts is not None), default=None)
    events.finish(at if running is not None else (last or at))
    for lane, journal in states.items():
        _money(totals[lane], journal)
    if running is not None:
        state, detail = "running", f"a job (pid {running}) holds this run folder: a snapshot of {_clock(at)}"
    elif events.end is not None:
        state = "finished"
        detail = f"{events.end.get('reason')}: {events.end.get('message')}"
    elif events.starts or binner.first is not None:
        state, detail = (
            "cut short",
            "the last start has no end: the job was killed (or crashed) and not restarted",
        )
    else:
        state, detail = "not started", "nothing journaled yet"
    first = min(
        (ts for ts in (binner.first, events.starts[0] if events.starts else None) if ts is not None),
        default=None,
    )
    return ReportData(
        run_dir=run_dir,
        generated_at=at,
        state=state,
        state_detail=detail,
        first_ts=first,
        last_ts=last,
        lanes={name: totals[name] for name in lanes if name in totals},
        bins=binner.bins,
        lane_order=binner.order,
        error_bins=binner.errors,
        error_columns=sorted(binner.error_columns, key=binner.error_columns.__getitem__),
        latency=binner.latency,
        spans=sorted(events.spans, key=lambda s: s.start),
        starts=events.starts,
        budget=events.budget,
        deadline=events.deadline,
        deadline_set_at=events.deadline_set_at,
        end_reason=None if events.end is None else str(events.end.get("reason")),
        end_message=None if events.end is None else str(events.end.get("message")),
    )


def _money(totals: LaneTotals, state: JournalState) -> None:
    totals.spent = state.spent
    totals.estimates = state.estimates
    totals.breakdown = state.breakdown
    totals.open_attempts = len(state.crashed)


def _clock(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(ts))
