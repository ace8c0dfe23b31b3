"""The console's Textual-free parts: history, formatting, export, options, fed a real job's recorded
snapshots (tests/support/recordings.py)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from regen.console import format as fmt
from regen.console.export import export_snapshot
from regen.console.history import ERROR_LINE_EVERY_S, History, event_line, provider_status
from regen.console.options import configure_environment
from regen.console.source import JobSource
from regen.console.widgets.status import Freshness, StatusStrip
from regen.engine.schema import ProviderView, Snapshot
from tests.support.replay import ReplaySource, frames


def frame(**fields: Any) -> Snapshot:
    """A recorded snapshot of a real OpenRouter job a second in, without errors or events, `fields` over
    its top level."""
    snap = frames("openrouter", 5)[4]
    snap["errors"], snap["events"] = {}, []
    snap.update(fields)  # type: ignore[typeddict-item]
    return snap


def test_console_data_modules_do_not_import_textual() -> None:
    code = (
        "import sys, regen.console.source, regen.console.history, regen.console.options, regen.console.export, regen.console.format; "
        "assert not [m for m in sys.modules if m.split('.')[0] == 'textual']"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_formatting() -> None:
    assert fmt.clock(3725) == "1:02:05"
    assert fmt.clock(None) == "-"
    assert (
        fmt.short_duration(45) == "45s"
        and fmt.short_duration(725) == "12m05s"
        and fmt.short_duration(7300) == "2h01m"
    )
    assert fmt.count(1464.4) == "1464" and fmt.count(12_345) == "12.3k" and fmt.count(2_500_000) == "2.50M"
    assert fmt.seconds(0.85) == "850ms" and fmt.seconds(1.234) == "1.23s" and fmt.seconds(42.4) == "42s"
    assert fmt.number(True) is None and fmt.number("1") is None and fmt.number(2) == 2.0


def test_provider_status_is_the_jobs_word() -> None:
    provider = frame()["lanes"][0]["providers"][0]
    said: list[ProviderView] = [
        {**provider, "status": word} for word in ("slow", "FAIL", "EXCL", "bogus", "")
    ]
    assert [provider_status(p) for p in said] == ["SLOW", "FAIL", "EXCL", "OK", "OK"]


def test_history_windows_are_bounded_and_sampled_by_job_time() -> None:
    history = History(points=5, sample_every_s=1.0)
    played = frames("openrouter", 40)  # ten seconds of the job, four a second
    assert played[-1]["elapsed_s"] - played[0]["elapsed_s"] > 6
    for snap in played:
        history.add(snap, 0.0)
    assert len(history.output_tokens_per_s) == 5
    assert history.snapshots_seen == 40
    [lane] = played[-1]["lanes"]
    busiest = max(lane["providers"], key=lambda p: p["requests"])["slug"]
    assert len(history.providers[busiest].output_tokens_per_s) == 5
    assert history.dataset_eta_s(played[-1]["datasets"][0]) is not None


def test_error_lines_are_rate_limited_and_no_event_is_lost() -> None:
    history = History()
    for second in range(12):
        history.add(
            frame(
                elapsed_s=float(second),
                state="RUNNING",
                errors={"timeout": second},
                events=[{"ts": 1.0, "event": "pause", "source": "console"}] if second == 3 else [],
            ),
            0.0,
        )
    lines = history.take_lines()
    errors = [line for line in lines if line.text.startswith("errors")]
    assert len(errors) == 1 + (11 - 1) // int(ERROR_LINE_EVERY_S)
    assert sum(int(part.split()[0][1:]) for line in errors for part in line.text[7:].split(", ")) <= 11
    assert [line.text for line in lines if line.level == "action"] == ["paused (by console)"]
    assert history.take_lines() == []


def test_state_changes_and_budget_block_become_lines() -> None:
    history = History()
    history.add(frame(elapsed_s=0.0, state="RUNNING"), 0.0)
    history.add(frame(elapsed_s=1.0, state="PAUSED"), 0.0)
    stopped = frame(elapsed_s=2.0, state="STOPPED", outcome={"reason": "budget", "message": "budget spent"})
    [lane] = stopped["lanes"]
    lane["money"] = {**lane["money"], "blocked": True, "budget": 5}
    history.add(stopped, 0.0)
    texts = [line.text for line in history.take_lines()]
    assert texts == [
        "job RUNNING → PAUSED",
        "job PAUSED → STOPPED: budget spent",
        "budget reached: no new requests (budget $5.00)",
    ]


def test_event_lines_for_known_and_unknown_events() -> None:
    assert (
        event_line({"ts": 1, "event": "exclude", "provider": "x", "source": "console"}).text
        == "excluded x (by console)"
    )
    line = event_line({"ts": 1, "event": "crash_recovered", "attempts": 3})
    assert line.text == "crash recovered attempts=3" and line.level == "info"
    assert event_line({"event": "fatal", "reason": "credits", "message": "m"}).level == "error"


def test_export_writes_json_and_csv(tmp_path: Path) -> None:
    snap = frame()
    paths = export_snapshot(snap, tmp_path / "out", 1_750_000_000.0)
    assert [p.name for p in paths] == [
        "regen-snapshot-20250615-150640.json",
        "regen-snapshot-20250615-150640-providers.csv",
        "regen-snapshot-20250615-150640-datasets.csv",
    ]
    assert json.loads(paths[0].read_text())["model"] == "moonshotai/kimi-k2.5"
    rows = list(csv.DictReader(paths[1].open()))
    [lane] = snap["lanes"]
    assert [row["name"] for row in rows] == [p["name"] for p in lane["providers"]]
    assert len(list(csv.DictReader(paths[2].open()))) == 3


def test_configure_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "environ", dict(os.environ))  # nothing leaks into later tests
    configure_environment(fps=15, color_system="256", escape_delay_ms=25)
    assert os.environ["TEXTUAL_FPS"] == "15" and os.environ["TEXTUAL_COLOR_SYSTEM"] == "256"
    assert os.environ["ESCDELAY"] == "25"
    configure_environment(color_system="none")
    assert os.environ["NO_COLOR"] == "1"
    with pytest.raises(ValueError):
        configure_environment(fps=0)
    with pytest.raises(ValueError):
        configure_environment(color_system="16m")


def test_run_console_sets_the_environment_then_runs_without_mouse(monkeypatch: pytest.MonkeyPatch) -> None:
    from regen.console.app import RegenApp
    from regen.console.launch import run_console

    monkeypatch.setattr(os, "environ", dict(os.environ))
    runs: list[bool] = []

    def fake_run(self: RegenApp, *, mouse: bool = True) -> None:
        runs.append(mouse)

    monkeypatch.setattr(RegenApp, "run", fake_run)
    assert run_console(ReplaySource("openrouter", count=0), fps=20, no_mouse=True, color_system="256") == 0
    assert runs == [False]
    assert os.environ["TEXTUAL_FPS"] == "20" and os.environ["TEXTUAL_COLOR_SYSTEM"] == "256"


def test_the_socket_client_is_a_job_source() -> None:
    from regen.console.client import SocketSource

    source = SocketSource(Path("/nonexistent/control.sock"), readonly=True)
    assert isinstance(source, JobSource) and source.readonly


def test_events_seen_twice_are_logged_once() -> None:
    history = History()
    start = {"ts": 1.0, "seq": 1, "event": "start"}
    history.add_events([start])
    history.add(frame(elapsed_s=1.0, events=[start, {"ts": 2.0, "seq": 2, "event": "pause"}]), 0.0)
    assert [line.text for line in history.take_lines()] == ["start", "paused"]


def test_a_platform_hold_shows_in_the_header_and_the_log() -> None:
    """A real job's platform hold (a 429 with X-RateLimit-Reset), as its console received it."""
    played = frames("openrouter", 1000)
    held = next(snap for snap in played if snap["lanes"][0]["held_s"] is not None)
    strip = StatusStrip()
    strip.snapshot = held
    seconds = held["lanes"][0]["held_s"]
    assert seconds is not None and f"HELD {int(seconds)}s" in strip._markup(Freshness(1.0, 5.0))
    strip.snapshot = frame()
    assert "HELD" not in strip._markup(Freshness(1.0, 5.0))
    hold = next(e for snap in played for e in snap.get("events", []) if e["event"] == "hold")
    line = event_line(hold)
    assert line.level == "warning"
    assert line.text == f"platform rate limit: all requests wait {hold['seconds']} s ({hold['reason']})"


