"""The console under test: a seeded scripted job, a frozen clock, waiting on its workers, and what
its widgets show now."""

from __future__ import annotations

from typing import Any

from textual.pilot import Pilot

from regen.console.app import RegenApp
from regen.console.options import ConsoleOptions
from regen.console.scripted import SIM_EPOCH, ScriptedSource
from regen.console.widgets.log import EventLog
from regen.console.widgets.status import StatusStrip

# The console's clock in tests: 100 s after the simulated job started, forever.
FROZEN_NOW = SIM_EPOCH + 100.0


def make_app(
    source: ScriptedSource | None = None, options: ConsoleOptions | None = None, **source_args: Any
) -> RegenApp:
    """The console on a seeded scripted job, with a frozen clock and no animation."""
    source = source or ScriptedSource(
        seed=source_args.pop("seed", 3), count=source_args.pop("count", 20), **source_args
    )
    options = options or ConsoleOptions()
    options.repaint_interval_s = 0.0  # every snapshot repaints: tests wait on messages, not timers
    app = RegenApp(source, options, clock=lambda: FROZEN_NOW)
    app.animation_level = "none"
    return app


def scripted(app: RegenApp) -> ScriptedSource:
    assert isinstance(app.source, ScriptedSource)
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
        await scripted(app).idle()
        await pilot.pause()


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
