"""`regen sglang start|status|stop --cluster` on a real Slurm: one stand-in SGLang server per node.

Slurm is the real slurmctld and slurmd on loopback (tests/support/slurm.py), the nodes aliases of
this machine; the servers are the stand-in launcher, started by each node's step exactly as a GPU
node's SGLang would be.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.gpuhost import group_members
from tests.support.processes import ENV, assert_gone, run_regen
from tests.support.slurm import LabCluster, Slurm, lab_cluster


@pytest.fixture
def lab(empty_queue: Slurm, tmp_path: Path) -> LabCluster:
    return lab_cluster(empty_queue, tmp_path / "lab")


def regen(lab: LabCluster, *args: str, text: str | None = None, timeout: float = 180) -> Any:
    settings = lab.root / "settings.toml"
    settings.write_text(text if text is not None else lab.settings_text())
    return run_regen(*args, "--settings", str(settings), env={**ENV, **lab.slurm.env()}, timeout=timeout)


def status(lab: LabCluster) -> dict[str, Any]:
    done = regen(lab, "sglang", "status", "--cluster", "lab", "--json")
    assert done.returncode == 0, done.stderr
    clusters = json.loads(done.stdout)["clusters"]
    assert len(clusters) == 1
    return dict(clusters[0])


def server_pids(lab: LabCluster, nodes: list[str]) -> list[int]:
    return [int(lab.state(node)["server_pid"]) for node in nodes]


def test_start_makes_every_node_ready_status_shows_them_and_stop_leaves_nothing(lab: LabCluster) -> None:
    done = regen(lab, "sglang", "start", "--cluster", "lab")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "lab: submitted job" in out and "lab: every node ready (2) in job" in out, out
    for node in ("node1", "node2"):
        assert f"{node}: [8/8] ready" in out and f"{node}: ready at http://127.0.0.1:" in out, out

    seen = status(lab)
    job = seen["job_id"]
    assert seen["job_state"] == "RUNNING" and lab.slurm.queue() == [job]
    nodes = {n["node"]: n for n in seen["nodes"]}
    assert sorted(nodes) == ["node1", "node2"]
    assert all(n["state"] == "ready" for n in nodes.values()), nodes
    # Two servers of one machine: two ports, each answering as itself.
    assert len({n["url"] for n in nodes.values()}) == 2
    assert all(
        n["server"]["ready"] and n["server"]["served_model_name"] == "Kimi-K2.5" for n in nodes.values()
    )
    text = regen(lab, "sglang", "status", "--cluster", "lab").stdout
    assert f"lab: slurm job {job} RUNNING · 2 of 2 nodes ready" in text, text

    again = regen(lab, "sglang", "start", "--cluster", "lab")
    assert again.returncode == 0, again.stderr
    assert f"lab: job {job} is already RUNNING: not submitted again" in again.stdout
    assert lab.slurm.queue() == [job]

    pids = server_pids(lab, ["node1", "node2"])
    stopped = regen(lab, "sglang", "stop", "--cluster", "lab")
    assert stopped.returncode == 0, stopped.stderr
    assert f"lab: job {job} cancelled" in stopped.stdout
    assert lab.slurm.queue() == []
    assert_gone(pids)
    after = status(lab)
    assert after["job_state"] == "CANCELLED"
    assert {n["state"] for n in after["nodes"]} == {"stopped"}, after["nodes"]
    nothing = regen(lab, "sglang", "stop", "--cluster", "lab")
    assert nothing.returncode == 0 and "no job of regen's is running" in nothing.stdout


def test_a_partition_slurm_does_not_have_is_refused_in_one_line(lab: LabCluster) -> None:
    done = regen(lab, "sglang", "start", "--cluster", "lab", text=lab.settings_text(partition="nope"))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "regen: cluster lab: sbatch failed (exit 1): sbatch: error: Batch job submission failed: Invalid "
        "partition name specified (the job asked for --nodes=2 --ntasks-per-node=1 --time=20:00 "
        "--partition=nope); nothing was submitted"
    ]
    assert lab.slurm.queue() == []


def test_a_launch_the_nodes_refuse_names_the_node_the_reason_and_the_log(lab: LabCluster) -> None:
    text = lab.settings_text().replace("tp = 1", 'tp = 1\nlaunch_args = ["--no-such-flag"]')
    done = regen(lab, "sglang", "start", "--cluster", "lab", text=text)
    assert done.returncode == 1, done.stdout
    err = done.stderr
    assert "regen: lab: " in err and "nodes failed" in err, err
    assert "not launched: --no-such-flag is not a flag of this sglang's launch_server" in err, err
    assert "(log " in err and "/nodes/node" in err and "Traceback" not in err
    assert "regen sglang stop --cluster lab ends it" in err or lab.slurm.queue() == []
    regen(lab, "sglang", "stop", "--cluster", "lab")
    assert lab.slurm.queue() == []


def test_a_node_whose_step_is_killed_is_lost_and_the_others_go_on(lab: LabCluster) -> None:
    assert regen(lab, "sglang", "start", "--cluster", "lab").returncode == 0
    victim = lab.state("node2")
    os.kill(int(victim["agent_pid"]), signal.SIGKILL)  # the step's task dies without a word
    deadline = time.monotonic() + 60
    while True:
        nodes = {n["node"]: n for n in status(lab)["nodes"]}
        if nodes["node2"]["state"] == "lost":
            break
        assert time.monotonic() < deadline, nodes
        time.sleep(0.5)
    assert "its step ended without a word" in nodes["node2"]["failure"]
    assert nodes["node1"]["state"] == "ready" and nodes["node1"]["server"]["ready"]
    # What the killed step left ends with it: the server and every process of its group.
    assert_gone([int(victim["server_pid"])])
    deadline = time.monotonic() + 15
    while group_members(int(victim["server_pid"])):
        assert time.monotonic() < deadline, group_members(int(victim["server_pid"]))
        time.sleep(0.1)
    assert regen(lab, "sglang", "stop", "--cluster", "lab").returncode == 0
    assert lab.slurm.queue() == []


def test_inside_an_allocation_the_servers_are_its_steps_and_a_stop_leaves_the_allocation(
    lab: LabCluster,
) -> None:
    held = lab.slurm.run("salloc", "--no-shell", "-N", "2", "-p", "gpu", "--time=10:00")
    allocation = next(w for w in (held.stdout + held.stderr).split() if w.isdigit())
    text = lab.settings_text(allocation=allocation)
    done = regen(lab, "sglang", "start", "--cluster", "lab", text=text)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"lab: submitted job {allocation}" in done.stdout
    assert lab.slurm.queue() == [allocation]  # nothing submitted: the servers run as its steps
    steps = lab.slurm.run("squeue", "-h", "-s", "-j", allocation, "-o", "%j").stdout.split()
    assert steps.count("regen-node") == 2, steps
    pids = server_pids(lab, ["node1", "node2"])
    stopped = regen(lab, "sglang", "stop", "--cluster", "lab", text=text)
    assert stopped.returncode == 0, stopped.stderr
    assert_gone(pids)
    assert lab.slurm.queue() == [allocation]  # the allocation is the operator's, still held
    assert "regen-node" not in lab.slurm.run("squeue", "-h", "-s", "-j", allocation, "-o", "%j").stdout
    again = regen(lab, "sglang", "status", "--cluster", "lab", "--json", text=text)
    assert json.loads(again.stdout)["clusters"][0]["job_state"] == "ENDED"
    lab.slurm.run("scancel", allocation)


def test_an_allocation_that_is_not_running_is_refused(lab: LabCluster) -> None:
    done = regen(lab, "sglang", "start", "--cluster", "lab", text=lab.settings_text(allocation="99999"))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "regen: cluster lab: allocation 99999 is not in the queue: nothing was started"
    ]
