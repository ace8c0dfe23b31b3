"""`regen report` (docs/report.md): a run folder's journals as one self-contained HTML page.

Two real run folders, each made once for the module: a job on both fleets against the simulators
(tests/support/real_jobs.py `play("fleets")`: pauses, a deadline, OpenRouter's credits running out,
errors of many classes), run to its end in this process so its summary can be compared; and
`regen run --headless` against `regen sim openrouter` (each its own process), reported on while it
runs and again after a SIGKILL. The page is loaded in headless Chromium (Debian's package; `.ci/run`
installs it), its console read for errors and its charts counted as the browser laid them out.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from regen.engine.control.headless import summary_lines
from regen.engine.run.recovery import read_journals, read_lanes
from regen.engine.run.report_data import ReportData, read_report
from regen.engine.runtime import run as run_loop
from regen.engine.schema import Snapshot
from regen.engine.units import amount
from regen.report.page import totals_rows
from tests.support.datasets import write_dataset
from tests.support.journals import reconciled_before_end
from tests.support.openrouter_sim import SIM_KEY, openrouter_process
from tests.support.processes import ENV, regen_in_process, run_regen, settings_file, start_headless_run
from tests.support.real_jobs import play

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
JOURNALS = ("attempts.jsonl", "events.jsonl")


# ------------------------------------------------------------------------------ a finished run


@dataclass
class Finished:
    run_dir: Path
    snapshot: Snapshot
    summary: list[str]


@pytest.fixture(scope="module")
def fleets(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    root = tmp_path_factory.mktemp("fleets")
    played = run_loop(play("fleets", root))
    job = played.job
    assert job.outcome is not None
    snapshot = job.snapshot()
    return Finished(root / "run", snapshot, summary_lines(snapshot, job.outcome))


def test_the_reports_totals_are_the_summarys_figures(fleets: Finished) -> None:
    # A bill journaled before the end it corrects left its estimate pending in any replay (found by
    # this test on a loaded machine: the lookup answered while the row was being tokenized).
    assert reconciled_before_end(fleets.run_dir / "attempts.jsonl") == []
    data = read_report(fleets.run_dir, "openrouter")
    assert list(data.lanes) == ["sglang", "openrouter"]
    for lane in fleets.snapshot["lanes"]:
        totals, money = data.lanes[lane["name"]], lane["money"]
        assert (totals.rows, totals.output_tokens) == (lane["rows"], lane["output_tokens"]), lane["name"]
        assert totals.attempts == lane["attempts"] and dict(totals.errors) == lane["errors"], lane["name"]
        assert float(totals.spent) == money["spent"] and float(totals.confirmed) == money["confirmed"]
        assert float(totals.estimates.pending) == money["pending"]["amount"]
        assert totals.estimates.pending_count == money["pending"]["requests"]
        assert float(totals.estimates.unknowable) == money["unknowable"]["amount"]
        assert totals.estimates.unknowable_count == money["unknowable"]["requests"]
        breakdown = totals.breakdown
        assert float(breakdown.useful) == money["useful"] and breakdown.useful_per_m == money["useful_per_m"]
        assert breakdown.useful_tokens == money["useful_output_tokens"]
        for cause, waste in money["waste"].items():
            assert (float(breakdown.waste[cause]), breakdown.waste_tokens[cause]) == (
                waste["amount"],
                waste["tokens"],
            )
        assert float(breakdown.waste_total) == money["waste_total"]
    assert sum(t.rows for t in data.lanes.values()) == sum(d["done"] for d in fleets.snapshot["datasets"])
    # The page words each figure as the summary does: the summary's own lines hold the table's cells.
    table = dict(totals_rows(data))
    summary = "\n".join(fleets.summary)
    for index, lane in enumerate(fleets.snapshot["lanes"]):
        spent = table["spent"][index]
        assert spent == amount(lane["money"]["spent"], lane["money"]["unit"], "exact")
        assert f"  {lane['name']}: {lane['rows']} rows" in summary and spent in summary, (spent, summary)


def test_one_pass_gives_each_lane_what_recovery_gives_it(fleets: Finished) -> None:
    attempts, events = (fleets.run_dir / name for name in JOURNALS)
    together = read_lanes(attempts, events, ["sglang", "openrouter"], "openrouter")
    for lane, state in together.items():
        alone = read_journals(attempts, events, backend=lane, default="openrouter", count_attempts=False)
        assert (state.spent, state.estimates, state.excluded) == (
            alone.spent,
            alone.estimates,
            alone.excluded,
        )
        assert vars_of(state.breakdown) == vars_of(alone.breakdown)
        assert (state.crashed, state.to_reconcile, state.deadline) == (
            alone.crashed,
            alone.to_reconcile,
            alone.deadline,
        )
        assert state.first_start_ts == alone.first_start_ts is not None


def vars_of(breakdown: Any) -> dict[str, Any]:
    return {"useful": breakdown.useful, "tokens": breakdown.useful_tokens, "waste": breakdown.waste}


def test_the_report_holds_both_fleets_the_deadline_the_pauses_and_the_errors(fleets: Finished) -> None:
    data = read_report(fleets.run_dir, "openrouter")
    assert data.state == "finished" and data.end_reason is not None
    fleet = fleets.snapshot.get("fleet")
    assert fleet is not None and data.deadline == fleet["deadline_ts"]
    paused = {span.lane for span in data.spans if span.kind == "pause"}
    assert paused == {"sglang", "openrouter"}, data.spans
    assert all(span.end >= span.start for span in data.spans)
    assert {lane for lane, _ in data.latency} == {"sglang", "openrouter"}
    assert ("openrouter", "credits") in data.error_columns
    assert data.budget and data.budget[-1][1] == 5
    rows = data.bins.series(data.column("sglang", 0))[1]
    assert sum(rows) == data.lanes["sglang"].rows, "every row is in a time bin"


def test_regen_report_writes_one_self_contained_page_and_a_png_per_chart(
    fleets: Finished, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out" / "night.html"
    assert regen_in_process("report", str(fleets.run_dir), "--out", str(out)) == 0
    assert f"report: {out}" in capsys.readouterr().out
    page = out.read_text()
    charts = re.findall(r'<h2 id="([a-z]+)">', page)
    assert charts == ["throughput", "rows", "spend", "latency", "errors", "waste"]
    for name in charts:
        assert (tmp_path / "out" / f"night-{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert external_references(page) == []
    # The summary's money, as it says it, is on the page.
    for lane in fleets.snapshot["lanes"]:
        assert amount(lane["money"]["spent"], lane["money"]["unit"], "exact") in page
    if CHROMIUM is None:
        pytest.skip(
            "chromium is not installed here (.ci/run installs it): the page was not loaded in a browser"
        )
    drawn, console = browse(out)
    assert console == [f"regen report: {len(charts)} of {len(charts)} charts drawn"]
    assert drawn == len(charts)


def external_references(page: str) -> list[str]:
    """Everything the page would fetch: src and href values other than in-page anchors and data:,
    CSS url(...) and @import. The SVG namespace names (xmlns) are names, never fetched."""
    found = [
        m for m in re.findall(r'\b(?:src|href)\s*=\s*"([^"]*)"', page) if not m.startswith(("#", "data:"))
    ]
    found += re.findall(r"url\(([^)#][^)]*)\)", page) + re.findall(r"@import[^;]*", page)
    return found


def browse(page: Path) -> tuple[int | None, list[str]]:
    """Load `page` in headless Chromium with every network name unresolvable; the charts it drew
    (the page's own count) and every message its console logged."""
    assert CHROMIUM is not None
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless=new",
            "--disable-gpu",
            "--no-sandbox",
            "--no-first-run",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    console = re.findall(r':CONSOLE[^\]]*\] "(.*)", source:', done.stderr)
    drawn = re.search(r'data-charts-drawn="(\d+)"', done.stdout)
    return (int(drawn.group(1)) if drawn else None), console


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed here (.ci/run installs it)")
def test_the_browser_check_sees_a_script_error(tmp_path: Path) -> None:
    page = tmp_path / "broken.html"
    page.write_text(
        '<html><body><figure><svg width="10" height="10"></svg></figure><script>nope();</script></body></html>'
    )
    drawn, console = browse(page)
    assert drawn is None and console == ["Uncaught ReferenceError: nope is not defined"]


# ------------------------------------------------------------------------ running, then killed


@dataclass
class Killed:
    run_dir: Path
    pid: int
    running: ReportData
    running_page: str
    after: ReportData
    journals_before: dict[str, str]  # name -> sha256 after the kill, before the report
    torn: bytes


SIM = {
    "api_keys": [SIM_KEY],
    "time_scale": 0.05,
    "min_completion_tokens": 10,
    "max_completion_tokens": 60,
    "chunk_interval_s": 0.01,
    "keepalive_interval_s": 0.05,
    "generation_lookup_delay_s": 0.1,
    "retry_after_s": 0,
    "faults": {"http_502": 0.03, "cut_mid_stream": 0.03},
    "seed": 21,
}


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Killed:
    root = tmp_path_factory.mktemp("killed")
    run_dir = root / "run"
    with openrouter_process(root, SIM) as base_url:
        data = write_dataset(root, "A", 3000)
        settings = settings_file(root, base_url, [data], concurrency=16)
        proc = start_headless_run(settings, root / "job.log", env={**ENV, "OPENROUTER_API_KEY": SIM_KEY})
        try:
            wait_for_ends(run_dir / "attempts.jsonl", 60, proc, root / "job.log")
            running = read_report(run_dir, "openrouter")
            live = run_regen("report", str(run_dir), "--out", str(root / "live" / "report.html"), timeout=120)
            assert live.returncode == 0, live.stderr
            assert proc.poll() is None, "the job was still running while it was reported on"
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    # What a SIGKILL in the middle of a write leaves: a last line without its newline.
    torn = b'{"k":"start","rid":"A-00002999#0","ds":"A","li'
    with open(run_dir / "attempts.jsonl", "ab") as f:
        f.write(torn)
    before = {name: sha(run_dir / name) for name in JOURNALS}
    after = read_report(run_dir, "openrouter")
    return Killed(
        run_dir, proc.pid, running, (root / "live" / "report.html").read_text(), after, before, torn
    )


def wait_for_ends(journal: Path, ends: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    import time

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if journal.exists() and journal.read_bytes().count(b'"k":"end"') >= ends:
            return
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.05)
    raise AssertionError(f"fewer than {ends} attempts ended:\n{log.read_text()[-3000:]}")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_running_job_is_reported_as_a_snapshot_of_now(killed: Killed) -> None:
    running = killed.running
    assert running.state == "running" and f"pid {killed.pid}" in running.state_detail
    lane = running.lanes["openrouter"]
    assert lane.rows > 0 and lane.spent > 0
    assert lane.open_attempts > 0, "attempts in flight when it was read"
    assert "running</span>" in killed.running_page and f"pid {killed.pid}" in killed.running_page
    assert killed.after.lanes["openrouter"].attempts >= lane.attempts


def test_a_run_cut_by_sigkill_is_reported_from_what_its_journals_hold(killed: Killed, tmp_path: Path) -> None:
    after = killed.after
    assert after.state == "cut short" and after.end_reason is None
    # The report wrote nothing: the torn last line is still there for the next start to cut.
    assert {name: sha(killed.run_dir / name) for name in JOURNALS} == killed.journals_before
    assert (killed.run_dir / "attempts.jsonl").read_bytes().endswith(killed.torn)
    # Its money is what the next start rebuilds (on a copy: recovery cuts the torn line).
    copy = tmp_path / "copy"
    shutil.copytree(killed.run_dir, copy, ignore=shutil.ignore_patterns("*.sock", "job.lock"))
    state = read_journals(
        copy / "attempts.jsonl", copy / "events.jsonl", backend="openrouter", default="openrouter"
    )
    lane = after.lanes["openrouter"]
    assert (lane.spent, lane.estimates, lane.open_attempts) == (
        state.spent,
        state.estimates,
        len(state.crashed),
    )
    assert lane.breakdown.useful == state.breakdown.useful and lane.breakdown.waste == state.breakdown.waste
    assert lane.open_attempts > 0, "the kill cut attempts in flight"


def test_regen_report_says_in_one_line_what_is_not_a_run_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert regen_in_process("report", str(tmp_path / "nowhere")) == 2
    said = capsys.readouterr().err
    assert (
        said
        == f"regen: {tmp_path / 'nowhere'}: no such run folder (give RUN_DIR, or set job.run_dir in settings)\n"
    )
    assert regen_in_process("report", str(tmp_path)) == 1
    assert "no journals" in capsys.readouterr().err
    (tmp_path / "attempts.jsonl").write_text('{"k": "end"}\n')
    assert regen_in_process("report", str(tmp_path)) == 1
    said = capsys.readouterr().err
    assert (
        said.startswith(f"regen: {tmp_path / 'attempts.jsonl'}:1: end record without a request id")
        and said.count("\n") == 1
    )
