"""Console test fixtures: a seeded scripted job, a frozen clock, UTC wall times, helpers that wait on workers."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from textual.pilot import Pilot

from regen.console.app import RegenApp
from regen.console.options import ConsoleOptions
from regen.console.scripted import SIM_EPOCH, ScriptedSource

# The console's clock in tests: 100 s after the simulated job started, forever.
FROZEN_NOW = SIM_EPOCH + 100.0


@pytest.fixture(autouse=True)
def plain_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller's colour and frame-rate settings do not reach the tests."""
    for name in ("NO_COLOR", "TEXTUAL_COLOR_SYSTEM", "TEXTUAL_FPS", "TEXTUAL_THEME", "TEXTUAL_ANIMATIONS"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def utc() -> Iterator[None]:
    """Wall-clock times print the same everywhere."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if before is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = before
    time.tzset()


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
