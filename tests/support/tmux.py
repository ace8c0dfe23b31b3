"""A tmux server of the test's own, to drive the console in a real terminal."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

# For a module's `pytestmark`: without tmux the test is skipped, except in CI (.ci/run installs it).
needs_tmux = pytest.mark.skipif(
    shutil.which("tmux") is None and not os.environ.get("CI"), reason="tmux is not installed (CI installs it)"
)


class Tmux:
    """One tmux server of our own (its own socket), so tests never touch the operator's sessions."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket

    def __call__(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-S", str(self.socket), *args], capture_output=True, text=True, timeout=20
        )
        return done.stdout

    def screen(self) -> str:
        return self("capture-pane", "-t", "regen", "-p")

    def keys(self, *keys: str) -> None:
        self("send-keys", "-t", "regen", *keys)

    def wait_for(self, predicate: Callable[[str], bool], what: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if predicate(screen):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}; screen:\n{screen}")
