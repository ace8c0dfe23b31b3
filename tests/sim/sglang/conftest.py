"""Fixtures for the SGLang simulator's own tests: real servers on loopback, a raw HTTP client.

Other folders' tests can reuse the raw client `SGApi` (tests/support/sglang_http.py) and the plain
helpers in tests/support/sglang_sim.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from regen.sim.sglang.server import SGLangSim
from regen.sim.sglang.tokens import SimTokenizer
from tests.support.sglang_http import SGApi
from tests.support.sglang_sim import fast_config, model_folder, running_sim


@pytest.fixture(scope="session")
def kimi_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Kimi-like model folder (tokenizer with <|im_end|>, <think>, </think>; config.json)."""
    return model_folder(tmp_path_factory.mktemp("kimi-model"))


@pytest.fixture(scope="session")
def chatml_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_folder(tmp_path_factory.mktemp("chatml-model"), "chatml")


@pytest.fixture(scope="session")
def kimi_tok(kimi_model: Path) -> SimTokenizer:
    return SimTokenizer(kimi_model)


@pytest.fixture
async def sglang_sim(kimi_tok: SimTokenizer) -> AsyncIterator[SGLangSim]:
    async with running_sim(fast_config(), kimi_tok) as sim:
        yield sim


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        yield session


@pytest.fixture
def api(http: aiohttp.ClientSession, sglang_sim: SGLangSim, kimi_tok: SimTokenizer) -> SGApi:
    return SGApi(http, sglang_sim, kimi_tok)
