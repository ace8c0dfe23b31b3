"""Reusable helpers for tests that need "SGLang": the simulator in-process, as `regen sim sglang`, or
through the stand-in `python -m sglang.launch_server` exactly as a GPU host runs it.

    from tests.support.sglang_sim import fast_config, model_folder, running_sim, standin_env, start_standin

    async with running_sim(fast_config(), tokenizer_dir) as sim:      # in this process, ready
        url = sim.base_url                                            # http://127.0.0.1:PORT

    model = model_folder(tmp_path / "model")                          # config.json + Kimi-like tokenizer
    env = standin_env(tmp_path, {"time_scale": 0.02})                 # PYTHONPATH + simulator config
    # remote command (what regen runs over SSH): <python> -m sglang.launch_server --model-path <model> ...
    proc = start_standin(model, port, env=env, extra=["--tp", "8"])   # local Popen in its own group

The stand-in (tests/support/standin/) needs nothing but this repository and the venv's packages:
PYTHONPATH carries the stand-in folder (its `sglang` package) and the repository's src/ (for `regen`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regen.sim.sglang.config import SimSGLangConfig
from regen.sim.sglang.launch import CONFIG_ENV
from regen.sim.sglang.logs import SimLog
from regen.sim.sglang.server import SGLangSim
from regen.sim.sglang.tokens import SimTokenizer
from tests.support.processes import ENV, ROOT, regen_argv
from tests.support.tiktoken_model import build_tiktoken_tokenizer
from tests.support.tokenizers import build_tokenizer

STANDIN = Path(__file__).resolve().parent / "standin"

__all__ = [
    "STANDIN",
    "SimProcess",
    "fast_config",
    "model_folder",
    "running_sim",
    "sim_process",
    "standin_env",
    "start_standin",
    "stop_group",
    "wait_for_line",
]


def fast_config(**overrides: Any) -> SimSGLangConfig:
    """Startup in tens of milliseconds, short outputs, quick decode: behaviour, not speed."""
    base: dict[str, Any] = {
        "time_scale": 0.01,
        "startup_weights_s": 1.0,
        "startup_kv_pool_s": 0.5,
        "startup_cuda_graph_s": 0.5,
        "startup_http_s": 0.1,
        "startup_warmup_s": 0.1,
        "output_len_min": 8,
        "output_len_max": 40,
        "min_step_s": 0.002,
        "child_processes": 0,
        "seed": 7,
    }
    base.update(overrides)
    return SimSGLangConfig(**base)


def model_folder(
    folder: Path, kind: str = "kimi", *, context_length: int = 262144, eos_token_id: int | None = None
) -> Path:
    """A model folder as a GPU host holds one, minus the weights: config.json and the tokenizer. The
    model's eos is the tokenizer's ([EOS] for "kimi"), not the end-of-turn token, so a client that
    forgets stop_token_ids runs to its length limit; `eos_token_id` adds a generation_config.json.
    "tiktoken" is Kimi's own shape (tiktoken.model and remote code, tests/support/tiktoken_model.py):
    load it with trust_remote_code."""
    if kind == "tiktoken":
        build_tiktoken_tokenizer(folder)
    else:
        build_tokenizer(folder, kind)
    if eos_token_id is not None:
        (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_token_id}))
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": {"max_position_embeddings": context_length},
    }
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@asynccontextmanager
async def running_sim(
    config: SimSGLangConfig | None = None,
    tokenizer: SimTokenizer | Path | None = None,
    *,
    ready: bool = True,
    log: SimLog | None = None,
) -> AsyncIterator[SGLangSim]:
    """The simulator in this event loop on a free loopback port; ready unless `ready=False`."""
    cfg = config if config is not None else fast_config()
    if tokenizer is None or isinstance(tokenizer, Path):
        if tokenizer is None:
            raise ValueError("running_sim needs a tokenizer folder or a SimTokenizer")
        tokenizer = SimTokenizer(tokenizer, end_of_turn=cfg.end_of_turn)
    sim = SGLangSim(cfg, tokenizer, log=log)
    await sim.start()
    try:
        if ready:
            await sim.wait_ready(30)
        yield sim
    finally:
        await sim.stop()


@dataclass
class SimProcess:
    """`regen sim sglang` in a process of its own: a server that can be stopped as a GPU server
    stalls (SIGSTOP: the kernel still accepts its connections, nothing answers) and continued."""

    url: str
    proc: subprocess.Popen[str]

    def stall(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)


@contextmanager
def sim_process(folder: Path, model: Path, config: dict[str, Any]) -> Iterator[SimProcess]:
    """`regen sim sglang` with `config` (written to folder/sglang-sim.json) serving the model folder's
    tokenizer, ready (its /health answered); continued if stopped, then ended, at the exit."""
    path = folder / "sglang-sim.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    proc = subprocess.Popen(
        regen_argv("sim", "sglang", "--port", "0", "--config", str(path), "--tokenizer", str(model)),
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    sim: SimProcess | None = None
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on" in line, line
        sim = SimProcess(line.split(" on ", 1)[1].strip(), proc)
        until = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"the simulator exited ({proc.returncode}) before it was ready")
            try:
                with urllib.request.urlopen(f"{sim.url}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > until:
                raise AssertionError(f"{sim.url} was not ready within 60 s")
            time.sleep(0.05)
        yield sim
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def standin_env(tmp: Path, config: dict[str, Any] | None = None, **extra: str) -> dict[str, str]:
    """Environment for a Python that should find the stand-in `sglang` (and `engine`), with the
    stand-in `nvidia-smi` first on PATH and its simulated host scoped to `tmp` (servers other tests
    start elsewhere on this machine are not on "this host's" GPUs); `config` becomes the
    simulator's config file (REGEN_SGLANG_SIM_CONFIG)."""
    env = {k: v for k, v in os.environ.items() if k != CONFIG_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(STANDIN), str(ROOT / "src")])
    env["PATH"] = os.pathsep.join([str(STANDIN / "bin"), env.get("PATH", "")])
    env["REGEN_SIM_GPU_SCOPE"] = str(tmp)
    env["PYTHONUNBUFFERED"] = "1"
    if config is not None:
        path = tmp / "sglang-sim.json"
        path.write_text(json.dumps(config), encoding="utf-8")
        env[CONFIG_ENV] = str(path)
    env.update(extra)
    return env


