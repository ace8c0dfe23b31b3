"""One node's SGLang server inside a cluster job: what each node's step runs (docs/clusters.md).

The batch script (engine/cluster/batch.py) starts this on every node with the same bootstrap as a
host script (engine/host/remote.py), the payload read from a file on the shared filesystem instead
of stdin; its one argument is the job folder's ``spec.json``. Standard library only. On the node it:

1. takes the address this machine is reached at from the submitting host (the route to
   ``SLURM_SUBMIT_HOST``) and the first free port from the spec's;
2. takes the model folder's identity (engine/host/scripts/identity.py) and runs the preflight of a
   host launch (sglang importable, every flag in ``--help``, the model's config.json; the GPUs only
   where the job asked for them: Slurm gave them, so nothing else holds them);
3. runs ``python -m sglang.launch_server`` with the same flags as on a host (sglangctl.launch_argv),
   bound to that address, in its own process group, its output in ``nodes/NODE.log``;
4. follows the log's phases and asks ``/health_generate`` until 200, then keeps watching;
5. writes everything it knows to ``nodes/NODE.json`` (atomically: a reader never sees half of it),
   again whenever it changes and every few seconds as a heartbeat;
6. on SIGTERM (scancel, the job's end) stops the server's process group (TERM, grace, KILL) and
   exits; when the server dies or fails, stops what is left of it and exits non-zero, so the step
   ends and Slurm says so too.

The state file's ``state`` is one of ``starting``, ``ready``, ``failed`` (never ready, or died:
``failure`` says why, ``tail`` holds the log's last lines) and ``stopped`` (ended by a signal).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from regen.engine.host.scripts import identity, sglangctl, sglanglog

# Ports tried above the first one before a node gives up.
PORT_TRIES = 64
WATCH_S = 0.25
HEALTH_EVERY_S = 1.0
HEARTBEAT_S = 5.0
# After a failure line, the server gets this long to exit by itself before its group is stopped.
DYING_GRACE_S = 5.0
TAIL_LINES = 15
PR_SET_PDEATHSIG = 1  # linux/prctl.h


class Node:
    """This node's server and its state file."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.name = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        folder = os.path.join(str(spec["dir"]), "nodes")
        os.makedirs(folder, exist_ok=True)
        self.state_path = os.path.join(folder, f"{self.name}.json")
        self.log = os.path.join(folder, f"{self.name}.log")
        self.began = time.time()
        self.record: dict[str, Any] = {
            "node": self.name,
            "job_id": os.environ.get("SLURM_JOB_ID"),
            "step_id": os.environ.get("SLURM_STEP_ID"),
            "agent_pid": os.getpid(),
            "state": "starting",
            "phase": "preflight",
            "phases": [],
            "address": None,
            "port": None,
            "url": None,
            "log": self.log,
            "version": None,
            "identity": None,
            "server_pid": None,
            "failure": None,
            "tail": [],
            "started_at": self.began,
            "ready_at": None,
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.port_lock: int | None = None
        self.stopping: str | None = None
        self.written_at = 0.0

    # ---------------------------------------------------------------------------- the file

    def write(self, **changes: Any) -> None:
        self.record.update(changes)
        self.record["updated_at"] = time.time()
        tmp = f"{self.state_path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(self.record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state_path)
        self.written_at = time.monotonic()

    def fail(self, failure: str, status: int = 1) -> int:
        self.write(state="failed", failure=failure, tail=sglangctl._tail(self.log, TAIL_LINES))
        return status

    # --------------------------------------------------------------------------- the place

    def address(self) -> str:
        """The address the submitting host reaches this node at: the source of the route to it."""
        listen = self.spec.get("listen")
        if listen:
            return str(listen)
        submit = os.environ.get("SLURM_SUBMIT_HOST") or os.environ.get("SLURM_LAUNCH_NODE_IPADDR")
        if submit:
            with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((submit, 9))  # UDP: no packet is sent, the kernel only picks the route
                return str(s.getsockname()[0])
        return socket.gethostbyname(socket.gethostname())

    def free_port(self, address: str, first: int) -> int | None:
        """The first port from ``first`` up that is free and that no other node script on this
        machine holds: each holds a lock per port for its life, so two nodes of one machine (two
        jobs, or node aliases) never pick the same one between the check and the server's bind."""
        for port in range(first, min(first + PORT_TRIES, 65536)):
            lock = os.open(
                os.path.join(tempfile.gettempdir(), f"regen-node-port-{address}-{port}.lock"),
                os.O_RDWR | os.O_CREAT,
                0o600,
            )
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(lock)
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                # As uvicorn binds: a port in TIME_WAIT is free, one with a listener is not.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((address, port))
                except OSError as exc:
                    os.close(lock)
                    if exc.errno == errno.EADDRINUSE:
                        continue
                    raise
            self.port_lock = lock  # held until this process ends
            return port
        return None

    # -------------------------------------------------------------------------- the server

    def run(self) -> int:
        self.write()
        address = self.address()
        port = self.free_port(address, int(self.spec["port"]))
        if port is None:
            return self.fail(
                f"no free port from {self.spec['port']} to {int(self.spec['port']) + PORT_TRIES - 1}"
            )
        url = f"http://{address}:{port}"
        spec = {**self.spec, "port": port, "listen": address}
        self.write(address=address, port=port, identity=identity.survey(str(spec["model_path"])))
        checks = sglangctl.preflight(spec)
        version = next((c.get("version") for c in checks if c["check"] == "sglang"), None)
        refused = [c["detail"] for c in checks if not c["ok"]]
        self.write(version=version, checks=[{k: c[k] for k in ("check", "ok", "detail")} for c in checks])
        if refused:
            return self.fail("not launched: " + "; ".join(refused))
        if self.stopping:
            self.write(state="stopped", failure=f"stopped by {self.stopping} before the launch")
            return 0
        out = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        try:
            self.proc = subprocess.Popen(
                sglangctl.launch_argv(spec),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                cwd=os.path.dirname(self.log),
                env=sglangctl._env(spec),
                start_new_session=True,  # its own group: stopped as one, whatever it forks
                preexec_fn=_die_with_parent,
                close_fds=True,
            )
        finally:
            os.close(out)
        self.write(phase="launched", server_pid=self.proc.pid, url=url)
        return self.follow(url)

    def follow(self, url: str) -> int:
        assert self.proc is not None
        state = sglanglog.LogState()
        offset = 0
        failed_at: float | None = None
        asked_at = 0.0
        while True:
            offset = self._read(state, offset)
            status = self.proc.poll()
            if self.stopping:
                self.stop_group()
                self.write(state="stopped", failure=f"stopped by {self.stopping}")
                return 0
            if status is not None:
                where = state.phase or "startup"
                said = (
                    state.failure or f"the server exited (status {status}) during {where} without saying why"
                )
                if self.record["state"] == "ready":
                    said = f"the server died after it was ready: {state.failure or f'status {status}'}"
                self.stop_group()
                return self.fail(said, status or 1)
            if state.failure is not None:
                failed_at = failed_at or time.monotonic()
                if time.monotonic() - failed_at > DYING_GRACE_S:
                    self.stop_group()
                    return self.fail(f"launch failed after {state.phase or 'startup'}: {state.failure}")
            if self.record["state"] != "ready" and time.monotonic() - asked_at >= HEALTH_EVERY_S:
                asked_at = time.monotonic()
                if self._healthy(url) and owns_listener(self.proc.pid, int(self.record["port"])):
                    self.write(state="ready", ready_at=time.time(), phase=state.phase or "ready")
            if time.monotonic() - self.written_at >= HEARTBEAT_S:
                self.write()
            time.sleep(WATCH_S)

    def _read(self, state: sglanglog.LogState, offset: int) -> int:
        try:
            with open(self.log, "rb") as f:
                f.seek(offset)
                chunk = f.read(sglangctl.WATCH_CHUNK)
        except FileNotFoundError:
            return offset
        end = chunk.rfind(b"\n") + 1
        changed = False
        for line in chunk[:end].decode("utf-8", "replace").splitlines():
            entered = state.feed(line)
            if entered is not None:
                self.record["phases"].append([entered, round(time.time() - self.began, 2)])
                self.record["phase"] = entered
                changed = True
        if changed:
            self.write()
        return offset + end

    def _healthy(self, url: str) -> bool:
        try:
            with urllib.request.urlopen(url + "/health_generate", timeout=5) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def stop_group(self) -> None:
        """TERM to the server's process group, the grace period, then KILL; until nothing is left."""
        proc = self.proc
        if proc is None:
            return
        pgid = proc.pid
        grace = float(self.spec.get("grace_s") or 30.0)
        if sglangctl.members(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while sglangctl.members(pgid) and time.monotonic() < deadline:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(0.1)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)


def _die_with_parent() -> None:
    """In the server, before it runs: a KILL when this script dies, however it dies. Slurm ends a
    step by its processes; a step whose script was killed can lose track of a server in a session
    of its own (proctrack/linuxproc follows parents), and a server nobody stops holds the GPUs."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on ``port`` (any address), from /proc/net/tcp and tcp6."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            # local address "HEXIP:HEXPORT", state 0A is LISTEN, the inode is the tenth field.
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    return found


def owns_listener(pgid: int, port: int) -> bool:
    """A process of group ``pgid`` holds the socket listening on ``port``: the server that answers
    there is this node's own, not another one that took the port first."""
    inodes = _listening_inodes(port)
    for pid in sglangctl.members(pgid):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                return True
    return False


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: nodeserver SPEC_JSON_PATH", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as f:
        spec = json.load(f)
    node = Node(spec)

    def stop(signum: int, _frame: object) -> None:
        node.stopping = signal.Signals(signum).name

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    try:
        return node.run()
    except Exception as exc:  # said in the state file, where regen reads it, not only in a log
        node.stop_group()
        return node.fail(f"the node script failed: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    sys.exit(main())
