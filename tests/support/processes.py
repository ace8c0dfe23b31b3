"""The `regen` command as tests run it, and the processes around it: where the repository is, the
environment a child Python needs, a free port, and waiting for a job to get somewhere or to be gone.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A child Python imports regen from this checkout's src/, and never sees the operator's own key.
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1"}
ENV.pop("OPENROUTER_API_KEY", None)


def regen_argv(*args: str) -> list[str]:
    """The command line of `regen ARGS`: this interpreter, this checkout's regen (run it with ENV)."""
    return [sys.executable, "-m", "regen", *args]


def run_regen(
    *args: str, cwd: Path | None = None, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`regen ARGS` in a process of its own, to its end: its exit code and output as text."""
    return subprocess.run(
        regen_argv(*args),
        capture_output=True,
        text=True,
        env=ENV if env is None else env,
        cwd=cwd,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def regen_in_process(*args: str) -> int:
    """`regen ARGS` in this process (its output reaches capsys); its exit code."""
    from regen.cli.main import main

    return main(list(args))


def regen_captured(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`regen ARGS` in this process with `env` as its environment: what `run_regen` returns, without
    a Python start (most of a refusal's cost). For the tests that check an exit code and a message;
    an exception that escapes `main` is a traceback the operator would see, and fails the test."""
    from regen.cli.main import main

    saved = dict(os.environ)
    out, err = io.StringIO(), io.StringIO()
    # What earlier tests in this process left for the collector says its last words now, to the real
    # stderr, not into this command's (a finalizer's "Exception ignored in ..." line).
    gc.collect()
    try:
        os.environ.clear()
        os.environ.update(ENV if env is None else env)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's refusals, and SystemExit("message") as Python ends it
                if exc.code is None or isinstance(exc.code, int):
                    code = exc.code or 0
                else:
                    print(exc.code, file=sys.stderr)
                    code = 1
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return subprocess.CompletedProcess(regen_argv(*args), code, out.getvalue(), err.getvalue())


def start_headless_run(
    settings: Path, log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """`regen run --headless --settings SETTINGS` in the background, its output to `log`."""
    out = open(log, "wb")  # noqa: SIM115 - the job's output for its life
    try:
        return subprocess.Popen(
            regen_argv("run", "--headless", "--settings", str(settings)),
            env=ENV if env is None else env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    finally:
        out.close()


# Ports a test hands to a server that binds it later. Drawn below the kernel's ephemeral range
# (/proc/sys/net/ipv4/ip_local_port_range, 32768 and up), never from it: there any client socket of
# any process (another pytest-xdist worker's) may take the port between the draw and the bind. Each
# worker draws from its own slice, so two workers never hand out the same port.
_PORTS_LOW, _PORTS_HIGH = 10_000, 32_000
_drawn: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on now, none this process handed out before, and none another
    pytest-xdist worker can hand out."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(worker) if worker.isdigit() else 0
    size = (_PORTS_HIGH - _PORTS_LOW) // max(workers, 1)
    low = _PORTS_LOW + index * size
    for _ in range(200):
        port = random.randrange(low, low + size)
        if port in _drawn:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _drawn.add(port)
        return port
    raise RuntimeError(f"no free loopback port in {low}..{low + size}")


def settings_file(tmp_path: Path, base_url: str, datasets: list[Path], **job: object) -> Path:
    """tmp_path/settings.toml for a headless OpenRouter job at `base_url`, run folder tmp_path/run."""
    path = tmp_path / "settings.toml"
    job_lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in job.items())
    path.write_text(
        f'[openrouter]\nbase_url = "{base_url}"\nmax_tokens = 64\n'
        f"[job]\ndatasets = {json.dumps([str(d) for d in datasets])}\n"
        f'run_dir = "{tmp_path / "run"}"\nbackoff_base_s = 0.01\nbackoff_max_s = 0.1\n{job_lines}\n'
        "[headless]\nstatus_interval_s = 0.2\n"
    )
    return path


# -- waiting ------------------------------------------------------------------------------------


def wait_gone(pid: int, timeout_s: float = 10.0) -> None:
    """Wait until process `pid` has exited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"process {pid} did not end")


def wait_for_attempts(journal: Path, ends: int, timeout_s: float = 60.0) -> None:
    """Wait until the attempt journal holds `ends` settled attempts: the job is under way."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if journal.exists() and journal.read_bytes().count(b'"k":"end"') >= ends:
            return
        time.sleep(0.05)
    raise AssertionError(f"{journal}: fewer than {ends} attempts after {timeout_s} s")


def wait_rows(
    data: Path, at_least: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 120
) -> None:
    """Wait until the dataset folder `data` holds `at_least` rows, while the job `proc` (output in
    `log`) still runs."""
    deadline = time.monotonic() + timeout
    results = data / "raw_responses.jsonl"
    while time.monotonic() < deadline:
        if results.exists() and results.read_bytes().count(b"\n") >= at_least:
            return
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.05)
    raise AssertionError(f"fewer than {at_least} rows in {timeout} s:\n{log.read_text()[-3000:]}")


def children_of(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # The name in parentheses may hold spaces: the fields after its last ")" are fixed.
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def assert_gone(pids: list[int], timeout_s: float = 15.0) -> None:
    """Every one of `pids` ends within `timeout_s` (what a killed job started ends with it)."""
    deadline = time.monotonic() + timeout_s
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if _alive(pid)]
        time.sleep(0.05)
    assert not alive, f"processes the killed job started outlived it: {alive}"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has ended; it waits for init to reap it


def kill_at_random_moments(
    settings: Path, env: dict[str, str], rng: random.Random, times: int, low: float, high: float
) -> int:
    """Start the headless job and SIGKILL it a random delay after it sent its first request (a
    start on a busy machine can take longer than the delay), `times` times; returns the kills."""
    kills = 0
    attempts = settings.parent / "run" / "attempts.jsonl"

    def starts() -> tuple[int, int]:
        """The journal file's inode and its start records (a rotation makes a fresh file)."""
        try:
            with attempts.open("rb") as f:
                return os.fstat(f.fileno()).st_ino, f.read().count(b'"k":"start"')
        except FileNotFoundError:
            return 0, 0

    for _ in range(times):
        before = starts()
        proc = subprocess.Popen(
            regen_argv("run", "--headless", "--settings", str(settings)),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            now = starts()
            if now[1] > (before[1] if now[0] == before[0] else 0):
                break
            time.sleep(0.02)
        time.sleep(rng.uniform(low, high))
        if proc.poll() is None:
            children = children_of(proc.pid)
            proc.kill()
            kills += 1
            proc.wait()
            # What the job started (its tokenizer workers) ends with it (src/regen/engine/lifetime.py).
            assert_gone(children)
        proc.wait()
    return kills
