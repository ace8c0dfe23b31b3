"""The loopback Slurm itself: a 2-node job runs, and scancel ends one that is running."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.slurm import Slurm


def _wait_gone(slurm: Slurm, job: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if job not in slurm.queue():
            return
        time.sleep(0.3)
    raise AssertionError(f"job {job} still queued")


def test_two_node_job_runs(slurm: Slurm, tmp_path: Path) -> None:
    out = tmp_path / "out-%t.txt"
    job = slurm.run(
        "sbatch",
        "--parsable",
        "-N",
        "2",
        f"--output={tmp_path}/batch.txt",
        "--wrap",
        f"srun --output={out} sh -c 'echo $SLURMD_NODENAME'",
    ).stdout.strip()
    _wait_gone(slurm, job)
    names = sorted(p.read_text().strip() for p in tmp_path.glob("out-*.txt"))
    assert names == ["node1", "node2"], (names, (tmp_path / "batch.txt").read_text())


def test_scancel_ends_a_running_job(slurm: Slurm, tmp_path: Path) -> None:
    job = slurm.run(
        "sbatch", "--parsable", "-N", "2", f"--output={tmp_path}/o.txt", "--wrap", "srun sleep 300"
    ).stdout.strip()
    deadline = time.monotonic() + 20
    while slurm.run("squeue", "-h", "-j", job, "-o", "%T", check=False).stdout.strip() != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.3)
    slurm.run("scancel", job)
    _wait_gone(slurm, job)
