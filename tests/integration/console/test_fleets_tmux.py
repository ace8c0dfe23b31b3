"""In real tmux: the console on a real job with both fleets shows them in one view; P pauses one
backend while the other runs on, and d changes the deadline.

The job is `regen run` on both simulators, each in its own process (`regen sim sglang`, `regen sim
openrouter`), with `job.backends = ["sglang", "openrouter"]` and a deadline, as an operator runs it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from regen.sim.sglang.tokens import builtin_tokenizer_folder
from tests.support.processes import ENV, free_port, wait_gone
from tests.support.processes import regen_argv as regen
from tests.support.tmux import Tmux, needs_tmux

pytestmark = needs_tmux
KEY = "sk-sim-test"


def start(command: list[str]) -> tuple[subprocess.Popen[str], str]:
    """A simulator in its own process, and the URL it listens on (from its first line)."""
    proc = subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "listening on" in line, line
    return proc, line.split(" on ", 1)[1].strip()


@pytest.fixture
def simulators(tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """Both simulators as processes: the GPUs slower than the deadline needs, OpenRouter beside them.
    Yields the SGLang URL, OpenRouter's API URL and the tokenizer folder both use."""
    tokenizer = builtin_tokenizer_folder(tmp_path / "tokenizer")
    gpu_config = tmp_path / "sglang-sim.json"
    gpu_config.write_text(
        json.dumps(
            {
                "served_model_name": "kimi-k2.5",
                "startup_weights_s": 0.0,
                "startup_kv_pool_s": 0.0,
                "startup_cuda_graph_s": 0.0,
                "startup_http_s": 0.0,
                "startup_warmup_s": 0.0,
                "decode_tokens_per_s": 40.0,
                "max_running_requests": 16,
                "output_len_min": 40,
                "output_len_max": 200,
                "child_processes": 0,
                "time_scale": 0.5,
                "seed": 7,
            }
        )
    )
    paid_config = tmp_path / "openrouter-sim.json"
    paid_config.write_text(
        json.dumps(
            {
                "api_keys": [KEY],
                "time_scale": 0.3,
                "min_completion_tokens": 40,
                "max_completion_tokens": 200,
                "chunk_interval_s": 0.05,
                "seed": 7,
            }
        )
    )
    sglang, gpu_url = start(
        regen("sim", "sglang", "--port", "0", "--config", str(gpu_config), "--tokenizer", str(tokenizer))
    )
    port = free_port()
    openrouter, _ = start(regen("sim", "openrouter", "--port", str(port), "--config", str(paid_config)))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{gpu_url}/health", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                assert time.monotonic() < deadline, "the SGLang simulator never became healthy"
                time.sleep(0.1)
        yield gpu_url, f"http://127.0.0.1:{port}/api/v1", tokenizer
    finally:
        for proc in (sglang, openrouter):
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)


def clear_the_box(tmux: Tmux) -> None:
    """ctrl+u empties the box; wait until it is empty (its placeholder shows) before typing, since
    Textual runs the binding after the key and letters typed at once could land before it."""
    tmux.keys("C-u")
    tmux.wait_for(lambda s: "12h, 90m, 06:30 or none" in s, "the box emptied")


