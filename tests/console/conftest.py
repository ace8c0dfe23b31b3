"""Console tests run with the caller's colour settings kept out and UTC wall times
(tests/support/console_env.py). The console under test (a real job's recording replayed, waiting on
workers) is tests/support/console_app.py."""

from __future__ import annotations

from tests.support.console_env import plain_environment, utc

__all__ = ["plain_environment", "utc"]
