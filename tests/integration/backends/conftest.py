"""One test body per backend: `backend_case` starts the matching simulator in its own process on
loopback and says how to point settings at it (tests/support/backend_cases.py). The shared
dispatcher is proven shared by running the same tests through every backend."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from regen.engine.config.settings import (
    JobSettings,
    OpenRouterSettings,
    Settings,
    SGLangSettings,
    TokenizerSettings,
)
from regen.sim.openrouter.server import OpenRouterSim
from regen.sim.sglang.server import SGLangSim
from regen.sim.sglang.tokens import SimTokenizer
from tests.support.backend_cases import BACKENDS, BOTH, BackendCase, openrouter_case, sglang_case
from tests.support.openrouter_sim import SIM_KEY, fast_sim_config
from tests.support.sglang_sim import fast_config, model_folder


@pytest.fixture(scope="session")
def sglang_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Kimi-like model folder (config.json and tokenizer), built once."""
    return model_folder(tmp_path_factory.mktemp("backends-sglang-model"))


@pytest.fixture(params=BACKENDS)
def backend_case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BackendCase]:
    if request.param == "sglang":
        with sglang_case(tmp_path, request.getfixturevalue("sglang_model")) as case:
            yield case
    else:
        with openrouter_case(tmp_path) as case:
            yield case


@pytest.fixture(scope="session")
def fleet_tok(sglang_model: Path) -> SimTokenizer:
    return SimTokenizer(sglang_model)


@pytest.fixture
async def gpu_sim(fleet_tok: SimTokenizer) -> AsyncIterator[SGLangSim]:
    """The SGLang simulator in this loop, fast: a GPU fleet that keeps up."""
    sim = SGLangSim(fast_config(served_model_name="kimi-k2.5"), fleet_tok)
    await sim.start()
    try:
        await sim.wait_ready(30)
        yield sim
    finally:
        await sim.stop()


@pytest.fixture
async def paid_sim() -> AsyncIterator[OpenRouterSim]:
    """The OpenRouter simulator in this loop, slower than the fast GPUs: about a second an answer."""
    server = OpenRouterSim(
        fast_sim_config(time_scale=0.6, min_completion_tokens=10, max_completion_tokens=40)
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
def fleet_settings(tmp_path: Path, sglang_model: Path) -> Callable[..., Settings]:
    def build(gpu_url: str, paid_url: str, datasets: list[Path], **job: Any) -> Settings:
        params: dict[str, Any] = {
            "backends": BOTH,
            "datasets": datasets,
            "run_dir": tmp_path / "run",
            "concurrency": 16,
            "backoff_base_s": 0.01,
            "backoff_max_s": 0.05,
            "commit_interval_s": 0.001,
            "reconcile_timeout_s": 5.0,
            **job,
        }
        return Settings(
            openrouter=OpenRouterSettings(base_url=paid_url, api_key=SIM_KEY, max_tokens=64),
            sglang=SGLangSettings(urls=[gpu_url], metrics_interval_s=0.05),
            tokenizer=TokenizerSettings(path=sglang_model, workers=1),
            job=JobSettings(**params),
        )

    return build