def start_standin(
    model: Path,
    port: int,
    *,
    env: dict[str, str],
    extra: list[str] | None = None,
    log: Path | None = None,
    served_model_name: str = "kimi-k2.5",
) -> subprocess.Popen[bytes]:
    """`python -m sglang.launch_server` with regen's launch flags, in its own session and process
    group (as `setsid` gives it on a host), output to `log` (or a pipe)."""
    argv = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--tp",
        "8",
        "--served-model-name",
        served_model_name,
        "--enable-metrics",
        *(extra or []),
    ]
    out = open(log, "wb") if log is not None else subprocess.PIPE  # noqa: SIM115 - owned by the child
    try:
        return subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        if log is not None and not isinstance(out, int):
            out.close()


def wait_for_line(
    path: Path, text: str, timeout_s: float = 30.0, proc: subprocess.Popen[bytes] | None = None
) -> str:
    """Poll a log file until a line contains `text`; returns the log so far."""
    deadline = time.monotonic() + timeout_s
    content = ""
    while time.monotonic() < deadline:
        content = path.read_text(errors="replace") if path.exists() else ""
        if text in content:
            return content
        if proc is not None and proc.poll() is not None:
            content = path.read_text(errors="replace") if path.exists() else ""
            if text in content:
                return content
            raise AssertionError(f"process exited ({proc.returncode}) before {text!r}:\n{content[-3000:]}")
        time.sleep(0.05)
    raise AssertionError(f"no {text!r} within {timeout_s} s:\n{content[-3000:]}")


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """TERM the process's group, then KILL it; returns when nothing of the group is left."""
    pgid = proc.pid
    if group_alive(pgid):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and group_alive(pgid):
        proc.poll()
        time.sleep(0.05)
    if group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)
    proc.wait(timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and group_alive(pgid):
        time.sleep(0.05)
