"""SGLang's life on a GPU host: preflight, a detached launch, its log, its state, a stop by process group.

Shipped on stdin like hostcmd.py (docs/gpu-host.md, "Running code on the host"); its arguments come
as argv: a command and one JSON object (the launch spec), never part of a shell string. It answers in
JSON lines. docs/sglang.md §12 has the rules it keeps:

    start SPEC          already running (same flags)? refuse other flags; else preflight, then launch
    watch SPEC OFFSET   the log from OFFSET (bounded), whether the server is alive
    status SPEC         the pid file, the process group, the phase from the log, the GPUs
    stop SPEC           TERM to the process group, a grace period, KILL, then nothing of it is left

The server runs ``sys.executable -m sglang.launch_server FLAGS...`` (the host's configured python),
in its own session and process group (setsid), SIGHUP ignored, stdin from /dev/null, stdout and
stderr into ``WORK_DIR/sglang-PORT.log``; ``WORK_DIR/sglang-PORT.pid`` holds its pid, its process
group, its start time (so a recycled pid is never taken for it) and the command line.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from regen.engine.host.scripts import probe, sglanglog

# How long the checks may take: importing sglang and its --help load torch on a real host.
IMPORT_TIMEOUT_S = 300.0
HELP_TIMEOUT_S = 600.0
# A launcher that dies this soon (a bad flag, a missing folder) is reported by start itself.
EARLY_EXIT_S = 0.5
WATCH_CHUNK = 256 * 1024
# Where status looks for the phase (the startup lines are near the start) and for a late failure.
HEAD_BYTES = 2 * 1024 * 1024
TAIL_BYTES = 64 * 1024
TAIL_LINES = 15
_FLAG = re.compile(r"(?<![\w-])(--[A-Za-z0-9][A-Za-z0-9_-]*)")
_VERSION_CODE = "import sys, sglang; sys.stdout.write(str(getattr(sglang, '__version__', '') or ''))"


def _emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record, ensure_ascii=False) + "\n")
    sys.stdout.flush()


# ------------------------------------------------------------------------------------ files


def _paths(spec: dict[str, Any]) -> tuple[str, str, str]:
    work = probe.expand(str(spec["work_dir"]))
    port = int(spec["port"])
    return work, os.path.join(work, f"sglang-{port}.pid"), os.path.join(work, f"sglang-{port}.log")


def _read_record(pid_file: str) -> dict[str, Any] | None:
    try:
        with open(pid_file, "rb") as f:
            record = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"unreadable": True}
    return record if isinstance(record, dict) else {"unreadable": True}


def _write_record(pid_file: str, record: dict[str, Any]) -> None:
    tmp = pid_file + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, pid_file)


def _tail(log: str, lines: int = TAIL_LINES) -> list[str]:
    try:
        with open(log, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - TAIL_BYTES))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    kept = [line for line in text.splitlines() if line.strip()]
    return kept[-lines:]


# ---------------------------------------------------------------------------------- processes


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first), or None when there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    return raw.rsplit(")", 1)[1].split()


def _start_ticks(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def _alive(record: dict[str, Any] | None) -> bool:
    """The recorded server itself runs: same pid, same start time (not a recycled pid), not a zombie."""
    if not record or not isinstance(record.get("pid"), int):
        return False
    fields = _stat(int(record["pid"]))
    if fields is None or fields[0] in ("Z", "X"):
        return False
    return len(fields) > 19 and int(fields[19]) == record.get("start_ticks")


def members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (zombies excluded), by /proc; never by name."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat(int(entry))
        if fields is None or len(fields) < 3 or fields[0] in ("Z", "X"):
            continue
        if int(fields[2]) == pgid:
            found.append(int(entry))
    return sorted(found)


# ------------------------------------------------------------------------------------ checks


def _env(spec: dict[str, Any]) -> dict[str, str]:
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (spec.get("env") or {}).items()})
    return env


def _env_digest(spec: dict[str, Any]) -> str:
    # Values stay out of the pid file (they may hold tokens); their digest tells a change apart.
    canonical = json.dumps(sorted((spec.get("env") or {}).items()))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _run(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int | None, str, str]:
    try:
        done = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return None, "", f"did not finish in {timeout:.0f} s"
    except OSError as exc:
        return 127, "", exc.strerror or str(exc)
    return done.returncode, done.stdout.decode("utf-8", "replace"), done.stderr.decode("utf-8", "replace")


def _last(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def flag_problems(wanted: Sequence[str], listed: set[str]) -> list[str]:
    """Each flag of ``wanted`` that argparse would not take, given the flags ``--help`` lists.

    argparse accepts an exact flag or a unique prefix of one (``--tp`` is ``--tp-size``); a prefix
    of several is ambiguous and refused (docs/sglang.md §1).
    """
    problems = []
    for flag in wanted:
        if flag in listed:
            continue
        candidates = sorted(f for f in listed if f.startswith(flag))
        if len(candidates) == 1:
            continue
        if candidates:
            problems.append(f"{flag} is ambiguous in this sglang (could be {', '.join(candidates[:4])})")
        else:
            problems.append(f"{flag} is not a flag of this sglang's launch_server (not in --help)")
    return problems


def _flags_of(argv: Sequence[str]) -> list[str]:
    out = []
    for word in argv:
        if word.startswith("--") and len(word) > 2:
            name = word.split("=", 1)[0]
            if name not in out:
                out.append(name)
    return out


def _port_free(port: int) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As uvicorn binds: a port in TIME_WAIT is free, one with a listener is not.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} on 127.0.0.1 is already in use on the host"
            return f"port {port} cannot be bound on the host: {exc.strerror or exc}"
    return None


def _gpu_check(say: Callable[..., None], tp: int) -> None:
    """No compute process on any GPU, and at least ``tp`` of them."""
    gpus = probe.gpus()
    if gpus["error"]:
        say("gpus", False, f"cannot list the GPUs: {gpus['error']}")
    else:
        busy = [
            f"GPU {g['index']}: pid {p['pid']} ({p['name']}, {p['memory_mib']} MiB)"
            for g in gpus["gpus"]
            for p in g["processes"]
        ]
        if busy:
            say("gpus", False, "GPUs in use by compute processes: " + "; ".join(busy[:8]), gpus=gpus["gpus"])
        elif len(gpus["gpus"]) < tp:
            say("gpus", False, f"{len(gpus['gpus'])} GPUs on the host, but tp is {tp}", gpus=gpus["gpus"])
        else:
            say("gpus", True, f"{len(gpus['gpus'])} GPUs, no compute processes", gpus=gpus["gpus"])


def preflight(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every check the launch needs, each ``{"check", "ok", "detail"}``; any not ok refuses the launch."""
    checks: list[dict[str, Any]] = []

    def say(name: str, ok: bool, detail: str, **extra: Any) -> None:
        checks.append({"check": name, "ok": ok, "detail": detail, **extra})

    # A cluster node's GPUs are the ones Slurm gave the step: with none asked for, none to check.
    if spec.get("check_gpus", True):
        _gpu_check(say, int(spec.get("tp") or 1))
    if spec.get("check_port", True):  # a cluster node took a free port itself
        problem = _port_free(int(spec["port"]))
        say("port", problem is None, problem or f"port {spec['port']} is free")

    env = _env(spec)
    python = sys.executable
    code, out, err = _run([python, "-c", _VERSION_CODE], env, IMPORT_TIMEOUT_S)
    version = out.strip() if code == 0 else None
    if code == 0:
        say("sglang", True, f"sglang {version or '(no __version__)'} importable by {python}", version=version)
        code, out, err = _run([python, "-m", "sglang.launch_server", "--help"], env, HELP_TIMEOUT_S)
        if code != 0:
            say(
                "flags",
                False,
                f"python -m sglang.launch_server --help failed: {_last(err) or f'exit {code}'}",
            )
        else:
            listed = set(_FLAG.findall(out))
            problems = flag_problems(_flags_of(launch_argv(spec)[3:]), listed)
            say(
                "flags",
                not problems,
                "; ".join(problems) or f"every flag regen passes is in --help ({len(listed)} listed)",
            )
    else:
        say("sglang", False, f"{python} cannot import sglang: {_last(err) or f'exit {code}'}")

    model = probe.expand(str(spec["model_path"]))
    config = os.path.join(model, "config.json")
    if not os.path.isdir(model):
        say(
            "model",
            False,
            f"model folder {model} does not exist"
            if not os.path.exists(model)
            else f"{model} is not a folder",
        )
    elif not os.access(model, os.R_OK | os.X_OK):
        say("model", False, f"model folder {model} is not readable")
    else:
        try:
            with open(config, "rb") as f:
                parsed = json.loads(f.read())
        except FileNotFoundError:
            say("model", False, f"{model} has no config.json")
        except (OSError, ValueError) as exc:
            say("model", False, f"{config} cannot be read: {exc}")
        else:
            ok = isinstance(parsed, dict)
            say("model", ok, f"{config} readable" if ok else f"{config} is not a JSON object")
    return checks


