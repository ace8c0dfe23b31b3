"""Shared fixtures: the OpenRouter simulator on a loopback port (in this loop or in a process of its
own), settings, a tmux server. Their helpers are in tests/support/. Which tests are the `integration`
kind, that `make check` leaves to `make test`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from regen.engine.config.settings import JobSettings, OpenRouterSettings, Settings
from regen.sim.openrouter.server import OpenRouterSim
from tests.support.kinds import FIRST, INTEGRATION, ROOT
from tests.support.openrouter_sim import SECRET, SIM_KEY, fast_sim_config, openrouter_process
from tests.support.tmux import Tmux


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.relative_to(ROOT).as_posix().startswith(INTEGRATION):
            item.add_marker(pytest.mark.integration)
    # Longest first (tests/support/kinds.py FIRST): the runs of a minute start while every worker is
    # busy and the many short tests fill the end, instead of one long test running alone at the end
    # of the suite. A stable sort: each module's tests keep their order.
    items.sort(key=_start_order)


def _start_order(item: pytest.Item) -> int:
    path = item.path.relative_to(ROOT).as_posix()
    for rank, prefix in enumerate(FIRST):
        if path.startswith(prefix):
            return rank
    return len(FIRST) + (0 if item.get_closest_marker("integration") else 1)


@pytest.fixture
async def sim() -> AsyncIterator[OpenRouterSim]:
    server = OpenRouterSim(fast_sim_config())
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
def sim_process(tmp_path: Path) -> Iterator[str]:
    """`regen sim openrouter` in its own process, so it outlives the jobs the tests kill."""
    config = {
        "api_keys": [SIM_KEY, SECRET],
        "time_scale": 0.05,
        "min_completion_tokens": 10,
        "max_completion_tokens": 60,
        "chunk_interval_s": 0.01,
        "keepalive_interval_s": 0.05,
        "generation_lookup_delay_s": 0.1,
        "retry_after_s": 0,
        "faults": {"http_502": 0.02, "cut_mid_stream": 0.02},
        "seed": 3,
    }
    with openrouter_process(tmp_path, config) as base_url:
        yield base_url


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


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    """A tmux server of this test's own, killed at its end."""
    server = Tmux(tmp_path / "tmux.sock")
    yield server
    server("kill-server")
