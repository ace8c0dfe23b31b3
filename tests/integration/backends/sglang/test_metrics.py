"""The servers' /metrics in the snapshot, and the concurrency they steer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import orjson

from regen.engine.config.settings import Settings
from regen.engine.job.job import Job, StopReason
from regen.sim.sglang.tokens import SimTokenizer
from tests.support.datasets import read_rows, write_dataset
from tests.support.recording_sim import recording_sim, sim_config, slow_config
from tests.support.views import sglang_account


async def test_metrics_are_polled_into_the_snapshot(
    sim_tok: SimTokenizer, sglang_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    async with recording_sim(slow_config(), sim_tok) as server:
        data = write_dataset(tmp_path, "M", 40)
        job = Job(sglang_settings([server.base_url], [data], concurrency=12))
        await job.prepare()
        runner = asyncio.create_task(job.run())
        seen_running = 0.0
        snap = job.snapshot()
        while not runner.done():
            snap = job.snapshot()
            [facts] = sglang_account(snap["lanes"][0]["account"])["servers"]
            seen_running = max(seen_running, facts["running"] or 0.0)
            if seen_running >= 12 and (facts["kv_usage"] or 0) > 0 and facts["gen_throughput"]:
                break
            await asyncio.sleep(0.02)
        job.stop(cancel=True)
        await runner
        state = server.state()
    account = sglang_account(snap["lanes"][0]["account"])
    [facts] = account["servers"]
    assert seen_running == 12, "running requests as the server counts them"
    assert facts["version"] == "0.5.23" and facts["served_model_name"] == "kimi-k2.5" and facts["gpus"] == 8
    kv_usage, gen_throughput = facts["kv_usage"], facts["gen_throughput"]
    assert kv_usage is not None and 0 < kv_usage < 1 and gen_throughput is not None and gen_throughput > 0
    assert facts["generation_tokens_total"] <= state["counters"]["generation_tokens"]
    assert facts["checked_at"] is not None and facts["error"] is None
    worker = f"127.0.0.1:{server.port}"
    assert [r["name"] for r in job.lanes[0].backend.view()["routes"]] == [worker]
    assert [p["name"] for p in snap["lanes"][0]["providers"]] == [worker]
    assert snap["lanes"][0]["money"]["unit"] == "gpu_s" and snap["lanes"][0]["money"]["budget"] is None
    assert account["gpu_s"] > 0


async def test_a_deep_queue_lowers_the_ceiling_and_a_short_one_lifts_it(
    sim_tok: SimTokenizer, sglang_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    # Four requests run at a time; the rest queue. With the healthy band at 2..6 queued, but never
    # more queued than a quarter of the slots (one), the job should keep 4 + 1 in flight from the
    # start, not the 48 the operator allows; a server that runs more is seen running more.
    config = sim_config(max_running_requests=4, output_len_min=30, output_len_max=40, time_scale=0.2)
    async with recording_sim(config, sim_tok) as server:
        # More prompts than the test needs: the lift is seen before the work runs out, however
        # slowly this machine runs; the job is stopped (drained) once it is.
        data = write_dataset(tmp_path, "Q", 5000)
        band = {"healthy_queue_min": 2, "healthy_queue_max": 6}
        settings = sglang_settings([server.base_url], [data], concurrency=48, min_concurrency=2, sglang=band)
        job = Job(settings)
        await job.prepare()
        runner = asyncio.create_task(job.run())
        while job.lanes[0].limit.suggested is None and not runner.done():
            await asyncio.sleep(0.01)
        lowered = job.lanes[0].limit.current
        assert lowered < 20, f"the ceiling came down to {lowered}"
        # What was already in flight drains through the queue; nothing new goes past the ceiling.
        while job.in_flight > lowered and not runner.done():
            await asyncio.sleep(0.01)
        queue_peak_after = 0
        for _ in range(50):
            queue_peak_after = max(queue_peak_after, server.state()["queued"])
            assert job.in_flight <= job.lanes[0].limit.current
            await asyncio.sleep(0.02)
        assert 0 < queue_peak_after <= 8, "the queue stays in its band"
        # The server takes more at a time: its queue empties and the ceiling lifts. Its answers
        # also take 5x longer, so that 30 in flight asks for only ~35 rows/s: at 0.2 s a request a
        # busy 2-core machine could not feed 30 at once, the ceiling (in flight + 2) would stop
        # where the job's own feeding does (27 was seen in CI), and the work run out first.
        slower = {"max_running_requests": 64, "time_scale": 1.0}
        server.apply_config(server.config.model_copy(update=slower))
        limit = job.lanes[0].limit
        while not runner.done() and limit.suggested is not None and limit.suggested < 30:
            await asyncio.sleep(0.01)
        assert limit.suggested is None or limit.suggested >= 30, (
            f"lifted to {limit.suggested} with {job.in_flight} in flight before the work ran out"
        )
        job.stop(cancel=False, reason=StopReason.OPERATOR)
        assert (await runner).reason is StopReason.OPERATOR
    lines = [row["line"] for row in read_rows(data)]
    assert 0 < len(lines) < 5000 and len(set(lines)) == len(lines), "what finished, once each"
    hints = [
        e
        for e in (
            orjson.loads(line) for line in (settings.job.run_dir / "events.jsonl").read_bytes().splitlines()
        )
        if e["event"] == "concurrency_hint"
    ]
    assert hints[0]["ceiling"] == lowered == 5 and "the servers run 4 at once" in hints[0]["reason"]
    assert len(hints) >= 2 and (hints[-1]["ceiling"] is None or hints[-1]["ceiling"] >= 30)


async def test_a_small_server_gets_about_what_it_runs_at_once_not_the_job_concurrency(
    sim_tok: SimTokenizer, sglang_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    # Two requests run at a time on this server; the operator allows 16 and leaves the healthy
    # queue band at its defaults (100..2000, made for large servers). The job should keep about
    # the server's two slots and a short queue in flight, from the first request, never 16.
    config = sim_config(max_running_requests=2, output_len_min=30, output_len_max=40, time_scale=0.2)
    async with recording_sim(config, sim_tok) as server:
        data = write_dataset(tmp_path, "S", 40)
        settings = sglang_settings([server.base_url], [data], concurrency=16)
        job = Job(settings)
        await job.prepare()
        runner = asyncio.create_task(job.run())
        peak_in_flight = peak_queued = 0
        while not runner.done():
            peak_in_flight = max(peak_in_flight, job.in_flight)
            peak_queued = max(peak_queued, int(server.state()["queued"]))
            await asyncio.sleep(0.005)
        assert (await runner).reason is StopReason.DONE
    assert peak_in_flight <= 3, f"{peak_in_flight} in flight on a server that runs 2 at once"
    # One queued, and at most one more for the moment between two batches.
    assert peak_queued <= 2, f"{peak_queued} waited in the server's queue"
    assert len(read_rows(data)) == 40
