"""Responses past the edge, over loopback with the job's own client: a 200,000-token answer, a body
that never ends, a stream at one byte a second, a megabyte of headers; and, through the fault
proxy, connections cut, stalled, slowed and refused. Each attempt fails with its class and a
clear message, holds no more than its limit, and the other requests on the same client finish
meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from regen.engine.backends.openrouter.client import (
    MAX_FIELD_SIZE,
    MAX_HEADERS,
    AttemptResult,
    OpenRouterClient,
    max_response_bytes,
)
from regen.engine.backends.openrouter.errors import ErrorClass
from regen.engine.config.settings import OpenRouterSettings
from regen.sim.openrouter.catalog import default_models
from regen.sim.openrouter.server import OpenRouterSim
from tests.support.faultproxy import FaultProxy, ThreadedFaultProxy
from tests.support.openrouter_sim import SIM_KEY, fast_sim_config

PROMPT = [{"role": "user", "content": "Explain MoE routing in two sentences."}]
SLUGS = sorted({e.slug for e in default_models()[0].endpoints})
FAULTY = "fireworks"
ONLY_FAULTY = [s for s in SLUGS if s != FAULTY]  # the ignore list that routes to the faulty one
HEALTHY = [FAULTY]  # the ignore list that keeps away from it
# One network read past the limit may be in hand when the limit is seen: aiohttp's buffer pauses
# the socket above 128 KiB, and one read of the socket brings up to 256 KiB more.
READ_SLACK = 384 << 10


def client_for(base_url: str, **settings: Any) -> OpenRouterClient:
    params: dict[str, Any] = {
        "base_url": base_url,
        "api_key": SIM_KEY,
        "max_tokens": 64,
        "read_timeout_s": 2.0,
        "request_timeout_s": 30.0,
        "connect_timeout_s": 5.0,
    }
    params.update(settings)
    return OpenRouterClient(OpenRouterSettings(**params), pool_size=64)


@pytest.fixture
async def sim() -> AsyncIterator[OpenRouterSim]:
    server = OpenRouterSim(fast_sim_config(tokens_per_event=1, time_scale=0.001))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def faulty_while_others_finish(
    client: OpenRouterClient, others: int = 20
) -> tuple[AttemptResult, list[AttemptResult], bool]:
    """Start one attempt routed to the faulty provider, then `others` to healthy ones on the same
    client; returns (faulty result, others' results, whether the faulty one was still running
    when every other one had finished)."""
    faulty = asyncio.create_task(client.complete(PROMPT, ONLY_FAULTY))
    await asyncio.sleep(0.05)
    done = await asyncio.gather(*(client.complete(PROMPT, HEALTHY) for _ in range(others)))
    still_running = not faulty.done()
    return await faulty, list(done), still_running


def assert_healthy(results: list[AttemptResult]) -> None:
    assert all(r.error is None and r.content for r in results), [r.error for r in results]


def held(result: AttemptResult) -> int:
    """What the attempt kept: its text, in bytes."""
    return len(result.content.encode()) + len(result.reasoning.encode())


# -- the simulator's edge faults --------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
async def test_a_200000_token_answer_is_cut_at_the_size_limit(sim: OpenRouterSim, stream: bool) -> None:
    sim.config.provider_faults = {FAULTY: {"runaway_length": 1.0}}
    sim.config.runaway_tokens = 200_000
    async with client_for(sim.base_url, stream=stream) as client:
        limit = max_response_bytes(64)
        assert client.max_response_bytes == limit == (1 << 20) + 64 * 2048
        result, others, _ = await faulty_while_others_finish(client)
    assert_healthy(others)
    assert result.error is not None and result.error.error_class is ErrorClass.SERVER
    assert result.error.message == f"response larger than {limit} bytes, the limit for max_tokens 64: cut off"
    assert result.received_bytes <= limit + READ_SLACK
    assert held(result) <= limit
    assert sim.faults_injected["runaway_length"] == 1


@pytest.mark.parametrize("stream", [True, False])
async def test_a_body_that_never_ends_is_cut_at_the_size_limit(sim: OpenRouterSim, stream: bool) -> None:
    sim.config.provider_faults = {FAULTY: {"endless_body": 1.0}}
    async with client_for(sim.base_url, stream=stream) as client:
        result, others, _ = await faulty_while_others_finish(client)
    assert_healthy(others)
    assert result.error is not None and result.error.error_class is ErrorClass.SERVER
    assert "response larger than" in result.error.message and "cut off" in result.error.message
    assert result.received_bytes <= client.max_response_bytes + READ_SLACK
    assert held(result) <= client.max_response_bytes
    # The simulator saw the client leave and billed what it had sent.
    for _ in range(200):
        if sim.billing.records and any(r.cancelled for r in sim.billing.records):
            break
        await asyncio.sleep(0.01)
    assert any(r.cancelled for r in sim.billing.records)


@pytest.mark.parametrize("stream", [True, False])
async def test_a_stream_at_one_byte_a_second_ends_at_the_total_limit(
    sim: OpenRouterSim, stream: bool
) -> None:
    sim.config.provider_faults = {FAULTY: {"trickle": 1.0}}
    sim.config.trickle_bytes_per_s = 1.0
    async with client_for(sim.base_url, stream=stream, read_timeout_s=2.5, request_timeout_s=4.0) as client:
        started = time.monotonic()
        result, others, still_running = await faulty_while_others_finish(client)
        took = time.monotonic() - started
    assert_healthy(others)
    assert still_running, "the other requests finished while the trickle went on"
    assert result.error is not None and result.error.error_class is ErrorClass.NETWORK
    # A byte a second keeps the idle limit quiet; the whole-attempt limit ends it.
    assert result.error.message == "no complete answer within request_timeout_s (4 s)"
    assert took >= 4.0
    assert result.received_bytes < 100


@pytest.mark.parametrize(
    ("count", "message"),
    [
        (1, f"response headers rejected: a header line over {MAX_FIELD_SIZE} bytes"),
        (200, f"response headers rejected: more than {MAX_HEADERS} headers"),
    ],
)
@pytest.mark.parametrize("stream", [True, False])
async def test_a_megabyte_of_headers_is_refused(
    sim: OpenRouterSim, stream: bool, count: int, message: str
) -> None:
    sim.config.provider_faults = {FAULTY: {"huge_headers": 1.0}}
    sim.config.huge_header_bytes = 1 << 20
    sim.config.huge_header_count = count
    async with client_for(sim.base_url, stream=stream) as client:
        result, others, _ = await faulty_while_others_finish(client)
    assert_healthy(others)
    assert result.error is not None and result.error.error_class is ErrorClass.NETWORK
    assert result.error.message == message
    assert result.received_bytes == 0 and held(result) == 0


async def test_edge_faults_are_off_by_default_and_named() -> None:
    from regen.sim.openrouter.config import EDGE_FAULTS, FAULT_CLASSES, SimConfig

    config = SimConfig()
    assert config.faults == {} and config.provider_faults == {}
    assert set(EDGE_FAULTS) == {"runaway_length", "trickle", "endless_body", "huge_headers"}
    assert not set(EDGE_FAULTS) & set(FAULT_CLASSES)
    assert SimConfig(faults={"trickle": 0.5}).faults == {"trickle": 0.5}


# -- the fault proxy ----------------------------------------------------------------------------


@pytest.fixture
async def proxied(sim: OpenRouterSim) -> AsyncIterator[FaultProxy]:
    proxy = FaultProxy("127.0.0.1", sim.port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


async def test_proxy_passes_through(proxied: FaultProxy) -> None:
    async with client_for(proxied.base_url) as client:
        results = await asyncio.gather(*(client.complete(PROMPT, []) for _ in range(10)))
    assert_healthy(list(results))
    assert proxied.connections >= 1 and proxied.bytes_down > 0 and proxied.bytes_up > 0


@pytest.mark.parametrize(
    ("cut_after", "reset", "message"),
    [
        (100, False, "the server closed the connection before the answer was complete"),
        (100, True, "ClientOSError: [Errno 104] Connection reset by peer"),
        (600, False, "answer cut short: the connection was closed in the middle of the body"),
        (600, True, "answer cut short: the connection was reset in the middle of the body"),
    ],
)
async def test_a_cut_connection_is_a_network_error(
    proxied: FaultProxy, cut_after: int, reset: bool, message: str
) -> None:
    proxied.cut_after = cut_after  # 100: inside the headers; 600: inside the stream
    proxied.cut_with_reset = reset
    async with client_for(proxied.base_url) as client:
        result = await client.complete(PROMPT, [])
        proxied.cut_after = None
        again = await client.complete(PROMPT, [])
    assert result.error is not None and result.error.error_class is ErrorClass.NETWORK
    assert result.error.message == message
    assert result.http_status == (None if cut_after == 100 else 200)
    assert again.error is None and again.content
    assert proxied.cuts >= 1


async def test_a_stalled_connection_ends_at_the_idle_limit(proxied: FaultProxy) -> None:
    async with client_for(proxied.base_url, read_timeout_s=0.5) as client:
        proxied.stall = True
        stalled = asyncio.create_task(client.complete(PROMPT, []))
        result = await stalled
        proxied.stall = False
        again = await client.complete(PROMPT, [])
    assert result.error is not None and result.error.error_class is ErrorClass.NETWORK
    assert result.error.message == "no data for 0.5 s"
    assert again.error is None


async def test_a_slowed_connection_still_answers_within_its_limits(proxied: FaultProxy) -> None:
    proxied.rate = 4000.0  # bytes per second: an answer of a few kilobytes takes about a second
    async with client_for(proxied.base_url) as client:
        started = time.monotonic()
        result = await client.complete(PROMPT, [])
    assert result.error is None and result.content
    assert time.monotonic() - started > 0.3
    assert result.received_bytes > 0


async def test_refused_then_back_on_the_same_port(proxied: FaultProxy) -> None:
    async with client_for(proxied.base_url) as client:
        port = proxied.port
        await proxied.stop()
        down = await client.complete(PROMPT, [])
        proxied.refuse = True
        await proxied.restart()
        assert proxied.port == port
        reset = await client.complete(PROMPT, [])
        proxied.refuse = False
        back = await client.complete(PROMPT, [])
    assert down.error is not None and down.error.error_class is ErrorClass.NETWORK
    assert "Cannot connect" in down.error.message or "Connect call failed" in down.error.message
    assert down.http_status is None and down.generation_id is None, "nothing was sent"
    assert reset.error is not None and reset.error.error_class is ErrorClass.NETWORK
    assert back.error is None and back.content


def test_threaded_proxy_for_other_processes(sim_process_port: int) -> None:
    import urllib.error
    import urllib.request

    with ThreadedFaultProxy("127.0.0.1", sim_process_port) as proxy:
        url = f"http://127.0.0.1:{proxy.port}/api/v1/models"
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert resp.status == 200
        proxy.stop()
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(url, timeout=5)
        proxy.restart()
        proxy.set(rate=100_000.0)
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert resp.status == 200 and resp.read()
        with pytest.raises(AttributeError):
            proxy.set(explode=True)


@pytest.fixture
def sim_process_port() -> Any:
    """The simulator on its own loop in a thread, as a process would be for the proxy."""
    loop = asyncio.new_event_loop()
    sim = OpenRouterSim(fast_sim_config())
    import threading

    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(sim.start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield sim.port
    finally:
        asyncio.run_coroutine_threadsafe(sim.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
