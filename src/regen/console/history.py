"""What the console remembers between snapshots: sparkline windows, rates it derives, log lines.

`History.add` runs once per snapshot in the snapshot worker, before coalescing, so no sample and
no journal event is lost when the UI skips a repaint; the UI reads it only in message handlers.
Nothing here imports Textual.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from regen.console.format import number, percent
from regen.engine.schema import DatasetView, EventRecord, ProviderView, Snapshot, budget_lane
from regen.engine.units import DOLLARS, amount

STATUSES = ("OK", "SLOW", "FAIL", "EXCL", "DRIFT")
# Error deltas go to the log at most once per this many seconds of job time.
ERROR_LINE_EVERY_S = 5.0


@dataclass(slots=True, frozen=True)
class LogLine:
    """One line for the log pane."""

    ts: float
    level: str  # "info", "warning", "error" or "action"
    text: str


def provider_status(provider: ProviderView) -> str:
    """OK/SLOW/FAIL/EXCL/DRIFT: the job's word (engine/job/stats.py status_word is the only rule)."""
    given = provider["status"].upper()
    return given if given in STATUSES else "OK"


@dataclass(slots=True)
class _Window:
    """(job time, value) samples over a bounded window, for rates of cumulative counters."""

    samples: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=61))

    def add(self, elapsed: float, value: float) -> None:
        self.samples.append((elapsed, value))

    def rate(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, v0), (t1, v1) = self.samples[0], self.samples[-1]
        return (v1 - v0) / (t1 - t0) if t1 > t0 else None


@dataclass(slots=True)
class ProviderHistory:
    """One provider's sparkline windows."""

    latency_p50_s: deque[float]
    output_tokens_per_s: deque[float]


class History:
    """Sparkline windows (one point per `sample_every_s` of job time) and pending log lines."""

    def __init__(self, points: int = 300, sample_every_s: float = 1.0) -> None:
        self.points = points
        self.sample_every_s = sample_every_s
        self.output_tokens_per_s: deque[float] = deque(maxlen=points)
        self.requests_per_s: deque[float] = deque(maxlen=points)
        self.latency_p50_s: deque[float] = deque(maxlen=points)
        self.providers: dict[str, ProviderHistory] = {}
        self.datasets: dict[str, _Window] = {}
        self.statuses: dict[str, str] = {}
        self.snapshots_seen = 0
        self._last_sample: float | None = None
        self._last_state: str | None = None
        self._budget_blocked = False
        self._last_seq = float("-inf")
        self._errors: dict[str, float] = {}
        self._error_delta: dict[str, float] = {}
        self._last_error_line: float | None = None
        self._lines: list[LogLine] = []

    # ------------------------------------------------------------------------------ reading

    def take_lines(self) -> list[LogLine]:
        """Log lines gathered since the last call."""
        lines, self._lines = self._lines, []
        return lines

    def dataset_eta_s(self, dataset: DatasetView) -> float | None:
        """Seconds until a dataset is done at its rate over the last minute (None when unknown)."""
        window = self.datasets.get(dataset["name"])
        rate = None if window is None else window.rate()
        if rate is None or rate <= 0:
            return None
        return max(0.0, dataset["total"] - dataset["done"]) / rate

    # ------------------------------------------------------------------------------ writing

    def add_events(self, events: list[EventRecord]) -> None:
        """Journal events (operator actions, errors, state changes) become log lines, each once.

        Events carry the journal's sequence number; one already seen (say, in the hello's backlog
        and again in the first snapshot) is skipped.
        """
        for event in events:
            seq = number(event.get("seq"))
            if seq is not None:
                if seq <= self._last_seq:
                    continue
                self._last_seq = seq
            self._lines.append(event_line(event))

    def add(self, snap: Snapshot, received_at: float) -> None:
        """Fold one snapshot in: the job's figures, and the routes of the lane the console shows
        (engine/schema.py budget_lane)."""
        self.snapshots_seen += 1
        elapsed = snap["elapsed_s"]
        if self._last_sample is not None and elapsed < self._last_sample:
            self._reset()
        self.add_events(snap.get("events", []))
        self._note_state(snap, received_at)
        self._note_errors(snap, elapsed, received_at)
        providers = budget_lane(snap)["providers"]
        self._note_statuses(providers, received_at)
        if self._last_sample is not None and elapsed < self._last_sample + self.sample_every_s:
            return
        self._last_sample = elapsed
        rates = snap["rates"]
        self.output_tokens_per_s.append(rates["output_tokens_per_s"])
        self.requests_per_s.append(rates["attempts_per_s"])
        self.latency_p50_s.append(weighted_latency(providers) or 0.0)
        for provider in providers:
            slug = slug_of(provider)
            history = self.providers.get(slug)
            if history is None:
                history = self.providers[slug] = ProviderHistory(
                    deque(maxlen=self.points), deque(maxlen=self.points)
                )
            history.latency_p50_s.append(provider["latency_p50_s"] or 0.0)
            history.output_tokens_per_s.append(provider["output_tokens_per_s"])
        for dataset in snap["datasets"]:
            self.datasets.setdefault(dataset["name"], _Window()).add(elapsed, dataset["done"])

    def _reset(self) -> None:
        for window in (self.output_tokens_per_s, self.requests_per_s, self.latency_p50_s):
            window.clear()
        self.providers.clear()
        self.datasets.clear()
        self._errors.clear()
        self._error_delta.clear()
        self._last_sample = None
        self._last_error_line = None

    def _note_state(self, snap: Snapshot, ts: float) -> None:
        state = snap["state"]
        if state and state != self._last_state:
            if self._last_state is not None:
                level = (
                    "error"
                    if state == "STOPPED"
                    else "warning"
                    if state in ("PAUSED", "DRAINING")
                    else "info"
                )
                outcome = snap["outcome"]
                why = (
                    f": {outcome['message']}"
                    if state in ("STOPPED", "DONE") and outcome is not None and outcome["message"]
                    else ""
                )
                self._lines.append(LogLine(ts, level, f"job {self._last_state} → {state}{why}"))
            self._last_state = state
        money_ = budget_lane(snap)["money"]
        if money_["blocked"] and not self._budget_blocked:
            self._lines.append(
                LogLine(
                    ts,
                    "warning",
                    f"budget reached: no new requests (budget {amount(money_['budget'], DOLLARS, 'cents')})",
                )
            )
        self._budget_blocked = money_["blocked"]

    def _note_errors(self, snap: Snapshot, elapsed: float, ts: float) -> None:
        for name, now in snap["errors"].items():
            delta = now - self._errors.get(name, 0.0)
            if delta > 0:
                self._error_delta[name] = self._error_delta.get(name, 0.0) + delta
            self._errors[name] = now
        due = self._last_error_line is None or elapsed >= self._last_error_line + ERROR_LINE_EVERY_S
        if self._error_delta and due:
            text = ", ".join(f"+{n:.0f} {name}" for name, n in sorted(self._error_delta.items()))
            self._lines.append(LogLine(ts, "warning", f"errors {text}"))
            self._error_delta.clear()
            self._last_error_line = elapsed

    def _note_statuses(self, providers: list[ProviderView], ts: float) -> None:
        for provider in providers:
            slug = slug_of(provider)
            status = provider_status(provider)
            before = self.statuses.get(slug)
            self.statuses[slug] = status
            if before is not None and before != status and status in ("SLOW", "FAIL"):
                requests = provider["requests"]
                failed = sum(provider["errors"].values())
                detail = (
                    f" ({percent(failed / requests)} of requests failed)"
                    if requests and status == "FAIL"
                    else ""
                )
                self._lines.append(
                    LogLine(
                        ts,
                        "error" if status == "FAIL" else "warning",
                        f"{provider['name']}: {status}{detail}",
                    )
                )


