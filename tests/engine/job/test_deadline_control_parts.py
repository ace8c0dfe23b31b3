"""The deadline control's parts that need no simulator: in-flight seconds, the deadline journaled
and read back, the headless lines (engine/job/lanes.py, engine/run/recovery.py, engine/control/headless.py)."""

from __future__ import annotations

import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest

from regen.engine.control.headless import deadline_part, event_lines, plan_line, plan_part
from regen.engine.data.jsonl import JsonlError
from regen.engine.job.lanes import Lane
from regen.engine.money.fleetplan import RouteOffer, Work, plan_fleets
from regen.engine.money.fleetplan.pacing import verdict_words
from regen.engine.money.ledger import PER_MILLION, RoutePrice
from regen.engine.run.recovery import read_journals
from regen.engine.schema import FleetView
from tests.support.views import partial


def bare_lane() -> Lane:
    # Only the in-flight bookkeeping is exercised: the parts it does not touch stay unset.
    return Lane(None, None, None, None, None)  # type: ignore[arg-type]


def test_in_flight_seconds_integrate_the_count_over_time() -> None:
    lane = bare_lane()
    lane.fly(+1, 10.0)
    lane.fly(+1, 11.0)  # 1 in flight for 1 s
    assert lane.busy_s(13.0) == pytest.approx(1.0 + 2 * 2.0), "2 in flight for 2 s more"
    lane.fly(-1, 13.0)
    lane.fly(-1, 14.0)
    assert lane.in_flight == 0
    assert lane.busy_s(100.0) == pytest.approx(1.0 + 4.0 + 1.0), "nothing in flight adds nothing"


def write_events(path: Path, events: list[dict[str, Any]]) -> None:
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))


