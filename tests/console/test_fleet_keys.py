"""The two-fleet keys: P pauses or resumes one backend, d changes the deadline; every test asserts the
commands actually sent and what the job answered. The job is a real two-fleet job's recording
(tests/support/real_jobs.py, "fleets": SGLang and OpenRouter paced to a deadline), replayed."""

from __future__ import annotations

from textual.widgets import Input, OptionList

from regen.console.app import RegenApp
from regen.console.options import ConsoleOptions
from regen.console.palette import RegenCommands
from regen.console.screens import DeadlineScreen, HelpScreen, LaneScreen
from regen.console.widgets.cost import CostPane
from regen.console.widgets.fleets import FleetsPane
from regen.engine.durations import duration
from regen.engine.schema import LaneView
from tests.support.console_app import footer_actions, log_text, make_app, replay, settle
from tests.support.real_jobs import DEADLINE

SIZE = (140, 42)


def fleets_app(options: ConsoleOptions | None = None, *, readonly: bool = False) -> RegenApp:
    return make_app("fleets", options, readonly=readonly)


def pane_text(app: RegenApp, pane: str = "#fleets-pane") -> str:
    return str(app.query_one(pane, FleetsPane).render())


def lane(app: RegenApp, name: str) -> LaneView:
    assert app.latest is not None
    return next(lane for lane in app.latest["lanes"] if lane["name"] == name)


def lane_state(app: RegenApp, name: str) -> str:
    return lane(app, name)["state"]


def chooser_text(app: RegenApp) -> list[str]:
    options = app.screen.query_one(OptionList)
    return [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]


async def test_two_fleets_show_the_fleets_pane_beside_the_cost_pane() -> None:
    app = fleets_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.has_class("-fleets")
        assert app.query_one("#fleets-pane").display and app.query_one(CostPane).display
        assert not app.query_one("#fleets-strip").display
        text = pane_text(app)
        assert (
            text.index("sglang RUNNING")
            < text.index("openrouter RUNNING")
            < text.index(f"Plan deadline {DEADLINE}")
        )
        worker = lane(app, "sglang")["providers"][0]["name"][:14]  # as wide as the pane shows it
        provider = max(lane(app, "openrouter")["providers"], key=lambda p: p["requests"])["name"]
        assert "GPU-" in text and worker in text and provider in text and "ceiling" in text
        first = text.splitlines()[0]
        assert first.startswith("sglang RUNNING") and "openrouter RUNNING" in first, "side by side"


async def test_a_narrow_tall_terminal_shows_the_compact_fleets_in_the_bottom_strip() -> None:
    app = fleets_app()
    async with app.run_test(size=(100, 44)) as pilot:
        await settle(pilot)
        assert not app.query_one("#fleets-pane").display and app.query_one("#fleets-strip").display
        assert not app.query_one("#throughput-pane").display and app.query_one(CostPane).display
        text = pane_text(app, "#fleets-strip")
        assert lane(app, "sglang")["providers"][0]["name"][:14] not in text, "compact: no routes"
        paid = lane(app, "openrouter")
        limit = f"· {paid['in_flight']}/{paid['concurrency']['effective']} ≤{paid['ceiling']}"
        assert "sglang RUNNING" in text and limit in text and f"Plan deadline {DEADLINE}" in text


async def test_one_backend_keeps_the_cost_pane_and_offers_no_fleet_keys() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert not app.has_class("-fleets")
        assert app.query_one(CostPane).display
        assert not any(pane.display for pane in app.query(FleetsPane))
        assert "pause_backend" not in footer_actions(app) and "set_deadline" not in footer_actions(app)
        await pilot.press("P", "d")
        await settle(pilot)
        assert not isinstance(app.screen, LaneScreen | DeadlineScreen)
        assert replay(app).commands == []
        titles = [title for title, _, _ in RegenCommands(app.screen)._commands()]
        assert "Set deadline…" not in titles and "Pause or resume one backend…" not in titles
        assert not any("deadline" in e.description.lower() for e in app.help_entries())


