"""The fleets pane's lines, from views made for each case and from a real two-fleet job's snapshot."""

from __future__ import annotations

from typing import Any

from regen.console import format as fmt
from regen.console.widgets.fleets import fleet_lines, lane_lines, plan_lines, route_lines, shows_fleets
from regen.engine.durations import duration
from regen.engine.schema import FleetView, LaneView, MoneyView, ProviderView, Snapshot
from tests.support.replay import frames
from tests.support.views import partial

EPOCH = 1_750_000_000.0  # a fixed instant the views' times are set from


def route(name: str, requests: int, share: float, status: str = "OK") -> ProviderView:
    return partial(ProviderView, name=name, slug=name.lower(), requests=requests, share=share, status=status)


def lane(name: str, unit: str, **fields: Any) -> LaneView:
    view: dict[str, Any] = {
        "name": name,
        "unit": unit,
        "state": "running",
        "reason": None,
        "rows": 1200,
        "rows_share": 0.6,
        "output_tokens": 2_400_000,
        "in_flight": 17,
        "concurrency": {"configured": 200, "effective": 180},
        "ceiling": None,
        "rates": {"output_tokens_per_s": 850.0},
        "money": {"unit": unit, "spent": 7200.0 if unit == "gpu_s" else 12.5},
        "providers": [],
    }
    view.update(fields)
    return partial(LaneView, **view)


def fleet(**fields: Any) -> FleetView:
    view: dict[str, Any] = {
        "deadline": "12h",
        "deadline_ts": EPOCH + 12 * 3600,
        "time_left_s": 3 * 3600 + 30 * 60,
        "steered": True,
        "ceiling": 28,
        "reason": "on track: OpenRouter 28 in flight, 840 tokens/s for 12.1M tokens by the deadline in 3h30m",
        "plan": {},
        "fits": True,
        "verdict": "fits",
        "eta_s": 3 * 3600 + 10 * 60,
        "gpu_tokens_per_s": 2400.0,
        "openrouter_tokens_per_s": 840.0,
        "request_tokens_per_s": 30.0,
        "aim_tokens_per_s": 840.0,
        "projected_usd": 36.96,
    }
    view.update(fields)
    return partial(FleetView, **view)


# ------------------------------------------------------------------------------------- format


def test_spans_and_the_eta_against_the_deadline() -> None:
    assert [duration(s, "coarse") for s in (None, -1, 45, 20 * 60, 3 * 3600 + 10 * 60, 7200)] == [
        "-",
        "-",
        "45s",
        "20m",
        "3h10m",
        "2h",
    ]
    assert fmt.against_deadline(3 * 3600 + 600, 3 * 3600 + 1800) == (
        "ETA 3h10m, 20m before the deadline",
        False,
    )
    assert fmt.against_deadline(3600 + 42 * 60, 3600) == ("ETA 1h42m, 42m after the deadline", True)
    assert fmt.against_deadline(600, None) == ("ETA 10m", False)
    assert fmt.against_deadline(None, 600)[1] is False


# ---------------------------------------------------------------------------------- the lanes


def test_a_job_shows_the_fleets_with_several_lanes_or_a_fleet_view() -> None:
    assert not shows_fleets(None)
    assert not shows_fleets(partial(Snapshot, lanes=[lane("openrouter", "usd")]))
    assert shows_fleets(partial(Snapshot, lanes=[lane("sglang", "gpu_s"), lane("openrouter", "usd")]))
    assert shows_fleets(partial(Snapshot, lanes=[lane("openrouter", "usd")], fleet=fleet()))


def test_a_dollar_lane_shows_dollars_its_limit_and_the_ceiling() -> None:
    lines = lane_lines(lane("openrouter", "usd", ceiling=28))
    assert lines[0] == "[b]openrouter[/] [b $success]RUNNING[/] 1200 rows 60%"
    assert lines[1] == "  2.40M tok · 850 tok/s · $12.50"
    assert lines[2] == "  in flight 17/180 · ceiling 28"


def test_a_gpu_lane_shows_gpu_hours_and_no_ceiling_when_there_is_none() -> None:
    lines = lane_lines(lane("sglang", "gpu_s", state="paused"))
    assert "[b $warning]PAUSED[/]" in lines[0]
    assert lines[1].endswith("· 2.00 GPU-h")
    assert lines[2] == "  in flight 17/180"


def test_a_lane_that_is_not_running_says_why() -> None:
    lines = lane_lines(lane("sglang", "gpu_s", state="out", reason="gpu-a: connection refused"))
    assert "[b $error]OUT[/]" in lines[0]
    assert lines[1] == "  [$warning]gpu-a: connection refused[/]"


def test_the_busiest_routes_first_and_the_rest_counted() -> None:
    routes = [
        route("Chutes", 3, 0.05),
        route("DeepInfra", 40, 0.5),
        route("Idle", 0, 0.0),
        route("Novita", 12, 0.2),
    ]
    routes += [route("Fireworks", 25, 0.3, "SLOW")]
    lines = route_lines(lane("openrouter", "usd", providers=routes), top=3)
    names = [line.split("[/]")[1].split()[0] for line in lines[:3]]
    assert names == ["DeepInfra", "Fireworks", "Novita"]
    assert "SLOW" in lines[1] and "25 req" in lines[1] and "30%" in lines[1]
    assert lines[3] == "  [$text-muted]+1 more[/]"  # Chutes; a route without requests is not counted
    assert len(lines) == 4


