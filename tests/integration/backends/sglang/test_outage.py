"""The SGLang backend after an outage: back at full speed at once (docs/faults.md, outages).

The fault proxy (tests/support/faultproxy.py) stands where the job's end of an SSH tunnel would: it
stops listening (the tunnel dropped: every stream cut, every new connection refused) and listens
again on the same port (the tunnel back). The free probe is /health_generate through it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

from regen.engine.config.settings import Settings
from regen.engine.job.job import Job, StopReason
from regen.sim.sglang.tokens import SimTokenizer
from tests.support.datasets import one_row_per_prompt, write_dataset
from tests.support.faultproxy import FaultProxy
from tests.support.journals import journal
from tests.support.recording_sim import recording_sim, sim_config

CONCURRENCY = 16
PROBE_S = 1.0


async def wait_for(condition: Callable[[], bool], timeout_s: float = 30.0) -> float:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)
    return time.monotonic()


async def test_a_dropped_tunnel_holds_and_its_return_ends_the_hold_within_a_probe(
    sim_tok: SimTokenizer, sglang_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    data = write_dataset(tmp_path, "T", 80)
    # Long answers: 600-900 tokens at 400 tokens a second, each stream in flight 1.5-2.3 s.
    config = sim_config(time_scale=0.1, output_len_min=600, output_len_max=900, stream_interval=20)
    async with recording_sim(config, sim_tok) as sim:
        proxy = FaultProxy("127.0.0.1", sim.port)
        await proxy.start()
        try:
            settings = sglang_settings(
                [f"http://127.0.0.1:{proxy.port}"],
                [data],
                concurrency=CONCURRENCY,
                max_attempts=3,
                outage_probe_s=PROBE_S,
            )
            settings.openrouter = settings.openrouter.model_copy(update={"max_tokens": 10000})
            job = Job(settings)
            await job.prepare()
            runner = asyncio.create_task(job.run())
            lane = job.lanes[0]
            await wait_for(lambda: lane.stats.counters.rows >= 4 and job.in_flight >= CONCURRENCY)
            proxy.refuse = True
            await proxy.stop()  # the tunnel dropped
            await wait_for(lambda: lane.outage is not None)
            await asyncio.sleep(4.0)
            proxy.refuse = False
            await proxy.restart()  # the tunnel back on the same local port
            back = time.monotonic()
            ended = await wait_for(lambda: lane.outage is None)
            full = await wait_for(lambda: job.in_flight >= CONCURRENCY, 10)
            outcome = await asyncio.wait_for(runner, 120)
        finally:
            await proxy.stop()
    assert ended - back <= 2.0 + PROBE_S, f"the hold outlived the tunnel's return by {ended - back:.1f} s"
    assert full - ended <= 2.0, f"full concurrency {full - ended:.2f} s after the hold ended"
    assert outcome.reason is StopReason.DONE, outcome.message
    one_row_per_prompt(data, 80)
    # GPU time is measured at the attempt: spent is the sum of the attempts' charges as journaled
    # (what a restart rebuilds), the refused attempts cost nothing, and the cut streams were
    # charged the time they held the server: no more than the meter's busy GPU-seconds, which
    # also count the milliseconds the refused connections were in flight.
    records = journal(settings.job.run_dir / "attempts.jsonl")
    ends = [r for r in records if r["k"] == "end"]
    assert job.lanes[0].ledger.spent == sum((Decimal(r["cost"]) for r in ends), Decimal(0))
    refused = [r for r in ends if r.get("sent") is False]
    assert refused and all(r["cost"] == "0" for r in refused)
    cut = [r for r in ends if r["outcome"] == "network"]
    # Most streams are mid-answer when the tunnel drops (a busy machine may have a few between requests).
    assert len(cut) >= CONCURRENCY // 2 and all(Decimal(r["cost"]) > 0 for r in cut), (
        "the streams cut were charged"
    )
    [worker] = job.lanes[0].backend.workers  # type: ignore[attr-defined]
    assert job.lanes[0].ledger.spent <= Decimal(str(worker.meter.busy_gpu_s()))
