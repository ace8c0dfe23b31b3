"""SGLang failures as the job meets them: cancel and abort, a 503 storm, dropped streams, server
aborts, a bad prompt, and the server gone and back."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import orjson

from regen.engine.backends.base import Standalone
from regen.engine.config.settings import Settings
from regen.engine.job.job import Job, StopReason
from regen.engine.run.records import start_record
from regen.sim.sglang.tokens import SimTokenizer
from tests.support.datasets import one_row_per_prompt, read_rows, write_dataset
from tests.support.journals import journal
from tests.support.recording_sim import RecordingSim, recording_sim, sim_config, slow_config


async def wait_for(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_stop_cancel_aborts_every_rid_in_flight(
    sim_tok: SimTokenizer, sglang_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    async with recording_sim(slow_config(), sim_tok) as server:
        data = write_dataset(tmp_path, "A", 60)
        settings = sglang_settings([server.base_url], [data], concurrency=16)
        job = Job(settings)
        await job.prepare()
        runner = asyncio.create_task(job.run())
        await wait_for(lambda: job.in_flight == 16 and server.state()["running"] >= 16)
        # What `regen stop --cancel` sends over the control socket.
        await job.handle_command("stop", {"cancel": True}, "test")
        outcome = await runner
        assert outcome.reason is StopReason.OPERATOR
        cancelled = {
            r["rid"]
            for r in journal(settings.job.run_dir / "attempts.jsonl")
            if r["k"] == "end" and r["outcome"] == "cancelled"
        }
        assert len(cancelled) == 16
        assert cancelled <= set(server.abort_calls), "an /abort_request for every cancelled rid"
        await wait_for(lambda: cancelled <= set(server.served))
        assert all(server.served[rid]["finish"]["type"] == "abort" for rid in cancelled)
        assert not server.scheduler.live, "nothing is left generating on the server"
    assert read_rows(data) == [] or all(row["generation_id"] not in cancelled for row in read_rows(data))


async def test_a_503_storm_lowers_the_concurrency_and_every_prompt_still_gets_its_row(
    sim_tok: SimTokenizer, sglang_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    async with recording_sim(sim_config(faults={"http_503_rate": 0.5}), sim_tok) as server:
        data = write_dataset(tmp_path, "S", 300)
        settings = sglang_settings(
            [server.base_url], [data], concurrency=64, min_concurrency=4, max_attempts=60
        )
        job = Job(settings)
        await job.prepare()
        runner = asyncio.create_task(job.run())
        lowest = 64
        while not runner.done():
            lowest = min(lowest, job.lanes[0].limit.current)
            await asyncio.sleep(0.005)
        assert runner.result().reason is StopReason.DONE
        assert lowest < 64 and job.lanes[0].limit.backoffs > 0
        assert job.snapshot()["errors"]["overloaded"] > 0
    one_row_per_prompt(data, 300)
    ends = [
        r
        for r in journal(settings.job.run_dir / "attempts.jsonl")
        if r["k"] == "end" and r["outcome"] == "overloaded"
    ]
    assert ends and all(r["http"] == 503 for r in ends)


async def test_dropped_streams_and_server_aborts_are_retried_into_one_row(
    sim_tok: SimTokenizer, sglang_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    faults = {"drop_rate": 0.25, "abort_rate": 0.25, "fault_position": 0.5}
    async with recording_sim(sim_config(faults=faults), sim_tok) as server:
        data = write_dataset(tmp_path, "D", 120)
        settings = sglang_settings([server.base_url], [data], concurrency=24, max_attempts=40)
        job = Job(settings)
        await job.prepare()
        assert (await job.run()).reason is StopReason.DONE
        injected = server.faults_injected
        assert injected.get("drop", 0) > 5 and injected.get("abort", 0) > 5
        outcomes = Counter(
            r["outcome"] for r in journal(settings.job.run_dir / "attempts.jsonl") if r["k"] == "end"
        )
        assert outcomes["network"] >= 1 and outcomes["abort"] >= 1
        cut = {
            r["rid"]
            for r in journal(settings.job.run_dir / "attempts.jsonl")
            if r["k"] == "end" and r["outcome"] == "network"
        }
        # A stream cut mid-way may still be generating on the server: its rid is aborted there.
        assert cut & set(server.abort_calls)
    rows = one_row_per_prompt(data, 120)
    for row in rows:
        assert server.served[row["generation_id"]]["output_ids"] == row["output_ids"]
    # A failed attempt used the GPU too: its share is in the ledger, as waste.
    assert job.lanes[0].settler.breakdown.waste["retries"] > 0


async def test_a_prompt_longer_than_the_context_is_given_up_at_once_and_said_so(
    sim_tok: SimTokenizer, sglang_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    async with recording_sim(sim_config(context_length=400), sim_tok) as server:
        prompts = [[{"role": "user", "content": f"short {i}"}] for i in range(6)]
        prompts[3] = [{"role": "user", "content": "long " * 600}]
        data = write_dataset(tmp_path, "L", prompts)
        settings = sglang_settings([server.base_url], [data])
        job = Job(settings)
        await job.prepare()
        outcome = await job.run()
    assert outcome.reason is StopReason.FAILED_PROMPTS
    assert sorted(row["line"] for row in read_rows(data)) == [0, 1, 2, 4, 5]
    [gave_up] = [r for r in journal(settings.job.run_dir / "attempts.jsonl") if r["k"] == "gave_up"]
    assert gave_up["line"] == 3 and gave_up["attempts"] == 1 and "exceed the 400 tokens" in gave_up["why"]
    assert gave_up["reason"] == "over_context", "refused before it was sent (docs/sglang.md §11.5)"
    # The last line says what the journal says: one attempt, a refusal a rerun cannot fix, the line.
    assert outcome.message.startswith(
        "1 prompt longer than the model's context after 1 attempt, which a rerun cannot fix: L line 3 ("
    ), outcome.message
    assert outcome.message.endswith("); change it first") and "exceed the 400 tokens" in outcome.message
    assert "run again" not in outcome.message and "6 attempts" not in outcome.message


async def test_the_server_gone_holds_dispatch_and_its_return_ends_the_outage(
    sim_tok: SimTokenizer, sglang_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    data = write_dataset(tmp_path, "O", 200)
    async with recording_sim(sim_config(), sim_tok) as first:
        port = first.port
        settings = sglang_settings([first.base_url], [data], concurrency=8, max_attempts=3)
        job = Job(settings)
        await job.prepare()
        runner = asyncio.create_task(job.run())
        await wait_for(lambda: job.lanes[0].stats.counters.rows >= 20)
    # The server is gone: connections are refused, attempts give their attempt back, dispatch holds.
    await wait_for(lambda: job.lanes[0].outage is not None)
    await asyncio.sleep(0.5)
    assert job.snapshot()["lanes"][0]["outage_s"] is not None
    async with recording_sim(sim_config(), sim_tok, port=port) as second:
        assert (await runner).reason is StopReason.DONE, "no prompt ran out of attempts in the outage"
        assert second.served
    one_row_per_prompt(data, 200)
    unsent = [
        r
        for r in journal(settings.job.run_dir / "attempts.jsonl")
        if r["k"] == "end" and r.get("sent") is False
    ]
    assert unsent and all(r["cost"] == "0" and r["outcome"] == "unreachable" for r in unsent)
    events = [e["event"] for e in journal(settings.job.run_dir / "events.jsonl")]
    assert "outage" in events and "outage_end" in events


async def test_cancel_of_an_attempt_sends_its_abort_without_holding_up_the_close(
    sim: RecordingSim, sglang_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    """The backend on its own: a cancelled attempt's abort goes out in the background."""
    from regen.engine.backends.sglang.backend import SGLangBackend
    from regen.engine.data.datasets import Prompt

    backend = SGLangBackend(sglang_settings([sim.base_url], []))
    await backend.open(Standalone())
    sim.apply_config(
        sim.config.model_copy(update={"time_scale": 1.0, "output_len_min": 200, "output_len_max": 300})
    )
    prompt = Prompt("A", 0, "0" * 64, [{"role": "user", "content": "hello"}])
    handles: list[str | None] = []
    task = asyncio.create_task(backend.attempt(prompt, "A-00000000#0", handles.append, lambda _: None))
    await wait_for(
        lambda: "A-00000000#0" in sim.scheduler.live and bool(sim.scheduler.live["A-00000000#0"].output_ids)
    )
    assert handles == ["A-00000000#0"], "the rid is journaled before the request leaves"
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await backend.close()
    assert sim.abort_calls == ["A-00000000#0"]
    assert backend.workers[0].meter.in_flight == 0


