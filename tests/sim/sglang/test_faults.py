"""Faults, each off by default: server aborts, 503s, dropped connections, the watchdog, startup failures."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

from regen.sim.sglang.logs import SimLog
from regen.sim.sglang.tokens import SimTokenizer
from tests.support.sglang_http import SGApi, parse_sse
from tests.support.sglang_sim import fast_config, running_sim


async def test_no_faults_by_default(api: SGApi) -> None:
    results = await asyncio.gather(*(api.generate(rid=f"n#{i}") for i in range(20)))
    assert all(r.status == 200 for r in results)
    assert all(r.json["meta_info"]["finish_reason"]["type"] == "stop" for r in results)
    assert (await api.state())["faults_injected"] == {}


async def test_server_abort_fault(api: SGApi) -> None:
    await api.config({"faults": {"abort_rate": 1.0, "abort_message": "Aborted by the scheduler"}})
    r = (await api.generate(sampling={"max_new_tokens": 300})).json
    assert r["meta_info"]["finish_reason"] == {
        "type": "abort",
        "message": "Aborted by the scheduler",
        "status_code": None,
        "err_type": None,
    }
    assert 0 < len(r["output_ids"]) < 300
    s = await api.stream(sampling={"max_new_tokens": 300})
    assert s.done and s.chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert (await api.state())["faults_injected"]["abort"] == 2


async def test_http_503_fault(api: SGApi) -> None:
    await api.config({"faults": {"http_503_rate": 1.0}})
    r = await api.generate()
    assert r.status == 503
    assert r.json == {
        "object": "error",
        "message": "Service Unavailable",
        "type": "503",
        "param": None,
        "code": 503,
    }
    await api.config({"faults": {"http_503_rate": 0.0}})
    assert (await api.generate()).status == 200


async def test_rates_apply_per_request(api: SGApi) -> None:
    await api.config({"seed": 11, "faults": {"http_503_rate": 0.3}})
    statuses = [(await api.generate(rid=f"p#{i}")).status for i in range(60)]
    n503 = statuses.count(503)
    assert 5 < n503 < 35 and statuses.count(200) == 60 - n503


async def test_dropped_connection_mid_stream(api: SGApi) -> None:
    await api.config({"decode_tokens_per_s": 20.0, "faults": {"drop_rate": 1.0, "fault_position": 0.5}})
    body = api.body(stream=True, rid="drop#0", sampling={"max_new_tokens": 300})
    raw = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async with api.session.post(api.url("/generate"), data=orjson.dumps(body)) as resp:
            assert resp.status == 200
            async for chunk in resp.content.iter_any():
                raw += chunk
    events = parse_sse(raw) if raw else []
    assert "[DONE]" not in events
    assert all(e["meta_info"]["finish_reason"] is None for e in events)
    state = await api.state()
    assert "drop#0" in state["aborted_rids"] and state["running"] == 0


async def test_dropped_connection_without_streaming(api: SGApi) -> None:
    await api.config({"faults": {"drop_rate": 1.0}})
    with pytest.raises(aiohttp.ClientError):
        await api.generate(rid="drop#1")


async def test_watchdog_crash_after_requests(kimi_tok: SimTokenizer, http: aiohttp.ClientSession) -> None:
    log = SimLog()
    cfg = fast_config(watchdog_timeout=30.0, faults={"watchdog_after_requests": 2})
    async with running_sim(cfg, kimi_tok, log=log) as sim:
        api = SGApi(http, sim, kimi_tok)
        ok = await asyncio.gather(*(api.generate(rid=f"w#{i}") for i in range(2)))
        assert all(r.status == 200 for r in ok)
        hung = asyncio.create_task(api.generate(rid="w#2"))
        assert sim.crashed is not None
        status = await asyncio.wait_for(asyncio.shield(sim.crashed), 10)
        assert status == -9  # the process tree is killed, as SGLang's sigquit handler does
        with pytest.raises(aiohttp.ClientError):
            await hung
        lines = list(log.lines)
    watchdog = [i for i, line in enumerate(lines) if "watchdog timeout (self.watchdog_timeout=30" in line]
    sigquit = [i for i, line in enumerate(lines) if "Received sigquit from a child process" in line]
    assert watchdog and sigquit and watchdog[0] < sigquit[0]
    assert "TP0] Scheduler watchdog timeout" in lines[watchdog[0]]


async def test_watchdog_crash_after_seconds_when_busy(
    kimi_tok: SimTokenizer, http: aiohttp.ClientSession
) -> None:
    cfg = fast_config(watchdog_timeout=20.0, faults={"watchdog_after_s": 10.0})
    async with running_sim(cfg, kimi_tok) as sim:
        api = SGApi(http, sim, kimi_tok)
        await api.config({"decode_tokens_per_s": 2.0})
        task = asyncio.create_task(api.generate(sampling={"max_new_tokens": 1000, "ignore_eos": True}))
        assert sim.crashed is not None
        assert await asyncio.wait_for(asyncio.shield(sim.crashed), 10) == -9
        with pytest.raises(aiohttp.ClientError):
            await task


async def test_a_short_stall_does_not_trip_the_watchdog(api: SGApi) -> None:
    await api.config({"watchdog_timeout": 200.0, "decode_tokens_per_s": 5.0})
    task = asyncio.create_task(api.generate(sampling={"max_new_tokens": 40, "ignore_eos": True}))
    await asyncio.sleep(0.05)
    await api.config({"faults": {"stall": True}})
    await asyncio.sleep(0.2)  # 20 simulated seconds, well under the 200 s timeout
    assert (await api.state())["hung"] is False
    await api.config({"faults": {"stall": False}})
    r = await task
    assert r.json["meta_info"]["finish_reason"] == {"type": "length", "length": 40}
    assert api.sim.crashed is not None and not api.sim.crashed.done()


@pytest.mark.parametrize(
    ("phase", "signature", "reached"),
    [
        ("weights", "torch.OutOfMemoryError: CUDA out of memory.", "Load weight begin."),
        (
            "kv_pool",
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
            "Load weight end.",
        ),
        ("cuda_graph", "Exception: Capture cuda graph failed: CUDA out of memory.", "Memory pool end."),
        (
            "warmup",
            "Initialization failed. warmup error: Traceback (most recent call last):",
            "Uvicorn running on",
        ),
    ],
)
async def test_startup_failure_signatures(
    kimi_tok: SimTokenizer, phase: str, signature: str, reached: str
) -> None:
    log = SimLog()
    cfg = fast_config(faults={"startup_fail_at": phase})
    async with running_sim(cfg, kimi_tok, ready=False, log=log) as sim:
        assert sim.crashed is not None
        status = await asyncio.wait_for(asyncio.shield(sim.crashed), 10)
        assert not sim.ready.is_set()
        with pytest.raises(RuntimeError, match="died"):
            await sim.wait_ready(1)
    text = "\n".join(log.lines)
    assert status == -9
    assert signature in text
    assert reached in text
    assert "The server is fired up and ready to roll!" not in text
    if phase != "warmup":
        assert "Scheduler hit an exception: Traceback (most recent call last):" in text
        assert text.rstrip().endswith(
            "Received sigquit from a child process. It usually means the child failed."
        )
    if phase == "cuda_graph":
        assert "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)" in text
        assert "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)" in text
        assert "Capture target decode CUDA graph end." not in text


async def test_http_phase_failure_is_uvicorns_bind_error(kimi_tok: SimTokenizer) -> None:
    log = SimLog()
    async with running_sim(
        fast_config(faults={"startup_fail_at": "http"}), kimi_tok, ready=False, log=log
    ) as sim:
        assert sim.crashed is not None
        assert await asyncio.wait_for(asyncio.shield(sim.crashed), 10) == 1
    assert log.contains("ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', ")