def slug_of(provider: ProviderView) -> str:
    """A route's key in the console: its slug, else its name."""
    return provider["slug"] or provider["name"]


def weighted_latency(providers: list[ProviderView]) -> float | None:
    """Median latency across providers, weighted by their share of requests."""
    total = weight_sum = 0.0
    for provider in providers:
        latency, share = provider["latency_p50_s"], provider["share"]
        if latency is not None and share > 0:
            total += latency * share
            weight_sum += share
    return total / weight_sum if weight_sum else None


_EVENT_TEXT = {
    "pause": "paused",
    "resume": "resumed",
    "exclude": "excluded {provider}",
    "include": "included {provider}",
    "concurrency": "concurrency set to {value}",
    "budget": "budget set to ${value}",
    "stop": "stop requested ({mode})",
    "hold": "platform rate limit: all requests wait {seconds} s ({reason})",
    "hold_end": "platform rate limit reset: requests go out again",
}
_EVENT_LEVEL = {
    "fatal": "error",
    "stop": "warning",
    "exclude": "action",
    "include": "action",
    "pause": "action",
    "resume": "action",
    "concurrency": "action",
    "budget": "action",
    "blocked": "warning",
    "invalid_line": "warning",
    "hold": "warning",
}


def event_line(event: EventRecord) -> LogLine:
    """A journal event as a log line: known events in words, others as key=value pairs."""
    name = str(event.get("event", "event"))
    fields = {k: v for k, v in event.items() if k not in ("ts", "seq", "event")}
    source = fields.pop("source", None)
    template = _EVENT_TEXT.get(name)
    try:
        text = template.format(**fields) if template else ""
    except (KeyError, IndexError, ValueError):
        text = ""
    if not text:
        text = " ".join([name.replace("_", " "), *(f"{k}={v}" for k, v in fields.items())])
    if source:
        text += f" (by {source})"
    ts = number(event.get("ts")) or 0.0
    return LogLine(ts, _EVENT_LEVEL.get(name, "info"), text)
