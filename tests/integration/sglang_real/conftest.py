"""The real sglang wheels the contract tests read (tests/support/sglang_wheel.py): 0.5.23, the release
regen's docs follow, and 0.5.9 for the older spellings regen also handles."""

from __future__ import annotations

import pytest

from tests.support.sglang_wheel import CURRENT, OLDER, RealSGLang, fetch_wheel


@pytest.fixture(scope="session")
def sglang_current() -> RealSGLang:
    return RealSGLang(fetch_wheel(CURRENT))


@pytest.fixture(scope="session")
def sglang_older() -> RealSGLang:
    return RealSGLang(fetch_wheel(OLDER))


@pytest.fixture(scope="session")
def releases(sglang_current: RealSGLang, sglang_older: RealSGLang) -> dict[str, RealSGLang]:
    return {CURRENT: sglang_current, OLDER: sglang_older}
