"""Shared fixtures: the OpenRouter simulator on a loopback port, small datasets, settings."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from regen.engine.config.settings import JobSettings, OpenRouterSettings, Settings
from regen.sim.openrouter.config import SimConfig
from regen.sim.openrouter.server import OpenRouterSim

SIM_KEY = "sk-sim-test"


def fast_sim_config(**overrides: Any) -> SimConfig:
    """A simulator that answers in milliseconds: tests check behaviour, not speed."""
    base: dict[str, Any] = {
        "time_scale": 0.002,
        "min_completion_tokens": 8,
        "max_completion_tokens": 40,
        "chunk_interval_s": 0.005,
        "keepalive_interval_s": 0.02,
        "generation_lookup_delay_s": 0.05,
        "retry_after_s": 0,
        "seed": 1,
    }
    base.update(overrides)
    return SimConfig(**base)


@pytest.fixture
async def sim() -> AsyncIterator[OpenRouterSim]:
    server = OpenRouterSim(fast_sim_config())
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def write_dataset(
    root: Path, name: str, prompts: list[list[dict[str, Any]]] | int, *, raw: list[bytes] | None = None
) -> Path:
    """A dataset folder; `prompts` is message lists, or a count of generated single-turn prompts."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(prompts, int):
        prompts = [
            [{"role": "user", "content": f"{name} question {i}: explain topic {i % 17}."}]
            for i in range(prompts)
        ]
    lines = raw if raw is not None else [orjson.dumps({"messages": m}) for m in prompts]
    (folder / "prompts.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
    return folder


@pytest.fixture
def make_settings(tmp_path: Path) -> Callable[..., Settings]:
    def build(base_url: str, datasets: list[Path] | None = None, **job: Any) -> Settings:
        openrouter = job.pop("openrouter", {})
        params: dict[str, Any] = {
            "datasets": datasets or [],
            "run_dir": tmp_path / "run",
            "concurrency": 64,
            "backoff_base_s": 0.01,
            "backoff_max_s": 0.05,
            "commit_interval_s": 0.001,
            "reconcile_timeout_s": 5.0,
        }
        params.update(job)
        return Settings(
            openrouter=OpenRouterSettings(base_url=base_url, api_key=SIM_KEY, max_tokens=64, **openrouter),
            job=JobSettings(**params),
        )

    return build


def read_rows(folder: Path) -> list[dict[str, Any]]:
    path = folder / "raw_responses.jsonl"
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]
