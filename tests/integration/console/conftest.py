"""The console on real jobs and in real tmux, with the caller's colour settings kept out and UTC wall
times, as in tests/console/ (tests/support/console_env.py)."""

from __future__ import annotations

from tests.support.console_env import plain_environment, utc

__all__ = ["plain_environment", "utc"]
