"""Which tests are the `integration` kind (the folder tests/integration/; tests/conftest.py marks
them), that `make check` leaves to `make test`, and which start first."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

# The integration kind is a folder: the tests that run whole jobs, processes, sshd, tmux or a wheel
# build, seconds each and most of the suite's time. `make check` (the edit loop) runs the others;
# `make test` and CI run all. A test's kind is where it lives, so a file moved or added is never
# misfiled by a list kept by hand.
INTEGRATION = "tests/integration/"

# The longest runs, longest first (measured: `--durations`), started in this order (tests/conftest.py
# sorts the suite; the Makefile's `--maxschedchunk=1` makes xdist hand tests out one at a time, so a
# worker that is free takes the next in this order). Without both, xdist gives each worker a block of
# ~80 consecutive tests up front, and the night once started 6 minutes in and ran alone for 80 s.
FIRST = (
    "tests/integration/test_journey.py",  # 80 s: the night on the installed wheel (it waits for the wheel's build)
    "tests/integration/backends/test_deadline_control.py",  # 63 s, 25 s, 23 s, 11 s
    "tests/integration/backends/test_fleet_stall.py",  # five of 20-35 s
    "tests/integration/host/test_router_overload.py",  # 41 s, 40 s: smg under 200 in flight, per setting
    "tests/integration/cli/test_demo_fleets.py",  # 41 s
    "tests/integration/backends/test_fleets.py",  # 37 s, 35 s, 17 s: jobs killed and resumed
    "tests/integration/cluster/test_slurm_run.py",  # 27 s: a job on the loopback Slurm
    "tests/integration/backends/test_dispatcher.py",  # 25 s, 24 s, 17 s
    "tests/integration/host/test_model_identity.py",  # 24 s
    "tests/integration/sglang_real/test_contract.py",  # 24 s
    "tests/integration/cli/test_cli.py",  # 22 s
    "tests/integration/job/test_snapshot_schema.py",  # 21 s, 15 s, 12 s
    "tests/integration/host/test_sglang_router.py",  # 20 s
    "tests/integration/backends/test_fleets_console.py",  # 18 s
    "tests/integration/job/test_job.py",  # 17 s, 17 s
    "tests/integration/job/test_providers.py",  # 17 s
    "tests/integration/backends/sglang/test_outage.py",  # 16 s
    "tests/integration/host/test_sglang_lifecycle.py",  # 16 s, 12 s, 11 s
    "tests/integration/cli/test_report.py",  # 15 s to set up
    "tests/integration/job/test_outage_recovery.py",  # 15 s, 14 s
    "tests/integration/job/test_outages.py",  # 14 s, 12 s
    "tests/integration/console/test_tmux.py",  # 14 s
    "tests/integration/console/test_fleets_tmux.py",  # 14 s
    "tests/integration/host/test_sglang_run.py",  # 13 s, 12 s, 11 s
    "tests/integration/test_wheel.py",  # 6 s once the wheel is built
)
