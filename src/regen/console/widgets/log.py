"""The log pane: journal events, error bursts and operator actions; bounded, tails unless scrolled back."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from rich.text import Text
from textual.widgets import RichLog

from regen.console.format import wall_time
from regen.console.history import LogLine
from regen.console.widgets.colors import theme_style

LEVEL_WORD = {"info": "info", "warning": "WARN", "error": "ERR ", "action": "you "}
LEVEL_VARIABLE = {"info": "text-muted", "warning": "warning", "error": "error", "action": "accent"}


class EventLog(RichLog):
    """Bounded lines with a level word each; new lines count up in the subtitle while scrolled back."""

    DEFAULT_CSS = """
    EventLog {
        background: $surface;
        padding: 0 1;
        scrollbar-size-vertical: 1;
    }
    """

    def __init__(
        self, *, max_lines: int = 2000, time_format: Callable[[float], str] = wall_time, id: str | None = None
    ) -> None:
        super().__init__(
            max_lines=max_lines, wrap=False, markup=False, highlight=False, auto_scroll=False, id=id
        )
        self.border_title = "Log"
        self.time_format = time_format
        self.unseen = 0
        self.lines_written = 0
        self.following = True

    def add(self, lines: Iterable[LogLine]) -> None:
        """Append lines; follow the tail only when the view is already at the end."""
        lines = list(lines)
        if not lines:
            return
        tailing = self.following
        muted = theme_style(self.app, "text-muted")
        for line in lines:
            text = Text(no_wrap=True, end="")
            text.append(f"{self.time_format(line.ts)} ", style=muted)
            level_style = theme_style(
                self.app, LEVEL_VARIABLE.get(line.level, "foreground"), bold=line.level != "info"
            )
            text.append(f"{LEVEL_WORD.get(line.level, line.level):<4} ", style=level_style)
            text.append(line.text)
            self.write(text, scroll_end=tailing)
            self.lines_written += 1
        self.unseen = 0 if tailing else self.unseen + len(lines)
        self.border_subtitle = f"{self.unseen} new below ↓ (end to follow)" if self.unseen else ""

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        if new >= self.max_scroll_y:
            self.following = True
            if self.unseen:
                self.unseen = 0
                self.border_subtitle = ""
        elif new < old:
            self.following = False
