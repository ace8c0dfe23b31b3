"""Console test fixtures: the caller's colour settings kept out, UTC wall times. The console under test
(a real job's recording replayed, waiting on workers) is tests/support/console_app.py."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def plain_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller's colour and frame-rate settings do not reach the tests."""
    for name in ("NO_COLOR", "TEXTUAL_COLOR_SYSTEM", "TEXTUAL_FPS", "TEXTUAL_THEME", "TEXTUAL_ANIMATIONS"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def utc() -> Iterator[None]:
    """Wall-clock times print the same everywhere."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if before is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = before
    time.tzset()
