"""Load realism (§13.24): 2000 concurrent streams through one simulator on loopback."""

from __future__ import annotations

import asyncio
import resource
import time
from decimal import Decimal

import aiohttp
import orjson
import pytest

from regen.sim.openrouter.server import OpenRouterSim
from tests.support.openrouter_http import KEY, quick

STREAMS = 2000
TOKENS = 20
# 20 tokens at 5 tokens/s keep each stream open ~4 s: long enough for all 2000 to be connected
# at once, so the peak proves real concurrency rather than fast turnover.
TOKENS_PER_S = 5.0
PROVIDERS = (
    "moonshotai",
    "fireworks",
    "together",
    "parasail",
    "baseten",
    "chutes",
    "deepinfra",
    "gmicloud",
    "novita",
    "atlas-cloud",
    "siliconflow",
)


def _raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"needs {needed} file descriptors, hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


async def test_2000_concurrent_streams_all_complete() -> None:
    _raise_fd_limit(2 * STREAMS + 512)  # client and server ends share this process
    sim = OpenRouterSim(
        quick(
            time_scale=1.0,
            min_completion_tokens=TOKENS,
            max_completion_tokens=TOKENS,
            reasoning_share=0.0,
            chunk_interval_s=0.05,
            keepalive_interval_s=1.0,
            endpoint_overrides={
                p: {"ttft_s": 0.0, "ttft_jitter": 0.0, "tokens_per_s": TOKENS_PER_S} for p in PROVIDERS
            },
        )
    )
    await sim.start()
    body = orjson.dumps(
        {
            "model": "moonshotai/kimi-k2.5",
            "stream": True,
            "max_tokens": 100,
            "messages": [{"role": "user", "content": "load"}],
        }
    )
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    url = sim.base_url + "/chat/completions"

    async def one(session: aiohttp.ClientSession) -> float:
        async with session.post(url, data=body, headers=headers) as r:
            assert r.status == 200
            raw = await r.read()
        assert raw.endswith(b"data: [DONE]\n\n")
        usage = [
            orjson.loads(line[6:])["usage"]
            for line in raw.split(b"\n")
            if line.startswith(b"data: {") and b'"usage"' in line
        ]
        assert usage[0]["completion_tokens"] == TOKENS
        return usage[0]["cost"]

    try:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            t0 = time.perf_counter()
            async with asyncio.timeout(45):
                costs = await asyncio.gather(*(one(session) for _ in range(STREAMS)))
            elapsed = time.perf_counter() - t0
    finally:
        await sim.stop()
    print(f"\n{STREAMS} streams completed in {elapsed:.2f}s, peak in flight {sim.peak_in_flight}")
    assert len(costs) == STREAMS
    assert sim.peak_in_flight == STREAMS
    assert sim.total_requests == STREAMS and sim.in_flight == 0
    assert len(sim.billing.records) == STREAMS
    assert sim.billing.billed_total == sum(Decimal(repr(c)) for c in costs)
    assert elapsed < 30
