"""A job on a cluster's nodes: the run starts with the first ready node, a slow node joins while it
runs, a node's step killed mid-run leaves, and every prompt has exactly one row (docs/clusters.md).

The real parts: Slurm (tests/support/slurm.py), the stand-in SGLang per node, the router (smg), the
job process (`regen run --headless`). Only the GPUs are pretend.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from regen.engine.run.events import EVENTS_FILE
from tests.support.datasets import read_rows, write_dataset
from tests.support.gpuhost import group_members
from tests.support.journals import journal
from tests.support.processes import ENV, regen_argv, run_regen, start_headless_run, wait_rows
from tests.support.slurm import LabCluster, Slurm, lab_cluster

PROMPTS = 600
# One request decodes this many tokens per simulated second: at the tests' time scale (0.01) an
# answer of 8-40 tokens takes about half a second, and one node makes the job last about 15 s.
DECODE = 0.5


@pytest.fixture
def lab(empty_queue: Slurm, tmp_path: Path) -> LabCluster:
    return lab_cluster(empty_queue, tmp_path / "lab")


def wait_for(what: str, check: object, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what} did not happen in {timeout_s:.0f} s"
        time.sleep(0.1)


def events(run: Path, name: str) -> list[dict[str, object]]:
    return [e for e in journal(run / EVENTS_FILE, complete_only=True) if e.get("event") == name]


def test_a_job_on_the_cluster_takes_a_late_node_and_loses_a_killed_one_without_losing_a_row(
    lab: LabCluster, tmp_path: Path
) -> None:
    lab.sim(decode_tokens_per_s=DECODE)
    lab.sim("node2", decode_tokens_per_s=DECODE, startup_weights_s=400.0)  # ready about 4 s after node1
    env = {**ENV, **lab.slurm.env()}
    data = write_dataset(tmp_path / "data", "chat", PROMPTS)
    run = tmp_path / "run"
    job = "\n".join(
        [
            "[openrouter]",
            "max_tokens = 64",
            "[headless]",
            "status_interval_s = 0.5",
            "[job]",
            'backend = "sglang"',
            f'datasets = ["{data}"]',
            f'run_dir = "{run}"',
            "concurrency = 24",
            "backoff_base_s = 0.05",
            "backoff_max_s = 0.5",
        ]
    )
    settings = tmp_path / "settings.toml"
    settings.write_text(lab.settings_text(top=job))
    starting = subprocess.Popen(
        regen_argv("sglang", "start", "--cluster", "lab", "--settings", str(settings)),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    job_proc: subprocess.Popen[bytes] | None = None
    try:
        wait_for("node1 ready", lambda: _state(lab, "node1") == "ready")
        assert _state(lab, "node2") != "ready"
        log = tmp_path / "job.log"
        job_proc = start_headless_run(settings, log, env=env)
        wait_rows(data, 10, job_proc, log)
        # node2 became ready while the job ran: it joined the router and took requests.
        assert starting.wait(120) == 0, starting.stdout.read().decode() if starting.stdout else ""
        wait_for("node2 joining", lambda: events(run, "node_joined"))
        assert [e["host"] for e in events(run, "node_joined")] == ["lab/node2"]
        wait_for("a row from node2", lambda: any(r["provider"] == "lab/node2" for r in read_rows(data)))
        # Then node2's step dies without a word, mid-run.
        victim = lab.state("node2")
        os.kill(int(victim["agent_pid"]), signal.SIGKILL)
        wait_for("node2 lost", lambda: events(run, "node_lost"))
        assert job_proc.wait(180) == 0, log.read_text()[-3000:]
    finally:
        for proc in (starting, job_proc):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        run_regen("sglang", "stop", "--cluster", "lab", "--settings", str(settings), env=env, timeout=120)
    lost = events(run, "node_lost")
    assert [e["host"] for e in lost] == ["lab/node2"]
    assert "lab/node2: lost: its step ended without a word" in str(lost[0]["reason"]), lost
    rows = read_rows(data)
    assert sorted(Counter(r["line"] for r in rows).items()) == [(i, 1) for i in range(PROMPTS)]
    by_node = Counter(r["provider"] for r in rows)
    assert set(by_node) == {"lab/node1", "lab/node2"} and by_node["lab/node1"] > by_node["lab/node2"] > 0
    assert {r["server"]["model_digest"] for r in rows} == {rows[0]["server"]["model_digest"]}
    assert not group_members(int(victim["server_pid"]))
    assert lab.slurm.queue() == []


def _state(lab: LabCluster, node: str) -> str | None:
    try:
        return str(lab.state(node)["state"])
    except (OSError, ValueError, KeyError):
        return None
