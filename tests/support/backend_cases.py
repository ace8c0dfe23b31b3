"""One test body per backend: a `BackendCase` is a backend and its simulator running in a process of
its own on loopback, and says how to point settings at it (tests/integration/backends/conftest.py's
`backend_case` fixture runs a test once per backend; both fleets' tests start both)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from regen.engine.config.loading import load_settings
from regen.engine.config.settings import Settings
from tests.support.openrouter_sim import SIM_KEY, openrouter_process
from tests.support.processes import ENV, regen_argv

BACKENDS = ["openrouter", "sglang"]
BOTH = [
    "sglang",
    "openrouter",
]  # both fleets in one job (tests/integration/backends/test_fleets.py, test_deadline_control.py)


@dataclass
class BackendCase:
    """A backend and the simulator serving it."""

    name: str
    base_url: str
    unit: str  # the ledger's unit: a "usd" case has a budget the tests can run into
    root: Path
    env: dict[str, str] = field(default_factory=dict)
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)  # further settings, by section
    job: dict[str, Any] = field(default_factory=dict)  # the backend's own [job] keys
    # When the SIGKILL test kills a run: after the job has started its requests.
    kill_after_s: tuple[float, float] = (0.3, 1.0)  # after the first request

    def settings_file(self, datasets: list[Path], **job: Any) -> Path:
        job = {
            "run_dir": str(self.root / "run"),
            "backoff_base_s": 0.01,
            "backoff_max_s": 0.1,
            "commit_interval_s": 0.002,
            "reconcile_timeout_s": 10.0,
            **self.job,
            **job,
            "datasets": [str(d) for d in datasets],
        }
        lines = ["[openrouter]", f'base_url = "{self.base_url}"', "max_tokens = 64", "[job]"]
        lines += [f"{key} = {json.dumps(value)}" for key, value in job.items()]
        lines += ["[headless]", "status_interval_s = 0.2"]
        for section, values in self.sections.items():
            lines += [f"[{section}]", *(f"{key} = {json.dumps(value)}" for key, value in values.items())]
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


@contextmanager
def openrouter_case(root: Path) -> Iterator[BackendCase]:
    """`regen sim openrouter` with a few faults, and the job's key for it."""
    config = {
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
    with openrouter_process(root, config) as base_url:
        yield BackendCase("openrouter", base_url, "usd", root, env={**ENV, "OPENROUTER_API_KEY": SIM_KEY})


def _wait_healthy(url: str, proc: subprocess.Popen[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the simulator exited ({proc.returncode}) before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url} was not ready within {timeout_s} s")


@contextmanager
def sglang_case(root: Path, model: Path) -> Iterator[BackendCase]:
    """`regen sim sglang` with a few faults, serving the model folder's tokenizer (the job renders
    its prompts with it)."""
    config = root / "sglang-sim.json"
    config.write_text(
        json.dumps(
            {
                "served_model_name": "kimi-k2.5",
                "time_scale": 0.3,
                "startup_weights_s": 0.5,
                "startup_kv_pool_s": 0.2,
                "startup_cuda_graph_s": 0.2,
                "startup_http_s": 0.1,
                "startup_warmup_s": 0.1,
                "output_len_min": 10,
                "output_len_max": 60,
                "min_step_s": 0.005,
                "child_processes": 0,
                "faults": {"abort_rate": 0.02, "http_503_rate": 0.02, "drop_rate": 0.02},
                "seed": 7,
            }
        )
    )
    proc = subprocess.Popen(
        regen_argv("sim", "sglang", "--port", "0", "--config", str(config), "--tokenizer", str(model)),
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "listening on" in line, line
    url = line.split(" on ", 1)[1].strip()
    try:
        _wait_healthy(url, proc)
        yield BackendCase(
            "sglang",
            url,
            "gpu_s",
            root,
            env=dict(ENV),
            sections={
                "sglang": {"urls": [url], "metrics_interval_s": 0.2},
                "tokenizer": {"path": str(model), "workers": 1},
            },
            job={"backend": "sglang"},
            # Counted from the first request sent (the tokenizer loads for seconds before it).
            kill_after_s=(1.0, 3.0),
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
