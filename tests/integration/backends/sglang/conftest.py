"""Fixtures for the SGLang backend's own tests: the simulator in this event loop, recording what it
served per rid (tests/support/recording_sim.py), and settings pointing a job at it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
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
from regen.sim.sglang.tokens import SimTokenizer
from tests.support.recording_sim import RecordingSim, recording_sim, sim_config
from tests.support.sglang_sim import model_folder


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Kimi-like model folder: the simulator serves its tokenizer, the job renders with it."""
    return model_folder(tmp_path_factory.mktemp("sglang-model"))


@pytest.fixture(scope="session")
def sim_tok(model_dir: Path) -> SimTokenizer:
    return SimTokenizer(model_dir)


@pytest.fixture
def sglang_settings(tmp_path: Path, model_dir: Path) -> Callable[..., Settings]:
    """Settings for a job on the SGLang backend against `urls`."""

    def build(
        urls: list[str], datasets: list[Path], sglang: dict[str, Any] | None = None, **job: Any
    ) -> Settings:
        params: dict[str, Any] = {
            "backend": "sglang",
            "datasets": datasets,
            "run_dir": tmp_path / "run",
            "concurrency": 32,
            "backoff_base_s": 0.01,
            "backoff_max_s": 0.05,
            "commit_interval_s": 0.001,
            **job,
        }
        return Settings(
            openrouter=OpenRouterSettings(max_tokens=64),
            sglang=SGLangSettings(urls=urls, metrics_interval_s=0.05, **(sglang or {})),
            tokenizer=TokenizerSettings(path=model_dir, workers=1),
            job=JobSettings(**params),
        )

    return build


@pytest.fixture
async def sim(sim_tok: SimTokenizer) -> AsyncIterator[RecordingSim]:
    """A ready simulator serving the model folder, fast and without faults."""
    async with recording_sim(sim_config(), sim_tok) as server:
        yield server
