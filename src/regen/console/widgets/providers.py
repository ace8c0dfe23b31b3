"""The providers pane: a DataTable keyed by slug, diffed cell by cell, with a filter and a sort."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from rich.style import Style
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.coordinate import Coordinate
from textual.geometry import Region
from textual.message import Message
from textual.strip import Strip
from textual.widgets import DataTable, Input

from regen.console import format as fmt
from regen.console.history import provider_status, slug_of
from regen.console.widgets.colors import theme_style
from regen.engine.schema import LaneView, ProviderView
from regen.engine.units import DOLLARS, Unit

STATUS_GLYPH = {"OK": "✓", "SLOW": "~", "FAIL": "✗", "EXCL": "-", "DRIFT": "≠"}
STATUS_VARIABLE = {
    "OK": "success",
    "SLOW": "warning",
    "FAIL": "error",
    "EXCL": "provider-excluded",
    "DRIFT": "error",
}


@dataclass(frozen=True, slots=True)
class Column:
    """A providers column: key, heading, fixed width, and priority (lower stays longer as space shrinks)."""

    key: str
    label: str
    width: int
    priority: int
    numeric: bool = True


COLUMNS = (
    Column("status", "Status", 6, 0, numeric=False),
    Column("name", "Provider", 12, 0, numeric=False),
    Column("p50", "p50", 6, 1),
    Column("p95", "p95", 6, 5),
    Column("p99", "p99", 6, 7),
    Column("ttft", "TTFT", 6, 3),
    Column("ttft95", "TTFT95", 6, 8),
    Column("tps", "tok/s", 6, 2),
    Column("requests", "Req", 5, 2),
    Column("errors", "Err", 4, 2),
    Column("share", "Share", 5, 2),
    Column("in_flight", "Fly", 5, 6),
    Column("spent", "Spent", 7, 1),
    Column("usd_m", "$/M", 6, 4),
    Column("note", "Out by", 10, 4, numeric=False),
    Column("fidelity", "Fidel", 6, 9, numeric=False),
)
CELL_PADDING = 1
# Headings that change with the backend: SGLang's routes are workers, and its money is GPU time.
WORKER_LABELS = {"name": "Worker", "usd_m": "GPUh/M"}


def columns_for(width: int) -> tuple[Column, ...]:
    """The columns that fit in `width` cells, most important first, shown in their usual order."""
    chosen: set[str] = set()
    used = 0
    for column in sorted(COLUMNS, key=lambda c: c.priority):
        need = column.width + 2 * CELL_PADDING
        if used + need > width and column.priority > 0:
            continue
        chosen.add(column.key)
        used += need
    return tuple(c for c in COLUMNS if c.key in chosen)


# Sort orders `s` cycles through: (name, key function over a provider row, descending).
SORTS: tuple[tuple[str, str, bool], ...] = (
    ("name", "name", False),
    ("spent", "spent", True),
    ("share", "share", True),
    ("tok/s", "tps", True),
    ("p50", "latency_p50_s", False),
    ("errors", "errors", True),
)


def _signature(value: object) -> object:
    """What decides whether a cell changed: for styled text, the words and the style."""
    if isinstance(value, Text):
        return (value.plain, str(value.style))
    return value


class NameCell(Text):
    """A provider's name cell; it carries the slug so a sort can rank rows by it."""

    def __init__(self, slug: str, name: str, style: Style) -> None:
        super().__init__(name, style=style, no_wrap=True, end="")
        self.slug = slug


def error_count(provider: ProviderView) -> int:
    return sum(provider["errors"].values())


