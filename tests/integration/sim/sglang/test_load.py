"""Load: 512 concurrent streams through one simulator on loopback, all in one batch, all exact.

Capacity figures (how many tokens and chunks per second the simulator sustains) are measured in
bench/sglang_sim_capacity.py, not asserted here.
"""

from __future__ import annotations

import asyncio
import resource

import aiohttp
import orjson
import pytest

from regen.sim.sglang.tokens import SimTokenizer
from tests.support.sglang_sim import fast_config, running_sim

STREAMS = 512
TOKENS = 40


def _raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"needs {needed} file descriptors, hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


async def test_512_concurrent_streams_share_one_batch(kimi_tok: SimTokenizer) -> None:
    _raise_fd_limit(2 * STREAMS + 512)  # client and server ends share this process
    # 40 tokens at 10 tokens/s keep every stream open ~4 s: long enough for all 512 to be running
    # at once, so the peak proves one batch rather than fast turnover.
    cfg = fast_config(
        time_scale=1.0,
        startup_weights_s=0,
        startup_kv_pool_s=0,
        startup_cuda_graph_s=0,
        startup_http_s=0,
        startup_warmup_s=0,
        max_running_requests=STREAMS,
        decode_tokens_per_s=10.0,
        max_gen_throughput=100_000.0,
        min_step_s=0.1,
    )
    prompt = [1, 2, 3, 4, 5]

    async def one(session: aiohttp.ClientSession, url: str, i: int) -> tuple[list[int], str, int]:
        body = orjson.dumps(
            {
                "input_ids": prompt,
                "rid": f"load#{i}",
                "stream": True,
                "sampling_params": {
                    "max_new_tokens": TOKENS,
                    "ignore_eos": True,
                    "skip_special_tokens": False,
                },
            }
        )
        chunks = 0
        last = b""
        async with session.post(url, data=body) as r:
            assert r.status == 200
            async for line in r.content:
                if line.startswith(b"data: {"):
                    chunks += 1
                    last = line
                elif line.startswith(b"data: [DONE]"):
                    break
        final = orjson.loads(last[6:])
        assert final["meta_info"]["finish_reason"] == {"type": "length", "length": TOKENS}
        return final["output_ids"], final["text"], chunks

    async with running_sim(cfg, kimi_tok) as sim:
        url = sim.base_url + "/generate"
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, read_bufsize=2**20) as session:
            async with asyncio.timeout(60):
                results = await asyncio.gather(*(one(session, url, i) for i in range(STREAMS)))
        state = sim.state()
    assert len(results) == STREAMS
    assert state["peak_running"] == STREAMS
    assert state["counters"]["requests"] == STREAMS
    assert state["counters"]["generation_tokens"] == STREAMS * TOKENS
    assert state["running"] == 0 and state["kv_used_tokens"] == 0
    ids, text, _ = results[0]
    assert all(r[0] == ids for r in results)  # same prompt, same seed
    assert kimi_tok.decode(ids, skip_special_tokens=False) == text
    assert all(r[2] >= 5 for r in results)  # really streamed, chunk by chunk
