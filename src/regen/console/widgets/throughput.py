"""Throughput sparklines: output tokens/s, requests/s and latency over the last minutes."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label

from regen.console import format as fmt
from regen.console.history import History
from regen.console.widgets.spark import ZeroSparkline

SERIES = (
    ("tokens", "output tok/s", fmt.rate),
    ("requests", "requests/s", fmt.rate),
    ("latency", "latency p50", fmt.seconds),
)


class ThroughputPane(Vertical):
    """Three labelled sparklines; each gets a new list per repaint, never a mutated one."""

    DEFAULT_CSS = """
    ThroughputPane {
        background: $surface;
        padding: 0 1;
    }
    ThroughputPane > Label {
        width: 1fr;
        color: $text-muted;
    }
    ThroughputPane > ZeroSparkline {
        height: 1fr;
        min-height: 1;
        margin-bottom: 0;
    }
    ThroughputPane > ZeroSparkline > .sparkline--max-color {
        color: $accent;
    }
    ThroughputPane > ZeroSparkline > .sparkline--min-color {
        color: $primary 50%;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "Throughput"
        self._shown: dict[str, object] = {}

    def compose(self) -> ComposeResult:
        for key, title, _ in SERIES:
            yield Label(f"{title} -", id=f"{key}-label")
            yield ZeroSparkline([], id=f"{key}-spark", summary_function=max)

    def show(self, history: History) -> None:
        """Repaint from the history windows; a label or sparkline that would not change is left alone."""
        windows = {
            "tokens": history.output_tokens_per_s,
            "requests": history.requests_per_s,
            "latency": history.latency_p50_s,
        }
        minutes = len(history.output_tokens_per_s) * history.sample_every_s / 60
        subtitle = f"last {minutes:.0f} min" if minutes >= 1 else "last minute"
        if subtitle != self._shown.get("subtitle"):
            # Setting a border subtitle repaints the whole pane, children included, even when equal.
            self._shown["subtitle"] = subtitle
            self.border_subtitle = subtitle
        for key, title, render in SERIES:
            window = windows[key]
            now = window[-1] if window else None
            peak = max(window) if window else None
            text = f"{title} {render(now)} (peak {render(peak)})"
            if text != self._shown.get(f"{key}-label"):
                self._shown[f"{key}-label"] = text
                self.query_one(f"#{key}-label", Label).update(text, layout=False)
            data = list(window)
            if data != self._shown.get(f"{key}-spark"):
                self._shown[f"{key}-spark"] = data
                self.query_one(f"#{key}-spark", ZeroSparkline).data = data
