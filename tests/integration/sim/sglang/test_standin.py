"""The stand-in `python -m sglang.launch_server`: SGLang's command line, its log, its process group.

Real processes throughout: the launcher runs in its own session as on a GPU host, the log goes to a
file, and every test ends the group it started.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.processes import free_port
from tests.support.sglang_sim import (
    group_alive,
    model_folder,
    standin_env,
    start_standin,
    stop_group,
    wait_for_line,
)

FAST = {
    "time_scale": 0.01,
    "startup_weights_s": 2.0,
    "output_len_min": 8,
    "output_len_max": 30,
    "min_step_s": 0.002,
}
READY = "The server is fired up and ready to roll!"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_folder(tmp_path_factory.mktemp("standin") / "Kimi-K2.5")


def launcher(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def post(url: str, body: object) -> tuple[int, bytes]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, r.read()


def test_import_sglang_reports_the_version(tmp_path: Path) -> None:
    env = standin_env(tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", "import sglang; print(sglang.__version__)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "0.5.23"


def test_help_lists_the_flags_regen_passes(tmp_path: Path) -> None:
    done = launcher(standin_env(tmp_path), "--help")
    assert done.returncode == 0
    assert done.stdout.startswith("usage: sglang serve [-h] --model-path MODEL_PATH")  # 0.5.23's prog
    flags = set(re.findall(r"--[a-z0-9-]+", done.stdout))
    for flag in (
        "--model-path",
        "--host",
        "--port",
        "--tp-size",
        "--tensor-parallel-size",
        "--served-model-name",
        "--enable-metrics",
        "--trust-remote-code",
        "--mem-fraction-static",
        "--context-length",
        "--reasoning-parser",
        "--tool-call-parser",
        "--enable-cache-report",
        "--model-loader-extra-config",
        "--log-level",
        "--watchdog-timeout",
        "--api-key",
        "--max-running-requests",
        "--cuda-graph-max-bs-decode",
        "--speculative-algorithm",
    ):
        assert flag in flags, flag
    # `--tp` is not a flag of its own: argparse takes it as the unique prefix of --tp-size.
    assert "--tp" not in flags and "--cuda-graph-max-bs" not in flags


def test_unknown_flag_is_refused_like_argparse(tmp_path: Path, model: Path) -> None:
    done = launcher(standin_env(tmp_path), "--model-path", str(model), "--no-such-flag", "1")
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == "sglang serve: error: unrecognized arguments: --no-such-flag 1"


def test_old_cuda_graph_flag_is_ambiguous_on_0_5_23(tmp_path: Path, model: Path) -> None:
    done = launcher(standin_env(tmp_path), "--model-path", str(model), "--cuda-graph-max-bs", "16")
    assert done.returncode == 2
    assert (
        "error: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
        "--cuda-graph-max-bs-prefill"
    ) in done.stderr


def test_model_path_is_required(tmp_path: Path) -> None:
    done = launcher(standin_env(tmp_path), "--port", "1")
    assert done.returncode == 2
    assert "the following arguments are required: --model-path/--model" in done.stderr


def test_model_folder_without_config_json(tmp_path: Path) -> None:
    folder = tmp_path / "weights"
    folder.mkdir()
    done = launcher(standin_env(tmp_path), "--model-path", str(folder))
    assert done.returncode == 1
    assert f"OSError: {folder} does not appear to have a file named config.json." in done.stderr
    missing = launcher(standin_env(tmp_path), "--model-path", str(tmp_path / "nope"))
    assert missing.returncode == 1
    assert "is not a local folder and is not a valid model identifier" in missing.stderr


def test_launch_serve_and_stop_by_process_group(tmp_path: Path, model: Path) -> None:
    port = free_port()
    env = standin_env(tmp_path, {**FAST, "child_processes": 2})
    log = tmp_path / "sglang.log"
    proc = start_standin(model, port, env=env, log=log)
    try:
        assert os.getpgid(proc.pid) == proc.pid  # its own group, as setsid makes it
        text = wait_for_line(log, READY, proc=proc)
        phases = [
            "Load weight begin.",
            "Load weight end.",
            "Memory pool end.",
            "CUDA graph end.",
            "max_total_num_tokens=",
            "Uvicorn running on",
            READY,
        ]
        at = [text.index(p) for p in phases]
        assert at == sorted(at)
        assert "type=KimiK25ForConditionalGeneration" in text
        assert "context_len=262144" in text  # from the model folder's config.json
        assert get(f"http://127.0.0.1:{port}/health_generate")[0] == 200
        info = json.loads(get(f"http://127.0.0.1:{port}/server_info")[1])
        assert info["tp_size"] == 8 and info["served_model_name"] == "kimi-k2.5"
        assert info["model_path"] == str(model) and info["version"] == "0.5.23"
        models = json.loads(get(f"http://127.0.0.1:{port}/v1/models")[1])
        assert models["data"][0]["id"] == "kimi-k2.5"
        status, body = post(
            f"http://127.0.0.1:{port}/generate",
            {"text": "hello", "sampling_params": {"max_new_tokens": 4}, "rid": "t#0"},
        )
        assert status == 200 and json.loads(body)["meta_info"]["id"] == "t#0"
        assert get(f"http://127.0.0.1:{port}/metrics")[0] == 200
        members = subprocess.run(["ps", "-o", "pid=", "-g", str(proc.pid)], capture_output=True, text=True)
        assert len(members.stdout.split()) == 3  # the server and its two helper processes
    finally:
        stop_group(proc)
    assert not group_alive(proc.pid)
    assert "SIGTERM received. signum=15 frame=None. Draining requests and shutting down..." in log.read_text()


def test_without_enable_metrics_there_is_no_metrics_endpoint(tmp_path: Path, model: Path) -> None:
    port = free_port()
    log = tmp_path / "sglang.log"
    env = standin_env(tmp_path, {**FAST, "child_processes": 0})
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--port", str(port)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_line(log, READY, proc=proc)
        assert get(f"http://127.0.0.1:{port}/metrics")[0] == 404
        info = json.loads(get(f"http://127.0.0.1:{port}/server_info")[1])
        assert info["tp_size"] == 1 and info["served_model_name"] == str(model)  # SGLang's defaults
    finally:
        stop_group(proc)


def test_cuda_graph_oom_fails_within_seconds_with_its_signature(tmp_path: Path, model: Path) -> None:
    log = tmp_path / "sglang.log"
    env = standin_env(tmp_path, {**FAST, "child_processes": 1, "faults": {"startup_fail_at": "cuda_graph"}})
    started = time.monotonic()
    proc = start_standin(model, free_port(), env=env, log=log)
    try:
        code = proc.wait(timeout=60)
    finally:
        stop_group(proc)
    assert time.monotonic() - started < 30
    assert code != 0 and code == -9  # killed with its process tree
    text = log.read_text()
    assert "Capture target decode CUDA graph begin." in text
    assert "Exception: Capture cuda graph failed: CUDA out of memory." in text
    assert "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)" in text
    assert "Received sigquit from a child process. It usually means the child failed." in text
    assert READY not in text
    assert not group_alive(proc.pid)


def test_watchdog_crash_ends_the_process(tmp_path: Path, model: Path) -> None:
    port = free_port()
    log = tmp_path / "sglang.log"
    env = standin_env(
        tmp_path,
        {**FAST, "child_processes": 1, "watchdog_timeout": 50.0, "faults": {"watchdog_after_requests": 0}},
    )
    proc = start_standin(model, port, env=env, log=log)
    try:
        wait_for_line(log, READY, proc=proc)
        with pytest.raises(OSError):  # the request never finishes: the server dies under it
            post(
                f"http://127.0.0.1:{port}/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4}}
            )
        code = proc.wait(timeout=30)
    finally:
        stop_group(proc)
    assert code == -9
    text = log.read_text()
    assert "Scheduler watchdog timeout (self.watchdog_timeout=50, self.soft=False)" in text
    assert text.index("watchdog timeout") < text.index("Received sigquit from a child process")
    assert not group_alive(proc.pid)


def test_ignored_sigterm_needs_sigkill(tmp_path: Path, model: Path) -> None:
    log = tmp_path / "sglang.log"
    env = standin_env(tmp_path, {**FAST, "child_processes": 1, "faults": {"ignore_sigterm": True}})
    proc = start_standin(model, free_port(), env=env, log=log)
    try:
        wait_for_line(log, READY, proc=proc)
        os.killpg(proc.pid, 15)
        time.sleep(1.0)
        assert proc.poll() is None and group_alive(proc.pid)
    finally:
        stop_group(proc, timeout_s=2.0)
    assert proc.returncode == -9 and not group_alive(proc.pid)


def test_the_references_launch_script_detaches_it(tmp_path: Path, model: Path) -> None:
    """The launch as regen ships it to a host (`bash -s` on stdin, setsid nohup, all three streams
    redirected): the shell returns at once, the server leads its own group and outlives the shell."""
    port = free_port()
    env = standin_env(tmp_path, {**FAST, "child_processes": 1})
    script = textwrap.dedent(
        """\
        WD=$1 MODEL=$2 PORT=$3 PY=$4
        mkdir -p "$WD/run" "$WD/logs"; cd "$WD" || exit 1
        LOG="logs/sglang.log"
        setsid nohup "$PY" -m sglang.launch_server \\
          --model-path "$MODEL" --served-model-name kimi-k2.5 --tp 8 --trust-remote-code \\
          --host 127.0.0.1 --port "$PORT" --mem-fraction-static 0.85 --context-length 131072 \\
          --reasoning-parser kimi_k2 --tool-call-parser kimi_k2 --enable-metrics --enable-cache-report \\
          --model-loader-extra-config '{"enable_multithread_load": true, "num_threads": 32}' \\
          --log-level info > "$LOG" 2>&1 < /dev/null &
        PID=$!
        echo "$PID" > run/sglang.pid
        """
    )
    wd = tmp_path / "wd"
    done = subprocess.run(
        ["bash", "-s", "--", str(wd), str(model), str(port), sys.executable],
        input=script,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    pid = int((wd / "run" / "sglang.pid").read_text())
    try:
        wait_for_line(wd / "logs" / "sglang.log", READY)
        assert os.getpgid(pid) == pid and os.getsid(pid) == pid
        assert get(f"http://127.0.0.1:{port}/health_generate")[0] == 200
        info = json.loads(get(f"http://127.0.0.1:{port}/server_info")[1])
        assert info["context_length"] == 131072 and info["reasoning_parser"] == "kimi_k2"
        assert info["enable_cache_report"] is True and info["trust_remote_code"] is True
    finally:
        os.killpg(pid, 15)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and group_alive(pid):
            time.sleep(0.05)
        if group_alive(pid):
            os.killpg(pid, 9)
    assert not group_alive(pid)


def nvidia_smi(env: dict[str, str], *query: str) -> list[str]:
    done = subprocess.run(
        ["nvidia-smi", *query], env=env, capture_output=True, text=True, timeout=30, check=True
    )
    return done.stdout.splitlines()


def test_stand_in_nvidia_smi_sees_the_server_while_it_runs(tmp_path: Path, model: Path) -> None:
    env = standin_env(tmp_path, {**FAST, "child_processes": 0})
    apps = ("--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader")
    gpus = (
        "--query-gpu=index,name,memory.total,memory.used,utilization.gpu",
        "--format=csv,noheader,nounits",
    )
    assert nvidia_smi(env, *apps) == []  # free GPUs: what a preflight wants
    rows = nvidia_smi(env, *gpus)
    assert len(rows) == 8 and rows[0] == "0, NVIDIA H200, 143771, 0, 0"
    log = tmp_path / "sglang.log"
    proc = start_standin(model, free_port(), env=env, log=log)
    try:
        wait_for_line(log, READY, proc=proc)
        listed = nvidia_smi(env, *apps)
        assert listed == [f"{proc.pid}, python3, 131072 MiB"] * 8  # --tp 8: every GPU
        assert all(r.split(", ")[3] == "131072" for r in nvidia_smi(env, *gpus))
        other = standin_env(tmp_path / "elsewhere")
        assert nvidia_smi(other, *apps) == []  # another simulated host
    finally:
        stop_group(proc)
    assert nvidia_smi(env, *apps) == []  # nothing left after stop
    bad = subprocess.run(
        ["nvidia-smi", "--query-gpu=bogus", "--format=csv"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and 'Field "bogus" is not a valid field to query.' in bad.stderr
