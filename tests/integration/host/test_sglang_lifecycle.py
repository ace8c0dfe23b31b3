"""`regen sglang start|status|stop` over a real sshd on loopback, with the stand-in launcher behind it.

Every launch is a real detached process tree on this machine (the "host"), found again through its
pid file and ended by its process group; each test's fixture ends whatever it left.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from tests.support.gpuhost import GpuHost, group_members
from tests.support.gpuhost import settings_file as settings
from tests.support.processes import ROOT, free_port, run_regen
from tests.support.sglang_sim import standin_env, start_standin, stop_group


def test_start_status_stop(host: GpuHost, tmp_path: Path) -> None:
    conf = settings(host, tmp_path)
    started = run_regen("sglang", "start", "--settings", str(conf), timeout=120)
    assert started.returncode == 0, started.stderr + started.stdout
    out = started.stdout
    # The phases as progress, in order, then the readiness probe through the tunnel.
    for step in ("[1/8] weights", "[3/8] kv pool", "[4/8] cuda graphs", "[7/8] http", "[8/8] ready"):
        assert step in out
    assert out.index("[1/8] weights") < out.index("[8/8] ready") < out.index("/health_generate")
    assert "gpu1: ready in" in out and "every host ready (1)" in out

    record = host.record()
    assert record is not None
    pid = record["pid"]
    # Its own session and process group; alive although the SSH session that launched it has ended.
    assert os.getsid(pid) == pid and os.getpgid(pid) == pid == record["pgid"]
    assert host.sshd.sessions() == []
    os.kill(pid, 0)
    members = group_members(pid)
    assert len(members) == 3  # the launcher and its two helpers
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    assert b"sglang.launch_server" in argv and b"--enable-metrics" in argv
    assert argv[argv.index(b"--port") + 1] == str(host.port).encode()
    assert argv[argv.index(b"--host") + 1] == b"127.0.0.1"
    # Requests through the router lose their own stream_interval: the server's is theirs.
    assert argv[argv.index(b"--stream-interval") + 1] == b"256"
    # stdin from /dev/null, stdout and stderr into the log in work_dir.
    assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
    assert os.readlink(f"/proc/{pid}/fd/1") == str(host.work / f"sglang-{host.port}.log")
    assert "The server is fired up and ready to roll!" in host.log()

    again = run_regen("sglang", "start", "--json", "--settings", str(conf), timeout=60)
    assert again.returncode == 0, again.stderr
    assert "already running" in again.stderr  # progress on stderr, only the JSON on stdout
    (result,) = json.loads(again.stdout)["hosts"]
    assert result["ok"] and result["already_running"] and result["pid"] == pid
    assert host.record()["pid"] == pid  # type: ignore[index]

    status = run_regen("sglang", "status", "--json", "--settings", str(conf), timeout=60)
    assert status.returncode == 0, status.stderr
    (entry,) = json.loads(status.stdout)["hosts"]
    assert entry["state"] == "ready" and entry["alive"] and entry["ready"]
    assert entry["phase"] == "ready" and entry["pid"] == pid
    assert (
        entry["version"] == "0.5.23" and entry["served_model_name"] == "Kimi-K2.5"
    )  # the model folder's name
    assert entry["model_path"] == str(host.model)
    assert entry["running"] == 0 and entry["queued"] == 0 and entry["kv_usage"] == 0
    busy = [g for g in entry["gpus"] if g["processes"]]
    assert [p["pid"] for g in busy for p in g["processes"]] == [pid, pid]  # tp 2: two GPUs held
    text = run_regen("sglang", "status", "--settings", str(conf), timeout=60)
    assert "gpu1: ready · pid" in text.stdout and "sglang 0.5.23" in text.stdout

    stopped = run_regen("sglang", "stop", "--settings", str(conf), timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    assert "nothing of its process group is left" in stopped.stdout and "TERM" in stopped.stdout
    assert group_members(pid) == []
    assert host.record() is None
    after = json.loads(run_regen("sglang", "status", "--json", "--settings", str(conf)).stdout)["hosts"][0]
    assert after["state"] == "stopped" and not after["alive"]
    assert all(not g["processes"] for g in after["gpus"])
    # Stopping what is not running is said, and is not a failure.
    twice = run_regen("sglang", "stop", "--settings", str(conf))
    assert twice.returncode == 0 and "no server regen started is running" in twice.stdout


def test_stop_kills_a_group_that_ignores_term(host: GpuHost, tmp_path: Path) -> None:
    host.set_sim(faults={"ignore_sigterm": True})
    conf = settings(host, tmp_path, stop_grace_s=1.0)
    assert run_regen("sglang", "start", "--settings", str(conf), timeout=120).returncode == 0
    pid = host.record()["pid"]  # type: ignore[index]
    stopped = run_regen("sglang", "stop", "--settings", str(conf), timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    assert "TERM then KILL" in stopped.stdout
    assert group_members(pid) == []


def test_cuda_graph_failure_is_reported_in_seconds(host: GpuHost, tmp_path: Path) -> None:
    host.set_sim(faults={"startup_fail_at": "cuda_graph"})
    conf = settings(host, tmp_path, ready_timeout_s=900.0)
    began = time.monotonic()
    failed = run_regen("sglang", "start", "--settings", str(conf), timeout=120)
    took = time.monotonic() - began
    assert failed.returncode == 1, failed.stdout
    # Told by the log, long before the 900 s readiness limit could say anything.
    assert took < 60
    assert "gpu1: launch failed after cuda graphs: Exception: Capture cuda graph failed" in failed.stderr
    assert "the log's last lines" in failed.stderr and "Possible solutions" in failed.stderr
    assert "[4/8] cuda graphs" in failed.stdout and "[8/8]" not in failed.stdout
    record = host.record()
    assert record is not None and group_members(record["pgid"]) == []


def test_unknown_flag_is_refused_before_launch(host: GpuHost, tmp_path: Path) -> None:
    conf = settings(host, tmp_path, launch_args=["--mem-fraction-static", "0.8", "--no-such-flag", "1"])
    refused = run_regen("sglang", "start", "--settings", str(conf), timeout=120)
    assert refused.returncode == 1
    assert "--no-such-flag is not a flag of this sglang's launch_server" in refused.stderr
    assert "--mem-fraction-static" not in refused.stderr  # a real flag is not blamed
    assert host.record() is None and not host.log()  # nothing was launched
    # An ambiguous prefix (0.5.23 split --cuda-graph-max-bs in two) is refused too, naming both.
    conf = settings(host, tmp_path, launch_args=["--cuda-graph-max-bs", "16"])
    ambiguous = run_regen("sglang", "start", "--settings", str(conf), timeout=120)
    assert ambiguous.returncode == 1
    assert "--cuda-graph-max-bs is ambiguous" in ambiguous.stderr
    assert "--cuda-graph-max-bs-decode" in ambiguous.stderr
    # --tp is argparse's unique prefix of --tp-size: accepted (the launches above never named it).


def test_preflight_refuses_busy_gpus_busy_port_and_a_model_without_config(
    host: GpuHost, tmp_path: Path
) -> None:
    conf = settings(host, tmp_path)
    # A server regen did not start, on this host's GPUs (its own port).
    other = start_standin(
        host.model, free_port(), env=standin_env(host.root, {"time_scale": 0.01}), log=tmp_path / "other.log"
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "Load weight begin" not in (tmp_path / "other.log").read_text():
            time.sleep(0.05)
        busy = run_regen("sglang", "start", "--settings", str(conf), timeout=120)
        assert busy.returncode == 1, busy.stdout + (tmp_path / "other.log").read_text()[-2000:]
        assert f"GPUs in use by compute processes: GPU 0: pid {other.pid}" in busy.stderr
    finally:
        stop_group(other)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", host.port))
        taken.listen()
        port = run_regen("sglang", "start", "--settings", str(conf), timeout=120)
    assert port.returncode == 1
    assert f"port {host.port} on 127.0.0.1 is already in use on the host" in port.stderr
    (host.model / "config.json").unlink()
    model = run_regen("sglang", "start", "--settings", str(conf), timeout=120)
    assert model.returncode == 1 and f"{host.model} has no config.json" in model.stderr
    assert host.record() is None


def test_other_flags_while_running_are_refused(host: GpuHost, tmp_path: Path) -> None:
    conf = settings(host, tmp_path)
    assert run_regen("sglang", "start", "--settings", str(conf), timeout=120).returncode == 0
    changed = settings(host, tmp_path, launch_args=["--max-running-requests", "64"])
    refused = run_regen("sglang", "start", "--settings", str(changed), timeout=60)
    assert refused.returncode == 1
    assert "already running on port" in refused.stderr and "with other flags" in refused.stderr


def test_usage_errors(tmp_path: Path) -> None:
    empty = tmp_path / "settings.toml"
    empty.write_text("")
    no_hosts = run_regen("sglang", "status", "--settings", str(empty))
    assert no_hosts.returncode == 2 and "no GPU hosts" in no_hosts.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text('[sglang]\nlaunch_args = ["--port", "1"]\n')
    refused = run_regen("sglang", "start", "--settings", str(bad))
    assert refused.returncode == 2 and "regen sets --model-path" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert ROOT.exists()
