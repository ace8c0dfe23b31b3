"""Keys drive the job through the source: every test asserts the commands actually sent and what the
job answered. The job is a real one's recording (tests/support/real_jobs.py: OpenRouter, and SGLang
where said), replayed with its replies."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual.binding import Binding
from textual.command import CommandList, CommandPalette
from textual.pilot import Pilot
from textual.widgets import Input

from regen.console.actions import FLEET_ACTIONS
from regen.console.app import RegenApp
from regen.console.options import ConsoleOptions
from regen.console.screens import BudgetScreen, ConfirmScreen, HelpScreen, ProviderDetailScreen, StopScreen
from regen.console.widgets.log import EventLog
from regen.console.widgets.providers import ProvidersTable
from regen.engine.schema import Hello, Snapshot, budget_lane
from tests.support.console_app import (
    busiest,
    cell,
    footer_actions,
    highlight,
    log_text,
    make_app,
    replay,
    routes,
    settle,
    status_text,
)
from tests.support.replay import ReplaySource
from tests.support.views import partial

SIZE = (120, 40)


async def test_p_pauses_then_resumes_and_the_footer_follows() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.job_state == "RUNNING"
        assert "pause_job" in footer_actions(app) and "resume_job" not in footer_actions(app)
        await pilot.press("p")
        await settle(pilot)
        assert replay(app).commands == [("pause", {})]
        assert app.job_state == "PAUSED"
        assert "resume_job" in footer_actions(app) and "pause_job" not in footer_actions(app)
        await pilot.press("p")
        await settle(pilot)
        assert replay(app).commands == [("pause", {}), ("resume", {})]
        assert app.job_state == "RUNNING"
        assert "→ pause the job" in log_text(app)
        assert "✓ resume: resumed" in log_text(app)


async def test_space_toggles_the_highlighted_provider() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        second = routes(app)[1]["slug"]
        await pilot.press("j")
        assert app.highlighted_slug == second
        await pilot.press("space")
        await settle(pilot)
        assert replay(app).commands == [("exclude", {"provider": second})]
        assert cell(app, second, "status") == "- EXCL"
        assert f"✓ exclude: excluded {second}" in log_text(app)
        await pilot.press("space")
        await settle(pilot)
        assert replay(app).commands[-1] == ("include", {"provider": second})
        assert cell(app, second, "status") != "- EXCL"


async def test_x_asks_first_with_the_impact_and_cancel_is_the_default() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("x")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        body = str(app.screen.query_one("#body").render())
        serving = [p for p in routes(app) if p["allowed"] and not p["excluded"]]
        assert f"{len(serving) - 1} of {len(serving)} providers remain" in body and "of traffic moves" in body
        await pilot.press("enter")  # focus starts on Cancel
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
        await pilot.press("x", "escape")
        await pilot.pause()
        assert replay(app).commands == []
        await pilot.press("x")
        await pilot.pause()
        await pilot.press("y")
        await settle(pilot)
        assert replay(app).commands == [("exclude", {"provider": serving[0]["slug"]})]


async def test_x_on_an_excluded_provider_says_so_and_sends_nothing() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        first = app.highlighted_slug
        await pilot.press("space")
        await settle(pilot)
        assert app.highlighted_slug == first, "the cursor stays on its provider"
        await pilot.press("x")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
        assert replay(app).commands == [("exclude", {"provider": first})]
        assert any("already excluded" in n.message for n in app._notifications)


async def test_b_refuses_a_budget_below_spent() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        spent = app.latest["lanes"][0]["money"]["spent"] if app.latest else 0.0
        assert spent > 0.01
        await pilot.press("b")
        await pilot.pause()
        assert isinstance(app.screen, BudgetScreen)
        box = app.screen.query_one(Input)
        box.value = "0.01"
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, BudgetScreen)
        assert "below what is already spent" in str(app.screen.query_one("#budget-error").render())
        box.value = "75"
        await pilot.press("enter")
        await settle(pilot)
        assert replay(app).commands == [("budget", {"value": 75.0})]
        assert app.latest is not None and app.latest["lanes"][0]["money"]["budget"] == 75.0


def configured(app: RegenApp) -> int:
    assert app.latest is not None
    return budget_lane(app.latest)["concurrency"]["configured"]


async def test_plus_and_minus_step_the_concurrency() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        before = configured(app)
        step = round(before * app.options.concurrency_step)
        await pilot.press("plus")
        await settle(pilot)
        # The job answers with what it applied (it may hold the limit at its own ceiling).
        assert replay(app).commands == [("concurrency", {"value": before + step})]
        assert f"✓ concurrency: concurrency {configured(app)}" in log_text(app)
        after = configured(app)
        await pilot.press("minus")
        await settle(pilot)
        step = round(after * app.options.concurrency_step)
        assert replay(app).commands[-1] == ("concurrency", {"value": after - step})
        assert configured(app) == after - step


async def test_f_freezes_the_display_but_not_the_feed() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        slug = busiest(app)
        before = cell(app, slug, "requests")
        await pilot.press("f")
        replay(app).advance(5)
        await settle(pilot)
        assert app.frozen and "FROZEN" in status_text(app)
        assert cell(app, slug, "requests") == before
        assert app.latest is not None and app.displayed is not app.latest
        assert "thaw" in footer_actions(app)
        await pilot.press("f")
        await pilot.pause()
        assert not app.frozen
        assert cell(app, slug, "requests") != before
        assert replay(app).commands == []


async def test_readonly_refuses_every_steering_key_and_says_so() -> None:
    app = make_app(readonly=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert "READ-ONLY" in status_text(app)
        for key in ("p", "space", "x", "b", "plus", "minus"):
            await pilot.press(key)
            await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen | BudgetScreen)
        assert replay(app).commands == []
        assert any("read-only" in n.message for n in app._notifications)
        app.action_stop_job()
        await pilot.pause()
        assert not isinstance(app.screen, StopScreen)
        # The view still works.
        await pilot.press("s", "f")
        assert app.frozen


async def test_filter_sort_and_cursor_keys() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        table = app.query_one(ProvidersTable)
        # Every endpoint of the model: those serving, and those the settings keep out (listed last).
        assert table.row_count == len(routes(app)) and not all(p["allowed"] for p in routes(app))
        await pilot.press("slash", "d", "e", "e", "p")
        await pilot.pause()
        assert table.row_count == 1 and app.highlighted_slug == "deepinfra"
        await pilot.press("escape")
        await pilot.pause()
        assert table.row_count == len(routes(app))
        first = app.highlighted_slug
        await pilot.press("s")  # spent, descending
        await pilot.pause()
        providers = {p["slug"]: p for p in app.provider_rows()}
        order = table_order(table)
        # Routes the settings (or the guard) keep out stay below the others, whatever the sort.
        kept = [providers[slug]["allowed"] for slug in order]
        assert kept == sorted(kept, reverse=True)
        for allowed in (True, False):
            spent = [providers[slug]["spent"] for slug in order if providers[slug]["allowed"] is allowed]
            assert spent == sorted(spent, reverse=True)
        assert app.highlighted_slug == first, "the cursor kept its provider through the sort"
        await pilot.press(*["k"] * len(order), "j", "j", "k")
        assert app.highlighted_slug == order[1]


def palette_first_hit(app: RegenApp) -> str:
    if not isinstance(app.screen, CommandPalette):
        return ""
    hits = app.screen.query_one(CommandList)
    return str(hits.get_option_at_index(0).prompt) if hits.option_count else ""


async def wait_until(pilot: Pilot[Any], condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait for a condition the app reaches on its own timers (the palette batches its hits)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not reached"
        await pilot.pause(0.02)


def table_order(table: ProvidersTable) -> list[str]:
    from textual.coordinate import Coordinate

    return [str(table.coordinate_to_cell_key(Coordinate(i, 0))[0].value) for i in range(table.row_count)]


async def test_the_cursor_stays_on_its_provider_when_the_order_changes() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("s")  # by spent: the order moves as money comes in
        await pilot.press("j", "j")
        slug = app.highlighted_slug
        for _ in range(4):
            replay(app).advance(3)
            await settle(pilot)
            assert app.highlighted_slug == slug


async def test_enter_opens_the_provider_detail() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        failing = next(p for p in routes(app) if p["status"] == "FAIL")  # most answers cut mid-stream
        await highlight(pilot, failing["slug"])
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, ProviderDetailScreen)
        await pilot.pause()
        title = str(app.screen.query_one("#detail-title").render())
        assert f"{failing['name']} ({failing['slug']})" in title and "FAIL" in title
        assert "stream_error" in str(app.screen.query_one("#detail-errors-text").render())
        replay(app).advance(2)
        await settle(pilot)
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, ProviderDetailScreen)


async def test_e_exports_the_snapshot_on_screen(tmp_path: Path) -> None:
    app = make_app(options=ConsoleOptions(export_dir=tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("e")
        await settle(pilot)
        files = sorted(p.name for p in tmp_path.iterdir())
        assert len(files) == 3
        data = json.loads(next(tmp_path.glob("*.json")).read_text())
        assert data["state"] == "RUNNING" and len(data["lanes"][0]["providers"]) == len(routes(app))
        header = next(tmp_path.glob("*-providers.csv")).read_text().splitlines()[0]
        assert header.startswith("name,slug,status")
        assert "exported" in log_text(app) and str(tmp_path) in log_text(app)


async def test_t_cycles_the_themes() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.theme == "regen-dark"
        seen = []
        for _ in range(3):
            await pilot.press("t")
            await pilot.pause()
            seen.append(app.theme)
        assert sorted(seen) == ["regen-contrast", "regen-dark", "regen-light"]


async def test_help_lists_every_binding_with_its_current_key() -> None:
    app = make_app(options=ConsoleOptions(keymap={"pause": "P", "freeze": "F"}))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = str(app.screen.query_one("#help-text").render())
        for binding in RegenApp.BINDINGS:
            assert isinstance(binding, Binding) and binding.tooltip
            if binding.action in FLEET_ACTIONS:
                continue  # a one-backend job: listed only for two fleets (tests/console/test_fleet_keys.py)
            assert binding.tooltip.split(" (")[0] in text or binding.id in ("pause", "freeze")
        assert "Pause the job, or resume it" in text
        lines = {line.split()[0]: line for line in text.splitlines() if line.strip()}
        assert "P" in lines and "Pause the job" in lines["P"]
        assert "?" in lines and "/" in lines and "+" in lines
        await pilot.press("escape")
        await pilot.press("p")  # remapped away: nothing
        await settle(pilot)
        assert replay(app).commands == []
        await pilot.press("P")
        await settle(pilot)
        assert replay(app).commands == [("pause", {})]


async def test_stop_is_typed_and_offers_drain_or_cancel() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.action_stop_job()
        await pilot.pause()
        assert isinstance(app.screen, StopScreen)
        await pilot.press("s", "t", "o", "enter")  # not the word yet
        await pilot.pause()
        assert isinstance(app.screen, StopScreen)
        await pilot.press("p", "enter")
        await settle(pilot)
        assert replay(app).commands == [("stop", {"cancel": False})]
        assert app.job_state in ("DRAINING", "STOPPED")


async def test_stop_from_the_command_palette() -> None:
    app = make_app("sglang")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"stop job")
        await wait_until(pilot, lambda: "Stop job" in palette_first_hit(app))
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, StopScreen)
        await pilot.press(*"stop")
        await pilot.pause()
        await pilot.click("#cancel")
        await settle(pilot)
        assert replay(app).commands == [("stop", {"cancel": True})]
        assert app.job_state == "DRAINING" and "✓ stop: stopping: cancelling requests in flight" in log_text(
            app
        )


async def test_a_refused_command_goes_to_the_log_and_a_toast() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.send("budget", "budget → $0.00", value=0.0)
        await settle(pilot)
        assert "✗ budget refused: a budget of $0.00 is below what is already spent" in log_text(app)
        assert any(n.severity == "error" for n in app._notifications)


async def test_a_job_that_ends_says_so_and_steering_stops() -> None:
    app = make_app(count=None)  # the whole recording: the operator's stop, the drain, the goodbye
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.job_state == "STOPPED" and app.ended == "the job has ended"
        header, why = status_text(app).splitlines()
        assert "✗ DISCONNECTED" in header and why == "the job has ended"
        assert "disconnected: the job has ended" in log_text(app)
        await pilot.press("p")
        await pilot.pause()
        assert replay(app).commands == []
        assert any("not connected to the job (the job has ended)" in n.message for n in app._notifications)


async def test_the_end_of_the_feed_disables_steering() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        replay(app).finish()
        await pilot.pause()
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.ended is not None and "DISCONNECTED" in status_text(app)
        await pilot.press("p")
        await pilot.pause()
        assert replay(app).commands == []


async def test_narrow_terminal_drops_secondary_columns_and_tiny_shows_a_message() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        table = app.query_one(ProvidersTable)
        assert table.column_keys == [
            "status",
            "name",
            "p50",
            "ttft",
            "tps",
            "requests",
            "errors",
            "share",
            "spent",
        ]
        assert app.screen.has_class("-narrow")
        await pilot.resize_terminal(50, 12)
        await pilot.pause()
        assert app.has_class("-too-small")
        assert "needs at least 60x16" in str(app.query_one("#too-small").render())
        await pilot.resize_terminal(200, 50)
        await pilot.pause()
        assert not app.has_class("-too-small")
        assert len(table.column_keys) == 16 and "fidelity" in table.column_keys


async def test_snapshots_coalesce() -> None:
    from regen.console.messages import SnapshotArrived

    first, second = (
        SnapshotArrived(partial(Snapshot, state="RUNNING"), 1.0),
        SnapshotArrived(partial(Snapshot, state="PAUSED"), 2.0),
    )
    assert second.can_replace(first)


async def test_a_source_that_fails_to_connect_is_reported() -> None:
    class Refusing(ReplaySource):
        async def connect(self) -> Hello:
            raise ConnectionRefusedError("no job is running on /srv/regen-run")

    app = make_app(source=Refusing("openrouter"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert "no job is running" in status_text(app)
        assert any("no job is running" in n.message for n in app._notifications)


async def test_repaints_are_throttled_and_the_newest_snapshot_wins() -> None:
    app = make_app(count=1)
    app.options.repaint_interval_s = 60.0  # after make_app, which sets 0 for the other tests
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        first = app.displayed
        assert first is not None and first is app.latest
        replay(app).advance(3)
        await settle(pilot)
        assert app.displayed is first and app.latest is not first
        assert app._repaint_timer is not None
        app._show_latest()  # what the timer does when the interval has passed
        assert app.displayed is app.latest


async def test_keymap_problems_are_reported_not_fatal() -> None:
    app = make_app(options=ConsoleOptions(keymap={"no-such-action": "z", "freeze": "p"}))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("p")
        await settle(pilot)
        messages = [n.message for n in app._notifications if n.title == "Keymap"]
        assert any("unknown binding id 'no-such-action'" in m for m in messages)
        assert any("reuses p (pause)" in m for m in messages)


async def test_the_log_tails_until_scrolled_back_and_counts_what_is_new() -> None:
    from regen.console.history import LogLine

    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        log = app.query_one(EventLog)
        log.add(LogLine(0.0, "info", f"line {i}") for i in range(60))
        await pilot.pause()
        assert log.is_vertical_scroll_end and log.following
        log.scroll_home(animate=False)
        await pilot.pause()
        assert not log.following
        log.add([LogLine(0.0, "warning", "late 1"), LogLine(0.0, "error", "late 2")])
        await pilot.pause()
        assert log.scroll_y == 0 and log.border_subtitle.startswith("2 new below")
        log.scroll_end(animate=False)
        await pilot.pause()
        assert log.following and not log.border_subtitle
        small = EventLog(max_lines=10)
        await app.screen.mount(small)
        small.add(LogLine(0.0, "info", str(i)) for i in range(25))
        await pilot.pause()
        assert len(small.lines) == 10
