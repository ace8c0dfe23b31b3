"""The control socket under clients that misbehave: one that stops reading, one that reads slowly,
one that never says hello, one that sends garbage, one of another user. Real Unix sockets, the
real server; the job (or a stand-in snapshot source) keeps going, and healthy clients are served.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import textwrap
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any, cast

import orjson
import pytest

from regen.console.client import SocketSource
from regen.engine.config.settings import Settings
from regen.engine.control.headless import run_headless
from regen.engine.control.server import (
    MAX_LINE,
    PROTOCOL_VERSION,
    WRITE_HIGH_WATER,
    ControlServer,
    open_control,
)
from regen.engine.job.job import Job, JobError
from regen.engine.run.state import StopReason
from regen.engine.schema import JobInfo, Snapshot
from regen.sim.openrouter.server import OpenRouterSim
from tests.support.datasets import read_rows, write_dataset
from tests.support.views import partial

HELLO = orjson.dumps({"hello": {"protocol": PROTOCOL_VERSION, "readonly": False}}) + b"\n"


class Source:
    """A stand-in job: numbered snapshots of a chosen size, one event per snapshot."""

    def __init__(self, pad: int = 0) -> None:
        self.seq = 0
        self.pad = "x" * pad
        self.events: list[dict[str, Any]] = []
        self.commands: list[tuple[str, Mapping[str, Any]]] = []

    def snapshot(self) -> Snapshot:
        self.seq += 1
        self.events.append({"seq": len(self.events) + 1, "event": "tick", "n": self.seq})
        # Not a job's snapshot: the server passes one through as JSON, and these are numbered and sized.
        return cast(Snapshot, {"seq": self.seq, "pad": self.pad})

    def events_since(self, cursor: int) -> tuple[int, list[dict[str, Any]]]:
        if cursor < 0:
            return len(self.events), self.events[cursor:]
        return len(self.events), self.events[cursor:]

    async def handle(self, name: str, args: Mapping[str, Any], source: str) -> str:
        self.commands.append((name, args))
        if name == "boom":
            raise RuntimeError("the job refused: boom")
        if name == "keyerror":
            return str(args["value"])
        if name == "valueerror":
            return str(int(args["value"]))
        if name == "job":
            raise JobError("budget below what is already spent")
        return f"did {name}"


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    servers: list[ControlServer] = []

    async def start(source: Source, **kw: Any) -> ControlServer:
        kw.setdefault("interval_s", 3600.0)  # the tests push snapshots themselves
        server = ControlServer(
            tmp_path / "control.sock",
            snapshot=source.snapshot,
            events_since=source.events_since,
            job_info=partial(JobInfo, pid=os.getpid()),
            handle=source.handle,
            **kw,
        )
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await asyncio.wait_for(server.close(), 10)


async def raw_client(path: Path, *, rcvbuf: int | None = None) -> socket.socket:
    """A client that sends its hello and then reads only when the test says so."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, str(path))
    await loop.sock_sendall(sock, HELLO)
    return sock


