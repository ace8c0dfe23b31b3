"""One test body per backend: `backend_case` starts the matching simulator in its own process on
loopback and says how to point settings at it. The shared dispatcher is proven shared by running
the same tests through every backend."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest

from regen.engine.config.loading import load_settings
from regen.engine.config.settings import (
    JobSettings,
    OpenRouterSettings,
    Settings,
    SGLangSettings,
    TokenizerSettings,
)
from regen.sim.openrouter.server import OpenRouterSim
from regen.sim.sglang.server import SGLangSim
from regen.sim.sglang.tokens import SimTokenizer
from tests.conftest import SIM_KEY, fast_sim_config, read_rows
from tests.sglang_sim import fast_config
from tests.test_cli import ENV, free_port, regen

BACKENDS = ["openrouter", "sglang"]


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


def _sglang(root: Path, model: Path) -> Iterator[BackendCase]:
    # The simulator serves the model folder's tokenizer and the job renders its prompts with it.
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
        regen("sim", "sglang", "--port", "0", "--config", str(config), "--tokenizer", str(model)),
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


@pytest.fixture(scope="session")
def sglang_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Kimi-like model folder (config.json and tokenizer), built once."""
    from tests.sglang_sim import model_folder

    return model_folder(tmp_path_factory.mktemp("backends-sglang-model"))


@pytest.fixture(params=BACKENDS)
def backend_case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BackendCase]:
    if request.param == "sglang":
        yield from _sglang(tmp_path, request.getfixturevalue("sglang_model"))
    else:
        yield from _openrouter(tmp_path)


# -- both fleets in one job (tests/backends/test_fleets.py, test_deadline_control.py) -----------------------

BOTH = ["sglang", "openrouter"]


def journal(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def one_row_per_prompt(folder: Path, expected: int) -> list[dict[str, Any]]:
    rows = read_rows(folder)
    lines = Counter(row["line"] for row in rows)
    assert len(rows) == expected and set(lines) == set(range(expected)), f"{len(rows)} rows for {expected}"
    assert max(lines.values()) == 1
    return rows


@pytest.fixture(scope="session")
def fleet_tok(sglang_model: Path) -> SimTokenizer:
    return SimTokenizer(sglang_model)


@pytest.fixture
async def gpu_sim(fleet_tok: SimTokenizer) -> AsyncIterator[SGLangSim]:
    """The SGLang simulator in this loop, fast: a GPU fleet that keeps up."""
    sim = SGLangSim(fast_config(served_model_name="kimi-k2.5"), fleet_tok)
    await sim.start()
    try:
        await sim.wait_ready(30)
        yield sim
    finally:
        await sim.stop()


@pytest.fixture
async def paid_sim() -> AsyncIterator[OpenRouterSim]:
    """The OpenRouter simulator in this loop, slower than the fast GPUs: about a second an answer."""
    server = OpenRouterSim(fast_sim_config(time_scale=0.6, min_completion_tokens=10, max_completion_tokens=40))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
def fleet_settings(tmp_path: Path, sglang_model: Path) -> Callable[..., Settings]:
    def build(gpu_url: str, paid_url: str, datasets: list[Path], **job: Any) -> Settings:
        params: dict[str, Any] = {
            "backends": BOTH,
            "datasets": datasets,
            "run_dir": tmp_path / "run",
            "concurrency": 16,
            "backoff_base_s": 0.01,
            "backoff_max_s": 0.05,
            "commit_interval_s": 0.001,
            "reconcile_timeout_s": 5.0,
            **job,
        }
        return Settings(
            openrouter=OpenRouterSettings(base_url=paid_url, api_key=SIM_KEY, max_tokens=64),
            sglang=SGLangSettings(urls=[gpu_url], metrics_interval_s=0.05),
            tokenizer=TokenizerSettings(path=sglang_model, workers=1),
            job=JobSettings(**params),
        )

    return build
