"""A text pane that repaints only when its words change, and lays out only when its height does."""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Static


class TextPane(Static):
    """A `Static` fed whole lines of content markup; an unchanged text costs nothing on a tick."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self._shown_markup: str | None = None
        self._line_count = 0

    def show_lines(self, lines: list[str]) -> None:
        """Show `lines` unless they are what is on screen already."""
        markup = "\n".join(lines)
        if markup == self._shown_markup:
            return
        self._shown_markup = markup
        # A layout pass only when the height (line count) changes, not on every tick.
        relayout = len(lines) != self._line_count
        self.update(Content.from_markup(markup), layout=relayout)
        self._line_count = len(lines)
        if relayout and self.is_mounted:
            # A change made while a resize is handled (the first paint came before the first layout)
            # is not laid out by the pass under way; ask for one after it.
            self.call_after_refresh(self.refresh, layout=True)
