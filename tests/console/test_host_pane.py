"""The host pane draws the snapshot's hosts; `i` asks the job to inspect them again.

The recordings' jobs have no GPU host (a host needs SSH): the host's view here is what
engine/host/monitor.py's view() gives, which tests/integration/host checks against a real sshd, put into a real
job's recorded frames; the job's answers to the keys are its recorded ones."""

from __future__ import annotations

import copy
from typing import Any

from regen.console.app import RegenApp
from regen.console.widgets.host import NO_HOST, HostPane, host_lines
from regen.engine.schema import HostSGLangView, HostView, InspectView, Snapshot
from tests.support.console_app import log_text, make_app, replay, settle
from tests.support.views import partial

FROZEN_NOW = 1_750_000_100.0  # the clock the host's times are read against

INSPECT: InspectView = {
    "state": "done",
    "finished_at": FROZEN_NOW - 45,
    "datasets": 3,
    "prompts": 123456,
    "invalid": 7,
}

# What engine/host/monitor.py's view() gives for one host (tests/integration/host checks the real one).
HOST: HostView = {
    "name": "gpu1",
    "address": "10.0.0.5:22",
    "state": "connected",
    "error": None,
    "retries": 2,
    "connected_at": FROZEN_NOW - 300,
    "gpus": [
        {
            "index": 0,
            "name": "NVIDIA H200",
            "memory_used_mib": 81234,
            "memory_total_mib": 143771,
            "utilization_pct": 97,
            "processes": [],
        },
        {
            "index": 1,
            "name": "NVIDIA H200",
            "memory_used_mib": 0,
            "memory_total_mib": 143771,
            "utilization_pct": None,
            "processes": [],
        },
    ],
    "gpu_error": None,
    "disk": {
        "data_root": {"path": "/data", "free_bytes": 83_000_000_000},
        "model_path": {"path": "/m", "free_bytes": 1_500_000_000_000},
    },
    "polled_at": FROZEN_NOW - 2,
    "polls": 30,
    "inspect": INSPECT,
    "tunnel": None,
    "sglang": None,
    "sglang_action": None,
}


def sglang(**fields: Any) -> HostSGLangView:
    """The monitor's view of a host's SGLang (engine/host/monitor.py, _sglang_view): every key, None
    where the status said nothing."""
    keys = (
        "ok",
        "error",
        "state",
        "pid",
        "alive",
        "phase",
        "failure",
        "ready",
        "version",
        "launched_version",
        "served_model_name",
        "running",
        "queued",
        "gen_throughput",
        "kv_usage",
        "retractions",
        "port",
    )
    return partial(HostSGLangView, **{**dict.fromkeys(keys), **fields})


def test_a_host_in_a_few_lines() -> None:
    assert host_lines(HOST, FROZEN_NOW) == [
        "gpu1 connected · 2 reconnects",
        "  GPU 0:79/140G 97%  1:0/140G –",
        "  disk data 83G free · model 1.5T free",
        "  3 datasets · 123,456 prompts · 7 invalid · 45s ago",
    ]


def test_a_host_that_is_down_says_why_and_keeps_what_it_knew() -> None:
    down: HostView = {
        **HOST,
        "state": "reconnecting",
        "error": "connection lost during status",
        "inspect": {**INSPECT, "state": "running"},
    }
    lines = host_lines(down, FROZEN_NOW)
    assert lines[0] == "gpu1 reconnecting · 2 reconnects"
    assert lines[1] == "  connection lost during status"
    assert "  inspecting… (last 45s ago)" in lines
    refused: HostView = {
        **HOST,
        "state": "host key refused",
        "error": "gpu1: unknown host key ...",
        "gpus": [],
        "disk": {},
        "inspect": None,
    }
    assert host_lines(refused, FROZEN_NOW) == [
        "gpu1 host key refused · 2 reconnects",
        "  gpu1: unknown host key ...",
    ]


def with_host(host: HostView) -> RegenApp:
    """The console on a recorded job whose frames carry `host`."""

    def edit(snap: Snapshot) -> None:
        snap["hosts"] = [copy.deepcopy(host)]

    return make_app(count=3, edit=edit)


async def test_the_pane_shows_the_hosts_and_i_inspects_again() -> None:
    app = with_host(HOST)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        pane = app.query_one(HostPane)
        assert pane.text.splitlines()[0] == "gpu1 connected · 2 reconnects"
        assert "3 datasets · 123,456 prompts · 7 invalid" in pane.text
        await pilot.press("i")
        await settle(pilot)
        assert replay(app).commands == [("inspect", {})]
        assert "✗ inspect refused: no GPU hosts in the settings" in log_text(app)  # the recorded job's answer


async def test_without_hosts_the_pane_says_so() -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert app.query_one(HostPane).text == NO_HOST


# A host whose SGLang is starting (the monitor's view: engine/host/monitor.py, _sglang_view).
STARTING: HostView = {
    **HOST,
    "sglang": sglang(
        ok=True,
        state="starting",
        phase="kv pool",
        launched_version="0.5.23",
        pid=4242,
        alive=True,
        ready=False,
    ),
    "sglang_action": {
        "what": "start",
        "state": "running",
        "started_at": FROZEN_NOW - 20,
        "message": None,
        "progress": ["gpu1: [3/8] kv pool: KV Cache is allocated. #tokens: 1000000"],
    },
}
READY: HostView = {
    **HOST,
    "sglang": sglang(
        ok=True,
        state="ready",
        phase="ready",
        version="0.5.23",
        pid=4242,
        alive=True,
        ready=True,
        running=120.0,
        queued=450.0,
        kv_usage=0.62,
        gen_throughput=5432.0,
    ),
    "tunnel": {
        "host": "gpu1",
        "url": "http://127.0.0.1:40123",
        "remote_port": 30000,
        "state": "open",
        "error": None,
        "drops": 1,
        "reopens": 1,
        "connections": 12,
    },
}


def test_sglang_starting_shows_its_phase_as_progress() -> None:
    lines = host_lines(STARTING, FROZEN_NOW)
    assert "  SGLang starting 0.5.23 ▰▰▰▱▱▱▱▱ kv pool" in lines
    assert lines[-2:] == ["  starting SGLang…", "  [3/8] kv pool: KV Cache is allocated. #tokens: 1000000"]


def test_sglang_ready_shows_its_load_and_the_tunnel() -> None:
    lines = host_lines(READY, FROZEN_NOW)
    assert "  SGLang ready 0.5.23" in lines
    assert "  run 120 · queue 450 · KV 62% · 5,432 tok/s" in lines
    assert "  tunnel open · 1 drops" in lines
    failed: HostView = {
        **HOST,
        "sglang": sglang(
            ok=True,
            state="dead",
            phase="cuda graphs",
            failure="Exception: Capture cuda graph failed: CUDA out of memory",
        ),
    }
    assert "  failed: Exception: Capture cuda graph failed: CUDA out of memory" in host_lines(
        failed, FROZEN_NOW
    )


async def test_keys_start_sglang_and_stop_it_after_a_confirmation_that_defaults_to_cancel() -> None:
    app = with_host(READY)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("G")
        await settle(pilot)
        assert replay(app).commands == [("sglang_start", {})]
        await pilot.press("K")
        await settle(pilot)
        assert "gpu1" in str(app.screen.query_one("#body").render())
        await pilot.press("enter")  # the focused button is Cancel
        await settle(pilot)
        assert replay(app).commands == [("sglang_start", {})]
        await pilot.press("K")
        await settle(pilot)
        await pilot.press("y")
        await settle(pilot)
        assert replay(app).commands == [("sglang_start", {}), ("sglang_stop", {})]
