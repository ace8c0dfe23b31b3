"""The console on a real SGLang job: GPU time where dollars would be, workers where providers would be."""

from __future__ import annotations

import asyncio
import io
import re
import time
from collections.abc import Callable
from pathlib import Path

from regen.console.app import RegenApp
from regen.console.client import SocketSource
from regen.console.options import ConsoleOptions
from regen.console.widgets.cost import CostPane
from regen.console.widgets.providers import ProvidersPane, ProvidersTable
from regen.console.widgets.status import StatusStrip
from regen.engine.config.settings import Settings
from regen.engine.control.headless import run_headless
from regen.engine.control.server import SOCKET_NAME
from regen.engine.job.job import Job, JobState
from regen.sim.sglang.tokens import SimTokenizer
from tests.support.datasets import write_dataset
from tests.support.recording_sim import recording_sim, slow_config


def servers_running(app: RegenApp) -> bool:
    if app.displayed is None:
        return False
    account = app.displayed["lanes"][0]["account"]
    return account["kind"] == "sglang" and bool(account["servers"]) and bool(account["servers"][0]["running"])


async def test_the_console_shows_gpu_time_and_workers(
    sim_tok: SimTokenizer, sglang_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    async with recording_sim(slow_config(), sim_tok) as server:
        data = write_dataset(tmp_path, "A", 400)
        job = Job(sglang_settings([server.base_url], [data], concurrency=16))
        await job.prepare()
        runner = asyncio.create_task(run_headless(job, out=io.StringIO(), interval_s=60))
        socket = job.run_dir / SOCKET_NAME
        while not socket.exists():
            await asyncio.sleep(0.01)
        app = RegenApp(SocketSource(socket), ConsoleOptions(repaint_interval_s=0), clock=time.time)
        worker = f"127.0.0.1:{server.port}"
        try:
            async with app.run_test(size=(160, 50)) as pilot:
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 30
                while not (app.displayed and app.displayed["rows"] > 3 and servers_running(app)):
                    assert loop.time() < deadline
                    await pilot.pause(0.05)
                await pilot.pause(0.2)
                pane = app.query_one(ProvidersPane)
                table = app.query_one(ProvidersTable)
                assert pane.border_title == "Workers"
                assert [str(c.label) for c in table.columns.values()][1] == "Worker"
                assert worker in table.rows
                spent = table.get_cell(worker, "spent")
                assert str(getattr(spent, "plain", spent)).endswith(("s", "h")), spent
                cost = "\n".join(app.query_one(CostPane)._lines())
                assert "GPU-" in cost and not re.search(r"\$\d", cost), "no dollar amounts"
                assert "running" in cost and "queued" in cost and "KV" in cost
                assert "none: GPU time is counted" in cost
                header = app.query_one(StatusStrip)._markup(app._freshness())
                assert "GPU-" in header and not re.search(r"\$\d", header)
                # Exclusion is not offered: SGLang has no routes to exclude.
                assert app.displayed["lanes"][0]["supports_exclude"] is False
                # The job ends while the console is still attached, as an operator would see it.
                job.stop(cancel=True)
                await asyncio.wait_for(runner, timeout=20)
                await pilot.pause(0.2)
        finally:
            if not runner.done() and job.state not in (JobState.STOPPED, JobState.DONE):
                job.stop(cancel=True)
            await asyncio.wait_for(runner, timeout=20)
