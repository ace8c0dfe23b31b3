"""The console attached to a real job (on the OpenRouter simulator) through its control socket."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual.pilot import Pilot

from regen.console.app import RegenApp
from regen.console.client import SocketSource
from regen.console.options import ConsoleOptions
from regen.console.screens import ConfirmScreen
from regen.console.widgets.providers import ProvidersTable
from regen.engine.config.settings import Settings
from regen.engine.control.headless import run_headless
from regen.engine.control.server import SOCKET_NAME
from regen.engine.job.job import Job, JobState
from regen.sim.openrouter.server import OpenRouterSim
from tests.support.console_app import log_text
from tests.support.datasets import write_dataset
from tests.support.jobs import openrouter


async def wait_until(pilot: Pilot[Any], condition: Callable[[], bool], timeout: float = 20.0) -> None:
    """Wait for the job to get somewhere (it runs on its own clock)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not reached"
        await pilot.pause(0.05)


async def test_the_console_watches_and_steers_a_real_job(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.time_scale = 0.05
    dataset = write_dataset(tmp_path, "A", 2000)
    job = Job(make_settings(sim.base_url, [dataset], concurrency=8, reconcile_timeout_s=0.5))
    await job.prepare()
    runner = asyncio.create_task(run_headless(job, out=io.StringIO(), interval_s=60))
    socket = job.run_dir / SOCKET_NAME
    while not socket.exists():
        await asyncio.sleep(0.01)
    app = RegenApp(
        SocketSource(socket), ConsoleOptions(repaint_interval_s=0, export_dir=tmp_path), clock=time.time
    )
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until(pilot, lambda: app.displayed is not None and app.displayed["rows"] > 3)
            table = app.query_one(ProvidersTable)
            assert table.row_count >= 1 and app.job_state == "RUNNING"
            await pilot.press("p")
            await wait_until(pilot, lambda: app.job_state == "PAUSED")
            assert job.state is JobState.PAUSED
            await pilot.press("p")
            await wait_until(pilot, lambda: app.job_state == "RUNNING")
            slug = app.highlighted_slug
            assert slug is not None
            await pilot.press("x")
            await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("y")
            await wait_until(pilot, lambda: slug in openrouter(job).excluded or "refused" in log_text(app))
            await pilot.press("e")
            await wait_until(pilot, lambda: len(list(tmp_path.glob("regen-snapshot-*"))) == 3)
            assert "paused" in log_text(app) and "resumed" in log_text(app)
            assert app.job_state == "RUNNING"  # all of the above while the job was still running
    finally:
        if not runner.done() and job.state not in (JobState.STOPPED, JobState.DONE):
            job.stop(cancel=True)
        await asyncio.wait_for(runner, timeout=20)
