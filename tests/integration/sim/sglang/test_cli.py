"""`regen sim sglang` and `python -m regen.sim sglang` as an operator runs them: real processes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.support.processes import ENV, regen_argv, regen_captured
from tests.support.sglang_sim import model_folder

QUICK = {"time_scale": 0.01, "output_len_min": 4, "output_len_max": 12}


def start(argv: list[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(argv, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("regen sim sglang listening on http://127.0.0.1:"), line
    return proc, line.split(" on ", 1)[1].strip()


def ready(url: str) -> None:
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError("not ready")


@pytest.mark.parametrize("entry", ["regen", "module"])
def test_port_zero_prints_the_url_and_serves(tmp_path: Path, entry: str) -> None:
    config = tmp_path / "sim.toml"
    config.write_text("\n".join(f"{k} = {v}" for k, v in QUICK.items()) + "\n")
    if entry == "regen":
        argv = regen_argv("sim", "sglang", "--port", "0", "--config", str(config))
    else:
        argv = [sys.executable, "-m", "regen.sim", "sglang", "--port", "0", "--config", str(config)]
    proc, url = start(argv)
    try:
        ready(url)
        req = urllib.request.Request(
            url + "/generate",
            method="POST",
            data=json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 3}}).encode(),
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            body = json.loads(r.read())
        assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0
    assert "The server is fired up and ready to roll!" in err
    assert "Traceback" not in err


def test_served_tokenizer_comes_from_tokenizer_flag(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "tok", "chatml")
    config = tmp_path / "sim.json"
    config.write_text(json.dumps({**QUICK, "served_model_name": "chatml-test"}))
    proc, url = start(
        regen_argv("sim", "sglang", "--port", "0", "--config", str(config), "--tokenizer", str(folder))
    )
    try:
        ready(url)
        with urllib.request.urlopen(url + "/_sim/state", timeout=10) as r:
            state = json.loads(r.read())
        with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
            models = json.loads(r.read())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=15)
    assert state["tokenizer"]["folder"] == str(folder)
    assert state["tokenizer"]["think_open_id"] is None  # ChatML has no thinking tokens
    assert models["data"][0]["id"] == "chatml-test"


@pytest.mark.parametrize(
    ("content", "suffix", "needle"),
    [
        (
            '{"max_running_requests": 0}',
            ".json",
            "max_running_requests: Input should be greater than or equal to 1",
        ),
        ('{"faults": {"startup_fail_at": "later"}}', ".json", "faults.startup_fail_at"),
        ("speed = [", ".toml", "not valid TOML"),
        ('{"nope": 1}', ".json", "nope: Extra inputs are not permitted"),
        ("x", ".yaml", "unsupported config type '.yaml'"),
        (
            '{"output_len_min": 9, "output_len_max": 3}',
            ".json",
            "output_len_min (9) is above output_len_max (3)",
        ),
    ],
)
def test_bad_config_is_one_line_and_exit_2(tmp_path: Path, content: str, suffix: str, needle: str) -> None:
    config = tmp_path / f"sim{suffix}"
    config.write_text(content)
    done = regen_captured("sim", "sglang", "--port", "0", "--config", str(config))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"regen: {config}: ")
    assert needle in lines[0]
    assert done.stdout == ""


def test_missing_config_and_bad_tokenizer_exit_2(tmp_path: Path) -> None:
    done = regen_captured("sim", "sglang", "--config", str(tmp_path / "none.json"))
    assert done.returncode == 2 and "cannot read" in done.stderr and "Traceback" not in done.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    done = regen_captured("sim", "sglang", "--tokenizer", str(empty))
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"regen: {empty}: cannot load the tokenizer")
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_port_in_use_exits_1(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        done = subprocess.run(
            regen_argv("sim", "sglang", "--port", str(port)),
            env=ENV,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert f"regen: cannot listen on 127.0.0.1:{port}" in done.stderr and "Traceback" not in done.stderr


def test_a_crash_exits_1_with_the_reason(tmp_path: Path) -> None:
    config = tmp_path / "sim.json"
    config.write_text(json.dumps({**QUICK, "faults": {"startup_fail_at": "cuda_graph"}}))
    done = subprocess.run(
        regen_argv("sim", "sglang", "--port", "0", "--config", str(config)),
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "Capture cuda graph failed" in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("regen: the simulated SGLang server died")
