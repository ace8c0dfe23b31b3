"""End to end in real tmux: run on the simulator, pause, exclude a provider, detach, re-attach, stop."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import orjson

from tests.support.datasets import read_rows, write_dataset
from tests.support.processes import ENV, regen_argv, settings_file, wait_gone
from tests.support.tmux import Tmux, needs_tmux

pytestmark = needs_tmux


def test_console_in_tmux_steers_the_job(sim_process: str, tmp_path: Path, tmux: Tmux) -> None:
    data = [write_dataset(tmp_path, "A", 20000)]
    settings = settings_file(tmp_path, sim_process, data, concurrency=8)
    env = " ".join(
        f"{k}={v!r}"
        for k, v in {**ENV, "OPENROUTER_API_KEY": "sk-sim-test", "TERM": "tmux-256color"}.items()
        if k in ("PATH", "PYTHONPATH", "HOME", "OPENROUTER_API_KEY", "TERM", "PYTHONUNBUFFERED")
    )
    command = " ".join(regen_argv("run", "--settings", str(settings)))
    tmux(
        "new-session",
        "-d",
        "-s",
        "regen",
        "-x",
        "120",
        "-y",
        "40",
        f"cd {tmp_path} && env {env} {command}; sleep 600",
    )
    tmux.wait_for(lambda s: "RUNNING" in s and "Providers" in s and "p Pause" in s, "the console")

    # p: the header says PAUSED, the footer offers Resume, and the job stops dispatching.
    tmux.keys("p")
    tmux.wait_for(lambda s: "PAUSED" in s, "PAUSED")
    tmux.wait_for(lambda s: "p Resume" in s, "the footer naming Resume")
    events = tmp_path / "run" / "events.jsonl"
    time.sleep(1.0)
    journal_before = (tmp_path / "run" / "attempts.jsonl").stat().st_size
    time.sleep(1.0)
    assert (tmp_path / "run" / "attempts.jsonl").stat().st_size == journal_before, (
        "nothing dispatched while paused"
    )
    tmux.keys("p")
    tmux.wait_for(lambda s: "RUNNING" in s, "RUNNING again")

    # space on the highlighted provider: EXCL on screen, and later requests carry it in provider.ignore.
    tmux.wait_for(lambda s: "OK" in s, "a provider row")
    # (Endpoints the settings keep out are listed as EXCL from the start: count the EXCL rows.)
    before = tmux.screen().count("EXCL")
    tmux.keys("Space")
    tmux.wait_for(lambda s: s.count("EXCL") > before, "one more EXCL")
    excluded = [orjson.loads(x) for x in events.read_bytes().splitlines() if b'"exclude"' in x]
    assert excluded and excluded[-1]["source"] == "console"
    slug = excluded[-1]["provider"]
    time.sleep(1.5)
    attempts = [orjson.loads(x) for x in (tmp_path / "run" / "attempts.jsonl").read_bytes().splitlines()]
    excluded_at = excluded[-1]["ts"]
    later = [r for r in attempts if r["k"] == "end" and r["ts"] > excluded_at + 0.5 and r.get("provider")]
    assert later, "the job went on after the exclusion"
    assert all(not r["provider"].lower().startswith(slug) for r in later)

    # q detaches: the console exits, the job keeps running.
    pid = int((tmp_path / "run" / "job.lock").read_text())
    tmux.keys("q")
    tmux.wait_for(lambda s: "Providers" not in s, "the console to close")
    os.kill(pid, 0)
    rows_then = len(read_rows(data[0]))
    time.sleep(1.0)
    assert len(read_rows(data[0])) > rows_then, "the job keeps generating with no console"

    # regen attach shows it again.
    tmux(
        "new-window",
        "-t",
        "regen",
        f"cd {tmp_path} && env {env} {' '.join(regen_argv('attach', '--settings', str(settings)))}; sleep 600",
    )
    tmux.wait_for(lambda s: "RUNNING" in s and "EXCL" in s, "the re-attached console")

    # stop ends it with every row intact.
    stopped = subprocess.run(
        regen_argv("stop", "--settings", str(settings)),
        env={**ENV, "OPENROUTER_API_KEY": "sk-sim-test"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert stopped.returncode == 0, stopped.stderr
    wait_gone(pid)
    raw = (data[0] / "raw_responses.jsonl").read_bytes()
    assert raw.endswith(b"\n")
    rows = [orjson.loads(line) for line in raw.splitlines()]
    assert rows and len({r["line"] for r in rows}) == len(rows)
    journal = [orjson.loads(x) for x in (tmp_path / "run" / "attempts.jsonl").read_bytes().splitlines()]
    assert {r["rid"] for r in journal if r["k"] == "start"} == {r["rid"] for r in journal if r["k"] == "end"}