# ----------------------------------------------------------------------------------- the plan


def test_the_plan_ahead_of_the_deadline_and_within_the_budget() -> None:
    lines = plan_lines(fleet(), partial(MoneyView, unit="usd", budget=100.0), width=40)
    assert lines[0] == "[b]Plan[/] deadline 12h (03:06) · 3h30m left"
    assert lines[1] == "  ETA 3h10m, 20m before the deadline"
    assert lines[2] == "  [b $success]fits[/] · projected $36.96 of $100.00"
    assert lines[3] == "  GPU 2400 tok/s · OpenRouter 840 tok/s"
    assert lines[4] == "  ceiling 28 in flight · aims 840 tok/s"
    assert lines[5].startswith("  [$text-muted]on track: OpenRouter 28 in flight,")


def test_a_wide_pane_puts_the_plan_on_fewer_lines() -> None:
    lines = plan_lines(fleet(), partial(MoneyView, unit="usd", budget=100.0), width=92)
    assert lines[0] == "[b]Plan[/] deadline 12h (03:06) · 3h30m left · ETA 3h10m, 20m before the deadline"
    assert (
        lines[1]
        == "  [b $success]fits[/] · projected $36.96 of $100.00 · GPU 2400 tok/s · OpenRouter 840 tok/s"
    )
    assert lines[2] == "  ceiling 28 in flight · aims 840 tok/s"
    assert lines[3] == f"  [$text-muted]{fleet()['reason']}[/]"
    assert len(lines) == 4


def test_a_late_plan_is_in_the_warning_colour_and_one_that_does_not_fit_in_red() -> None:
    late = fleet(
        eta_s=3 * 3600 + 72 * 60,
        fits=False,
        verdict="over the budget",
        projected_usd=130.0,
        ceiling=None,
        aim_tokens_per_s=None,
    )
    lines = plan_lines(late, partial(MoneyView, unit="usd", budget=100.0), width=120)
    assert lines[0].endswith(" · [b $warning]ETA 4h12m, 42m after the deadline[/]")
    assert lines[1].startswith(
        "  [b $error]over the budget[/] · projected $130.00 of $100.00 [b $budget-warn]over by $30.00[/]"
    )
    assert lines[1].endswith(" · GPU 2400 tok/s · OpenRouter 840 tok/s")
    assert lines[2] == "  ceiling none: flat out"
    # In a pane too narrow for both, the money goes on the next line.
    narrow = plan_lines(late, partial(MoneyView, unit="usd", budget=100.0), width=40)
    assert narrow[1] == "  [b $warning]ETA 4h12m, 42m after the deadline[/]"
    assert narrow[2] == "  [b $error]over the budget[/]"
    assert narrow[3] == "  projected $130.00 of $100.00 [b $budget-warn]over by $30.00[/]"


def test_without_a_deadline_and_after_it() -> None:
    no_deadline = fleet(deadline=None, deadline_ts=None, time_left_s=None)
    free = plan_lines(no_deadline, partial(MoneyView, unit="usd", budget=None), width=40)
    assert free[0] == "[b]Plan[/] no deadline: both fleets flat out"
    assert free[1] == "  ETA 3h10m · [b $success]fits[/] · projected $36.96"
    passed = plan_lines(fleet(time_left_s=-125.0), partial(MoneyView, unit="usd", budget=None), width=40)
    assert passed[0] == "[b]Plan[/] deadline 12h (03:06) [b $warning]passed 2m ago[/]"


def test_the_reason_wraps_to_the_width_and_is_bounded() -> None:
    long = fleet(reason=" ".join(["word"] * 80))
    lines = plan_lines(long, partial(MoneyView, unit="usd", budget=None), width=40)
    reason = [line for line in lines if line.startswith("  [$text-muted]")]
    assert len(reason) == 3
    assert all(len(line) - len("  [$text-muted][/]") <= 38 for line in reason)


def test_markup_in_names_is_escaped() -> None:
    lines = lane_lines(lane("[b]x", "usd", providers=[route("[red]evil", 5, 1.0)]))
    assert lines[0].startswith("[b]\\[b]x[/]")
    assert "\\[red]evil" in lines[3]


# ------------------------------------------------------------------------------ a real job's


def test_a_real_two_fleet_snapshot_reads_in_the_jobs_order() -> None:
    """What a real job on both fleets sent (tests/support/real_jobs.py "fleets"), as the pane lays it out."""
    snap: Any = frames("fleets", 21)[20]
    assert [lane["name"] for lane in snap["lanes"]] == ["sglang", "openrouter"]
    gpu, paid = snap["lanes"]
    assert gpu["unit"] == gpu["money"]["unit"] == "gpu_s" and gpu["money"]["budget"] is None
    assert paid["unit"] == "usd" and paid["money"]["budget"] == 5.0
    assert gpu["rows"] > 0 and paid["rows"] > 0 and gpu["rows"] + paid["rows"] == snap["rows"]
    # OpenRouter keeps under the deadline controller's ceiling.
    assert paid["ceiling"] == snap["fleet"]["ceiling"] is not None
    text = "\n".join(fleet_lines(snap))
    assert text.index("[b]sglang[/]") < text.index("[b]openrouter[/]") < text.index("[b]Plan[/]")
    assert f"ceiling {paid['ceiling']}" in text and "GPU-" in text
