"""The job's host monitor: polls without overlap, the last inspect, reconnection shown; the job's wiring."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from regen.console.widgets.host import host_lines
from regen.engine.config.settings import Settings
from regen.engine.host.monitor import HostMonitor
from regen.engine.job.job import Job, JobError
from regen.sim.openrouter.server import OpenRouterSim
from tests.support.datasets import write_dataset
from tests.support.hosts import HostFactory
from tests.support.sshd import SshServer


async def until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.02)


def inspect_state(monitor: HostMonitor) -> str | None:
    """The first host's inspect state (None: none yet)."""
    inspect = monitor.view()[0]["inspect"]
    return None if inspect is None else inspect["state"]


def spans(server: SshServer, arg: str) -> list[tuple[float, float]]:
    """(start, end) of each finished fake nvidia-smi call with this argument prefix."""
    starts: dict[str, float] = {}
    out = []
    for line in server.calls():
        pid, what, ts, called = line.split(" ", 3)
        if not called.startswith(arg):
            continue
        if what == "start":
            starts[pid] = float(ts)
        elif pid in starts:
            out.append((starts.pop(pid), float(ts)))
    return out


async def test_polls_never_overlap_and_the_view_is_plain_data(
    own_sshd: SshServer, tree: dict[str, Path], make_host: HostFactory
) -> None:
    server = own_sshd
    (server.bin_dir / "delay").write_text("0.15")  # each nvidia-smi call takes 0.15 s
    monitor = HostMonitor([make_host(server, tree, poll_interval_s=0.01)], inspect_at_start=False)
    monitor.start()
    try:
        await until(lambda: monitor.view()[0]["polls"] >= 3)
    finally:
        await monitor.close()
    view = monitor.view()
    assert orjson.loads(orjson.dumps(view)) == view, "JSON-able as it is"
    host = view[0]
    assert host["name"] == "gpu1" and host["error"] is None and host["inspect"] is None
    assert [g["memory_used_mib"] for g in host["gpus"]] == [81234, 0]
    data_root = host["disk"]["data_root"]
    assert data_root is not None and data_root["free_bytes"] > 0
    calls = sorted(spans(server, "--query-gpu"))
    assert len(calls) >= 3
    for (_, end), (start, _) in itertools.pairwise(calls):
        assert start >= end, "a poll began before the one before it had finished"
    assert host["state"] == "closed"


async def test_inspect_at_start_and_again_on_request(
    sshd: SshServer, tree: dict[str, Path], make_host: HostFactory
) -> None:
    monitor = HostMonitor([make_host(sshd, tree, poll_interval_s=5)])
    monitor.start()
    try:
        await until(lambda: inspect_state(monitor) == "done")
        first = monitor.view()[0]["inspect"]
        assert first is not None
        # What the console's host pane makes of the real view.
        drawn = host_lines(monitor.view()[0], time.time())
        assert drawn[0] == "gpu1 connected" and drawn[1] == "  GPU 0:79/140G 97%  1:0/140G –"
        assert drawn[2].startswith("  disk data ") and " free · model " in drawn[2]
        assert drawn[3].startswith("  3 datasets · 52 prompts · 7 invalid · ")
        assert first["datasets"] == 3 and first["prompts"] == 40 + 7 + 5 and first["invalid"] == 5 + 1 + 1
        assert first["duplicates"] == 2 and first["results_rows"] == 11
        assert monitor.inspect_now() == "inspecting gpu1"
        assert monitor.inspect_now("gpu1") == "already inspecting gpu1"
        assert inspect_state(monitor) == "running"
        await monitor.wait_inspected()
        again = monitor.view()[0]["inspect"]
        assert again is not None and again["state"] == "done" and again["finished_at"] > first["finished_at"]
    finally:
        await monitor.close()


async def test_a_restarted_host_shows_reconnecting_then_connected(
    own_sshd: SshServer, tree: dict[str, Path], make_host: HostFactory
) -> None:
    server = own_sshd
    monitor = HostMonitor([make_host(server, tree, poll_interval_s=0.1)], inspect_at_start=False)
    monitor.connection("gpu1").backoff_base_s = 0.1
    monitor.start()
    seen: set[str] = set()

    def state() -> str:
        s = str(monitor.view()[0]["state"])
        seen.add(s)
        return s

    try:
        await until(lambda: monitor.view()[0]["polls"] >= 1)
        server.stop()
        await until(lambda: state() in ("disconnected", "reconnecting"))
        await asyncio.sleep(0.5)
        assert state() in ("disconnected", "reconnecting", "unreachable")
        server.start()
        polls = monitor.view()[0]["polls"]
        await until(lambda: state() == "connected" and monitor.view()[0]["polls"] > polls)
    finally:
        await monitor.close()
    assert "reconnecting" in seen and monitor.view()[0]["retries"] >= 1


async def test_a_refused_key_is_shown_and_not_hammered(
    sshd: SshServer, tree: dict[str, Path], make_host: HostFactory, tmp_path: Path
) -> None:
    known = tmp_path / "empty"
    known.write_text("")
    monitor = HostMonitor([make_host(sshd, tree, known_hosts=known, poll_interval_s=0.01)])
    monitor.start()
    try:
        await until(lambda: inspect_state(monitor) == "failed")
        await asyncio.sleep(0.5)
        await until(lambda: monitor.view()[0]["state"] == "host key refused")
        host = monitor.view()[0]
    finally:
        await monitor.close()
    assert host["error"] is not None and "unknown host key" in host["error"]
    inspect = host["inspect"]
    assert inspect is not None and inspect["error"] is not None and "unknown host key" in inspect["error"]
    assert monitor._hosts["gpu1"].failures <= 3, "polls back off while the key is refused"


def test_no_hosts_means_nothing_to_watch() -> None:
    monitor = HostMonitor([])
    assert monitor.view() == [] and len(monitor) == 0


async def test_the_job_polls_its_hosts_and_inspects_on_command(
    sim: OpenRouterSim,
    sshd: SshServer,
    tree: dict[str, Path],
    make_host: HostFactory,
    tmp_path: Path,
    make_settings: Callable[..., Settings],
) -> None:
    sim.config.time_scale = 0.05
    settings = make_settings(sim.base_url, [write_dataset(tmp_path, "A", 40)], concurrency=2)
    settings.hosts = [make_host(sshd, tree, poll_interval_s=0.2)]
    job = Job(settings)
    await job.prepare()
    runner = asyncio.ensure_future(job.run())
    await until(lambda: job.state.value == "RUNNING")
    job.pause()  # the run stays open while the hosts are looked at
    snap: dict[str, Any] = {}

    def inspected() -> bool:
        snap.update(job.snapshot())
        return (snap["hosts"][0]["inspect"] or {}).get("state") == "done"

    try:
        await until(inspected)
        assert snap["hosts"][0]["state"] == "connected" and snap["hosts"][0]["gpus"]
        assert await job.handle_command("inspect", {}) == "inspecting gpu1"
        try:
            await job.handle_command("inspect", {"host": "gpu9"})
        except JobError as exc:
            assert "no host named 'gpu9'" in str(exc)
        else:
            raise AssertionError("an unknown host was accepted")
    finally:
        job.resume()
        await asyncio.wait_for(runner, 30)
    assert job.snapshot()["hosts"][0]["state"] == "closed", "the run's end closes the connection"
