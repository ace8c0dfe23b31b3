"""The console attached to a real job on both fleets (the SGLang and OpenRouter simulators): the
fleets pane shows each backend from the job's own snapshot, P pauses one backend in the job while
the other runs on, and d sets the job's deadline, which its controller then steers to."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from textual.pilot import Pilot
from textual.widgets import Input

from regen.console.app import RegenApp
from regen.console.client import SocketSource
from regen.console.options import ConsoleOptions
from regen.console.screens import DeadlineScreen, LaneScreen
from regen.console.widgets.cost import CostPane
from regen.console.widgets.fleets import FleetsPane
from regen.engine.config.settings import Settings
from regen.engine.control.headless import run_headless
from regen.engine.control.server import SOCKET_NAME
from regen.engine.job.job import Job
from regen.engine.schema import LaneView
from regen.sim.openrouter.server import OpenRouterSim
from regen.sim.sglang.server import SGLangSim
from tests.support.datasets import write_dataset


async def wait_until(
    pilot: Pilot[Any], condition: Callable[[], bool], what: str, timeout: float = 30.0
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.05)


def lane(app: RegenApp, name: str) -> LaneView:
    assert app.displayed is not None
    return next(x for x in app.displayed["lanes"] if x["name"] == name)


async def test_the_fleets_pane_and_p_on_a_real_two_fleet_job(
    gpu_sim: SGLangSim,
    paid_sim: OpenRouterSim,
    fleet_settings: Callable[..., Settings],
    tmp_path: Path,
) -> None:
    gpu_sim.apply_config(gpu_sim.config.model_copy(update={"time_scale": 0.3}))
    data = write_dataset(tmp_path, "A", 3000)
    job = Job(fleet_settings(gpu_sim.base_url, paid_sim.base_url, [data]))
    await job.prepare()
    runner = asyncio.create_task(run_headless(job, out=io.StringIO(), interval_s=60))
    socket = job.run_dir / SOCKET_NAME
    while not socket.exists():
        await asyncio.sleep(0.01)
    app = RegenApp(SocketSource(socket), ConsoleOptions(repaint_interval_s=0), clock=time.time)
    try:
        async with app.run_test(size=(140, 42)) as pilot:
            await wait_until(
                pilot,
                lambda: bool(
                    app.displayed and all(x["rows"] for x in app.displayed.get("lanes", [{"rows": 0}]))
                ),
                "rows from both backends",
            )
            await pilot.pause(0.2)
            assert app.has_class("-fleets") and app.query_one(CostPane).display
            text = str(app.query_one("#fleets-pane", FleetsPane).render())
            assert text.index("sglang RUNNING") < text.index("openrouter RUNNING")
            assert "GPU-" in text and "$" in text

            await pilot.press("P")
            await pilot.pause()
            assert isinstance(app.screen, LaneScreen)
            await pilot.press("enter")  # sglang, the first lane
            await wait_until(pilot, lambda: lane(app, "sglang")["state"] == "paused", "sglang paused")
            assert lane(app, "openrouter")["state"] == "running" and app.job_state == "RUNNING"
            assert "sglang PAUSED" in str(app.query_one("#fleets-pane", FleetsPane).render())
            # The job journaled it as the console's pause of that backend alone.
            events = [orjson.loads(x) for x in (job.run_dir / "events.jsonl").read_bytes().splitlines()]
            paused = [e for e in events if e.get("event") == "pause"]
            assert paused and paused[-1]["backend"] == "sglang" and paused[-1]["source"] == "console"
            # OpenRouter goes on making rows while the GPUs take nothing new.
            rows = lane(app, "openrouter")["rows"]
            await wait_until(pilot, lambda: lane(app, "openrouter")["rows"] > rows, "OpenRouter rows")
            await wait_until(
                pilot, lambda: lane(app, "sglang")["in_flight"] == 0, "the GPUs' requests to finish"
            )

            await pilot.press("P")
            await pilot.pause()
            await pilot.press("enter")
            await wait_until(pilot, lambda: lane(app, "sglang")["state"] == "running", "sglang resumed")

            # d: the job takes the deadline, journals it with the console as its source, and steers.
            await pilot.press("d")
            await pilot.pause()
            assert isinstance(app.screen, DeadlineScreen)
            app.screen.query_one(Input).value = "2h"
            await pilot.press("enter")
            await wait_until(
                pilot,
                lambda: (
                    app.displayed is not None
                    and "fleet" in app.displayed
                    and app.displayed["fleet"]["deadline"] == "2h"
                ),
                "the deadline shown",
            )
            fleet = job.snapshot()["fleet"]
            assert fleet["steered"] and fleet["deadline_ts"] is not None
            assert abs(fleet["deadline_ts"] - (time.time() + 7200)) < 30, (
                "a duration typed live counts from now"
            )
            assert "deadline" in str(app.query_one("#fleets-pane", FleetsPane).render())
            set_live = [e for e in job.events_since(0)[1] if e["event"] == "deadline"]
            assert set_live and set_live[-1]["source"] == "console" and set_live[-1]["text"] == "2h"
            job.stop(cancel=True)
            await runner
    finally:
        if not runner.done():
            job.stop(cancel=True)
            await runner