class ProvidersTable(DataTable[Any]):
    """Rows keyed by provider slug, columns by id; only changed cells are touched on a tick."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("j", "cursor_down", "Down", show=False, id="cursor-down", tooltip="Next provider"),
        Binding("k", "cursor_up", "Up", show=False, id="cursor-up", tooltip="Previous provider"),
    ]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(
            id=id, cursor_type="row", zebra_stripes=False, show_cursor=True, cell_padding=CELL_PADDING
        )
        self._cells: dict[tuple[str, str], object] = {}
        self._columns: tuple[Column, ...] = ()
        self.providers: dict[str, ProviderView] = {}
        self._caches_for = -1
        self._last_show: tuple[list[ProviderView], str, tuple[str, str, bool]] | None = None
        self.unit: Unit = DOLLARS
        self.labels: dict[str, str] = {}

    def set_backend(self, unit: Unit, workers: bool) -> None:
        """Money cells in the ledger's unit; worker headings for SGLang. Rebuilds only on a change."""
        labels = WORKER_LABELS if workers else {}
        if unit == self.unit and labels == self.labels:
            return
        self.unit, self.labels = unit, labels
        self._columns = ()
        self.fit_columns(self.size.width - 1)

    def render_lines(self, crop: Region) -> list[Strip]:
        # DataTable keys its render caches by a counter that every update_cell bumps, and keeps up
        # to 10,000 stale cells and 1,000 stale lines: on a live table that is some 100k objects
        # for each full garbage collection to walk (a pause of 100 ms and more). Keep the current ones only.
        if self._update_count != self._caches_for:
            self._caches_for = self._update_count
            for cache in (
                self._row_render_cache,
                self._cell_render_cache,
                self._row_renderable_cache,
                self._line_cache,
            ):
                cache.clear()
        return super().render_lines(crop)

    @property
    def column_keys(self) -> list[str]:
        """Keys of the columns shown now."""
        return [c.key for c in self._columns]

    def on_resize(self) -> None:
        self.fit_columns(self.size.width - 1)

    def fit_columns(self, width: int) -> None:
        """Show the columns that fit; a change rebuilds the columns (not on ticks: only on resize)."""
        columns = columns_for(width)
        if columns == self._columns:
            return
        keep = self.highlighted_slug
        self._columns = columns
        self.clear(columns=True)
        self._cells.clear()
        for column in self._columns:
            label = Text(
                self.labels.get(column.key, column.label), justify="right" if column.numeric else "left"
            )
            self.add_column(label, width=column.width, key=column.key)
        if self._last_show is not None:
            providers, filter_text, sort = self._last_show
            self.show(providers, filter_text=filter_text, sort=sort)
            if keep is not None and keep in self.rows:
                self.move_cursor(row=self.get_row_index(keep), animate=False)

    @property
    def highlighted_slug(self) -> str | None:
        """The provider under the cursor."""
        if not self.row_count:
            return None
        try:
            row_key, _ = self.coordinate_to_cell_key(Coordinate(self.cursor_row, 0))
        except Exception:
            return None
        return None if row_key.value is None else str(row_key.value)

    def _values(self, provider: ProviderView, status: str) -> dict[str, object]:
        excluded_style = self._style("provider-excluded") if status == "EXCL" else Style()
        note = (provider["kept_out"] or "") if status == "EXCL" or not provider["allowed"] else ""
        glyph = STATUS_GLYPH[status]
        return {
            "status": Text(
                f"{glyph} {status}", style=self._style(STATUS_VARIABLE[status], bold=status != "OK")
            ),
            "name": NameCell(slug_of(provider), provider["name"] or slug_of(provider), excluded_style),
            "p50": fmt.seconds(provider["latency_p50_s"]),
            "p95": fmt.seconds(provider["latency_p95_s"]),
            "p99": fmt.seconds(provider["latency_p99_s"]),
            "ttft": fmt.seconds(provider["ttft_p50_s"]),
            "ttft95": fmt.seconds(provider["ttft_p95_s"]),
            "tps": fmt.rate(provider["output_tokens_per_s"]),
            "requests": fmt.count(provider["requests"]),
            "errors": fmt.count(error_count(provider)),
            "share": fmt.percent(provider["share"]),
            "in_flight": fmt.count(provider["in_flight"]),
            "spent": fmt.amount(provider["spent"], self.unit, "short"),
            "usd_m": fmt.amount(provider["cost_per_m_output"], self.unit, "short"),
            "note": Text(note, style=excluded_style, no_wrap=True, overflow="ellipsis"),
            "fidelity": self._fidelity(provider),
        }

    def _fidelity(self, provider: ProviderView) -> Text:
        """The route's fingerprint in a word (engine/job/fidelity.py): its finish-mix similarity to
        the reference once tested, `drift` once flagged, `…` while it learns."""
        view = provider.get("fidelity")
        if view is None:
            return Text("")
        if view["state"] == "drift":
            return Text("drift", style=self._style("error", bold=True), no_wrap=True)
        if view["state"] == "learning":
            return Text("…", no_wrap=True)
        similarity = view["finish_similarity"]
        return Text("ok" if similarity is None else fmt.percent(similarity), no_wrap=True)

    def _style(self, variable: str, bold: bool = False) -> Style:
        return theme_style(self.app, variable, bold=bold)

    def show(
        self,
        providers: list[ProviderView],
        *,
        filter_text: str = "",
        sort: tuple[str, str, bool] = SORTS[0],
    ) -> None:
        """Diff the table against `providers`: add and remove rows, update changed cells, keep the cursor."""
        self._last_show = (providers, filter_text, sort)
        if not self._columns:
            return
        self.providers = {slug_of(p): p for p in providers}
        needle = filter_text.strip().lower()
        wanted = [
            p for p in providers if not needle or needle in slug_of(p).lower() or needle in p["name"].lower()
        ]
        wanted.sort(key=lambda p: self._sort_key(p, sort), reverse=sort[2])
        wanted_slugs = [slug_of(p) for p in wanted]
        keep = self.highlighted_slug
        for row_key in list(self.rows):
            if row_key.value not in wanted_slugs:
                self.remove_row(row_key)
                for column in self._columns:
                    self._cells.pop((str(row_key.value), column.key), None)
        for provider in wanted:
            slug = slug_of(provider)
            values = self._values(provider, provider_status(provider))
            if slug not in self.rows:
                cells = [self._cell_for(values[c.key], c) for c in self._columns]
                self.add_row(*cells, key=slug)
                for column in self._columns:
                    self._cells[(slug, column.key)] = _signature(values[column.key])
                continue
            for column in self._columns:
                value = values[column.key]
                signature = _signature(value)
                if self._cells.get((slug, column.key)) != signature:
                    self._cells[(slug, column.key)] = signature
                    self.update_cell(slug, column.key, self._cell_for(value, column))
        current = [str(key.value) for key in self._ordered_keys()]
        if current != wanted_slugs:
            rank = {slug: index for index, slug in enumerate(wanted_slugs)}
            self.sort("name", key=lambda cell: rank.get(getattr(cell, "slug", ""), len(rank)))
        if keep is not None and keep in self.rows:
            index = self.get_row_index(keep)
            if index != self.cursor_row:
                self.move_cursor(row=index, animate=False, scroll=False)

    def _ordered_keys(self) -> list[Any]:
        return [self.coordinate_to_cell_key(Coordinate(i, 0))[0] for i in range(self.row_count)]

    @staticmethod
    def _sort_key(provider: ProviderView, sort: tuple[str, str, bool]) -> tuple[Any, ...]:
        _, field, descending = sort
        # Routes the settings keep out never serve: they stay listed, below the others, whatever the sort.
        kept_out = not provider["allowed"]
        last = kept_out != descending  # reverse=True flips the order, so flip the flag with it
        if field == "name":
            return (last, provider["name"].lower())
        value: float | None
        if field == "errors":
            value = float(error_count(provider))
        elif field == "tps":
            value = provider["output_tokens_per_s"]
        elif field == "spent":
            value = provider["spent"]
        elif field == "share":
            value = provider["share"]
        else:
            value = provider["latency_p50_s"]
        missing = value is None
        # Missing values go last whichever way the sort runs.
        return (last, not missing if descending else missing, value or 0.0, provider["name"])

    @staticmethod
    def _cell_for(value: object, column: Column) -> object:
        if isinstance(value, str) and column.numeric:
            return Text(value, justify="right", no_wrap=True)
        return value

    def restyle(self) -> None:
        """Re-render the coloured cells after a theme change."""
        for slug, provider in self.providers.items():
            if slug not in self.rows:
                continue
            status = provider_status(provider)
            values = self._values(provider, status)
            for key in ("status", "name"):
                self._cells[(slug, key)] = _signature(values[key])
                self.update_cell(slug, key, values[key])


