"""Repaints stay cheap: the header first, panes spread over frames, unchanged text untouched, caches bounded."""

from __future__ import annotations

import gc
import time
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Label, Sparkline
from textual.widgets._footer import FooterKey

from regen.console.app import RegenApp
from regen.console.widgets.cost import CostPane
from regen.console.widgets.datasets import DatasetsPane
from regen.console.widgets.footer import RegenFooter
from regen.console.widgets.providers import ProvidersPane, ProvidersTable
from regen.console.widgets.status import StatusStrip
from regen.console.widgets.throughput import ThroughputPane
from tests.support.console_app import busiest, cell, make_app, replay, settle, status_text

SIZE = (120, 40)


def footer_words(app: RegenApp) -> list[str]:
    return [key.description for key in app.query_one(RegenFooter).query(FooterKey)]


async def pause_until(pilot: Pilot[Any], done: Any, timeout_s: float = 10.0) -> None:
    """Let frames pass until `done()`, for at most `timeout_s` of wall time (a count of frames is not a
    bound: a busy machine paints fewer of them in the same time)."""
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        await pilot.pause(0.02)
    assert done()


async def test_freeze_shows_in_the_header_and_the_footer_keys_change_in_place() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        keys = list(app.query_one(RegenFooter).query(FooterKey))
        assert "Freeze" in footer_words(app) and "Thaw" not in footer_words(app)
        await pilot.press("f")
        assert "FROZEN" in status_text(app)
        await pause_until(pilot, lambda: "Thaw" in footer_words(app))
        assert "Freeze" not in footer_words(app)
        await pilot.press("f")
        assert "FROZEN" not in status_text(app)
        await pause_until(pilot, lambda: "Freeze" in footer_words(app))
        # The same widgets, relabelled: no recompose (which mounts new keys and leaks the old ones).
        assert list(app.query_one(RegenFooter).query(FooterKey)) == keys


async def test_the_footer_still_recomposes_when_the_keys_themselves_change() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        shown = len(footer_words(app))
        await pilot.press("slash")  # the filter box has the focus: the table's keys leave the footer
        await pilot.pause()
        await pilot.press("escape")
        await pause_until(pilot, lambda: len(footer_words(app)) == shown)


async def test_pressing_f_again_and_again_does_not_stack_toasts() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        for _ in range(3):
            await pilot.press("f", "f")
        await pilot.pause()
        frozen_toasts = [n for n in app._notifications if n.title == "Frozen"]
        assert len(frozen_toasts) == 1 and not app.frozen


async def test_a_repaint_paints_the_header_at_once_and_the_panes_over_the_next_frames() -> None:
    app = make_app(count=1)
    app.options.repaint_interval_s = 60.0  # after make_app, which sets 0 for the other tests
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        slug = busiest(app)
        before = cell(app, slug, "requests")
        replay(app).advance(3)
        await settle(pilot)
        app._show_latest()  # what the repaint timer does
        assert app.displayed is app.latest
        assert app._pane_groups_due, "the panes wait for the frames after the header's"
        await pause_until(pilot, lambda: not app._pane_groups_due)
        assert cell(app, slug, "requests") != before


async def test_thaw_catches_up_over_the_next_frames() -> None:
    app = make_app()
    app.options.repaint_interval_s = 60.0
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("f")
        slug = busiest(app)
        before = cell(app, slug, "requests")
        replay(app).advance(3)
        await settle(pilot)
        await pilot.press("f")
        assert "FROZEN" not in status_text(app) and app.displayed is app.latest
        await pause_until(pilot, lambda: not app._pane_groups_due)
        assert cell(app, slug, "requests") != before


async def test_panes_leave_unchanged_text_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        snap = app.displayed
        assert snap is not None
        updates: list[str] = []

        def spy(name: str) -> Any:
            return lambda *args, **kwargs: updates.append(name)

        for pane in (app.query_one(CostPane), app.query_one(DatasetsPane), app.query_one(StatusStrip)):
            monkeypatch.setattr(pane, "update", spy(type(pane).__name__))
        for label in app.query_one(ThroughputPane).query(Label):
            monkeypatch.setattr(label, "update", spy(f"label {label.id}"))
        sparks = {spark.id: spark.data for spark in app.query_one(ThroughputPane).query(Sparkline)}
        subtitles = (
            app.query_one(ProvidersPane).border_subtitle,
            app.query_one(ThroughputPane).border_subtitle,
        )
        app._repaint()  # the same snapshot again, same clock
        assert updates == []
        assert {spark.id: spark.data for spark in app.query_one(ThroughputPane).query(Sparkline)} == sparks
        assert sparks and all(data is sparks[key] for key, data in sparks.items()), "not even a new list"
        assert subtitles == (
            app.query_one(ProvidersPane).border_subtitle,
            app.query_one(ThroughputPane).border_subtitle,
        )


async def test_the_providers_table_keeps_only_the_current_render_caches() -> None:
    app = make_app(count=60)
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(20):
            replay(app).advance(3)
            await settle(pilot)
        table = app.query_one(ProvidersTable)
        # DataTable keys these by a counter every cell update bumps; stale entries would pile up to
        # 10,000 cells and 1,000 lines for every full garbage collection to walk.
        cells = (table.row_count + 1) * len(table.columns)
        assert len(table._cell_render_cache) <= 2 * cells
        assert len(table._line_cache) <= 2 * (table.row_count + 1)


async def test_the_console_freezes_the_garbage_collector_once_after_its_first_paint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    frozen: list[bool] = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(True))
    monkeypatch.setattr(gc, "collect", lambda *a: 0)
    app = make_app()
    app._freeze_gc_pending = True  # what RegenApp(..., freeze_gc=True) sets
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        replay(app).advance(3)
        await settle(pilot)
        assert frozen == [True]
    assert not make_app()._freeze_gc_pending


async def test_unchanged_text_still_takes_the_new_theme_colours() -> None:
    """Skipping an equal text is safe: content markup names theme variables, resolved when rendered."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)

        def colours() -> set[str]:
            pane = app.query_one(DatasetsPane)
            return {
                str(segment.style.color)
                for strip in pane.render_lines(pane.size.region)
                for segment in strip
                if segment.style is not None and segment.style.color is not None
            }

        before = colours()
        app.theme = next(name for name in app.loaded_themes.names if name != app.theme)
        await pilot.pause()
        assert colours() != before
