"""The regen console: a Textual app over a `JobSource` (a running job's socket, or a recording of one).

Snapshots arrive in one worker, are folded into `History` there, and reach the UI as a coalescing
`SnapshotArrived` message; widgets change only in message handlers. Steering keys
(console/steering.py) send commands through the source and report the job's answer in the log and
a toast; what the console holds is console/state.py's. `q` detaches: the job lives on. Call
`regen.console.options.configure_environment` before importing this module.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from textual import events, on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.theme import Theme
from textual.timer import Timer
from textual.widgets import DataTable, Static
from textual.worker import Worker, WorkerState

from regen.console.actions import (
    ACTIONS,
    CONSOLE,
    FLEET_ACTIONS,
    GROUP_ORDER,
    STEERING_ACTIONS,
    VIEW,
    bindings,
)
from regen.console.export import export_snapshot
from regen.console.history import LogLine
from regen.console.messages import Connected, ExportDone, SnapshotArrived, SourceEnded
from regen.console.options import ConsoleOptions
from regen.console.palette import RegenCommands
from regen.console.screens import HelpEntry, HelpScreen, ProviderDetailScreen
from regen.console.source import JobSource
from regen.console.steering import SteeringKeys
from regen.console.theming import DEFAULT_THEME, LoadedThemes, load_themes, variable_defaults
from regen.console.widgets.cost import CostPane
from regen.console.widgets.datasets import DatasetsPane
from regen.console.widgets.fleets import FleetsPane, shows_fleets
from regen.console.widgets.footer import RegenFooter
from regen.console.widgets.host import HostPane
from regen.console.widgets.log import EventLog
from regen.console.widgets.providers import ProvidersPane, ProvidersTable
from regen.console.widgets.status import Freshness, StatusStrip
from regen.console.widgets.throughput import ThroughputPane
from regen.engine.schema import Snapshot, budget_lane

# At this many columns and more, the secondary panes sit in a right-hand column and every
# provider column shows; below it the console is "narrow" (80x24 over SSH in tmux).
WIDE_AT = 120
# At this many rows and more, a narrow console still shows cost and throughput in a bottom strip.
TALL_AT = 40


class RegenApp(SteeringKeys):
    """The console: header strip, providers, cost, datasets, throughput, log and host panes."""

    TITLE = "regen"
    CSS_PATH = "app.tcss"
    COMMANDS: ClassVar[set[Any]] = {*App.COMMANDS, RegenCommands}
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (WIDE_AT, "-wide")]  # noqa: RUF012 (declared as an instance variable in App)
    VERTICAL_BREAKPOINTS = [(0, "-short"), (TALL_AT, "-tall")]  # noqa: RUF012
    BINDINGS: ClassVar[list[BindingType]] = [*bindings()]

    def __init__(
        self,
        source: JobSource,
        options: ConsoleOptions | None = None,
        *,
        clock: Callable[[], float] = time.time,
        freeze_gc: bool = False,
    ) -> None:
        """`freeze_gc` exempts what exists after the first paint from garbage collection (`_freeze_gc`):
        for the console's own process, not for a test process that runs many apps."""
        super().__init__(source, options or ConsoleOptions(), clock)
        self.loaded_themes: LoadedThemes = load_themes(self.options.theme_dirs)
        for theme in self.loaded_themes.themes:
            self.register_theme(theme)
        self._view_toasts_until: dict[str, float] = {}
        self._last_repaint = float("-inf")
        self._repaint_timer: Timer | None = None
        self._freeze_gc_pending = freeze_gc
        self._pane_groups_due: list[list[Callable[[Snapshot], None]]] = []

    # ------------------------------------------------------------------------------- layout

    def compose(self) -> ComposeResult:
        yield StatusStrip(id="status")
        with Vertical(id="main"):
            with Vertical(id="left"):
                yield ProvidersPane(id="providers-pane")
                yield DatasetsPane(id="datasets-pane")
                yield FleetsPane(id="fleets-pane")
                yield EventLog(max_lines=self.options.log_max_lines, id="log-pane")
            with Vertical(id="right"):
                yield CostPane(id="cost-pane")
                yield FleetsPane(id="fleets-strip", compact=True)
                yield ThroughputPane(id="throughput-pane")
                yield HostPane(id="host-pane")
        yield Static("", id="too-small")
        yield RegenFooter()

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return variable_defaults(self.current_theme)

    def on_mount(self) -> None:
        self.status.budget_warn_fraction = self.options.budget_warn_fraction
        self.query_one(CostPane).budget_warn_fraction = self.options.budget_warn_fraction
        self._apply_theme_choice()
        self._apply_keymap()
        self.theme_changed_signal.subscribe(self, self._theme_changed)
        self._fit(self.size.width, self.size.height)
        self.query_one(ProvidersTable).focus()
        self.status.show(None, self._freshness())
        self._receive()
        self.set_interval(1.0, self._tick_freshness, name="freshness")

    def _apply_theme_choice(self) -> None:
        problems = list(self.loaded_themes.problems)
        wanted = self.options.theme
        if wanted in self.available_themes:
            self.theme = wanted
        else:
            problems.append(f"unknown theme {wanted!r}; using {DEFAULT_THEME}")
            self.theme = DEFAULT_THEME if DEFAULT_THEME in self.available_themes else "textual-dark"
        if problems:
            self.notify("\n".join(problems), title="Themes", severity="warning", timeout=10)

    def _apply_keymap(self) -> None:
        """Remap keys by binding id; unknown ids are reported, not fatal."""
        known = {b.id for b in self.all_bindings() if b.id}
        unknown = sorted(set(self.options.keymap) - known)
        if unknown:
            self.notify(
                f"unknown binding id {', '.join(map(repr, unknown))}; known: {', '.join(sorted(known))}",
                title="Keymap",
                severity="warning",
                timeout=10,
            )
        keymap = self._normalize_keymap(
            {name: keys for name, keys in self.options.keymap.items() if name in known}
        )
        # Textual drops a default binding whose key the keymap gives to another action; say so.
        taken: dict[str, list[str]] = {}
        for binding in self.all_bindings():
            if binding.id not in keymap:
                for key in self._normalize_keymap({"_": binding.key})["_"].split(","):
                    taken.setdefault(key, []).append(binding.id or binding.action)
        displaced = sorted(
            {
                f"{key} ({', '.join(dict.fromkeys(taken[key]))})"
                for keys in keymap.values()
                for key in keys.split(",")
                if key in taken
            }
        )
        if displaced:
            self.notify(
                f"the keymap reuses {'; '.join(displaced)}, which lose their key; remap them too",
                title="Keymap",
                severity="warning",
                timeout=10,
            )
        if keymap:
            self.set_keymap(keymap)

    @classmethod
    def all_bindings(cls) -> list[Binding]:
        """The console's own bindings (app and providers table)."""
        return [b for b in [*cls.BINDINGS, *ProvidersTable.BINDINGS] if isinstance(b, Binding)]

    def _theme_changed(self, theme: Theme) -> None:
        self.query_one(ProvidersTable).restyle()
        self._repaint()

    def on_resize(self, event: events.Resize) -> None:
        self._fit(event.size.width, event.size.height)

    def _fit(self, width: int, height: int) -> None:
        """Show a message instead of a broken layout below the minimum size (breakpoints do the rest)."""
        min_width, min_height = self.options.min_size
        too_small = width < min_width or height < min_height
        self.set_class(too_small, "-too-small")
        if too_small:
            self.query_one("#too-small", Static).update(
                f"regen needs at least {min_width}x{min_height}; this terminal is {width}x{height}.\n"
                "Enlarge it, or press q to detach (the job keeps running)."
            )

    # ----------------------------------------------------------------------------- receiving

    @work(group="snapshots", exclusive=True, exit_on_error=False, description="Receiving snapshots")
    async def _receive(self) -> None:
        hello = await self.source.connect()
        self.history.add_events(hello["events"])
        self.post_message(Connected(hello))
        async for snap in self.source.snapshots():
            received = self.clock()
            self.history.add(snap, received)
            self.post_message(SnapshotArrived(snap, received))
        self.post_message(SourceEnded(self.source.closed_reason or "the job closed the connection"))

    @on(Connected)
    def _connected(self, message: Connected) -> None:
        if self._shutting_down:
            return
        self.hello = message.hello
        self.readonly = self.readonly or message.hello["readonly"]
        self.status.hello = message.hello
        self.sub_title = message.hello["job"]["model"]
        self.refresh_bindings()
        self._repaint_status()

    @on(SnapshotArrived)
    def _snapshot_arrived(self, message: SnapshotArrived) -> None:
        if self._shutting_down:
            return
        self.latest, self.latest_at = message.snapshot, message.received_at
        self.job_state = message.snapshot["state"] or "STARTING"
        if self.frozen:
            self._repaint_status()
            return
        self._repaint_soon()

    def _repaint_soon(self) -> None:
        """Repaint now, or once the repaint interval has passed: snapshots may come faster than eyes need."""
        wait = self._last_repaint + self.options.repaint_interval_s - time.monotonic()
        if wait <= 0:
            self._show_latest()
        elif self._repaint_timer is None:
            self._repaint_timer = self.set_timer(wait, self._show_latest, name="repaint")

    def _show_latest(self) -> None:
        if self._shutting_down:
            return
        self._repaint_timer = None
        if self.frozen or self.latest is None:
            return
        self._last_repaint = time.monotonic()
        self.displayed, self.displayed_at = self.latest, self.latest_at
        self._paint_displayed()
        if self._freeze_gc_pending:
            self._freeze_gc_pending = False
            self.call_after_refresh(self._freeze_gc)

    def _freeze_gc(self) -> None:
        """Move what the console holds after its first full paint out of the collector's way.

        Modules, widgets and styles live as long as the console. Left in the oldest generation, every
        full collection walks them all (some 80k objects: 50 ms and more on a busy core, a frame that
        a key waits behind); frozen, a full collection walks only what came after.
        """
        gc.collect()
        gc.freeze()

    @on(SourceEnded)
    def _source_ended(self, message: SourceEnded) -> None:
        if self._shutting_down:
            return
        self.ended = message.reason
        self.event_log.add(
            [
                LogLine(
                    self.clock(), "error" if message.failed else "warning", f"disconnected: {message.reason}"
                )
            ]
        )
        self.notify(message.reason, title="Disconnected", severity="error" if message.failed else "warning")
        self.refresh_bindings()
        self._repaint_status()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """One place where workers' failures become messages for the operator."""
        if event.state is not WorkerState.ERROR:
            return
        error = event.worker.error
        text = str(error) or type(error).__name__
        if event.worker.group == "snapshots":
            self.post_message(SourceEnded(text, failed=True))
        elif event.worker.group == "commands":
            self.event_log.add([LogLine(self.clock(), "error", f"command failed: {text}")])
            self.notify(text, title="Command failed", severity="error")
        elif event.worker.group == "export":
            self.notify(text, title="Export failed", severity="error")

    # ------------------------------------------------------------------------------- painting

    def _freshness(self) -> Freshness:
        shown_at = self.displayed_at if self.frozen else self.latest_at
        return Freshness(
            age_s=None if shown_at is None else max(0.0, self.clock() - shown_at),
            stale_after_s=self.options.stale_after_s,
            frozen=self.frozen,
            readonly=self.readonly,
            disconnected=self.ended,
        )

    def _repaint_status(self) -> None:
        self.status.show(self.displayed, self._freshness())

    def _tick_freshness(self) -> None:
        if self._shutting_down:
            return
        self._repaint_status()

    def _paint_displayed(self) -> None:
        """Paint the snapshot just put on display: the header now, the panes over the next frames.

        A repaint of every pane in one frame is a long frame on a busy core, and a key pressed
        during it waits for all of it; one group of panes per frame bounds that wait. With a
        repaint interval of 0 (every snapshot repaints) everything is painted at once.
        """
        if self.options.repaint_interval_s <= 0 or self.displayed is None:
            self._repaint()
            return
        self._repaint_status()
        idle = not self._pane_groups_due
        self._pane_groups_due = self._pane_groups()
        if idle:
            self.call_after_refresh(self._paint_next_pane_group)

    def _paint_next_pane_group(self) -> None:
        if self._shutting_down:
            return
        snap = self.displayed
        if not self._pane_groups_due or snap is None:
            return
        for paint in self._pane_groups_due.pop(0):
            paint(snap)
        if self._pane_groups_due:
            self.call_after_refresh(self._paint_next_pane_group)

    def _pane_groups(self) -> list[list[Callable[[Snapshot], None]]]:
        """The panes in the order a repaint visits them, one group per frame (the table alone: it costs most)."""
        return [
            [self._paint_providers],
            [self._paint_cost, self._paint_datasets],
            [self._paint_throughput, self._paint_host, self._paint_log, self._paint_details],
        ]

    def _repaint(self) -> None:
        """Repaint every pane from the snapshot on screen, all in one frame."""
        if self._shutting_down:
            return
        snap = self.displayed
        self._pane_groups_due = []
        if snap is None:
            self._repaint_status()
            self.event_log.add(self.history.take_lines())
            return
        with self.batch_update():
            self._repaint_status()
            for group in self._pane_groups():
                for paint in group:
                    paint(snap)

    def _paint_providers(self, snap: Snapshot) -> None:
        lane = budget_lane(snap)
        self.providers_pane.set_backend(lane)
        self.providers_pane.show(lane["providers"])

    def _paint_cost(self, snap: Snapshot) -> None:
        # A job on both fleets shows the fleets pane (app.tcss, "-fleets"): under the datasets when the
        # terminal is wide, in the bottom strip beside the cost pane when it is narrow and tall.
        fleets = shows_fleets(snap)
        if fleets != self.has_class("-fleets"):
            self.set_class(fleets, "-fleets")
            self.refresh_bindings()
        if fleets:
            for pane in self.query(FleetsPane):
                pane.show(snap)
        self.query_one(CostPane).show(snap)

    def _paint_datasets(self, snap: Snapshot) -> None:
        self.query_one(DatasetsPane).show(snap, self.history)

    def _paint_throughput(self, snap: Snapshot) -> None:
        self.query_one(ThroughputPane).show(self.history)

    def _paint_host(self, snap: Snapshot) -> None:
        self.query_one(HostPane).show(snap)

    def _paint_log(self, snap: Snapshot) -> None:
        self.event_log.add(self.history.take_lines())

    def _paint_details(self, snap: Snapshot) -> None:
        for screen in self.screen_stack:
            if isinstance(screen, ProviderDetailScreen) and screen.is_mounted:
                screen.show(snap, self.history)

    @on(ProvidersPane.FilterChanged)
    def _filter_changed(self) -> None:
        if self.displayed is not None:
            self.providers_pane.show(self.provider_rows())

    @on(DataTable.RowSelected, "#providers")
    def _row_selected(self) -> None:
        self.action_details()

    # ---------------------------------------------------------------------------------- keys

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("toggle_provider", "exclude_provider") and not self.supports_exclude:
            return False
        if action in FLEET_ACTIONS and not self.shows_fleets:
            return False
        if action == "pause_job" and self.job_state == "PAUSED":
            return False
        if action == "resume_job" and self.job_state != "PAUSED":
            return False
        if action == "freeze":
            return not self.frozen
        if action == "thaw":
            return self.frozen
        if action in STEERING_ACTIONS:
            return True if self.can_steer else None
        return True

    # ---------------------------------------------------------------------------------- view

    def watch_frozen(self) -> None:
        # The footer (freeze or thaw) follows a frame after the header: its recompose is a layout
        # pass, and FROZEN must not wait for it. Keys check `check_action` when pressed, not the footer.
        self.call_after_refresh(self.refresh_bindings)

    def action_freeze(self) -> None:
        self.frozen = True
        self._repaint_status()
        self.notify_view("display frozen; the job keeps running (f thaws)", title="Frozen", timeout=3)

    def action_thaw(self) -> None:
        if self.frozen:
            self.action_toggle_freeze()

    def action_toggle_freeze(self) -> None:
        """Freeze the display, or thaw it and catch up with the newest snapshot."""
        if not self.frozen:
            self.action_freeze()
            return
        self.frozen = False
        self._last_repaint = time.monotonic()
        self.displayed, self.displayed_at = self.latest, self.latest_at
        self._paint_displayed()

    def action_filter(self) -> None:
        self.providers_pane.open_filter()

    def action_cycle_sort(self) -> None:
        self.providers_pane.sort_index += 1
        if self.displayed is not None:
            self.providers_pane.show(self.provider_rows())
        self.notify_view(f"providers sorted by {self.providers_pane.sort[0]}", timeout=2)

    def notify_view(self, message: str, *, title: str = "", timeout: float) -> None:
        """A toast about what a view key did, after the frame that shows it, and never twice at once.

        A toast is a mount and a layout pass: it waits for the frame with the key's own effect (the
        header's FROZEN, the table's new order). Pressing the key again while the same toast still
        shows does not stack another copy over the panes.
        """
        now = time.monotonic()
        if self._view_toasts_until.get(message, 0.0) > now:
            return
        self._view_toasts_until[message] = now + timeout
        self.call_after_refresh(self.notify, message, title=title, timeout=timeout)

    def action_details(self) -> None:
        slug = self.highlighted_slug
        if slug is None or self.displayed is None:
            self.notify("no provider highlighted", severity="warning")
            return
        screen = ProviderDetailScreen(slug)
        snap = self.displayed
        self.push_screen(screen)
        screen.call_after_refresh(screen.show, snap, self.history)

    def export_folder(self) -> Path:
        """Where `e` writes: the configured folder, else the job's run folder, else the current one."""
        if self.options.export_dir is not None:
            return self.options.export_dir
        run_dir = None if self.hello is None else self.hello["job"]["run_dir"]
        if run_dir and Path(run_dir).is_dir():
            return Path(run_dir)
        return Path.cwd()

    def action_export(self) -> None:
        if self.displayed is None:
            self.notify("nothing to export yet", severity="warning")
            return
        self._export(self.displayed, self.export_folder(), self.clock())

    @work(thread=True, group="export", exit_on_error=False, description="Exporting the snapshot")
    def _export(self, snap: Snapshot, folder: Path, now: float) -> None:
        paths = export_snapshot(snap, folder, now)
        self.post_message(ExportDone([str(p) for p in paths]))

    @on(ExportDone)
    def _exported(self, message: ExportDone) -> None:
        where = str(Path(message.paths[0]).parent)
        names = ", ".join(Path(p).name for p in message.paths)
        self.event_log.add([LogLine(self.clock(), "info", f"exported {names} to {where}")])
        self.notify(f"{names}\nin {where}", title="Exported")

    def action_next_theme(self) -> None:
        names = self.loaded_themes.names or [self.theme]
        index = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(index + 1) % len(names)]
        self.notify(f"theme {self.theme}", timeout=2)

    def help_entries(self) -> list[HelpEntry]:
        """Every action with its current keys (console/actions.py), a pair sharing a key on one line."""
        keymap = self.options.keymap
        entries: list[HelpEntry] = []
        seen: set[str] = set()
        table_keys = [
            (b.id or b.action, b.key, None, b.tooltip or b.description, VIEW)
            for b in ProvidersTable.BINDINGS
            if isinstance(b, Binding)
        ]
        fleets = self.shows_fleets
        actions = [
            (a.id, a.keys, a.key_display, a.help_line or a.help, a.group)
            for a in ACTIONS
            if a.keys and (fleets or not a.fleets)
        ]
        for key_id, default_keys, display, description, group in [*actions, *table_keys]:
            if key_id in seen:
                continue
            seen.add(key_id)
            keys = keymap.get(key_id, default_keys)
            shown = "/".join(
                self.get_key_display(
                    Binding(key.strip(), "", key_display=display if key.strip() == default_keys else None)
                )
                for key in keys.split(",")
            )
            entries.append(HelpEntry(shown, description, group))
        entries.append(HelpEntry("↑/↓", "Move between providers", VIEW))
        entries.append(HelpEntry("tab", "Move between panes", CONSOLE))
        entries.append(
            HelpEntry(
                self.get_key_display(Binding(self.COMMAND_PALETTE_BINDING, "")),
                "Commands, including Stop job (typed confirmation)",
                CONSOLE,
            )
        )
        order = {group: n for n, group in enumerate(GROUP_ORDER)}
        return sorted(entries, key=lambda e: order.get(e.group, len(order)))

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.help_entries(), self.readonly))

    def action_detach(self) -> None:
        self.exit("detached")

    async def on_unmount(self) -> None:
        await self.source.close()