class ProvidersPane(Vertical):
    """The providers table with its filter box."""

    DEFAULT_CSS = """
    ProvidersPane > Input {
        display: none;
        height: 1;
        border: none;
        padding: 0 1;
        background: $boost;
    }
    ProvidersPane.-filtering > Input {
        display: block;
    }
    ProvidersPane > ProvidersTable {
        height: auto;
        min-height: 4;
        max-height: 50vh;
        background: $surface;
    }
    """

    class FilterChanged(Message):
        """The filter text changed."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "Providers"
        self._subtitle = ""
        self.filter_text = ""
        self.sort_index = 0

    def compose(self) -> ComposeResult:
        yield Input(placeholder="filter providers (enter: keep, escape: clear)", id="provider-filter")
        yield ProvidersTable(id="providers")

    @property
    def table(self) -> ProvidersTable:
        return self.query_one(ProvidersTable)

    def set_backend(self, lane: LaneView) -> None:
        """The lane shown: SGLang's routes are its workers, its money GPU time."""
        workers = lane["name"] == "sglang"
        title = "Workers" if workers else "Providers"
        if self.border_title != title:
            self.border_title = title
        self.table.set_backend(lane["unit"], workers)

    @property
    def sort(self) -> tuple[str, str, bool]:
        return SORTS[self.sort_index % len(SORTS)]

    def open_filter(self) -> None:
        """Show the filter box and focus it."""
        self.add_class("-filtering")
        self.query_one(Input).focus()

    @on(Input.Changed, "#provider-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value
        self.post_message(self.FilterChanged())

    @on(Input.Submitted, "#provider-filter")
    def _filter_done(self) -> None:
        if not self.filter_text:
            self.remove_class("-filtering")
        self.table.focus()

    def close_filter(self) -> None:
        """Clear and hide the filter box."""
        box = self.query_one(Input)
        box.value = ""
        self.filter_text = ""
        self.remove_class("-filtering")
        self.table.focus()
        self.post_message(self.FilterChanged())

    def key_escape(self) -> None:
        if self.has_class("-filtering"):
            self.close_filter()

    def show(self, providers: list[ProviderView]) -> None:
        """Repaint the table and the subtitle (sort, filter, counts)."""
        self.table.show(providers, filter_text=self.filter_text, sort=self.sort)
        name, _, descending = self.sort
        parts = [f"sort {name} {'↓' if descending else '↑'}"]
        if self.filter_text:
            parts.append(f"filter “{self.filter_text}” {self.table.row_count} of {len(providers)}")
        subtitle = " · ".join(parts)
        if subtitle != self._subtitle:
            # Setting a border subtitle repaints the whole pane, table included, even when equal.
            self._subtitle = subtitle
            self.border_subtitle = subtitle
