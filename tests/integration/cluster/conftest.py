"""One loopback Slurm per test process (tests/support/slurm.py), its queue emptied after each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.slurm import Slurm, have_slurm, start_slurm


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    if not have_slurm():
        pytest.fail("slurm-wlm is missing: the cluster tests need slurmctld and slurmd (.ci/run installs it)")
    cluster = start_slurm(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        for job in cluster.queue():
            cluster.run("scancel", job, check=False)
        cluster.stop()


@pytest.fixture
def empty_queue(slurm: Slurm) -> Iterator[Slurm]:
    """The cluster with nothing queued, and nothing left queued by the test."""
    slurm.wait_empty()
    try:
        yield slurm
    finally:
        for job in slurm.queue():
            slurm.run("scancel", job, check=False)
        slurm.wait_empty()
