"""The shared dispatcher, through every backend: one row per prompt, the budget, steering, SIGKILL."""

from __future__ import annotations

import asyncio
import random
import subprocess
from pathlib import Path

import pytest

from regen.engine.job.job import Job, JobState, StopReason
from tests.support.backend_cases import BackendCase
from tests.support.datasets import one_row_per_prompt, read_rows, write_dataset
from tests.support.journals import journal
from tests.support.processes import kill_at_random_moments, regen_argv


async def test_every_prompt_gets_exactly_one_row(backend_case: BackendCase, tmp_path: Path) -> None:
    a, b = write_dataset(tmp_path, "A", 120), write_dataset(tmp_path, "B", 30)
    job = Job(backend_case.settings([a, b], concurrency=64, max_attempts=20))
    await job.prepare()
    outcome = await job.run()
    assert outcome.reason is StopReason.DONE, outcome.message
    rows = one_row_per_prompt(a, 120) + one_row_per_prompt(b, 30)
    assert {row["backend"] for row in rows} == {backend_case.name}
    assert job.lanes[0].ledger.reserved == 0
    if backend_case.unit == "usd":
        assert job.lanes[0].ledger.spent == backend_case.billed(), "spent is exactly what was billed"


async def test_the_budget_holds_at_full_concurrency(backend_case: BackendCase, tmp_path: Path) -> None:
    if backend_case.unit != "usd":
        pytest.skip(f"the {backend_case.name} ledger counts GPU time and has no budget to run into")
    a = write_dataset(tmp_path, "A", 3000)
    job = Job(backend_case.settings([a], concurrency=500, budget_usd=0.02, max_attempts=20))
    await job.prepare()
    runner = asyncio.create_task(job.run())
    peak_in_flight = 0
    while not runner.done():
        ledger = job.lanes[0].ledger
        assert ledger.budget is not None and ledger.spent + ledger.reserved <= ledger.budget
        peak_in_flight = max(peak_in_flight, job.in_flight)
        await asyncio.sleep(0.005)
    outcome = runner.result()
    assert outcome.reason is StopReason.BUDGET, outcome.message
    assert peak_in_flight > 50, "the gate was tested at a high concurrency"
    ledger = job.lanes[0].ledger
    assert ledger.budget is not None and ledger.spent <= ledger.budget
    assert job.lanes[0].ledger.spent == backend_case.billed(), "and nothing was billed past it"
    assert 0 < len(read_rows(a)) < 3000


async def test_pause_resume_drain_and_cancel(backend_case: BackendCase, tmp_path: Path) -> None:
    a = write_dataset(tmp_path, "A", 400)
    settings = backend_case.settings([a], concurrency=16, max_attempts=20)
    attempts = settings.job.run_dir / "attempts.jsonl"
    job = Job(settings)
    await job.prepare()
    runner = asyncio.create_task(job.run())
    while job.lanes[0].stats.counters.rows < 10:
        await asyncio.sleep(0.01)
    job.pause("test")
    while job.in_flight:
        await asyncio.sleep(0.01)  # paused: what was in flight finishes, nothing new goes
    starts = sum(1 for r in journal(attempts) if r["k"] == "start")
    await asyncio.sleep(0.3)
    assert sum(1 for r in journal(attempts) if r["k"] == "start") == starts, "nothing sent while paused"
    assert job.state is JobState.PAUSED
    job.resume("test")
    rows_at_resume = job.lanes[0].stats.counters.rows
    while job.lanes[0].stats.counters.rows < rows_at_resume + 10:
        await asyncio.sleep(0.01)
    while job.in_flight < 8:
        await asyncio.sleep(0.005)
    job.stop(cancel=True)
    outcome = await runner
    # job.stop() moved the state on; mypy keeps the PAUSED of the assert above.
    assert outcome.reason is StopReason.OPERATOR and job.state is JobState.STOPPED  # type: ignore[comparison-overlap]
    cancelled = [r for r in journal(attempts) if r["k"] == "end" and r["outcome"] == "cancelled"]
    assert cancelled, "requests in flight at the cancel are journaled as cancelled"
    assert len(read_rows(a)) < 400
    # Drain: a second run stopped without cancel lets what is in flight finish into rows.
    again = Job(settings)
    await again.prepare()
    runner = asyncio.create_task(again.run())
    while again.in_flight < 8:
        await asyncio.sleep(0.005)
    again.stop()
    outcome = await runner
    assert outcome.reason is StopReason.OPERATOR
    ends = journal(attempts)
    assert not [
        r for r in ends if r["k"] == "end" and r["outcome"] == "cancelled" and r["ts"] > cancelled[-1]["ts"]
    ]
    # A last run finishes the rest: every prompt once, cancelled ones re-sent.
    last = Job(settings)
    await last.prepare()
    assert (await last.run()).reason is StopReason.DONE
    one_row_per_prompt(a, 400)


def test_sigkill_then_resume_loses_and_duplicates_nothing(backend_case: BackendCase, tmp_path: Path) -> None:
    a, b = write_dataset(tmp_path, "A", 1200), write_dataset(tmp_path, "B", 300)
    settings = backend_case.settings_file([a, b], concurrency=48, max_attempts=20)
    low, high = backend_case.kill_after_s
    kills = kill_at_random_moments(settings, backend_case.env, random.Random(23), 3, low, high)
    assert kills >= 2, "the job finished too fast to be killed"
    final = subprocess.run(
        regen_argv("run", "--headless", "--settings", str(settings)),
        env=backend_case.env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert final.returncode == 0, final.stdout[-2000:] + final.stderr[-2000:]
    one_row_per_prompt(a, 1200)
    one_row_per_prompt(b, 300)
    events = journal(tmp_path / "run" / "events.jsonl")
    assert any(e.get("event") == "crash_recovered" for e in events), "a kill caught requests in flight"
    if backend_case.unit == "usd":
        from regen.engine.run.recovery import read_journals

        run_dir = tmp_path / "run"
        state = read_journals(run_dir / "attempts.jsonl", run_dir / "events.jsonl")
        billed = backend_case.billed()
        # Every attempt whose handle was journaled is settled at its bill; only those cut before any
        # handle stay at their worst case, which is never below what they cost.
        assert state.spent - state.estimates.unknowable <= billed <= state.spent
        assert state.estimates.pending == 0
