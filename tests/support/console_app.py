"""The console under test: a real job's recording replayed (tests/support/replay.py) with the replay's
clock, waiting on its workers, and what its widgets show now."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual.pilot import Pilot

from regen.console.app import RegenApp
from regen.console.options import ConsoleOptions
from regen.console.widgets.log import EventLog
from regen.console.widgets.status import StatusStrip
from regen.engine.schema import ProviderView, Snapshot, budget_lane
from tests.support.replay import ReplaySource


def make_app(
    kind: str = "openrouter",
    options: ConsoleOptions | None = None,
    *,
    count: int | None = 20,
    readonly: bool = False,
    edit: Callable[[Snapshot], None] | None = None,
    source: ReplaySource | None = None,
) -> RegenApp:
    """The console on `kind`'s recording (openrouter, sglang, fleets: tests/support/real_jobs.py),
    `count` frames in, its clock the replay's, no animation."""
    source = source or ReplaySource(kind, count=count, readonly=readonly, edit=edit)
    options = options or ConsoleOptions()
    options.repaint_interval_s = 0.0  # every snapshot repaints: tests wait on messages, not timers
    app = RegenApp(source, options, clock=source.now)
    app.animation_level = "none"
    return app


def replay(app: RegenApp) -> ReplaySource:
    assert isinstance(app.source, ReplaySource)
    return app.source


async def settle(pilot: Pilot[Any]) -> None:
    """Wait until commands are answered, the frames they release are taken, and messages are handled."""
    app = pilot.app
    assert isinstance(app, RegenApp)
    for attempt in range(3):
        busy = [w for w in app.workers if w.group in ("commands", "export") and not w.is_finished]
        if attempt and not busy:
            break
        if busy:
            await app.workers.wait_for_complete(busy)
        await replay(app).idle()
        await pilot.pause()


def routes(app: RegenApp) -> list[ProviderView]:
    """The providers pane's routes on screen (the budget lane's), in its first order: allowed ones
    by name, then those the settings keep out."""
    assert app.displayed is not None
    providers = budget_lane(app.displayed)["providers"]
    return sorted(providers, key=lambda p: (not p["allowed"], p["name"].lower()))


def busiest(app: RegenApp) -> str:
    """The slug of the route with the most requests on screen (its figures move from frame to frame)."""
    return max(routes(app), key=lambda p: p["requests"])["slug"]


async def highlight(pilot: Pilot[Any], slug: str) -> None:
    """Move the providers table's cursor to `slug` with the keys an operator uses (j)."""
    app = pilot.app
    assert isinstance(app, RegenApp)
    for _ in range(len(routes(app))):
        if app.highlighted_slug == slug:
            return
        await pilot.press("j")
    assert app.highlighted_slug == slug


def cell(app: RegenApp, slug: str, column: str) -> str:
    """The text of one providers cell."""
    value = app.query_one("#providers").get_cell(slug, column)  # type: ignore[attr-defined]
    return str(getattr(value, "plain", value))


def footer_actions(app: RegenApp) -> set[str]:
    """Actions the footer offers now (enabled)."""
    return {b.binding.action for b in app.screen.active_bindings.values() if b.enabled}


def log_text(app: RegenApp) -> str:
    """The event log's lines."""
    return "\n".join(line.text for line in app.query_one(EventLog).lines)


def status_text(app: RegenApp) -> str:
    """The status strip as it renders now."""
    return str(app.query_one(StatusStrip).render())
