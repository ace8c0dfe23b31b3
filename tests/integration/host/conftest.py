"""Fixtures for the GPU-host tests: a real sshd on loopback, a fake host tree, host settings (their
helpers: tests/support/sshd.py and tests/support/hosts.py).

One sshd serves the whole session (starting one costs ~0.1 s, but each test would also pay for
new keys); tests that stop or restart it use their own (``own_sshd``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from regen.engine.config.settings import HostSettings
from tests.support.gpuhost import GpuHost, make_gpu_host
from tests.support.hosts import HostFactory, build_tree, host_settings
from tests.support.sshd import SshServer, make_server, need_sshd


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    need_sshd()
    server = make_server(tmp_path_factory.mktemp("sshd"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_sshd(tmp_path: Path) -> Iterator[SshServer]:
    """An sshd this test may stop, restart or rekey."""
    need_sshd()
    server = make_server(tmp_path / "sshd")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def tree(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A host tree shared by the tests that only read it."""
    return build_tree(tmp_path_factory.mktemp("host"))


@pytest.fixture
def own_tree(tmp_path: Path) -> dict[str, Path]:
    """A host tree this test may change (push writes into it)."""
    return build_tree(tmp_path / "host")


@pytest.fixture
def make_host(tmp_path: Path) -> HostFactory:
    def make(server: SshServer, tree: dict[str, Path], **overrides: Any) -> HostSettings:
        return host_settings(server, tree, tmp_path, **overrides)

    return make


@pytest.fixture
def host(tmp_path: Path) -> Iterator[GpuHost]:
    """One GPU host (tests/support/gpuhost.py: the stand-in SGLang, nvidia-smi) over the session's sshd."""
    need_sshd()
    made = make_gpu_host(tmp_path / "gpu1")
    try:
        yield made
    finally:
        made.cleanup()