# ------------------------------------------------------------------------------------ commands


def launch_argv(spec: dict[str, Any], python: str | None = None) -> list[str]:
    """The server's command line: the host's python, regen's flags, then the operator's launch_args
    (argparse keeps a flag's last value, so theirs win). `--stream-interval` is the chunk interval
    of requests that do not name one: those the router passes on (docs/sglang.md §12)."""
    interval = ["--stream-interval", str(int(spec["stream_interval"]))] if spec.get("stream_interval") else []
    return [
        python or sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        probe.expand(str(spec["model_path"])),
        "--host",
        str(spec.get("listen") or "127.0.0.1"),  # a cluster node's server: the address regen reaches
        "--port",
        str(int(spec["port"])),
        "--tp",
        str(int(spec["tp"])),
        "--served-model-name",
        str(spec["served_model_name"]),
        "--enable-metrics",
        *interval,
        *[str(a) for a in spec.get("launch_args") or []],
    ]


def _ignore_hup() -> None:
    # nohup's half of the detachment (setsid is the other): a hangup never ends the server.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def start(spec: dict[str, Any]) -> None:
    work, pid_file, log = _paths(spec)
    argv = launch_argv(spec)
    record = _read_record(pid_file)
    if record is not None and _alive(record):
        same = record.get("argv") == argv and record.get("env_sha256") == _env_digest(spec)
        if same:
            _emit({"type": "running", "record": record, "log": log})
            return
        _emit(
            {
                "type": "refused",
                "reason": (
                    f"a server regen started is already running on port {spec['port']} with other flags "
                    f"(pid {record.get('pid')}); stop it first (regen sglang stop)"
                ),
                "record": record,
            }
        )
        return
    if record is not None and record.get("pgid") and members(int(record["pgid"])):
        _emit(
            {
                "type": "refused",
                "reason": (
                    f"processes of the last server's group {record['pgid']} are still running "
                    f"({', '.join(map(str, members(int(record['pgid']))[:8]))}); run regen sglang stop first"
                ),
                "record": record,
            }
        )
        return
    checks = preflight(spec)
    for check in checks:
        _emit({"type": "check", **check})
    failed = [c for c in checks if not c["ok"]]
    if failed:
        _emit({"type": "refused", "reason": "; ".join(c["detail"] for c in failed)})
        return
    version = next((c.get("version") for c in checks if c["check"] == "sglang"), None)
    os.makedirs(work, mode=0o700, exist_ok=True)
    if os.path.exists(log):
        os.replace(log, log + ".prev")  # the last launch's log stays readable beside the new one
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            cwd=work,
            env=_env(spec),
            start_new_session=True,
            preexec_fn=_ignore_hup,
            close_fds=True,
        )
    finally:
        os.close(out)
    record = {
        "pid": proc.pid,
        "pgid": proc.pid,  # setsid: the server leads its own session and process group
        "start_ticks": _start_ticks(proc.pid),
        "argv": argv,
        "env_keys": sorted((spec.get("env") or {}).keys()),
        "env_sha256": _env_digest(spec),
        "port": int(spec["port"]),
        "model_path": str(spec["model_path"]),
        "log": log,
        "version": version,
        "started_at": time.time(),
    }
    _write_record(pid_file, record)
    try:
        status = proc.wait(EARLY_EXIT_S)
    except subprocess.TimeoutExpired:
        _emit({"type": "launched", "record": record, "log": log})
        return
    _emit({"type": "exited", "status": status, "record": record, "log": log, "tail": _tail(log)})


