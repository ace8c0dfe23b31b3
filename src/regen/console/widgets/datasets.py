"""The datasets pane: one line each with a bar, done/total, tokens against the token budget, ETA, state."""

from __future__ import annotations

from textual import events
from textual.content import Content
from textual.markup import escape

from regen.console import format as fmt
from regen.console.history import History
from regen.console.widgets.bars import bar
from regen.console.widgets.text import TextPane
from regen.engine.schema import DatasetView, Snapshot

STATE_COLOUR = {"done": "$success", "running": "$foreground", "waiting": "$text-muted", "failed": "$error"}


# Below this many columns of content the token counts and failures are left out.
COMPACT_BELOW = 70


class DatasetsPane(TextPane):
    """Progress per dataset; the words say the state, the colour only repeats it."""

    DEFAULT_CSS = """
    DatasetsPane {
        padding: 0 1;
        background: $surface;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "Datasets"
        self.datasets: list[DatasetView] = []
        self.etas: dict[str, float | None] = {}

    def show(self, snap: Snapshot, history: History | None) -> None:
        """Repaint from a snapshot; ETAs come from the console's own rate window."""
        self.datasets = snap["datasets"]
        self.etas = {d["name"]: None if history is None else history.dataset_eta_s(d) for d in self.datasets}
        self._paint()

    def on_resize(self, event: events.Resize) -> None:
        self._paint()

    def _paint(self) -> None:
        if not self.datasets:
            self.show_lines(["no datasets yet"])
            return
        width = self.content_size.width or 60
        name_width = min(14, max(len(d["name"]) for d in self.datasets))
        lines = []
        for dataset in self.datasets:
            name = dataset["name"]
            total, done = dataset["total"], dataset["done"]
            fraction = done / total if total else None
            tokens, budget = dataset["output_tokens"], dataset["token_budget"]
            state = dataset["state"] or "-"
            failed = dataset["failed"]
            counts = f"{fmt.count(done)}/{fmt.count(total)}"
            token_text = (
                f"{fmt.count(tokens)}/{fmt.count(budget)} tok" if budget else f"{fmt.count(tokens)} tok"
            )
            eta = (
                "" if state in ("done", "token budget") else f"ETA {fmt.short_duration(self.etas.get(name))}"
            )
            colour = STATE_COLOUR.get(state, "$warning")
            tail_parts = [f"{fmt.percent(fraction):>4}", f"{counts:>11}"]
            if width >= COMPACT_BELOW:
                tail_parts.append(f"{token_text:>15}")
                if failed:
                    tail_parts.append(f"[$error]{fmt.count(failed)} failed[/]")
            tail_parts += [f"{eta:<11}", f"[{colour}]{escape(state)}[/]"]
            tail = " ".join(tail_parts)
            plain_tail = Content.from_markup(tail).cell_length
            bar_width = max(4, width - name_width - plain_tail - 3)
            lines.append(f"{escape(name[:name_width]):<{name_width}} {bar(fraction, bar_width)} {tail}")
        self.show_lines(lines)