def test_the_header_counts_a_two_fleet_jobs_requests_in_flight_against_no_one_limit() -> None:
    """Each backend's limit is its own (the fleets pane): the header once read "in flight 18/16" for
    16 at the GPUs and 2 at OpenRouter, OpenRouter's limit under both (found by tests/integration/test_journey.py)."""
    snap: Any = frames("fleets", 21)[20]
    strip = StatusStrip()
    strip.snapshot = snap
    second = strip._markup(Freshness(1.0, 5.0)).splitlines()[1]
    assert f"in flight {snap['in_flight']} ·" in second, second
    one: Any = frames("openrouter", 21)[20]
    strip.snapshot = one
    limit = one["lanes"][0]["concurrency"]["effective"]
    assert f"in flight {one['in_flight']}/{limit}" in strip._markup(Freshness(1.0, 5.0)).splitlines()[1]


def test_a_disconnected_console_says_why_on_a_line_of_its_own() -> None:
    """However narrow the terminal, the header's second line is the reason, in full where it fits."""
    strip = StatusStrip()
    strip.snapshot = frame()
    reason = "the job went away without a goodbye (killed, or crashed: see job.log in /srv/run)"
    header, why = strip._markup(Freshness(1.0, 5.0, disconnected=reason)).splitlines()
    assert "✗ DISCONNECTED" in header and reason in why
    assert "in flight" not in why, "the figures no longer move: the line says why instead"


def test_python_m_launch_points_to_a_real_job(capsys: pytest.CaptureFixture[str]) -> None:
    from regen.console.launch import main

    assert main() == 2
    said = capsys.readouterr().err
    assert "`regen demo` runs a real one" in said and "`regen attach`" in said


async def test_the_cost_pane_names_no_cause_when_nothing_was_wasted() -> None:
    """Every waste cause is in the snapshot, each at zero here: the line is the total alone."""
    from textual.app import App, ComposeResult

    from regen.console.widgets.cost import CostPane

    class Pane(App[None]):
        def compose(self) -> ComposeResult:
            yield CostPane()

    snap = frame()
    money = snap["lanes"][0]["money"]
    for cause in money["waste"].values():
        cause["amount"], cause["tokens"] = 0.0, 0
    async with Pane().run_test(size=(80, 20)) as pilot:
        pane = pilot.app.query_one(CostPane)
        pane.show(snap)
        waste = next(line for line in pane._lines() if line.startswith("Waste"))
        assert waste.split() == ["Waste", "$0.00"], waste
        money["waste"]["retries"] = {"amount": 0.012, "tokens": 40}
        pane.show(snap)
        waste = next(line for line in pane._lines() if line.startswith("Waste"))
        assert waste.endswith("(retries $0.01)"), waste