def test_the_first_start_and_the_last_deadline_are_read_back(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    write_events(
        events,
        [
            {"ts": 100.0, "event": "start"},
            {
                "ts": 100.5,
                "event": "deadline",
                "text": "2h",
                "at": 7300.0,
                "setting": "2h",
                "source": "settings",
            },
            {"ts": 200.0, "event": "start"},
            {
                "ts": 250.0,
                "event": "deadline",
                "text": "30m",
                "at": 2050.0,
                "setting": "2h",
                "source": "console",
            },
        ],
    )
    state = read_journals(tmp_path / "attempts.jsonl", events)
    assert state.first_start_ts == 100.0
    assert (
        state.deadline is not None
        and state.deadline["at"] == 2050.0
        and state.deadline["source"] == "console"
    )


def test_a_deadline_record_without_an_instant_is_named(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    write_events(events, [{"ts": 1.0, "event": "start"}, {"ts": 2.0, "event": "deadline", "at": "soon"}])
    with pytest.raises(JsonlError, match=r"events.jsonl:2: deadline event without an instant"):
        read_journals(tmp_path / "attempts.jsonl", events)


def fleet(**over: Any) -> FleetView:
    now = time.time()
    view: dict[str, Any] = {
        "deadline": "1h",
        "deadline_ts": now + 3600,
        "time_left_s": 3600.0,
        "steered": True,
        "ceiling": 12,
        "reason": "on track: OpenRouter 12 in flight, 400 tokens/s for 1.4M tokens by the deadline in 1h00m",
        "plan": {"reason": "the GPUs make 3.6M tokens of 5.0M tokens by the deadline (1h00m): fits"},
        "fits": True,
        "verdict": "fits",
        "eta_s": 3000.0,
    }
    view.update(over)
    return partial(FleetView, **view)


def test_the_status_line_says_the_eta_against_the_deadline() -> None:
    assert deadline_part(fleet()).endswith("in 01:00:00, ETA 00:50:00 (on time)")
    late = deadline_part(fleet(eta_s=4200.0, fits=False))
    assert "ETA 01:10:00 (00:10:00 late), CANNOT BE MET" in late
    assert "passed 00:02:00 ago" in deadline_part(fleet(time_left_s=-120.0))


def test_the_plan_line_before_the_start() -> None:
    assert plan_line(fleet()).endswith(
        "): the GPUs make 3.6M tokens of 5.0M tokens by the deadline (1h00m): fits; "
        "on track: OpenRouter 12 in flight, 400 tokens/s for 1.4M tokens by the deadline in 1h00m"
    )
    assert plan_line(fleet(deadline=None, deadline_ts=None)).startswith("plan: the GPUs make 3.6M")


def test_deadline_events_are_said_as_they_happen() -> None:
    lines = event_lines(
        [
            {"event": "steer", "ceiling": 3},
            {
                "event": "deadline_unreachable",
                "reason": "plan",
                "detail": "deadline cannot be met within the budget",
            },
            {"event": "deadline", "at": None, "source": "console"},
        ]
    )
    assert lines == [
        "deadline: cannot be met now: deadline cannot be met within the budget",
        "deadline cleared",
    ]


def planned(fits: bool = True, budget: str = "0.16", eta_s: float | None = 50.0, **over: Any) -> FleetView:
    """A fleet view with a real plan: 9,100 tokens left, the GPUs make 4,200 by the deadline (70
    tokens/s for a minute), OpenRouter carries the rest at $27/M with `budget` left; the verdict's
    words from the job's own rule beside it."""
    price = RoutePrice("cheap", Decimal(0), Decimal(27) / PER_MILLION)
    plan = plan_fleets(Work(9_100), 60.0, 70.0, (RouteOffer(price),), Decimal(budget))
    words = verdict_words(fits, plan, eta_s, 60.0)
    return fleet(
        plan=plan.to_dict(),
        time_left_s=60.0,
        deadline_ts=time.time() + 60,
        fits=fits,
        verdict=words,
        eta_s=eta_s,
        **over,
    )


def test_the_plan_said_before_the_start_is_the_plan_whether_or_not_paced() -> None:
    plan = "OpenRouter must carry 4.9k tokens for $0.13, budget left $0.16: fits"
    paced = plan_line(planned())
    assert "the GPUs make 4.2k tokens of 9.1k tokens by the deadline" in paced and plan in paced, paced
    assert paced.endswith(
        f"{plan}; on track: OpenRouter 12 in flight, 400 tokens/s for 1.4M tokens by the deadline in 1h00m"
    )
    unpaced = planned(steered=False)
    unpaced["reason"] = unpaced["plan"]["reason"]
    assert plan_line(unpaced).endswith(plan) and plan_line(unpaced).count(plan) == 1


def test_the_status_line_carries_the_plan_and_its_verdict() -> None:
    assert plan_part(planned()) == "plan GPUs 4200 tok, OpenRouter 4900 tok $0.13 (budget left $0.16): fits"
    assert plan_part(planned(fits=False, budget="0.05")).endswith("(budget left $0.05): over the budget")
    waiting = planned(fits=False)  # the live plan fits, the verdict waits for evidence
    assert plan_part(waiting).endswith(": not yet within reach")
    alone = planned()
    alone["plan"]["gpu_tokens"], alone["plan"]["gpu_tokens_per_s"], alone["plan"]["openrouter_tokens"] = (
        0,
        0.0,
        9100,
    )
    assert plan_part(alone).startswith("plan OpenRouter 9100 tok $0.13"), "no GPUs in the job: none named"


def test_fits_is_never_said_beside_a_cost_over_the_budget_left_or_an_eta_past_the_deadline() -> None:
    # The status line, 30 s after the GPUs stalled: "$0.17 (budget left $0.12): fits" and
    # "ETA 00:00:39 (00:00:19 late)". A verdict standing at "fits" (its band not yet crossed) beside
    # figures that say otherwise is said as at risk, naming the figure; it is never "fits".
    over = planned(budget="0.12", eta_s=39.0)
    assert over["fits"] and not over["plan"]["affordable"]
    line = plan_part(over)
    assert line.endswith("$0.13 (budget left $0.12): at risk: over the budget"), line
    late = planned(eta_s=79.0)
    assert late["plan"]["affordable"] and plan_part(late).endswith(": at risk: ETA past the deadline")
    for budget in ("0.05", "0.12", "0.13", "0.16", "1.00"):
        for eta in (None, 30.0, 59.0, 61.0, 300.0):
            for fits in (True, False):
                view = planned(fits=fits, budget=budget, eta_s=eta)
                plan = view["plan"]
                said = plan_part(view).rsplit(": ", 1)[-1]
                if said == "fits":
                    assert plan["budget_left"] is not None and plan["cost"] <= plan["budget_left"]
                    assert eta is None or eta <= 60.0, (budget, eta, fits)
