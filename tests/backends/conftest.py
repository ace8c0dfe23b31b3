"""One test body per backend: `backend_case` starts the matching simulator in its own process on
loopback and says how to point settings at it. The shared dispatcher is proven shared by running
the same tests through every backend (`openrouter` now; `sglang` joins with its backend)."""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from engine.settings import Settings, load_settings
from tests.conftest import SIM_KEY
from tests.test_cli import ENV, free_port, regen

BACKENDS = ["openrouter"]


@dataclass
class BackendCase:
    """A backend and the simulator serving it."""

    name: str
    base_url: str
    unit: str  # the ledger's unit: a "usd" case has a budget the tests can run into
    root: Path
    env: dict[str, str] = field(default_factory=dict)

    def settings_file(self, datasets: list[Path], **job: Any) -> Path:
        job = {
            "run_dir": str(self.root / "run"),
            "backoff_base_s": 0.01,
            "backoff_max_s": 0.1,
            "commit_interval_s": 0.002,
            "reconcile_timeout_s": 10.0,
            **job,
            "datasets": [str(d) for d in datasets],
        }
        lines = ["[openrouter]", f'base_url = "{self.base_url}"', "max_tokens = 64", "[job]"]
        lines += [f"{key} = {json.dumps(value)}" for key, value in job.items()]
        lines += ["[headless]", "status_interval_s = 0.2"]
        path = self.root / "settings.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def settings(self, datasets: list[Path], **job: Any) -> Settings:
        settings = load_settings(self.settings_file(datasets, **job))
        if self.name == "openrouter":
            from pydantic import SecretStr

            settings.openrouter.api_key = SecretStr(SIM_KEY)
        return settings

    def billed(self) -> Decimal:
        """What the simulator billed so far, in the ledger's unit."""
        root = self.base_url.removesuffix("/api/v1")
        with urllib.request.urlopen(f"{root}/_sim/ledger", timeout=10) as response:
            return Decimal(json.loads(response.read())["billed_total"])


def _openrouter(root: Path) -> Iterator[BackendCase]:
    port = free_port()
    config = root / "sim.json"
    config.write_text(
        json.dumps(
            {
                "api_keys": [SIM_KEY],
                "time_scale": 0.03,
                "min_completion_tokens": 10,
                "max_completion_tokens": 60,
                "chunk_interval_s": 0.01,
                "keepalive_interval_s": 0.05,
                "generation_lookup_delay_s": 0.1,
                "retry_after_s": 0,
                "faults": {"http_502": 0.02, "cut_mid_stream": 0.02},
                "seed": 7,
            }
        )
    )
    proc = subprocess.Popen(
        regen("sim", "openrouter", "--port", str(port), "--config", str(config)),
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "listening on" in line, line
    try:
        yield BackendCase(
            "openrouter",
            f"http://127.0.0.1:{port}/api/v1",
            "usd",
            root,
            env={**ENV, "OPENROUTER_API_KEY": SIM_KEY},
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


@pytest.fixture(params=BACKENDS)
def backend_case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BackendCase]:
    starters = {"openrouter": _openrouter}
    yield from starters[request.param](tmp_path)
