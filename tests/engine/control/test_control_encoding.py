"""What the control socket writes is strict JSON; a snapshot it cannot write is logged once with the
path to the bad value and skipped while the consoles stay attached, and a console let go always
reads why. Real Unix sockets, the real server and the console's own client."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from regen.console.client import SocketSource
from regen.engine.backends.sglang.errors import ErrorClass
from regen.engine.control.server import ENDED_WITHOUT_CLOSE, PROTOCOL_VERSION, ControlServer
from regen.engine.control.wire import encode, unencodable


class Job:
    """A stand-in job whose snapshot the test spoils and mends: one event per snapshot."""

    def __init__(self) -> None:
        self.seq = 0
        self.bad_key = False  # the SGLang backend's ErrorClass as a key, as on main before the fix
        self.bad_event = False
        self.events: list[dict[str, Any]] = []

    def snapshot(self) -> dict[str, Any]:
        self.seq += 1
        self.events.append({"seq": len(self.events) + 1, "event": "tick", "n": self.seq})
        if self.bad_event:
            self.events.append({"seq": len(self.events) + 1, "event": "odd", "what": {1, 2}})
        key: str = ErrorClass.ABORT if self.bad_key else "abort"
        return {"seq": self.seq, "lanes": [{"errors": {key: self.seq}}]}

    def events_since(self, cursor: int) -> tuple[int, list[dict[str, Any]]]:
        return len(self.events), self.events[cursor:]

    async def handle(self, name: str, args: Mapping[str, Any], source: str) -> str:
        return f"did {name}"


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Callable[[Job], Any]]:
    servers: list[ControlServer] = []

    async def start(job: Job) -> ControlServer:
        server = ControlServer(
            tmp_path / "control.sock",
            snapshot=job.snapshot,  # type: ignore[arg-type]  # a stand-in, not the job's Snapshot
            events_since=job.events_since,
            job_info={"pid": os.getpid()},  # type: ignore[typeddict-item]
            handle=job.handle,
            interval_s=3600.0,  # the test pushes snapshots itself
        )
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await asyncio.wait_for(server.close(), 10)


async def next_snapshot(console: SocketSource) -> dict[str, Any]:
    stream = console.snapshots()
    return dict(await asyncio.wait_for(anext(stream), 10))


def test_the_path_to_a_value_that_cannot_be_written_names_the_key_and_its_type() -> None:
    snap = {"state": "RUNNING", "lanes": [{"errors": {"abort": 1}}, {"errors": {ErrorClass.ABORT: 2}}]}
    with pytest.raises(TypeError):
        encode(snap)
    assert unencodable(snap) == "lanes[1].errors.abort: a key of type ErrorClass, not str"
    assert unencodable({"money": [1.0, {"spent": {1, 2}}]}) == "money[1].spent: set"


async def test_a_snapshot_that_cannot_be_encoded_is_logged_once_skipped_and_the_console_stays(
    served: Callable[[Job], Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job = Job()
    job.bad_key = True
    server: ControlServer = await served(job)
    console = SocketSource(tmp_path / "control.sock")
    with caplog.at_level(logging.ERROR, logger="regen.engine.control.server"):
        await console.connect()  # its first snapshot cannot be written: the hello comes alone
        for _ in range(5):
            await server.push_now()
        job.bad_key = False
        await server.push_now()
        snap = await next_snapshot(console)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1, said
    assert "lanes[0].errors.abort: a key of type ErrorClass, not str" in said[0]
    assert server.skipped_broadcasts == 5
    # The console is still attached and gets the first snapshot that can be written, with every
    # event since the last one it got (none lost while the broadcasts were skipped; a snapshot's own
    # event goes with the next one).
    assert snap["seq"] == job.seq and snap["lanes"][0]["errors"] == {"abort": job.seq}
    assert [e["n"] for e in snap["events"]] == list(range(1, job.seq))
    assert console.closed_reason is None and server.clients == 1
    await console.close()


async def test_an_event_that_cannot_be_encoded_is_left_out_and_the_others_arrive(
    served: Callable[[Job], Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job = Job()
    server: ControlServer = await served(job)
    console = SocketSource(tmp_path / "control.sock")
    await console.connect()
    await next_snapshot(console)
    job.bad_event = True
    with caplog.at_level(logging.ERROR, logger="regen.engine.control.server"):
        snaps = []
        for _ in range(2):
            await server.push_now()
            snaps.append(await next_snapshot(console))
    events = [e for snap in snaps for e in snap["events"]]
    assert [e["event"] for e in events].count("odd") == 0 and [e["event"] for e in events].count("tick") >= 2
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "an event not sent to consoles: what: set" in said[0]
    await console.close()


def test_a_job_that_stops_without_closing_its_socket_tells_the_console_why(tmp_path: Path) -> None:
    """The job's loop ends on an error (no close(), no summary): the console reads that, not a bare
    'the connection closed'."""
    path = tmp_path / "control.sock"
    attached = threading.Event()
    ready = threading.Event()

    async def failing_job() -> None:
        job = Job()
        server = ControlServer(
            path,
            snapshot=job.snapshot,  # type: ignore[arg-type]
            events_since=job.events_since,
            job_info={"pid": os.getpid()},  # type: ignore[typeddict-item]
            handle=job.handle,
            interval_s=0.05,
        )
        await server.start()
        ready.set()
        while not attached.is_set():
            await asyncio.sleep(0.01)
        raise RuntimeError("the job failed")

    def run() -> None:
        with pytest.raises(RuntimeError, match="the job failed"):
            asyncio.run(failing_job())

    thread = threading.Thread(target=run)
    thread.start()

    async def console_side() -> str | None:
        assert await asyncio.to_thread(ready.wait, 10)
        console = SocketSource(path, readonly=True)
        await console.connect()
        attached.set()
        async for _ in console.snapshots():
            pass
        await console.close()
        return console.closed_reason

    reason = asyncio.run(asyncio.wait_for(console_side(), 20))
    thread.join(10)
    assert reason == ENDED_WITHOUT_CLOSE


async def test_a_connection_that_closes_without_a_goodbye_is_explained(tmp_path: Path) -> None:
    path = tmp_path / "control.sock"

    async def answer_then_vanish(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(encode({"hello": {"protocol": PROTOCOL_VERSION, "job": {}}}) + b"\n")
        await writer.drain()
        writer.close()  # as a SIGKILLed job's socket does: no goodbye

    server = await asyncio.start_unix_server(answer_then_vanish, path=str(path))
    console = SocketSource(path)
    await console.connect()
    async for _ in console.snapshots():
        pass
    reason = console.closed_reason or ""
    assert "without a goodbye" in reason and f"job.log in {tmp_path}" in reason and "regen attach" in reason
    await console.close()
    server.close()
    await server.wait_closed()
