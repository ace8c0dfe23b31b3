"""The recordings the console's tests replay (tests/console/recordings/, `make recordings`) are what a
real job sent: every line checked against engine/schema.py, of this control protocol, holding the
failures and commands the tests rely on; and the replay plays them as a job would."""

from __future__ import annotations

import pytest

from regen.console.source import JobSource
from regen.engine.control.server import PROTOCOL_VERSION
from regen.engine.schema import EventRecord, JobInfo, Snapshot
from tests.support.real_jobs import KINDS
from tests.support.recordings import load
from tests.support.replay import ReplaySource
from tests.support.schema_check import problems


@pytest.mark.parametrize("kind", KINDS)
def test_a_recording_is_what_the_schema_says_and_of_this_protocol(kind: str) -> None:
    recording = load(kind)
    assert recording.header["protocol"] == PROTOCOL_VERSION, (
        f"recorded with control protocol {recording.header['protocol']}: run `make recordings`"
    )
    found = problems(recording.hello["job"], JobInfo, "hello.job")
    found += [p for e in recording.hello["events"] for p in problems(e, EventRecord, "hello.events")]
    for index, snap in enumerate(recording.snapshots()):
        found += problems(snap, Snapshot, f"snapshot {index}")
    assert not found, "\n".join(found[:40])
    for sent in recording.commands():
        assert set(sent) == {"at", "command", "reply"} and set(sent["reply"]) == {"ok", "message"}
    assert recording.entries[-1]["bye"] == "the job has ended"
    # The console's tests take their screens at frame 20, before the first command.
    first_command = next(i for i, e in enumerate(recording.entries) if "command" in e)
    assert sum(1 for e in recording.entries[:first_command] if "snapshot" in e) > 20


def test_the_recordings_hold_what_the_console_s_tests_need() -> None:
    staged = {kind: set(load(kind).header["staged"]) for kind in KINDS}
    assert {"a platform hold", "a quarantine", "openrouter out", "openrouter back"} <= staged["openrouter"]
    assert {"aborts, 503s and drops", "sglang out", "sglang back"} <= staged["sglang"]
    assert "the OpenRouter lane closed" in staged["fleets"]
    sent = {kind: [(c["command"]["name"], c["reply"]["ok"]) for c in load(kind).commands()] for kind in KINDS}
    assert ("budget", False) in sent["openrouter"] and ("budget", True) in sent["openrouter"]
    assert ("deadline", False) in sent["fleets"] and ("stop", True) in sent["sglang"]


async def test_the_replay_plays_holds_answers_from_the_recording_and_ends_with_its_goodbye() -> None:
    source = ReplaySource("openrouter", count=3)
    assert isinstance(source, JobSource)
    hello = await source.connect()
    assert hello["protocol"] == PROTOCOL_VERSION and hello["job"]["model"] == "moonshotai/kimi-k2.5"
    stream = source.snapshots()
    frames = [await anext(stream) for _ in range(3)]
    assert [f["elapsed_s"] for f in frames] == sorted(f["elapsed_s"] for f in frames)
    assert source.now() == load("openrouter").entries[2]["at"]
    reply = await source.command("pause")
    assert reply == {"ok": True, "message": "paused: no new requests; those in flight finish"}
    paused = await anext(stream)
    assert paused["state"] == "PAUSED" and "pause" in [e["event"] for e in paused["events"]]
    refused = await source.command("exclude", provider="nobody")
    assert refused["ok"] is False and "holds no exclude" in refused["message"]
    assert source.commands == [("pause", {}), ("exclude", {"provider": "nobody"})]
    source.advance(10_000)
    async for _ in stream:
        pass
    assert source.closed_reason == "the job has ended"


async def test_a_readonly_replay_is_refused_as_the_job_refuses_it() -> None:
    source = ReplaySource("sglang", readonly=True)
    assert (await source.connect())["readonly"] is True
    assert await source.command("pause") == {"ok": False, "message": "this console is read-only"}
