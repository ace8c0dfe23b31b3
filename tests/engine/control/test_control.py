"""The control socket: consoles attach, watch and steer; read-only and other versions are refused."""

from __future__ import annotations

import asyncio
import io
import os
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from regen.console.client import SocketSource
from regen.engine.config.settings import Settings
from regen.engine.control.headless import run_headless
from regen.engine.control.server import PROTOCOL_VERSION, SOCKET_NAME, ControlError
from regen.engine.job.job import Job, JobState
from regen.engine.schema import Snapshot
from regen.sim.openrouter.server import OpenRouterSim
from tests.support.datasets import read_rows, write_dataset
from tests.support.processes import ENV, regen_argv, settings_file, wait_for_attempts, wait_gone


async def start_job(settings: Settings) -> tuple[Job, asyncio.Task[object]]:
    job = Job(settings)
    await job.prepare()
    task = asyncio.create_task(run_headless(job, out=io.StringIO(), interval_s=60))
    socket_path = settings.job.run_dir / SOCKET_NAME
    while not socket_path.exists():
        await asyncio.sleep(0.01)
    return job, task


async def next_snapshot(source: SocketSource, predicate: Callable[[Snapshot], bool]) -> Snapshot:
    async def wait() -> Snapshot:
        async for snap in source.snapshots():
            if predicate(snap):
                return snap
        raise AssertionError(f"the job ended first: {source.closed_reason}")

    return await asyncio.wait_for(wait(), timeout=20)


async def test_console_watches_and_steers(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.time_scale = 0.05
    a = write_dataset(tmp_path, "A", 400)
    job, task = await start_job(make_settings(sim.base_url, [a], concurrency=8))
    path = job.run_dir / SOCKET_NAME
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    console, watcher = SocketSource(path), SocketSource(path, readonly=True)
    hello = await console.connect()
    await watcher.connect()
    assert hello["job"]["model"] == "moonshotai/kimi-k2.5" and hello["job"]["pid"] == os.getpid()
    await next_snapshot(console, lambda s: s["rows"] > 3)

    refused = await watcher.command("pause")
    assert refused == {"ok": False, "message": "this console is read-only"}
    assert job.state is JobState.RUNNING

    reply = await console.command("pause")
    assert reply["ok"] and "paused" in reply["message"]
    paused = await next_snapshot(watcher, lambda s: s["state"] == "PAUSED")
    assert paused["state"] == "PAUSED"
    seen = await next_snapshot(console, lambda s: any(e["event"] == "pause" for e in s["events"]))
    assert next(e for e in seen["events"] if e["event"] == "pause")["source"] == "console"

    reply = await console.command("exclude", provider="DeepInfra")
    assert reply["ok"] and "excluded deepinfra" in reply["message"]
    bad = await console.command("budget", value=0)
    assert not bad["ok"] and "below what is already spent" in bad["message"]
    unknown = await console.command("explode")
    assert not unknown["ok"] and "unknown command" in unknown["message"]
    mark = len(sim.requests)
    assert (await console.command("resume"))["ok"]
    await next_snapshot(console, lambda s: s["rows"] > 40)
    later = list(sim.requests)[mark:]
    assert later and all("deepinfra" in r["provider"].get("ignore", []) for r in later)

    assert (await console.command("stop"))["ok"]
    final = None
    async for snap in watcher.snapshots():
        final = snap
    assert final is not None and final["state"] in ("STOPPED", "DRAINING")
    assert watcher.closed_reason == "the job has ended"
    outcome = await task
    assert outcome.reason.value == "operator"  # type: ignore[attr-defined]
    await console.close()
    await watcher.close()
    rows = read_rows(a)
    assert len(rows) == len({r["line"] for r in rows})
    assert not path.exists(), "the socket goes with the job"


async def test_another_protocol_version_is_told_so(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.time_scale = 0.05
    a = write_dataset(tmp_path, "A", 200)
    job, task = await start_job(make_settings(sim.base_url, [a], concurrency=4))
    with pytest.raises(
        ControlError, match=f"this job speaks control protocol {PROTOCOL_VERSION}, the console speaks 99"
    ):
        await SocketSource(job.run_dir / SOCKET_NAME, protocol=99).connect()
    job.stop(cancel=True)
    await task


async def test_attach_without_a_job_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ControlError, match="no job is running"):
        await SocketSource(tmp_path / SOCKET_NAME).connect()


def test_detached_job_outlives_its_console_and_stops_on_request(sim_process: str, tmp_path: Path) -> None:
    data = [write_dataset(tmp_path, "A", 4000)]
    settings = settings_file(tmp_path, sim_process, data, concurrency=16)
    env = {**ENV, "OPENROUTER_API_KEY": "sk-sim-test"}
    # Not a terminal: the console falls back to status lines; the kill plays a dropped SSH session.
    proc = subprocess.Popen(
        regen_argv("run", "--settings", str(settings)),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_attempts(tmp_path / "run" / "attempts.jsonl", 20)  # the job is running, its console attached
    proc.kill()
    proc.wait()
    pid = int((tmp_path / "run" / "job.lock").read_text())
    os.kill(pid, 0)  # still alive after its console died
    attach = subprocess.Popen(
        regen_argv("attach", "--readonly", "--settings", str(settings)),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Its first status line, before the stop: a Python start can take seconds on a loaded machine.
    assert attach.stdout is not None
    first = attach.stdout.readline()
    stopped = subprocess.run(
        regen_argv("stop", "--settings", str(settings)), env=env, capture_output=True, text=True, timeout=60
    )
    assert stopped.returncode == 0, stopped.stderr
    assert "stopping: draining" in stopped.stderr
    rest, _ = attach.communicate(timeout=30)
    out = first + rest
    assert "RUNNING" in out and "detached: the job has ended" in out
    wait_gone(pid)
    rows = read_rows(data[0])
    assert 0 < len(rows) < 4000 and len({r["line"] for r in rows}) == len(rows)
    log = (tmp_path / "run" / "job.log").read_text()
    assert "stopped: stopped by the operator" in log
