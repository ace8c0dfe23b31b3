"""Screenshots of the console and of each pane on a real job's recording (tests/support/real_jobs.py,
tests/console/recordings/) replayed to a fixed frame, the replay's clock, no animation.

Update after an intended change, or after `make recordings`, with `pytest tests/console/test_snapshots.py
--snapshot-update`, then look at every SVG under `__snapshots__/` that changed before committing it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from textual.app import App, ComposeResult
from textual.pilot import Pilot
from textual.widget import Widget
from textual.widgets import Input
from textual.widgets._toast import Toast

from regen.console.app import RegenApp
from regen.console.history import History
from regen.console.options import ConsoleOptions
from regen.console.theming import load_themes, variable_defaults
from regen.console.widgets.cost import CostPane
from regen.console.widgets.datasets import DatasetsPane
from regen.console.widgets.host import HostPane
from regen.console.widgets.log import EventLog
from regen.console.widgets.providers import ProvidersPane
from regen.console.widgets.throughput import ThroughputPane
from regen.engine.schema import Snapshot
from tests.support.console_app import highlight, make_app, routes, settle
from tests.support.replay import timed_frames

SnapCompare = Callable[..., bool]


async def settled(pilot: Pilot[Any]) -> None:
    await settle(pilot)


def test_console_wide(snap_compare: SnapCompare) -> None:
    assert snap_compare(make_app(), terminal_size=(140, 42), run_before=settled)


def test_console_80x24(snap_compare: SnapCompare) -> None:
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=settled)


def test_console_narrow_and_tall(snap_compare: SnapCompare) -> None:
    assert snap_compare(make_app(), terminal_size=(100, 44), run_before=settled)


def test_console_disconnected(snap_compare: SnapCompare, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole recording: the operator stopped the job, it drained and said goodbye; the header says
    so, and so does a toast."""

    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot)
        await pilot.app.workers.wait_for_complete()
        # The toast is mounted a few frames after the goodbye: waited for by wall time (a busy machine
        # paints fewer frames), so the screen is the same however fast it runs.
        deadline = time.monotonic() + 10.0
        while not pilot.app.query(Toast) and time.monotonic() < deadline:
            await pilot.pause(0.02)
        assert pilot.app.query(Toast), "the goodbye's toast"
        await pilot.pause()

    # The toast stays on screen however long a busy machine takes to paint it.
    monkeypatch.setattr(RegenApp, "NOTIFICATION_TIMEOUT", 3600.0)
    assert snap_compare(make_app(count=None), terminal_size=(80, 24), run_before=run_before)


def test_console_too_small(snap_compare: SnapCompare) -> None:
    assert snap_compare(make_app(), terminal_size=(50, 12), run_before=settled)


def test_console_light_theme(snap_compare: SnapCompare) -> None:
    app = make_app(options=ConsoleOptions(theme="regen-light"))
    assert snap_compare(app, terminal_size=(120, 36), run_before=settled)


def test_console_high_contrast(snap_compare: SnapCompare) -> None:
    app = make_app(options=ConsoleOptions(theme="regen-contrast"))
    assert snap_compare(app, terminal_size=(120, 36), run_before=settled)


