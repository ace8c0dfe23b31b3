"""One registry of actions feeds the bindings, the help screen and the palette; sparklines start at zero."""

from __future__ import annotations

from rich.color import Color
from rich.console import Console
from textual.binding import Binding

from regen.console.actions import ACTIONS, STEERING_ACTIONS, Action, palette_actions
from regen.console.app import RegenApp
from regen.console.palette import RegenCommands
from regen.console.widgets.cost import CostPane, estimate_words
from regen.console.widgets.spark import ZeroBasedBars
from regen.engine.schema import EstimateView, MoneyView, Snapshot
from tests.support.console_app import make_app, settle
from tests.support.views import partial

SIZE = (140, 40)


def render(bars: ZeroBasedBars) -> list[str]:
    console = Console(width=bars.width, color_system=None, file=open("/dev/null", "w"))  # noqa: SIM115
    with console.capture() as capture:
        console.print(bars, end="")
    return capture.get().splitlines()


def test_every_binding_comes_from_the_registry_and_steering_is_derived() -> None:
    registered = {(a.id, a.action) for a in ACTIONS if a.keys}
    bound = {(b.id, b.action) for b in RegenApp.BINDINGS if isinstance(b, Binding)}
    assert bound == registered
    assert {a.name for a in ACTIONS if a.steering} == STEERING_ACTIONS
    assert "stop_job" in STEERING_ACTIONS and all(hasattr(RegenApp, f"action_{a.name}") for a in ACTIONS)


async def test_help_and_palette_are_made_from_the_registry() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        help_text = " ".join(e.description for e in app.help_entries())
        first_of_id: dict[str, Action] = {}
        for action in ACTIONS:
            if action.keys and not action.fleets:  # a one-backend job: the fleets' keys are not listed
                first_of_id.setdefault(action.id, action)
        for action in first_of_id.values():  # a pair sharing an id and a key has one line
            assert (action.help_line or action.help) in help_text, action.id
        provider = RegenCommands(app.screen)
        titles = [title for title, _, _ in provider._commands()]
        offered = {a.palette for a in palette_actions()} & set(titles)
        # Running and not frozen: pause, not resume; freeze, not thaw; stop and budget are offered.
        assert {"Pause job", "Freeze display", "Stop job…", "Set budget…", "Keys", "Detach"} <= offered
        assert "Resume job" not in titles and "Thaw display" not in titles
        # Routes the settings keep out are not offered for steering; the others are, and one the
        # precision guard excluded (it served outside the allowlist) can be included again.
        assert app.displayed is not None
        [lane] = app.displayed["lanes"]
        serving = [p["name"] for p in lane["providers"] if p["allowed"]]
        kept_out = [p["name"] for p in lane["providers"] if not p["allowed"] and not p["excluded"]]
        guarded = [p["name"] for p in lane["providers"] if p["excluded"]]
        assert serving and kept_out and guarded == ["DeepInfra"]
        assert all(f"Exclude provider {name}…" in titles for name in serving)
        assert not any(name in t for t in titles for name in kept_out)
        assert "Include provider DeepInfra" in titles


async def test_a_backend_without_exclusions_hides_the_exclude_keys() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.check_action("exclude_provider", ()) is True
        assert app.displayed is not None
        [lane] = app.displayed["lanes"]
        lane["supports_exclude"] = False
        assert app.check_action("exclude_provider", ()) is False
        assert app.check_action("toggle_provider", ()) is False


def test_zero_looks_like_zero() -> None:
    green, red = Color.parse("green"), Color.parse("red")
    for data in ([], [0.0], [0.0] * 50):
        lines = render(ZeroBasedBars(data, width=12, height=3, low=green, high=red))
        assert len(lines) == 3
        assert lines[0].strip() == "" and lines[1].strip() == "", "nothing above the baseline"
        assert set(lines[2]) <= {"▁"}, lines
    # One point of real load is a full bar; half of the peak is half as tall.
    lines = render(ZeroBasedBars([0.0, 5.0, 10.0], width=3, height=2, low=green, high=red))
    assert lines[0] == "  █" and lines[1] == "▁██"


async def test_cost_pane_says_what_the_estimates_are() -> None:
    money = partial(
        MoneyView,
        unit="usd",
        spent=0.8402,
        confirmed=0.7905,
        estimated=0.0497,
        pending={"amount": 0.0097, "requests": 2},
        unknowable={"amount": 0.04, "requests": 3},
        reserved=0.0,
        budget=5.0,
        waste={},
    )
    words = estimate_words(money)
    assert "2 awaiting their bill" in words and "3 cut before an id: worst case kept" in words
    nothing: EstimateView = {"amount": 0.0, "requests": 0}
    assert estimate_words({**money, "pending": nothing, "unknowable": nothing}) == ""
    bounded = estimate_words({**money, "unknowable_bound": "key_usage"})
    assert "3 cut before an id: bounded by the key's usage" in bounded

    def estimates(snap: Snapshot) -> None:
        [lane] = snap["lanes"]
        lane["money"] = {**lane["money"], **money}

    app = make_app(count=1, edit=estimates)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        text = str(app.query_one(CostPane).render())
        # Bills coming apart from worst cases no bill can name (docs/money.md).
        assert "Pending         $0.01  2 awaiting their bill" in text
        assert "Unknowable      $0.04  3 cut before an id: worst case kept" in text
        assert "$0.79 billed" in text
