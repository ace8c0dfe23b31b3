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

# The longest single runs, started first (tests/conftest.py orders the suite): the night on the
# installed wheel (which waits for the wheel's build), and the jobs killed and resumed.
FIRST = (
    "tests/test_journey.py",
    "tests/test_wheel.py",
    "tests/backends/test_fleets.py",
    "tests/backends/test_dispatcher.py",
    "tests/host/test_sglang_run.py",
    "tests/test_job.py",
)