def watch(spec: dict[str, Any], offset: int) -> None:
    _, pid_file, log = _paths(spec)
    record = _read_record(pid_file)
    alive = _alive(record)
    try:
        with open(log, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(min(offset, size))
            chunk = f.read(WATCH_CHUNK)
    except FileNotFoundError:
        size, chunk = 0, b""
    # Whole lines only: a line cut at the chunk's end comes whole with the next call.
    end = chunk.rfind(b"\n") + 1 if len(chunk) == WATCH_CHUNK or alive else len(chunk)
    if end == 0 and len(chunk) == WATCH_CHUNK:
        end = len(chunk)  # one line longer than a whole read: taken in pieces
    chunk = chunk[:end]
    _emit(
        {
            "type": "watch",
            "alive": alive,
            "record": record,
            "size": size,
            "offset": min(offset, size) + len(chunk),
            "text": chunk.decode("utf-8", "replace"),
            "tail": [] if alive else _tail(log),
        }
    )


def status(spec: dict[str, Any]) -> None:
    _, pid_file, log = _paths(spec)
    record = _read_record(pid_file)
    alive = _alive(record)
    pgid = record.get("pgid") if record else None
    group = members(int(pgid)) if isinstance(pgid, int) else []
    state = sglanglog.LogState()
    size = 0
    try:
        with open(log, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(HEAD_BYTES)
            tail = b""
            if size > HEAD_BYTES:
                f.seek(max(HEAD_BYTES, size - TAIL_BYTES))
                tail = f.read(TAIL_BYTES)
        for line in (head + b"\n" + tail).decode("utf-8", "replace").splitlines():
            state.feed(line)
    except FileNotFoundError:
        pass
    gpus = probe.gpus() if spec.get("gpus", True) else {"gpus": [], "error": None}
    _emit(
        {
            "type": "state",
            "record": record,
            "alive": alive,
            "group": group,
            "log": log,
            "log_bytes": size,
            "phase": state.phase,
            "failure": state.failure,
            "retractions_logged": state.retractions,
            "tail": _tail(log) if record else [],
            "gpus": gpus["gpus"],
            "gpu_error": gpus["error"],
        }
    )


def stop(spec: dict[str, Any]) -> None:
    _, pid_file, log = _paths(spec)
    record = _read_record(pid_file)
    grace = float(spec.get("grace_s") or 30.0)
    if record is None or not isinstance(record.get("pgid"), int):
        _emit({"type": "stopped", "was_running": False, "signals": [], "left": [], "record": record})
        return
    pgid = int(record["pgid"])
    before = members(pgid)
    signals: list[str] = []
    if before:
        # Only the group regen started: its id comes from regen's own pid file, never from a name.
        os.killpg(pgid, signal.SIGTERM)
        signals.append("TERM")
        deadline = time.monotonic() + grace
        while members(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if members(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            signals.append("KILL")
            deadline = time.monotonic() + 10.0
            while members(pgid) and time.monotonic() < deadline:
                time.sleep(0.05)
    left = members(pgid)
    if not left:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(pid_file)
    _emit(
        {
            "type": "stopped",
            "was_running": bool(before),
            "processes": before,
            "signals": signals,
            "left": left,
            "record": record,
            "tail": _tail(log),
        }
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    command = args[0]
    try:
        spec = json.loads(args[1])
        if command == "start":
            start(spec)
        elif command == "watch" and len(args) == 3:
            watch(spec, int(args[2]))
        elif command == "status":
            status(spec)
        elif command == "stop":
            stop(spec)
        else:
            print(f"sglangctl: bad arguments for {command!r}", file=sys.stderr)
            return 2
    except Exception as exc:  # one line back to regen, never a traceback on the operator's screen
        _emit({"type": "error", "message": f"{type(exc).__name__}: {exc}"})
        return 1
    _emit({"type": "done"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
