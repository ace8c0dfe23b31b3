"""The console's Textual-free parts: history, formatting, export, options, the scripted source."""

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
from regen.console.scripted import ScriptedSource, SimulatedJob
from regen.console.source import JobSource
from regen.console.widgets.status import Freshness, StatusStrip
from regen.engine.control.server import PROTOCOL_VERSION
from regen.engine.run.state import JobError
from regen.engine.schema import Snapshot


def frame(**fields: Any) -> Snapshot:
    """A snapshot of the scripted job one second in, without errors or events, `fields` over its top level."""
    job = SimulatedJob(1)
    job.step(1.0)
    snap = job.snapshot()
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
    assert fmt.money(12.345) == "$12.35" and fmt.money(12_345) == "$12,345"
    assert fmt.money_short(123.4) == "$123" and fmt.money_short(5.5) == "$5.50"
    assert fmt.seconds(0.85) == "850ms" and fmt.seconds(1.234) == "1.23s" and fmt.seconds(42.4) == "42s"
    assert fmt.number(True) is None and fmt.number("1") is None and fmt.number(2) == 2.0


def test_provider_status_is_the_jobs_word() -> None:
    provider = frame()["lanes"][0]["providers"][0]
    said = [{**provider, "status": word} for word in ("slow", "FAIL", "EXCL", "bogus", "")]
    assert [provider_status(p) for p in said] == ["SLOW", "FAIL", "EXCL", "OK", "OK"]


def test_history_windows_are_bounded_and_sampled_by_job_time() -> None:
    history = History(points=5, sample_every_s=1.0)
    job = SimulatedJob(1)
    for _ in range(40):
        job.step(0.5)
        history.add(job.snapshot(), 0.0)
    assert len(history.output_tokens_per_s) == 5
    assert history.snapshots_seen == 40
    assert len(history.providers["fireworks"].output_tokens_per_s) == 5
    snap = job.snapshot()
    assert history.dataset_eta_s(snap["datasets"][0]) is not None


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
    job = SimulatedJob(2)
    job.step(1.0)
    snap = job.snapshot()
    paths = export_snapshot(snap, tmp_path / "out", 1_750_000_000.0)
    assert [p.name for p in paths] == [
        "regen-snapshot-20250615-150640.json",
        "regen-snapshot-20250615-150640-providers.csv",
        "regen-snapshot-20250615-150640-datasets.csv",
    ]
    assert json.loads(paths[0].read_text())["model"] == "moonshotai/kimi-k2.5"
    rows = list(csv.DictReader(paths[1].open()))
    assert len(rows) == 8 and rows[0]["name"] == "AtlasCloud"
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


async def test_scripted_source_plays_holds_and_applies_commands() -> None:
    source = ScriptedSource(seed=5, count=3)
    assert isinstance(source, JobSource)
    hello = await source.connect()
    assert hello["protocol"] == PROTOCOL_VERSION and hello["job"]["model"] == "moonshotai/kimi-k2.5"
    frames = []
    stream = source.snapshots()
    for _ in range(3):
        frames.append(await anext(stream))
    assert [f["elapsed_s"] for f in frames] == [1.0, 2.0, 3.0]
    result = await source.command("pause")
    assert result == {"ok": True, "message": "paused: no new requests; those in flight finish"}
    paused = await anext(stream)
    assert paused["state"] == "PAUSED" and [e["event"] for e in paused["events"]] == ["pause"]
    refused = await source.command("exclude", provider="nobody")
    assert refused["ok"] is False
    await anext(stream)
    source.finish()
    with pytest.raises(StopAsyncIteration):
        await anext(stream)
    assert source.commands == [("pause", {}), ("exclude", {"provider": "nobody"})]


async def test_scripted_source_plays_given_frames_and_readonly_refuses() -> None:
    source = ScriptedSource(
        [{"state": "RUNNING", "elapsed_s": 1.0}, {"state": "DONE", "elapsed_s": 2.0}], count=2, readonly=True
    )
    stream = source.snapshots()
    assert [(await anext(stream))["state"] for _ in range(2)] == ["RUNNING", "DONE"]
    assert (await source.command("pause"))["ok"] is False
    assert source.commands == [("pause", {})]


def test_the_simulated_job_is_reproducible_and_refuses_like_the_job() -> None:
    a, b = SimulatedJob(9), SimulatedJob(9)
    for _ in range(10):
        a.step(1.0)
        b.step(1.0)
    assert a.snapshot() == b.snapshot()
    with pytest.raises(JobError, match="below what is already spent"):
        a.command("budget", {"value": 0.0})
    for slug in ("chutes", "deepinfra", "fireworks", "novita", "parasail"):
        a.command("exclude", {"provider": slug})
    with pytest.raises(JobError, match="would leave no provider"):
        a.command("exclude", {"provider": "together"})


def test_run_console_sets_the_environment_then_runs_without_mouse(monkeypatch: pytest.MonkeyPatch) -> None:
    from regen.console.app import RegenApp
    from regen.console.launch import run_console

    monkeypatch.setattr(os, "environ", dict(os.environ))
    runs: list[bool] = []

    def fake_run(self: RegenApp, *, mouse: bool = True) -> None:
        runs.append(mouse)

    monkeypatch.setattr(RegenApp, "run", fake_run)
    assert run_console(ScriptedSource(count=0), fps=20, no_mouse=True, color_system="256") == 0
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
    strip = StatusStrip()
    strip.snapshot = frame()
    strip.snapshot["lanes"][0]["held_s"] = 42.5
    assert "HELD 42s" in strip._markup(Freshness(1.0, 5.0))
    strip.snapshot["lanes"][0]["held_s"] = None
    assert "HELD" not in strip._markup(Freshness(1.0, 5.0))
    line = event_line({"ts": 1, "event": "hold", "seconds": 42.5, "reason": "free-models-per-min"})
    assert line.level == "warning"
    assert line.text == "platform rate limit: all requests wait 42.5 s (free-models-per-min)"