async def read_all(sock: socket.socket) -> list[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    data = bytearray()
    while True:
        chunk = await asyncio.wait_for(loop.sock_recv(sock, 1 << 16), 20)
        if not chunk:
            break
        data += chunk
    assert data.endswith(b"\n"), "every message is a whole line, the goodbye included"
    return [orjson.loads(line) for line in data.splitlines()]


class Reader:
    """A healthy console on the real client library's streams: counts every snapshot."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.seqs: list[int] = []
        self.replies: list[dict[str, Any]] = []
        self.other: list[dict[str, Any]] = []
        self.arrived = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        with contextlib.suppress(ConnectionError):
            await self._read()

    async def _read(self) -> None:
        while line := await self.reader.readline():
            message = orjson.loads(line)
            if "snapshot" in message:
                self.seqs.append(message["snapshot"]["seq"])
            elif "id" in message:
                self.replies.append(message)
            else:
                self.other.append(message)
            self.arrived.set()

    async def until(self, predicate: Callable[[], bool]) -> None:
        async def wait() -> None:
            while not predicate():
                self.arrived.clear()
                await self.arrived.wait()

        await asyncio.wait_for(wait(), 20)


# -- a console that stops reading -----------------------------------------------------------------


async def test_stalled_client_is_bounded_then_told_why_while_a_healthy_one_gets_every_snapshot(
    tmp_path: Path,
) -> None:
    await stalled_scenario(tmp_path)


def test_the_same_under_uvloop_the_jobs_loop(tmp_path: Path) -> None:
    uvloop = pytest.importorskip("uvloop")
    uvloop.run(stalled_scenario(tmp_path))


async def stalled_scenario(tmp_path: Path) -> None:
    source = Source(pad=200_000)
    server = ControlServer(
        tmp_path / "control.sock",
        snapshot=source.snapshot,
        events_since=source.events_since,
        job_info=partial(JobInfo),
        handle=source.handle,
        interval_s=3600,  # the test pushes snapshots itself
        max_missed=20,
        min_stall_s=0,
        close_grace_s=60,
    )
    await server.start()
    try:
        await _stalled(server, source, tmp_path)
    finally:
        await asyncio.wait_for(server.close(), 10)


async def _stalled(server: ControlServer, source: Source, tmp_path: Path) -> None:
    stalled = await raw_client(tmp_path / "control.sock", rcvbuf=4096)
    reader, writer, _ = await open_control(tmp_path / "control.sock")
    healthy = Reader(reader, writer)
    await healthy.until(lambda: len(healthy.seqs) >= 1)
    while server.clients < 2:
        await asyncio.sleep(0.01)
    line_size = len(orjson.dumps({"snapshot": {"seq": 10**9, "pad": source.pad}})) + 200
    bound = WRITE_HIGH_WATER + 2 * line_size + (64 << 10)
    most = 0
    pushes = 60
    for _ in range(pushes):
        await server.push_now()
        target = source.seq
        # Lock-step with the healthy client: it must see each snapshot before the next goes out.
        await healthy.until(lambda t=target: healthy.seqs[-1] == t)  # type: ignore[misc]
        stats = server.client_stats()
        most = max([most, *(s["buffered_bytes"] for s in stats)])
        assert most <= bound, f"{most} bytes held for one client (bound {bound})"
    # Every snapshot broadcast reached the healthy client, in order, none skipped.
    first = healthy.seqs[0]
    assert healthy.seqs == list(range(first, first + len(healthy.seqs)))
    assert len(healthy.seqs) >= pushes
    assert server.dropped_clients == 1 and server.clients == 1
    # The stalled client resumes reading: what was buffered for it, then why it was let go.
    messages = await read_all(stalled)
    assert messages[0]["hello"]["protocol"] == PROTOCOL_VERSION
    bye = messages[-1]["bye"]
    assert re.fullmatch(
        r"disconnected: this console read nothing for \d+ s \(21 snapshots behind\); attach again", bye
    )
    got = [m["snapshot"]["seq"] for m in messages if "snapshot" in m]
    assert 0 < len(got) < 10, "a bounded few snapshots were buffered for it, not every one"
    stalled.close()
    writer.close()


async def test_pushes_faster_than_the_timer_do_not_disconnect_a_client_early(
    served: Callable[..., Any], tmp_path: Path
) -> None:
    source = Source(pad=200_000)
    # Two missed snapshots would be too many, but not before the client read nothing for an hour.
    server: ControlServer = await served(source, max_missed=2, min_stall_s=3600)
    stalled = await raw_client(tmp_path / "control.sock", rcvbuf=4096)
    while server.clients < 1:
        await asyncio.sleep(0.01)
    for _ in range(30):
        await server.push_now()
        await asyncio.sleep(0)
    assert server.clients == 1 and server.dropped_clients == 0
    assert server.client_stats()[0]["missed"] > 2
    stalled.close()


async def test_slow_client_gets_the_newest_snapshot_and_is_told_of_dropped_events(
    served: Callable[..., Any], tmp_path: Path
) -> None:
    source = Source(pad=50_000)
    server: ControlServer = await served(source, max_missed=10_000, max_events=5)
    slow = await raw_client(tmp_path / "control.sock", rcvbuf=4096)
    while server.clients < 1:
        await asyncio.sleep(0.01)
    for _ in range(80):
        await server.push_now()
        await asyncio.sleep(0)  # let the sender run: it is blocked on the full socket anyway
    last = source.seq
    messages: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    data = bytearray()
    while not any(m.get("snapshot", {}).get("seq") == last for m in messages):
        data += await asyncio.wait_for(loop.sock_recv(slow, 1 << 16), 20)
        *complete, rest = data.split(b"\n")
        messages += [orjson.loads(x) for x in complete]
        data = bytearray(rest)
    snaps = [m["snapshot"] for m in messages if "snapshot" in m]
    assert len(snaps) < 40, "stale snapshots were replaced, not queued"
    assert snaps[-1]["seq"] == last
    # Not one event lost silently: each was delivered, or counted in events_dropped.
    delivered = sum(len(s["events"]) for s in snaps)
    dropped = sum(s.get("events_dropped", 0) for s in snaps)
    assert dropped > 0
    # The last snapshot's own event goes out with the next one.
    assert delivered + dropped == len(source.events) - 1
    slow.close()


async def test_console_client_turns_dropped_events_into_a_log_line(
    served: Callable[..., Any], tmp_path: Path
) -> None:
    source = Source(pad=50_000)
    server: ControlServer = await served(source, max_missed=10_000, max_events=3)
    console = SocketSource(tmp_path / "control.sock")
    await console.connect()
    assert console._writer is not None
    transport = cast(asyncio.Transport, console._writer.transport)  # a stream's transport reads too
    transport.pause_reading()  # the console stops reading for a while: the server drops events
    for _ in range(40):
        await server.push_now()
        await asyncio.sleep(0)
    transport.resume_reading()
    seen: list[dict[str, Any]] = []

    async def collect() -> None:
        async for snap in console.snapshots():
            seen.extend(snap["events"])
            if snap["seq"] == source.seq:  # type: ignore[typeddict-item]  # Source.snapshot's own key
                return

    await asyncio.wait_for(collect(), 20)
    notes = [e for e in seen if e["event"] == "events_not_shown"]
    assert notes and all(e["count"] > 0 for e in notes)
    ticks = [e for e in seen if e["event"] == "tick"]
    assert len(ticks) + sum(e["count"] for e in notes) == source.seq - 1
    await console.close()


async def test_console_client_skips_stale_snapshots_but_keeps_their_events(
    served: Callable[..., Any], tmp_path: Path
) -> None:
    source = Source()
    server: ControlServer = await served(source)
    console = SocketSource(tmp_path / "control.sock")
    await console.connect()
    for _ in range(40):  # nobody takes the console's snapshots meanwhile (a busy screen)
        await server.push_now()
        await asyncio.sleep(0.005)
    seen: list[dict[str, Any]] = []
    snaps = 0

    async def collect() -> None:
        nonlocal snaps
        async for snap in console.snapshots():
            snaps += 1
            seen.extend(snap["events"])
            if snap["seq"] == source.seq:  # type: ignore[typeddict-item]  # Source.snapshot's own key
                return

    await asyncio.wait_for(collect(), 20)
    assert snaps <= 5, "only the newest few snapshots are kept"
    assert [e["n"] for e in seen] == list(range(1, source.seq)), "every event, once, in order"
    await console.close()


async def test_job_finishes_and_stops_with_a_stalled_console_attached(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.time_scale = 0.01
    data = write_dataset(tmp_path, "A", 300)
    job = Job(make_settings(sim.base_url, [data], concurrency=16))
    await job.prepare()
    task = asyncio.create_task(run_headless(job, out=io.StringIO(), interval_s=60))
    path = job.run_dir / "control.sock"
    while not path.exists():
        await asyncio.sleep(0.01)
    stalled = await raw_client(path, rcvbuf=4096)
    outcome = await asyncio.wait_for(task, 120)  # close() cuts it off instead of waiting on it
    assert outcome.reason is StopReason.DONE
    rows = read_rows(data)
    assert sorted(r["line"] for r in rows) == list(range(300))
    stalled.close()


# -- garbage and strangers --------------------------------------------------------------------------


async def test_no_hello_is_dropped_after_the_timeout(
    served: Callable[..., Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = Source()
    server: ControlServer = await served(source, hello_timeout_s=0.3)
    reader, writer = await asyncio.open_unix_connection(str(tmp_path / "control.sock"))
    line = await asyncio.wait_for(reader.readline(), 10)
    assert orjson.loads(line) == {"error": "no hello within 0.3 s"}
    assert await asyncio.wait_for(reader.read(), 10) == b""
    assert server.clients == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    writer.close()


@pytest.mark.parametrize(
    ("hello", "error"),
    [
        (b"garbage\n", "expected a hello (not JSON)"),
        (b"\xff\xfe\x00\x01\n", "expected a hello (not JSON)"),
        (b"[1, 2]\n", "expected a hello"),
        (b'{"hello": 5}\n', "expected a hello"),
        (
            b'{"hello": {"protocol": "2"}}\n',
            f"this job speaks control protocol {PROTOCOL_VERSION}, the console speaks 2",
        ),
        (
            b'{"hello": {"protocol": %d, "readonly": "no"}}\n' % PROTOCOL_VERSION,
            "hello: readonly must be true or false",
        ),
        (b"{" * (MAX_LINE + 5) + b"\n", f"expected a hello (message longer than {MAX_LINE} bytes)"),
    ],
)
async def test_a_bad_hello_gets_an_error_and_is_closed(
    served: Callable[..., Any], tmp_path: Path, hello: bytes, error: str, caplog: pytest.LogCaptureFixture
) -> None:
    server: ControlServer = await served(Source())
    reader, writer = await asyncio.open_unix_connection(str(tmp_path / "control.sock"))
    writer.write(hello)
    with_drain = asyncio.create_task(writer.drain())
    line = await asyncio.wait_for(reader.readline(), 10)
    assert orjson.loads(line) == {"error": error}
    assert await asyncio.wait_for(reader.read(), 10) == b""
    with_drain.cancel()
    assert server.clients == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    writer.close()


async def test_garbage_after_hello_gets_errors_and_the_connection_stays_usable(
    served: Callable[..., Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = Source()
    server: ControlServer = await served(source)
    reader, writer, _ = await open_control(tmp_path / "control.sock")
    client = Reader(reader, writer)
    sent = [
        b"not json",
        b"\xff\xfe\x00binary\x01",
        b"[1, 2]",
        b'"a string"',
        b"42",
        b'{"id": [1], "command": "pause"}',
        b'{"id": 1, "command": 5}',
        b'{"id": 2, "command": "pause", "args": [1]}',
        b'{"id": 3, "command": "keyerror", "args": {}}',
        b'{"id": 4, "command": "valueerror", "args": {"value": "lots"}}',
        b'{"id": 5, "command": "boom"}',
        b'{"id": 6, "command": "job"}',
        b"x" * (MAX_LINE + 1),
        b"",  # a blank line is ignored
        b'{"id": 7, "command": "pause", "args": {"why": "\\u0000"}}',
    ]
    for line in sent:
        writer.write(line + b"\n")
    # A line of 3 MiB written in pieces, then a command after it.
    writer.write(b"y" * (1 << 20))
    writer.write(b"y" * (2 << 20) + b"\n")
    writer.write(b'{"id": "last", "command": "resume"}\n')
    await writer.drain()
    await client.until(lambda: any(r.get("id") == "last" for r in client.replies))
    errors = [m["error"] for m in client.other if "error" in m]
    assert errors[:5] == [
        errors[0],
        errors[1],
        "a message is a JSON object",
        "a message is a JSON object",
        "a message is a JSON object",
    ]
    assert errors[0].startswith("not JSON") and errors[1].startswith("not JSON")
    assert errors[5:] == [
        "id must be a number or a string",
        f"message longer than {MAX_LINE} bytes",
        f"message longer than {MAX_LINE} bytes",
    ]
    replies = {r["id"]: r for r in client.replies}
    assert replies[1] == {"id": 1, "ok": False, "message": "command must be a non-empty string"}
    assert replies[2] == {"id": 2, "ok": False, "message": "args must be an object"}
    assert replies[3] == {"id": 3, "ok": False, "message": "keyerror: missing argument 'value'"}
    assert replies[4]["ok"] is False and replies[4]["message"].startswith("valueerror: bad argument (")
    assert replies[5] == {"id": 5, "ok": False, "message": "the job refused: boom"}
    assert replies[6] == {"id": 6, "ok": False, "message": "budget below what is already spent"}
    assert replies[7] == {"id": 7, "ok": True, "message": "did pause"}
    assert replies["last"] == {"id": "last", "ok": True, "message": "did resume"}
    assert [name for name, _ in source.commands] == [
        "keyerror",
        "valueerror",
        "boom",
        "job",
        "pause",
        "resume",
    ]
    assert server.clients == 1, "still attached"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    writer.close()


async def test_a_flood_of_garbage_is_disconnected_with_the_reason(
    served: Callable[..., Any], tmp_path: Path
) -> None:
    server: ControlServer = await served(Source())
    reader, writer, _ = await open_control(tmp_path / "control.sock")
    client = Reader(reader, writer)
    writer.write(b"nope\n" * 500)
    await writer.drain()
    await asyncio.wait_for(client.task, 20)
    assert client.other[-1] == {"bye": "disconnected: 100 malformed messages in a row"}
    assert server.clients == 0


PEER = textwrap.dedent(
    """
    import json, socket, sys
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(sys.argv[1])
    except PermissionError:
        print(json.dumps({"connect": "EACCES"}))
        sys.exit(0)
    try:
        s.sendall(b'{"hello": {"protocol": PROTOCOL_VERSION, "readonly": false}}\\n')
    except OSError:
        pass  # the server may have answered and closed first
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    print(json.dumps({"received": data.decode()}))
    """
).replace("PROTOCOL_VERSION", str(PROTOCOL_VERSION))


def _as_nobody() -> None:
    entry = pwd.getpwnam("nobody")
    os.setgroups([])
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)


@pytest.mark.skipif(os.geteuid() != 0, reason="running a client as another user needs root")
async def test_a_peer_of_another_user_is_refused() -> None:
    python = shutil.which("python3", path="/usr/bin:/bin:/usr/local/bin")
    if python is None:
        pytest.skip("no system python3 that another user may run")
    # A folder every user may enter (pytest's tmp_path is private to root).
    folder = Path(tempfile.mkdtemp(prefix="regen-ctl-", dir="/tmp"))
    os.chmod(folder, 0o755)
    source = Source()
    server = ControlServer(
        folder / "control.sock",
        snapshot=source.snapshot,
        events_since=source.events_since,
        job_info=partial(JobInfo),
        handle=source.handle,
        interval_s=3600,
    )
    await server.start()
    try:

        async def peer() -> dict[str, Any]:
            proc = await asyncio.create_subprocess_exec(
                python,
                "-c",
                PEER,
                str(folder / "control.sock"),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                preexec_fn=_as_nobody,
                env={"PATH": "/usr/bin:/bin"},
            )
            out, err = await asyncio.wait_for(proc.communicate(), 30)
            assert proc.returncode == 0, err
            return dict(json.loads(out))

        # The socket's mode stops the stranger at the door...
        assert await peer() == {"connect": "EACCES"}
        # ...and with the mode loosened by someone, the server still checks who is calling.
        os.chmod(folder / "control.sock", 0o666)
        answer = await peer()
        assert answer == {"received": '{"error":"only the job\'s owner may attach"}\n'}
        assert server.clients == 0 and source.commands == []
    finally:
        await server.close()
        shutil.rmtree(folder, ignore_errors=True)
