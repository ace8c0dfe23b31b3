"""What every console test runs under, whichever folder holds it (tests/console/, and the integration
kind's tests/integration/console/): the caller's colour settings kept out, UTC wall times. These are
autouse fixtures, which each of those folders' conftest.py names (imports) to apply them there."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

COLOUR_SETTINGS = ("NO_COLOR", "TEXTUAL_COLOR_SYSTEM", "TEXTUAL_FPS", "TEXTUAL_THEME", "TEXTUAL_ANIMATIONS")


@pytest.fixture(autouse=True)
def plain_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller's colour and frame-rate settings do not reach the tests."""
    for name in COLOUR_SETTINGS:
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