def test_console_no_color(snap_compare: SnapCompare, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under NO_COLOR every state still reads: words and glyphs, never colour alone."""
    monkeypatch.setenv("NO_COLOR", "1")
    assert snap_compare(make_app(), terminal_size=(100, 30), run_before=settled)


def test_console_readonly_and_frozen(snap_compare: SnapCompare) -> None:
    app = make_app(readonly=True)
    assert snap_compare(app, terminal_size=(120, 36), run_before=settled, press=["f"])


def test_exclude_confirmation(snap_compare: SnapCompare) -> None:
    # The third route: a failing one, with traffic to move.
    assert snap_compare(make_app(), terminal_size=(100, 30), run_before=settled, press=["j", "j", "x"])


def test_budget_refusal(snap_compare: SnapCompare) -> None:
    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot)
        await pilot.press("b")
        await pilot.pause()
        box = pilot.app.screen.query_one(Input)
        box.cursor_blink = False
        box.value = "0.01"  # below what the job has spent by then
        await pilot.press("enter")

    assert snap_compare(make_app(), terminal_size=(100, 30), run_before=run_before)


def test_help_screen(snap_compare: SnapCompare) -> None:
    assert snap_compare(make_app(), terminal_size=(100, 44), run_before=settled, press=["question_mark"])


def test_provider_detail(snap_compare: SnapCompare) -> None:
    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot)
        assert isinstance(pilot.app, RegenApp)
        failing = next(p for p in routes(pilot.app) if p["status"] == "FAIL")
        await highlight(pilot, failing["slug"])
        await pilot.press("enter")
        await pilot.pause()
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(120, 40), run_before=run_before)


def two_fleets() -> Any:
    """The console on a job with both fleets (an SGLang server and OpenRouter) paced to a deadline."""
    return make_app("fleets")


def test_console_two_fleets(snap_compare: SnapCompare) -> None:
    assert snap_compare(two_fleets(), terminal_size=(140, 42), run_before=settled)


def test_console_two_fleets_narrow_and_tall(snap_compare: SnapCompare) -> None:
    assert snap_compare(two_fleets(), terminal_size=(100, 44), run_before=settled)


def test_backend_chooser(snap_compare: SnapCompare) -> None:
    assert snap_compare(two_fleets(), terminal_size=(100, 30), run_before=settled, press=["P"])


# ---------------------------------------------------------------------------------- each pane


class PaneApp(App[None]):
    """One pane alone, fed the 21st frame of the OpenRouter recording (and the history before it)."""

    CSS = """
    Screen { background: $background; }
    #pane { border: round $border; height: 1fr; }
    """

    def __init__(self, pane: Widget, feed: Callable[[Widget, Snapshot, History], None]) -> None:
        super().__init__()
        self.pane = pane
        self.feed = feed
        for theme in load_themes().themes:
            self.register_theme(theme)

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return variable_defaults(self.current_theme)

    def compose(self) -> ComposeResult:
        yield self.pane

    def on_mount(self) -> None:
        self.animation_level = "none"
        self.theme = "regen-dark"
        history = History()
        *before, (_, snap) = timed_frames("openrouter", 21)
        for at, earlier in before:
            history.add(earlier, at)
        self.call_after_refresh(self.feed, self.pane, snap, history)


def _providers(pane: Widget, snap: Snapshot, history: History) -> None:
    assert isinstance(pane, ProvidersPane)
    [lane] = snap["lanes"]
    pane.show(lane["providers"])


def _cost(pane: Widget, snap: Snapshot, history: History) -> None:
    assert isinstance(pane, CostPane)
    pane.show(snap)


def _datasets(pane: Widget, snap: Snapshot, history: History) -> None:
    assert isinstance(pane, DatasetsPane)
    pane.show(snap, history)


def _throughput(pane: Widget, snap: Snapshot, history: History) -> None:
    assert isinstance(pane, ThroughputPane)
    pane.show(history)


def _log(pane: Widget, snap: Snapshot, history: History) -> None:
    assert isinstance(pane, EventLog)
    pane.add(history.take_lines())


def _host(pane: Widget, snap: Snapshot, history: History) -> None:
    assert isinstance(pane, HostPane)
    pane.show(snap)


PANES: dict[
    str, tuple[Callable[[], Widget], Callable[[Widget, Snapshot, History], None], tuple[int, int]]
] = {
    "providers": (lambda: ProvidersPane(id="pane"), _providers, (110, 10)),
    "cost": (lambda: CostPane(id="pane"), _cost, (44, 12)),
    "cost-compact": (lambda: CostPane(id="pane"), _cost, (38, 7)),
    "datasets": (lambda: DatasetsPane(id="pane"), _datasets, (100, 5)),
    "throughput": (lambda: ThroughputPane(id="pane"), _throughput, (44, 14)),
    "log": (lambda: EventLog(id="pane"), _log, (80, 10)),
    "host": (lambda: HostPane(id="pane"), _host, (44, 3)),
}


@pytest.mark.parametrize("name", list(PANES))
def test_pane(name: str, snap_compare: SnapCompare) -> None:
    factory, feed, size = PANES[name]
    assert snap_compare(PaneApp(factory(), feed), terminal_size=size)
