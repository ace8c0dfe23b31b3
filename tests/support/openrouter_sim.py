"""The OpenRouter simulator as tests run it: fast settings for one in this event loop, or
`regen sim openrouter` in a process of its own, and the keys it accepts."""

from __future__ import annotations

import json
import random
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from regen.sim.openrouter.config import SimConfig
from tests.support.processes import ENV, free_port, regen_argv

SIM_KEY = "sk-sim-test"
# A key shaped like a real one, for the tests that look for it in every output and file.
SECRET = "sk-or-v1-" + "".join(random.Random(5).choices("abcdef0123456789", k=48))


def fast_sim_config(**overrides: Any) -> SimConfig:
    """A simulator that answers in milliseconds: tests check behaviour, not speed."""
    base: dict[str, Any] = {
        "time_scale": 0.002,
        "min_completion_tokens": 8,
        "max_completion_tokens": 40,
        "chunk_interval_s": 0.005,
        "keepalive_interval_s": 0.02,
        "generation_lookup_delay_s": 0.05,
        "retry_after_s": 0,
        "seed": 1,
    }
    base.update(overrides)
    return SimConfig(**base)


@contextmanager
def openrouter_process(
    folder: Path, config: dict[str, Any], regen: list[str] | None = None, env: dict[str, str] | None = None
) -> Iterator[str]:
    """`regen sim openrouter` in its own process (so it outlives the jobs tests kill) on a free
    loopback port, `config` written to folder/sim.json; yields its base URL, ends it with SIGTERM.
    `regen` and `env`: another regen's command and environment (an installed wheel's), not this checkout's."""
    port = free_port()
    path = folder / "sim.json"
    path.write_text(json.dumps(config))
    proc = subprocess.Popen(
        [*(regen or regen_argv()), "sim", "openrouter", "--port", str(port), "--config", str(path)],
        env=ENV if env is None else env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "listening on" in line, line
    try:
        yield f"http://127.0.0.1:{port}/api/v1"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
