"""The job against the simulator over real loopback HTTP: rows, money, routing, faults, steering."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest

from regen.engine.config.settings import Settings
from regen.engine.data.jsonl import iter_jsonl
from regen.engine.job import job as job_module
from regen.engine.job.job import Job, JobError, JobState, StopReason
from regen.engine.run.checkpoint import Checkpointer
from regen.engine.run.recovery import read_journals
from regen.engine.run.segments import SEGMENTS_DIR, history
from regen.sim.openrouter.config import FAULT_CLASSES
from regen.sim.openrouter.server import OpenRouterSim
from tests.support.datasets import one_row_per_prompt, read_rows, rows_written, write_dataset
from tests.support.jobs import openrouter, run_job


async def test_every_prompt_gets_one_row_and_spend_matches_the_bill(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    a = write_dataset(tmp_path, "A", 40)
    b = write_dataset(
        tmp_path, "B", [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]] * 5
    )
    job = await run_job(make_settings(sim.base_url, [a, b]))
    assert job.outcome is not None and job.outcome.reason is StopReason.DONE and job.outcome.exit_code == 0
    assert job.state is JobState.DONE
    rows = one_row_per_prompt(a, 40)
    one_row_per_prompt(b, 5)  # identical prompts stay distinct rows
    row = rows[0]
    assert row["schema_version"] == 1 and row["backend"] == "openrouter"
    assert row["id"] == f"A-{row['line']:08d}" and len(row["prompt_sha256"]) == 64
    assert row["status"] in ("ok", "truncated") and row["provider"] and row["served_model"]
    assert row["generation_id"].startswith("gen-") and row["content"] and isinstance(row["reasoning"], str)
    assert row["cost"] > 0 and row["cost_estimated"] is False
    assert job.lanes[0].ledger.spent == sim.billing.billed_total, "spent is the exact sum of usage.cost"
    assert job.lanes[0].ledger.reserved == 0


async def test_requests_carry_the_settings_and_the_provider_object(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    a = write_dataset(tmp_path, "A", 10)
    settings = make_settings(
        sim.base_url, [a], openrouter={"provider": {"ignore": ["deepinfra"], "sort": "price"}}
    )
    await run_job(settings)
    sent = [r for r in sim.requests if r.get("model")]
    assert sent and all(r["provider"]["ignore"] == ["deepinfra"] for r in sent)
    assert all(r["max_tokens"] == 64 and r["stream"] is True for r in sent)
    assert {r["served_by"] for r in sent}.isdisjoint({"deepinfra/fp4"})


async def test_exclude_while_running_reaches_later_requests(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.time_scale = 0.05
    a = write_dataset(tmp_path, "A", 60)
    job = Job(make_settings(sim.base_url, [a], concurrency=4, openrouter={"provider": {"sort": "price"}}))
    await job.prepare()
    runner = asyncio.create_task(job.run())
    while job.lanes[0].stats.counters.rows < 5:
        await asyncio.sleep(0.01)
    served_before = {r["served_by"] for r in sim.requests if r.get("served_by")}
    assert len(served_before) == 1, "sort=price sends everything to the cheapest allowed provider"
    cheapest = served_before.pop()
    slug = cheapest.split("/")[0]
    endpoint = openrouter(job).endpoint_named(slug)
    assert endpoint is not None
    display = endpoint.provider_name
    message = job.exclude(display)
    assert f"excluded {slug}" in message
    await asyncio.sleep(0.05)  # requests already on the wire when the exclusion happened
    mark = len(sim.requests)
    await runner
    later = list(sim.requests)[mark:]
    assert later and all(slug in r["provider"].get("ignore", []) for r in later)
    assert all(r["served_by"] != cheapest for r in later)
    events = [orjson.loads(x) for x in (job.run_dir / "events.jsonl").read_bytes().splitlines()]
    assert any(e["event"] == "exclude" and e["provider"] == slug for e in events)
    one_row_per_prompt(a, 60)


async def test_excluding_the_last_provider_is_refused(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    a = write_dataset(tmp_path, "A", 1)
    job = Job(make_settings(sim.base_url, [a], openrouter={"provider": {"only": ["moonshotai"]}}))
    await job.prepare()
    with pytest.raises(JobError, match="would leave no provider"):
        job.exclude("moonshotai")
    await job.run()


async def test_pause_stops_dispatch_and_resume_goes_on(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.time_scale = 0.02
    a = write_dataset(tmp_path, "A", 80)
    job = Job(make_settings(sim.base_url, [a], concurrency=8))
    await job.prepare()
    runner = asyncio.create_task(job.run())
    while job.lanes[0].stats.counters.rows < 8:
        await asyncio.sleep(0.01)
    job.pause()
    assert job.state is JobState.PAUSED
    while job.snapshot()["in_flight"]:
        await asyncio.sleep(0.01)
    sent = sim.total_requests
    await asyncio.sleep(0.3)
    assert sim.total_requests == sent, "nothing dispatched while paused"
    job.resume()
    await runner
    assert job.outcome is not None and job.outcome.reason is StopReason.DONE
    one_row_per_prompt(a, 80)


async def test_stop_with_cancel_then_resume_completes_without_duplicates(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.time_scale = 0.05
    a = write_dataset(tmp_path, "A", 50)
    settings = make_settings(sim.base_url, [a], concurrency=16)
    job = Job(settings)
    await job.prepare()
    runner = asyncio.create_task(job.run())
    while job.lanes[0].stats.counters.rows < 10:
        await asyncio.sleep(0.01)
    job.stop(cancel=True)
    outcome = await runner
    assert outcome.reason is StopReason.OPERATOR and outcome.exit_code == 1
    done_first = len(read_rows(a))
    assert 10 <= done_first < 50
    again = await run_job(settings)
    assert again.outcome is not None and again.outcome.reason is StopReason.DONE
    one_row_per_prompt(a, 50)
    assert again.lanes[0].stats.counters.rows == 50 - done_first, "finished prompts are skipped by identity"
    # Cancelled requests with a generation id were looked up in /generation; those cancelled
    # before their headers keep their worst case, flagged: the ledger never reads below the bill.
    known = again.lanes[0].ledger.spent - again.lanes[0].ledger.estimated
    assert known <= sim.billing.billed_total <= again.lanes[0].ledger.spent


async def test_a_changed_prompt_stops_the_resume(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    a = write_dataset(tmp_path, "A", 5)
    settings = make_settings(sim.base_url, [a])
    await run_job(settings)
    lines = (a / "prompts.jsonl").read_bytes().splitlines()
    lines[3] = orjson.dumps({"messages": [{"role": "user", "content": "edited"}]})
    (a / "prompts.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(JobError, match=r"prompts.jsonl:4: prompt changed since its row was written"):
        await Job(settings).prepare()


async def test_a_prompt_edited_after_a_cached_scan_stops_the_resume_even_at_the_same_size_and_mtime(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    a = write_dataset(tmp_path, "A", 5)
    settings = make_settings(sim.base_url, [a])
    await run_job(settings)
    assert (settings.job.run_dir / "scans" / "A.scan").is_file(), "the first start kept its scan"
    prompts = a / "prompts.jsonl"
    st = prompts.stat()
    prompts.write_bytes(prompts.read_bytes().replace(b"question 3:", b"question 9:"))  # same length
    os.utime(prompts, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert prompts.stat().st_size == st.st_size
    with pytest.raises(JobError, match=r"prompts.jsonl:4: prompt changed since its row was written"):
        await Job(settings).prepare()


async def test_rows_for_lines_that_are_not_valid_prompts_stop_the_resume(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    a = write_dataset(tmp_path, "A", 5)
    settings = make_settings(sim.base_url, [a])
    await run_job(settings)
    lines = (a / "prompts.jsonl").read_bytes().splitlines()
    lines[2] = b'{"messages": "not a list"}'  # the row for line 2 now names an invalid line
    (a / "prompts.jsonl").write_bytes(b"\n".join(lines[:4]) + b"\n")  # and line 4 is gone
    with pytest.raises(
        JobError, match=r"raw_responses.jsonl: 2 rows name lines that are not valid prompts .*first: line 3"
    ):
        await Job(settings, skip_invalid=True).prepare()


async def test_a_second_job_on_the_same_run_folder_is_refused(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    a = write_dataset(tmp_path, "A", 3)
    settings = make_settings(sim.base_url, [a])
    first = Job(settings)
    await first.prepare()
    with pytest.raises(JobError, match="another regen job is running"):
        await Job(settings).prepare()
    await first.run()


async def test_a_429_storm_lowers_concurrency_and_it_recovers(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.time_scale = 0.02
    sim.config.faults = {"http_429": 0.7}
    a = write_dataset(tmp_path, "A", 600)
    job = Job(make_settings(sim.base_url, [a], concurrency=64, max_attempts=50))
    await job.prepare()
    job.lanes[0].limit.quiet_s = 0.3
    job.lanes[0].limit.cooldown_s = 0.05
    runner = asyncio.create_task(job.run())
    while job.lanes[0].limit.backoffs < 2:
        await asyncio.sleep(0.01)
    lowest = job.lanes[0].limit.effective
    assert lowest < 64
    sim.config.faults = {}
    while job.lanes[0].limit.effective < 64 and not runner.done():
        await asyncio.sleep(0.01)
    assert job.lanes[0].limit.effective == 64, "back to the configured limit once the storm passed"
    await runner
    one_row_per_prompt(a, 600)


def test_engine_never_imports_textual() -> None:
    import subprocess
    import sys

    code = (
        "import sys, regen.engine.job.job, regen.engine.control.headless, regen.sim.openrouter.server; "
        "assert not [m for m in sys.modules if m.split('.')[0] == 'textual']"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_concurrency_change_applies_while_running(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.time_scale = 0.05
    a = write_dataset(tmp_path, "A", 60)
    job = Job(make_settings(sim.base_url, [a], concurrency=32))
    await job.prepare()
    assert job.set_concurrency(10_000) == 32, "clamped to the pool the job started with"
    job.set_concurrency(3)
    runner = asyncio.create_task(job.run())
    peak = 0
    while not runner.done():
        peak = max(peak, job.snapshot()["in_flight"])
        await asyncio.sleep(0.002)
    assert peak <= 3
    with pytest.raises(JobError, match="has ended"):
        job.set_concurrency(5)


# Every fault class the simulator can inject; the non-stream body cut has its own test below.
@pytest.mark.parametrize("fault", [f for f in FAULT_CLASSES if f != "cut_nonstream_body"])
async def test_every_fault_class_ends_with_one_row_per_prompt(
    fault: str, sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.faults = {fault: 0.3}
    a = write_dataset(tmp_path, "A", 30)
    job = await run_job(make_settings(sim.base_url, [a], max_attempts=30, reconcile_timeout_s=3.0))
    assert job.outcome is not None and job.outcome.reason is StopReason.DONE, job.outcome
    rows = one_row_per_prompt(a, 30)
    assert job.lanes[0].ledger.reserved == 0
    if fault == "reasoning_exhaustion":
        assert any(r["status"] == "truncated" and r["content"] == "" and r["reasoning"] for r in rows)
    elif fault == "degenerate":
        assert any("degenerate_content" in r["flags"] for r in rows)
    elif fault == "empty_stop":  # reasoning without an answer is kept, flagged (docs/data-contract.md §4.11)
        assert any("empty_content" in r["flags"] for r in rows) or job.lanes[0].stats.counters.errors["empty"]
    elif fault in ("missing_usage", "missing_cost"):
        assert any(r["cost_estimated"] for r in rows)
    elif fault != "slow_first_token":
        assert sum(job.lanes[0].stats.counters.errors.values()) > 0, "the fault was seen and retried"
    # Money: failed attempts count too; estimates are replaced by the billed amount when known.
    if fault not in ("missing_cost", "reset_before_headers"):
        for _ in range(100):
            if job.lanes[0].ledger.estimated == 0:
                break
            await asyncio.sleep(0.05)
    assert job.lanes[0].ledger.spent >= sim.billing.billed_total or job.lanes[0].ledger.estimated > 0


async def test_non_streaming_mode(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.faults = {"cut_nonstream_body": 0.2, "error_body_200": 0.1}
    a = write_dataset(tmp_path, "A", 20)
    job = await run_job(make_settings(sim.base_url, [a], max_attempts=20, openrouter={"stream": False}))
    assert job.outcome is not None and job.outcome.reason is StopReason.DONE
    rows = one_row_per_prompt(a, 20)
    assert all(r["request"]["stream"] is False for r in rows)
    assert all(r["stream"] is False for r in sim.requests if r.get("model"))


async def test_attempt_cap_gives_up_and_exits_1(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.faults = {"http_502": 1.0}
    a = write_dataset(tmp_path, "A", 3)
    job = await run_job(make_settings(sim.base_url, [a], max_attempts=2))
    assert job.outcome is not None and job.outcome.reason is StopReason.FAILED_PROMPTS
    assert job.outcome.exit_code == 1
    assert job.outcome.message == "3 prompts failed after 2 attempts each (server); run again to retry them"
    assert read_rows(a) == []
    journal = [orjson.loads(x) for x in (job.run_dir / "attempts.jsonl").read_bytes().splitlines()]
    assert sum(1 for r in journal if r["k"] == "end") == 6
    gave_up = [r for r in journal if r["k"] == "gave_up"]
    assert [(r["attempts"], r["reason"]) for r in gave_up] == [(2, "attempts")] * 3


async def test_bad_key_stops_with_auth_and_never_echoes_it(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    a = write_dataset(tmp_path, "A", 5)
    settings = make_settings(sim.base_url, [a])
    settings.openrouter.api_key = type(settings.openrouter.api_key)("sk-or-v1-" + "wrong" * 6)  # type: ignore[misc]
    job = Job(settings)
    with pytest.raises(JobError) as info:
        await job.prepare()
    assert "wrongwrong" not in str(info.value)


async def test_no_endpoints_404_is_fatal_with_the_constraint_named(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    a = write_dataset(tmp_path, "A", 5)
    # order + no fallbacks names a provider the model does not have: the server answers 404.
    settings = make_settings(
        sim.base_url, [a], openrouter={"provider": {"order": ["nosuchprovider"], "allow_fallbacks": False}}
    )
    job = await run_job(settings)
    assert job.outcome is not None and job.outcome.reason is StopReason.FATAL
    assert (
        "order=['nosuchprovider']" in job.outcome.message and "allow_fallbacks=False" in job.outcome.message
    )
    assert sum(1 for r in sim.requests if r.get("model")) <= 64, "never retried unchanged"


async def test_credits_running_out_stops_cleanly(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.credits = 0.002
    a = write_dataset(tmp_path, "A", 200)
    job = await run_job(make_settings(sim.base_url, [a], concurrency=4))
    assert job.outcome is not None and job.outcome.reason is StopReason.CREDITS
    assert "credits" in job.outcome.message.lower()
    assert 0 < len(read_rows(a)) < 200


async def test_dataset_token_budget_stops_its_dispatch(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    a = write_dataset(tmp_path, "A", 100)
    b = write_dataset(tmp_path, "B", 10)
    job = await run_job(make_settings(sim.base_url, [a, b], concurrency=4, dataset_token_budget=200))
    assert job.outcome is not None and job.outcome.reason is StopReason.DONE
    rows_a = read_rows(a)
    tokens = sum(r["usage"]["completion_tokens"] for r in rows_a)
    assert 200 <= tokens < 200 + 4 * 64, "over by at most what was in flight"
    assert len(rows_a) < 100
    snapshot = {d["name"]: d for d in job.snapshot()["datasets"]}
    assert snapshot["A"]["state"] == "token budget"


async def test_budget_with_2000_in_flight_never_overshoots_the_bill(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    from tests.support.openrouter_sim import fast_sim_config

    server = OpenRouterSim(
        fast_sim_config(time_scale=0.2, min_completion_tokens=20, max_completion_tokens=60)
    )
    await server.start()
    try:
        a = write_dataset(tmp_path, "A", 10000)
        budget = 0.8  # room for about 8000 responses: the budget, not the prompts, ends the run
        settings = make_settings(server.base_url, [a], concurrency=2000, budget_usd=budget)
        settings.openrouter.max_tokens = 60
        job = Job(settings)
        await job.prepare()
        runner = asyncio.create_task(job.run())
        peak = 0
        while not runner.done():
            peak = max(peak, job.in_flight)
            ledger = job.lanes[0].ledger
            assert ledger.budget is not None and ledger.spent + ledger.reserved <= ledger.budget
            await asyncio.sleep(0.01)
        outcome = runner.result()
    finally:
        await server.stop()
    assert outcome.reason is StopReason.BUDGET, outcome
    assert peak >= 1500, f"only {peak} in flight"
    assert server.peak_in_flight >= 1500
    assert server.billing.billed_total <= Decimal(str(budget)), "the simulator's own ledger"
    assert job.lanes[0].ledger.spent == server.billing.billed_total
    rows = read_rows(a)
    assert len(rows) == len({r["line"] for r in rows})


async def test_a_row_written_without_its_end_record_settles_the_attempt(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    a = write_dataset(tmp_path, "A", 10)
    settings = make_settings(sim.base_url, [a])
    first = await run_job(settings)
    journal = first.run_dir / "attempts.jsonl"
    records = journal.read_bytes().splitlines()
    # A crash between the row's fsync and the end record's: the end record of one ok row is lost.
    victim = next(i for i, line in enumerate(records) if b'"k":"end"' in line and b'"outcome":"ok"' in line)
    lost = orjson.loads(records[victim])
    journal.write_bytes(b"".join(line + b"\n" for i, line in enumerate(records) if i != victim))
    again = Job(settings)
    await again.prepare()
    assert again.lanes[0].ledger.spent == first.lanes[0].ledger.spent and again.lanes[0].ledger.estimated == 0
    assert again.lanes[0].settler.breakdown.useful == first.lanes[0].settler.breakdown.useful
    await again.run()
    settled = [
        orjson.loads(x)
        for x in journal.read_bytes().splitlines()
        if orjson.loads(x).get("rid") == lost["rid"]
    ]
    # The gen record is there only when it was written before its end record took its place
    # (engine/data/jsonl.py `supersede`); the row names the handle either way.
    assert [r["k"] for r in settled] in (["start", "gen", "end"], ["start", "end"])
    assert settled[-1]["outcome"] == "ok" and settled[-1]["gen"] == lost["gen"]
    one_row_per_prompt(a, 10)


async def test_a_stalled_stream_is_abandoned_after_the_idle_limit_and_retried(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.keepalive_interval_s = 30.0
    sim.config.slow_first_token_factor = 2000.0  # first token after seconds, with no keep-alive
    sim.config.faults = {"slow_first_token": 0.3}
    a = write_dataset(tmp_path, "A", 12)
    job = await run_job(make_settings(sim.base_url, [a], max_attempts=20, openrouter={"read_timeout_s": 0.3}))
    assert job.outcome is not None and job.outcome.reason is StopReason.DONE
    one_row_per_prompt(a, 12)
    journal = [orjson.loads(x) for x in (job.run_dir / "attempts.jsonl").read_bytes().splitlines()]
    stalled = [r for r in journal if r["k"] == "end" and r.get("msg") == "no data for 0.3 s"]
    assert stalled, "the idle limit fired"


async def test_an_attempt_that_keeps_talking_is_still_abandoned_at_the_total_limit(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.keepalive_interval_s = 0.05  # keep-alive comments flow, so the idle limit never fires
    sim.config.slow_first_token_factor = 2000.0
    sim.config.faults = {"slow_first_token": 0.3}
    a = write_dataset(tmp_path, "A", 12)
    settings = make_settings(
        sim.base_url, [a], max_attempts=20, openrouter={"read_timeout_s": 10.0, "request_timeout_s": 0.5}
    )
    job = await run_job(settings)
    assert job.outcome is not None and job.outcome.reason is StopReason.DONE
    one_row_per_prompt(a, 12)
    journal = [orjson.loads(x) for x in (job.run_dir / "attempts.jsonl").read_bytes().splitlines()]
    messages = {r.get("msg") for r in journal if r["k"] == "end" and r["outcome"] != "ok"}
    assert messages == {"no complete answer within request_timeout_s (0.5 s)"}


async def test_cancel_reaches_requests_that_had_not_started_yet(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    a = write_dataset(tmp_path, "A", 300)
    job = Job(make_settings(sim.base_url, [a], concurrency=200))
    await job.prepare()
    runner = asyncio.create_task(job.run())
    while job.in_flight == 0:
        await asyncio.sleep(0)
    job.stop(cancel=True)  # most of the 200 tasks were created but have not run a line yet
    outcome = await asyncio.wait_for(runner, timeout=20)
    assert outcome.reason is StopReason.OPERATOR
    assert job.in_flight == 0 and job.lanes[0].ledger.reserved == 0
    assert all(state.in_flight == 0 for state in job.datasets.values())


async def test_a_job_stopped_and_resumed_over_compactions_writes_each_row_once_and_loses_no_money(
    sim: OpenRouterSim,
    tmp_path: Path,
    make_settings: Callable[..., Settings],
) -> None:
    sim.config.time_scale = 0.05
    a = write_dataset(tmp_path, "A", 60)
    # Every start rotates (1 byte); no checkpoint while running does (300 s).
    settings = make_settings(sim.base_url, [a], concurrency=16, journal_segment_mb=1e-6)
    for stop_at in (10, 30):
        job = Job(settings)
        await job.prepare()
        runner = asyncio.create_task(job.run())
        while rows_written(a) < stop_at:
            await asyncio.sleep(0.01)
        job.stop(cancel=True)
        assert (await runner).reason is StopReason.OPERATOR
    last = await run_job(settings)
    assert last.outcome is not None and last.outcome.reason is StopReason.DONE
    one_row_per_prompt(a, 60)
    run_dir = settings.job.run_dir
    assert len(list((run_dir / SEGMENTS_DIR).iterdir())) == 2, (
        "the second and third starts rotated the journal"
    )
    # The ledger the last start rebuilt from its checkpoint is what the whole history says.
    full = read_journals(run_dir / "attempts.jsonl", run_dir / "events.jsonl")
    ledger = last.lanes[0].ledger
    assert ledger.spent == full.spent and ledger.estimated == full.estimated
    assert ledger.spent - ledger.estimated <= sim.billing.billed_total <= ledger.spent


async def test_a_journal_rotated_while_the_job_runs_keeps_every_row_and_cent_and_stays_bounded(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    """engine/run/checkpoint.py rotate_attempts through the appender's switch, with the job writing."""
    sim.config.time_scale = 0.05
    a = write_dataset(tmp_path, "A", 240)
    limit = 16_000
    settings = make_settings(
        sim.base_url, [a], concurrency=6, checkpoint_interval_s=1, journal_segment_mb=limit / (1 << 20)
    )
    job = await run_job(settings)
    assert job.outcome is not None and job.outcome.reason is StopReason.DONE
    one_row_per_prompt(a, 240)
    run_dir = settings.job.run_dir
    parts = history(run_dir / "attempts.jsonl")
    assert len(parts) >= 3, "one start with an empty journal: every segment was rotated while it ran"
    # Each rotation waited for the next checkpoint (a second at most) past the limit.
    assert all(part.stat().st_size < 4 * limit for part in parts)
    records = [record for part in parts for _, record in iter_jsonl(part)]
    starts = [r["rid"] for r in records if r["k"] == "start"]
    assert len(starts) == len(set(starts)) and {r["rid"] for r in records if r["k"] == "end"} == set(starts)
    full = read_journals(run_dir / "attempts.jsonl", run_dir / "events.jsonl")
    assert full.spent == job.lanes[0].ledger.spent == sim.billing.billed_total > 0
    # The next start reads the last checkpoint and the fresh file only, and gets the same money.
    again = Job(settings)
    await again.prepare()
    assert again.lanes[0].ledger.spent == full.spent
    assert again.checkpoints.written == 1
    await again.run()


