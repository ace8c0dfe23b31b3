"""Fixtures for the SGLang backend's own tests: the simulator in this event loop, recording what it
served per rid, and settings pointing a job at it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from regen.engine.config.settings import (
    JobSettings,
    OpenRouterSettings,
    Settings,
    SGLangSettings,
    TokenizerSettings,
)
from regen.sim.sglang.config import SimSGLangConfig
from regen.sim.sglang.logs import SimLog
from regen.sim.sglang.request import Req
from regen.sim.sglang.server import SGLangSim
from regen.sim.sglang.tokens import SimTokenizer
from tests.support.sglang_sim import fast_config, model_folder

SERVED = "kimi-k2.5"


class RecordingSim(SGLangSim):
    """The simulator, keeping what it received and generated for every client request by rid: the
    server's own record that rows are compared with."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.served: dict[str, dict[str, Any]] = {}
        self.abort_calls: list[str | None] = []  # the rid of every /abort_request, in order

    async def _abort_request(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read() or b"{}")  # aiohttp keeps the body for the handler
        self.abort_calls.append(body.get("rid") if isinstance(body, dict) else None)
        return await super()._abort_request(request)

    def _on_finish(self, req: Req) -> None:
        super()._on_finish(req)
        if not req.internal:
            self.served[req.rid] = {
                "prompt_ids": list(req.prompt_ids),
                "output_ids": list(req.output_ids),
                "finish": req.finish,
            }


@asynccontextmanager
async def recording_sim(
    config: SimSGLangConfig, tokenizer: SimTokenizer, log: SimLog | None = None, port: int = 0
) -> AsyncIterator[RecordingSim]:
    sim = RecordingSim(config, tokenizer, log=log)
    await sim.start(port=port)
    try:
        await sim.wait_ready(30)
        yield sim
    finally:
        await sim.stop()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Kimi-like model folder: the simulator serves its tokenizer, the job renders with it."""
    return model_folder(tmp_path_factory.mktemp("sglang-model"))


@pytest.fixture(scope="session")
def sim_tok(model_dir: Path) -> SimTokenizer:
    return SimTokenizer(model_dir)


def sim_config(**overrides: Any) -> SimSGLangConfig:
    return fast_config(served_model_name=SERVED, **overrides)


def slow_config(**overrides: Any) -> SimSGLangConfig:
    """Real time at 40 tokens/s per request: a 64-token answer stays in flight for 1.6 s."""
    quick_start = {f"startup_{phase}_s": 0.01 for phase in ("weights", "kv_pool", "cuda_graph", "http", "warmup")}
    return sim_config(time_scale=1.0, output_len_min=200, output_len_max=300, **quick_start, **overrides)


@pytest.fixture
def sglang_settings(tmp_path: Path, model_dir: Path) -> Callable[..., Settings]:
    """Settings for a job on the SGLang backend against `urls`."""

    def build(urls: list[str], datasets: list[Path], sglang: dict[str, Any] | None = None, **job: Any) -> Settings:
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
