"""Fixtures for the simulator's own tests: a real server on loopback and a thin HTTP client
(tests/support/openrouter_http.py).

Only regen.sim is imported from the project: the job's client is tested elsewhere.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from regen.sim.openrouter.server import OpenRouterSim
from tests.support.openrouter_http import Api, quick


@pytest.fixture
async def osim() -> AsyncIterator[OpenRouterSim]:
    server = OpenRouterSim(quick())
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
def api(http: aiohttp.ClientSession, osim: OpenRouterSim) -> Api:
    return Api(http, osim)
