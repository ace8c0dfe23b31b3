"""The backend against what the real 0.5.23 server does (staged by the simulator): the context a server
enforces, a server streaming deltas, "NaN happened", a full queue, data-parallel ranks, the bytes of a
long answer's stream, and connections the server closes when idle."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from regen.engine.backends.base import Standalone
from regen.engine.backends.sglang.backend import SGLangBackend
from regen.engine.config.settings import Settings
from regen.engine.data.datasets import Prompt
from regen.engine.job.job import Job, JobError, StopReason
from regen.engine.net.sglang_metrics import parse_metrics
from regen.engine.net.sglang_server import KEEPALIVE_S
from regen.sim.sglang.tokens import SimTokenizer
from tests.support.datasets import one_row_per_prompt, read_rows, write_dataset
from tests.support.journals import journal
from tests.support.recording_sim import RecordingSim, recording_sim, sim_config, slow_config


async def test_max_tokens_past_the_models_context_is_refused_though_server_info_says_none(
    sim_tok: SimTokenizer, sglang_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    # No --context-length: /server_info's context_length is None; /v1/models says the model's 48.
    async with recording_sim(sim_config(model_context_length=48), sim_tok) as server:
        assert server.config.context_length is None
        data = write_dataset(tmp_path, "C", 3)
        settings = sglang_settings([server.base_url], [data])  # max_tokens 64
        with pytest.raises(JobError, match=re.escape("openrouter.max_tokens (64) does not fit")):
            await Job(settings).prepare()


async def test_a_server_streaming_deltas_is_refused_at_open(
    sim_tok: SimTokenizer, sglang_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    async with recording_sim(sim_config(incremental_streaming_output=True), sim_tok) as server:
        settings = sglang_settings([server.base_url], [write_dataset(tmp_path, "I", 3)])
        with pytest.raises(JobError, match="--incremental-streaming-output") as refused:
            await Job(settings).prepare()
    assert "each chunk of its stream holds only what is new" in str(refused.value)


async def test_a_nan_happened_answer_is_a_failed_attempt_never_a_row(
    sim_tok: SimTokenizer, sglang_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    async with recording_sim(sim_config(faults={"nan_rate": 0.3}), sim_tok) as server:
        data = write_dataset(tmp_path, "N", 40)
        settings = sglang_settings([server.base_url], [data], max_attempts=30)
        job = Job(settings)
        await job.prepare()
        assert (await job.run()).reason is StopReason.DONE
        assert server.faults_injected.get("nan", 0) > 3
    outcomes = Counter(
        r["outcome"] for r in journal(settings.job.run_dir / "attempts.jsonl") if r["k"] == "end"
    )
    assert outcomes["nan"] == server.faults_injected["nan"]
    for row in one_row_per_prompt(data, 40):
        assert server.served[row["generation_id"]]["finish"]["matched"] != "NaN happened"
        assert row["native_finish_reason"]["matched"] == row["output_ids"][-1]


async def test_a_full_queue_throttles_like_a_503(
    sim_tok: SimTokenizer, sglang_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    config = sim_config(max_running_requests=4, max_queued_requests=4)
    async with recording_sim(config, sim_tok) as server:
        # A server that does not say how many it runs at once: the job's first burst (48) meets its
        # full queue before /metrics shows the four running (docs/sglang.md §11.6).
        server.hide_slots = True
        data = write_dataset(tmp_path, "Q", 200)
        settings = sglang_settings(
            [server.base_url], [data], concurrency=48, min_concurrency=2, max_attempts=80
        )
        job = Job(settings)
        await job.prepare()
        assert (await job.run()).reason is StopReason.DONE
        full = server.stats.finish_counts.get("abort", 0)
    assert full > 0
    assert job.lanes[0].limit.backoffs > 0, "the server's 503 aborts lowered the in-flight limit"
    one_row_per_prompt(data, 200)


async def test_load_is_the_sum_over_data_parallel_ranks(sim_tok: SimTokenizer) -> None:
    config = slow_config(dp_size=4, enable_dp_attention=True, max_running_requests=8)
    async with recording_sim(config, sim_tok) as server, aiohttp.ClientSession() as http:
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 200}}
        tasks = [asyncio.create_task(http.post(server.base_url + "/generate", json=body)) for _ in range(14)]
        while len(server.scheduler.running) < 8 or len(server.scheduler.waiting) < 6:
            await asyncio.sleep(0.01)
        async with http.get(server.base_url + "/metrics") as resp:
            load = parse_metrics(await resp.text())
        await http.post(server.base_url + "/abort_request", json={"abort_all": True})
        for resp in await asyncio.gather(*tasks):
            resp.release()
    assert (load.running, load.queued) == (8, 6)


async def test_a_long_answers_stream_costs_bytes_in_proportion_to_the_answer(
    sim_tok: SimTokenizer, sglang_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    config = sim_config(output_len_min=2000, output_len_max=2000, min_step_s=0.0005)
    async with recording_sim(config, sim_tok) as server:
        data = write_dataset(tmp_path, "B", 2)
        settings = sglang_settings([server.base_url], [data])
        settings.openrouter.max_tokens = 4096
        job = Job(settings)
        await job.prepare()
        assert (await job.run()).reason is StopReason.DONE
        sent = server.generate_bytes
    rows = read_rows(data)
    tokens = sum(len(row["output_ids"]) for row in rows)
    assert tokens >= 4000
    # About 32 cumulative chunks for a full answer (stream_interval 128 here): each ~13 B an id
    # (ids and text), so ~(16 + 1) / 2 x 13 B an id. A chunk per forward would be ~10x that.
    assert sent / tokens < 250


async def test_the_backends_idle_connections_close_before_the_servers_do(
    sim: RecordingSim, sglang_settings: Callable[..., Settings]
) -> None:
    backend = SGLangBackend(sglang_settings([sim.base_url], []))
    await backend.open(Standalone())
    try:
        prompt = Prompt("A", 0, "0" * 64, [{"role": "user", "content": "hello"}])

        async def one(rid: str) -> Any:
            return await backend.attempt(prompt, rid, lambda _: None, lambda _: None)

        assert (await one("A-0#0")).failure is None
        before = sim.state()["connections"]
        await one("A-0#1")
        assert sim.state()["connections"] == before, "a busy connection is reused"
        # Idle a while under the server's 5 s: the pool has closed it first, so the next request
        # opens a connection of its own rather than one the server may be closing.
        await asyncio.sleep(KEEPALIVE_S + 0.5)
        assert sim.config.timeout_keep_alive > KEEPALIVE_S + 0.5
        assert (await one("A-0#2")).failure is None
        assert sim.state()["connections"] == before + 1
    finally:
        await backend.close()
