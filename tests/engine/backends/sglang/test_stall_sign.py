"""The SGLang servers' own sign of a stall (docs/fleets.md, "A stalled fleet"): /metrics unanswered by
every server that may hold the job's requests, read from a real poll of a port nobody answers on."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import aiohttp
import pytest

from regen.engine.backends.sglang.backend import SGLangBackend
from regen.engine.backends.sglang.server import ServerFacts
from regen.engine.backends.sglang.worker import SIGN_POLLS, Worker
from regen.engine.config.settings import Settings

TIMEOUT = aiohttp.ClientTimeout(total=1.0)


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A port that accepts connections and never answers: a stopped server, as the kernel keeps it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def backend(workers: list[Worker], entry: Worker | None = None) -> SGLangBackend:
    settings = Settings.model_validate(
        {"job": {"backend": "sglang"}, "sglang": {"urls": [w.url for w in workers]}}
    )
    sglang = SGLangBackend(settings)
    sglang.workers, sglang.entry = workers, entry
    return sglang


def holding(worker: Worker, requests: int) -> Worker:
    for _ in range(requests):
        worker.meter.enter(0.0)
    return worker


async def unanswered(worker: Worker) -> None:
    """Polled SIGN_POLLS times, each timed out; one poll alone is no sign."""
    async with aiohttp.ClientSession() as session:
        assert await worker.scrape(session, TIMEOUT) is False
        assert worker.sign_at(1e12) is None, "one unanswered poll is no sign"
        for _ in range(SIGN_POLLS - 1):
            assert await worker.scrape(session, TIMEOUT) is False


async def test_every_server_holding_requests_must_show_it(silent_url: str) -> None:
    stopped = holding(Worker(silent_url, ServerFacts(), 1), 2)
    await unanswered(stopped)
    other = holding(Worker("http://127.0.0.1:9", ServerFacts(), 1), 2)  # not seen unanswered: no sign
    idle = Worker("http://127.0.0.1:10", ServerFacts(), 1)
    await unanswered(idle)
    now = stopped.unanswered_since or 0.0
    assert backend([stopped, other]).stall_sign(now + 3.0) is None
    assert backend([stopped, idle]).stall_sign(now + 3.0) == f"{stopped.name}: /metrics unanswered for 3s"


async def test_behind_the_router_every_server_of_the_fleet_counts(silent_url: str) -> None:
    # regen's router holds the requests (the servers' meters do not) and answers for itself.
    one, two = Worker(silent_url, ServerFacts(), 1), Worker(silent_url + "/", ServerFacts(), 1)
    router = Worker("http://127.0.0.1:11", ServerFacts(), 2, name="router")
    await unanswered(one)
    sglang = backend([one, two], holding(router, 4))
    assert sglang.stall_sign(1e12) is None, "one server not yet seen unanswered"
    await unanswered(two)
    sign = sglang.stall_sign(1e12)
    assert sign is not None and sign.count("/metrics unanswered") == 2, sign
    two.gone = True  # a cluster node that left: not one of the fleet's any more
    assert backend([one, two], router).stall_sign(1e12) is not None
    idle_router = Worker("http://127.0.0.1:11", ServerFacts(), 2, name="router")
    assert backend([one, two], idle_router).stall_sign(1e12) is None, "nothing in flight, no stall"
