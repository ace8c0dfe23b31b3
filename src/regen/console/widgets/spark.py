"""A sparkline whose bars start at zero: a quiet minute looks quiet, not like peak load.

Textual's Sparkline scales each series from its own minimum to its maximum, so a flat series, or
the single point of a job's first seconds, draws full-height bars. Here the scale runs from zero to
the series' peak, and a series that is all zero (a paused or starting job) is a flat baseline.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from rich.color import Color
from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.style import Style
from textual.app import RenderResult as WidgetRender
from textual.renderables._blend_colors import blend_colors
from textual.widgets import Sparkline

BARS = "▁▂▃▄▅▆▇█"


class ZeroBasedBars:
    """Bars for `data`, one column per bucket, the bucket's peak against the series' peak."""

    def __init__(self, data: Sequence[float], *, width: int, height: int, low: Color, high: Color) -> None:
        self.data = data
        self.width = max(1, width)
        self.height = max(1, height)
        self.low = low
        self.high = high

    def _peaks(self) -> list[float]:
        data, width = self.data, self.width
        if len(data) <= width:
            return [float(v) for v in data]
        step = Fraction(len(data), width)
        return [float(max(data[int(step * i) : int(step * (i + 1))] or [0.0])) for i in range(width)]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        peaks = self._peaks()
        top = max(peaks, default=0.0)
        width, height = self.width, self.height
        levels = len(BARS) * height
        # Each column's height in eighths of a cell; zero (or nothing yet) stays on the baseline.
        filled = [0 if top <= 0 or value <= 0 else max(1, round(value / top * levels)) for value in peaks]
        pad = width - len(filled)
        for row in reversed(range(height)):
            floor = row * len(BARS)
            if pad > 0:
                # Fewer points than columns: the series ends at the right edge, like Textual's.
                yield Segment(" " * pad if row else BARS[0] * pad, Style(color=self.low))
            for value, eighths in zip(peaks, filled, strict=True):
                if eighths <= floor:
                    bar = BARS[0] if row == 0 else " "
                else:
                    bar = BARS[min(len(BARS), eighths - floor) - 1]
                ratio = value / top if top > 0 else 0.0
                yield Segment(bar, Style(color=blend_colors(self.low, self.high, ratio)))
            if row:
                yield Segment.line()


class ZeroSparkline(Sparkline):
    """Textual's Sparkline widget (its data, CSS and colours) drawn from zero."""

    def render(self) -> WidgetRender:
        _, base = self.background_colors
        low = base + (
            self.get_component_styles("sparkline--min-color").color
            if self.min_color is None
            else self.min_color
        )
        high = base + (
            self.get_component_styles("sparkline--max-color").color
            if self.max_color is None
            else self.max_color
        )
        return ZeroBasedBars(
            list(self.data or []),
            width=self.size.width,
            height=self.size.height,
            low=low.rich_color,
            high=high.rich_color,
        )