def test_both_fleets_in_one_view_and_the_deadline_changed_from_the_keyboard(
    simulators: tuple[str, str, Path],
    tmp_path: Path,
    tmux: Tmux,
) -> None:
    gpu_url, paid_url, tokenizer = simulators
    data = tmp_path / "data" / "A"
    data.mkdir(parents=True)
    lines = [json.dumps({"messages": [{"role": "user", "content": f"question {i}"}]}) for i in range(20_000)]
    (data / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    settings = tmp_path / "settings.toml"
    settings.write_text(
        f'[openrouter]\nbase_url = "{paid_url}"\nmax_tokens = 256\n'
        f'[sglang]\nurls = ["{gpu_url}"]\nserved_model_name = "kimi-k2.5"\nmetrics_interval_s = 0.5\n'
        f'[tokenizer]\npath = "{tokenizer}"\nworkers = 1\n'
        f'[job]\nbackends = ["sglang", "openrouter"]\ndeadline = "10m"\ndatasets = ["{data}"]\n'
        f'run_dir = "{tmp_path / "run"}"\nconcurrency = 32\nbudget_usd = 5.0\n'
        "[steering]\ninterval_s = 0.5\nsmoothing_s = 2.0\ngpu_tokens_per_s = 500.0\n"
    )
    env = " ".join(
        f"{k}={v!r}"
        for k, v in {**ENV, "OPENROUTER_API_KEY": KEY, "TERM": "tmux-256color", "TZ": "UTC"}.items()
        if k in ("PATH", "PYTHONPATH", "HOME", "OPENROUTER_API_KEY", "TERM", "PYTHONUNBUFFERED", "TZ")
    )
    command = " ".join(regen("run", "--settings", str(settings)))
    # The pane's shell may carry an 80x24 COLUMNS/LINES from whoever started the tmux server; the
    # console must size itself from the window.
    tmux(
        "new-session",
        "-d",
        "-s",
        "regen",
        "-x",
        "140",
        "-y",
        "42",
        f"cd {tmp_path} && env -u COLUMNS -u LINES {env} {command}; sleep 600",
    )
    try:
        # One view: each backend with its state, its server or providers, then the plan to the deadline.
        screen = tmux.wait_for(
            lambda s: "Plan deadline 10m" in s and "ceiling" in s and "GPU-" in s and "req" in s,
            "the fleets pane",
            timeout=60,
        )
        assert (
            screen.index("sglang RUNNING")
            < screen.index("openrouter RUNNING")
            < screen.index("Plan deadline 10m")
        )
        assert "Fleets" in screen and "ETA " in screen and "projected $" in screen
        assert "P Backend" in screen and "d Deadline" in screen

        # P: the chooser lists both backends; enter pauses the first (sglang), OpenRouter runs on.
        tmux.keys("P")
        tmux.wait_for(lambda s: "Pause or resume one backend" in s, "the backend chooser")
        tmux.keys("Enter")
        screen = tmux.wait_for(lambda s: "sglang PAUSED" in s, "sglang paused")
        assert "openrouter RUNNING" in screen and "paused sglang" in screen  # the pane and the log
        events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
        assert any(e["event"] == "pause" and e.get("backend") == "sglang" for e in events), "the job's own"

        # d: a bad deadline is refused in the box with the job's rule; a good one reaches the job.
        tmux.keys("d")
        tmux.wait_for(lambda s: "Deadline now: 10m," in s and "Set [enter]" in s, "the deadline box")
        time.sleep(0.5)  # the box takes the keys once it has the focus (after it is drawn)
        clear_the_box(tmux)
        tmux.keys("-l", "1.5h")
        tmux.wait_for(lambda s: "1.5h" in s, "the text typed")
        tmux.keys("Enter")
        tmux.wait_for(lambda s: "not a time of day or a duration" in s, "the refusal")
        clear_the_box(tmux)
        tmux.keys("-l", "90m")
        tmux.wait_for(lambda s: "  90m" in s, "the text typed")
        tmux.keys("Enter")
        screen = tmux.wait_for(
            lambda s: "Plan deadline 90m" in s and "Set the deadline" not in s, "the new deadline"
        )
        assert "(1h30m from now)" in screen  # the job's answer, in the log

        tmux.keys("q")
        tmux.wait_for(lambda s: "Fleets" not in s, "the console to close")
    finally:
        pid_file = tmp_path / "run" / "job.lock"
        if pid_file.exists() and pid_file.read_text().strip():
            pid = int(pid_file.read_text())
            with_key = {**ENV, "OPENROUTER_API_KEY": KEY}
            subprocess.run(regen("stop", "--cancel", "--settings", str(settings)), env=with_key, timeout=60)
            wait_gone(pid, 30)
