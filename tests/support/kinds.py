"""Which tests are the `integration` kind (tests/conftest.py marks them), that `make check` leaves to
`make test`."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

# The tests that run whole jobs, processes, sshd, tmux or a wheel build: seconds each, most of the
# suite's time. `make check` (the edit loop) runs the others; `make test` and CI run all.
INTEGRATION = (
    "tests/host/",
    "tests/backends/",
    "tests/sglang_real/",
    "tests/console/test_real_job.py",
    "tests/sim/test_load.py",
    "tests/sim_sglang/test_cli.py",
    "tests/sim_sglang/test_load.py",
    "tests/sim_sglang/test_standin.py",
    "tests/test_cli.py",
    "tests/test_console_fleets_tmux.py",
    "tests/test_console_tmux.py",
    "tests/test_demo_fleets.py",
    "tests/test_disk_full.py",
    "tests/test_fidelity.py",
    "tests/test_hostile_inputs.py",
    "tests/test_job.py",
    "tests/test_journey.py",
    "tests/test_outage_recovery.py",
    "tests/test_outages.py",
    "tests/test_providers.py",
    "tests/test_report.py",
    "tests/test_snapshot_schema.py",
    "tests/test_training_rows.py",
    "tests/test_usage_bound.py",
    "tests/test_wheel.py",
)

# The longest runs, longest first (measured: `--durations`), started in this order (tests/conftest.py
# sorts the suite; the Makefile's `--maxschedchunk=1` makes xdist hand tests out one at a time, so a
# worker that is free takes the next in this order). Without both, xdist gives each worker a block of
# ~80 consecutive tests up front, and the night once started 6 minutes in and ran alone for 80 s.
FIRST = (
    "tests/test_journey.py",  # 80 s: the night on the installed wheel (it waits for the wheel's build)
    "tests/backends/test_deadline_control.py",  # 63 s, 25 s, 23 s, 11 s
    "tests/test_demo_fleets.py",  # 41 s
    "tests/backends/test_fleets.py",  # 37 s, 35 s, 17 s: jobs killed and resumed
    "tests/backends/test_dispatcher.py",  # 25 s, 24 s, 17 s
    "tests/host/test_model_identity.py",  # 24 s
    "tests/sglang_real/test_contract.py",  # 24 s
    "tests/test_cli.py",  # 22 s
    "tests/test_snapshot_schema.py",  # 21 s, 15 s, 12 s
    "tests/host/test_sglang_router.py",  # 20 s
    "tests/backends/test_fleets_console.py",  # 18 s
    "tests/test_job.py",  # 17 s, 17 s
    "tests/test_providers.py",  # 17 s
    "tests/backends/sglang/test_outage.py",  # 16 s
    "tests/host/test_sglang_lifecycle.py",  # 16 s, 12 s, 11 s
    "tests/test_report.py",  # 15 s to set up
    "tests/test_outage_recovery.py",  # 15 s, 14 s
    "tests/test_outages.py",  # 14 s, 12 s
    "tests/test_console_tmux.py",  # 14 s
    "tests/test_console_fleets_tmux.py",  # 14 s
    "tests/host/test_sglang_run.py",  # 13 s, 12 s, 11 s
    "tests/test_wheel.py",  # 6 s once the wheel is built
)