async def test_shift_p_pauses_one_backend_and_the_other_runs_on() -> None:
    app = fleets_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert "pause_backend" in footer_actions(app)
        await pilot.press("P")
        await pilot.pause()
        assert isinstance(app.screen, LaneScreen)
        shown = chooser_text(app)
        assert shown[0].startswith("sglang") and "RUNNING" in shown[0] and shown[0].endswith("→ pause")
        assert shown[1].startswith("openrouter") and shown[1].endswith("→ pause")
        await pilot.press("enter")  # the first lane: sglang
        await settle(pilot)
        assert replay(app).commands == [("pause", {"backend": "sglang"})]
        assert lane_state(app, "sglang") == "paused" and lane_state(app, "openrouter") == "running"
        assert app.job_state == "RUNNING"
        assert "sglang PAUSED" in pane_text(app) and "openrouter RUNNING" in pane_text(app)
        assert "✓ pause: paused sglang: no new requests there" in log_text(app)

        # Again: the chooser says sglang is paused, and choosing it resumes it.
        await pilot.press("P")
        await pilot.pause()
        assert chooser_text(app)[0].endswith("→ resume") and "PAUSED" in chooser_text(app)[0]
        await pilot.press("enter")
        await settle(pilot)
        assert replay(app).commands[-1] == ("resume", {"backend": "sglang"})
        assert lane_state(app, "sglang") == "running"

        # The second lane, and escape sends nothing.
        await pilot.press("P")
        await pilot.pause()
        await pilot.press("down", "enter")
        await settle(pilot)
        assert replay(app).commands[-1] == ("pause", {"backend": "openrouter"})
        assert lane_state(app, "openrouter") == "paused"
        await pilot.press("P")
        await pilot.pause()
        await pilot.press("escape")
        await settle(pilot)
        assert not isinstance(app.screen, LaneScreen) and len(replay(app).commands) == 3
        assert app.job_state == "RUNNING", "the job runs on while one backend is paused"


async def test_d_sets_the_deadline_after_checking_it_with_the_jobs_rules() -> None:
    app = fleets_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("d")
        await pilot.pause()
        assert isinstance(app.screen, DeadlineScreen)
        box = app.screen.query_one(Input)
        assert box.value == DEADLINE
        box.value = "1.5h"
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, DeadlineScreen), "bad text stays in the box"
        error = str(app.screen.query_one("#deadline-error").render())
        assert "job.deadline = '1.5h': not a time of day or a duration" in error
        box.value = "90m"
        await pilot.press("enter")
        await settle(pilot)
        assert replay(app).commands == [("deadline", {"value": "90m"})]
        assert "✓ deadline: deadline " in log_text(app) and "(1h30m from now)" in log_text(app)
        assert app.latest is not None and app.latest["fleet"]["deadline"] == "90m"
        left = duration(app.latest["fleet"]["time_left_s"], "coarse")
        assert (
            left.startswith("1h")
            and "Plan deadline 90m" in pane_text(app)
            and f"{left} left" in pane_text(app)
        )

        await pilot.press("d")
        await pilot.pause()
        app.screen.query_one(Input).value = "none"
        await pilot.press("enter")
        await settle(pilot)
        assert replay(app).commands[-1] == ("deadline", {"value": "none"})
        assert "Plan no deadline: both fleets flat out" in pane_text(app)

        await pilot.press("d")
        await pilot.pause()
        await pilot.press("escape")
        await settle(pilot)
        assert len(replay(app).commands) == 2


async def test_the_jobs_refusal_of_a_deadline_is_shown_as_other_refusals() -> None:
    app = fleets_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.send("deadline", "deadline → 1.5h", value="1.5h")
        await settle(pilot)
        assert "✗ deadline refused: job.deadline = '1.5h': not a time of day or a duration" in log_text(app)
        assert any(n.severity == "error" and n.title == "deadline refused" for n in app._notifications)


async def test_the_fleet_keys_are_in_help_and_the_palette_and_remappable() -> None:
    app = fleets_app(ConsoleOptions(keymap={"deadline": "D"}))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = str(app.screen.query_one("#help-text").render())
        lines = {line.split()[0]: line for line in text.splitlines() if line.strip()}
        assert "Pause or resume one backend" in lines["P"]
        assert "Set the deadline" in lines["D"]
        await pilot.press("escape")
        titles = [title for title, _, _ in RegenCommands(app.screen)._commands()]
        assert {"Set deadline…", "Pause or resume one backend…"} <= set(titles)
        await pilot.press("d")  # remapped away
        await pilot.pause()
        assert not isinstance(app.screen, DeadlineScreen)
        await pilot.press("D")
        await pilot.pause()
        assert isinstance(app.screen, DeadlineScreen)


async def test_a_readonly_console_shows_the_fleets_but_cannot_steer_them() -> None:
    app = fleets_app(readonly=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert f"Plan deadline {DEADLINE}" in pane_text(app)
        await pilot.press("P", "d")
        await settle(pilot)
        assert not isinstance(app.screen, LaneScreen | DeadlineScreen)
        assert replay(app).commands == []
        assert any("read-only" in n.message for n in app._notifications)