async def test_between_checkpoints_the_job_reads_on_and_writes_none(
    sim: OpenRouterSim,
    tmp_path: Path,
    make_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """engine/job/job.py `_checkpointing`: until a checkpoint is due the job reads on every READ_ON_S
    (what a read holds stays the prompts started since the one before: BENCHMARKS.md, "One process
    for 12 minutes"), and writes a checkpoint only when one is due or at the clean stop."""
    monkeypatch.setattr(job_module, "READ_ON_S", 0.1)
    calls: list[str] = []
    for name in ("read_on", "advance"):
        original = getattr(Checkpointer, name)

        def spy(self: Checkpointer, _original: Any = original, _name: str = name) -> Any:
            calls.append(_name)
            return _original(self)

        monkeypatch.setattr(Checkpointer, name, spy)
    sim.config.time_scale = 0.05
    a = write_dataset(tmp_path, "A", 80)
    job = await run_job(make_settings(sim.base_url, [a], concurrency=4, checkpoint_interval_s=600))
    assert job.outcome is not None and job.outcome.reason is StopReason.DONE
    one_row_per_prompt(a, 80)
    assert calls.count("read_on") >= 3, calls
    assert calls[-1] == "advance" and calls.count("advance") == 1, "while running, only the clean stop's"
    assert job.checkpoints.written == 2  # the start's (prepare) and the clean stop's