async def test_an_attempt_is_journaled_by_its_rid_alone_and_a_crash_is_settled_by_it(
    sim: RecordingSim, sglang_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    """An SGLang attempt's handle is its rid, which the start record names: no gen record follows it.
    An attempt a crash left open (a start, no end, no row) is still settled under its rid."""
    data = write_dataset(tmp_path, "A", 20)
    settings = sglang_settings([sim.base_url], [data])
    attempts = settings.job.run_dir / "attempts.jsonl"
    attempts.parent.mkdir(parents=True, exist_ok=True)
    crashed = "A-00000003#0"
    attempts.write_bytes(
        orjson.dumps(start_record(crashed, "A", 3, Decimal(0), "sglang", time.time())) + b"\n"
    )
    job = Job(settings)
    await job.prepare()
    assert (await job.run()).reason is StopReason.DONE
    one_row_per_prompt(data, 20)
    records = journal(attempts)
    assert not [r for r in records if r["k"] == "gen"], "the start record names the handle already"
    by_rid: dict[str, list[str]] = {}
    for r in records:
        if "rid" in r:
            by_rid.setdefault(r["rid"], []).append(r["k"])
    assert len(by_rid) == 21 and all(kinds == ["start", "end"] for kinds in by_rid.values()), by_rid
    [lost] = [r for r in records if r["k"] == "end" and r["rid"] == crashed]
    assert lost["outcome"] == "lost_at_crash" and lost["gen"] == crashed and lost["be"] == "sglang"
    ends = [r for r in records if r["k"] == "end" and r["rid"] != crashed]
    assert all(r["gen"] == r["rid"] for r in ends)
