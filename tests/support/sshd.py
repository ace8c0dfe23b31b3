"""A real OpenSSH server on a loopback port, for the host tests and bench/inspect_host.py.

It runs as the current user with its own throw-away host and client keys, its own sshd_config
(no PAM, keys only, an AuthorizedKeysFile of its own) and a PATH, set through sshd's SetEnv, whose
first folder holds a fake ``nvidia-smi``: a real sshd, a real login shell, only the GPU is pretend.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import free_port

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
# Privilege separation needs this folder when sshd starts as root; the Debian service makes it.
PRIVSEP_DIR = Path("/run/sshd")

FAKE_NVIDIA_SMI = r"""#!/bin/sh
# A stand-in for nvidia-smi: two GPUs, one busy. Each call appends "PID start|end TIME ARG" to
# calls.log beside it, so tests can tell whether (and when) anything ran on the host. A file
# "delay" beside it holds seconds to wait; a file "hang-once" makes one call remove it, write its
# pid to "hanging" and sleep, so a test can drop the connection while a command waits here.
here=$(dirname "$0")
echo "$$ start $(date +%s.%N) $1" >> "$here/calls.log"
if [ -e "$here/hang-once" ]; then
  rm -f "$here/hang-once"
  echo $$ > "$here/hanging.tmp" && mv "$here/hanging.tmp" "$here/hanging"
  exec sleep 30
fi
if [ -e "$here/delay" ]; then
  sleep "$(cat "$here/delay")"
fi
case "$1" in
  --query-gpu=*)
    echo "0, GPU-aaaa, NVIDIA H200, 81234, 143771, 97"
    echo "1, GPU-bbbb, NVIDIA H200, 0, 143771, [N/A]"
    ;;
  --query-compute-apps=*)
    echo "GPU-aaaa, 4242, python3, 81000"
    ;;
  *) echo "fake nvidia-smi: unexpected $*" >&2; exit 9 ;;
esac
echo "$$ end $(date +%s.%N) $1" >> "$here/calls.log"
"""


def need_sshd() -> None:
    """Fail (not skip) without sshd: the GPU-host tests are part of the suite."""
    import pytest  # here, not at the top: bench/ uses this module outside pytest

    if not Path(SSHD).exists():
        pytest.fail(f"{SSHD} is missing: the GPU-host tests need openssh-server (.ci/run installs it)")


def keygen(path: Path, kind: str = "ed25519") -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", f"regen-test-{path.name}", "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return path


@dataclass
class SshServer:
    root: Path
    port: int
    host_key: Path
    client_key: Path
    bin_dir: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def user(self) -> str:
        import getpass

        return getpass.getuser()

    @property
    def config(self) -> Path:
        return self.root / "sshd_config"

    def known_hosts_line(self) -> str:
        public = (self.host_key.with_suffix(".pub")).read_text().split()
        return f"[127.0.0.1]:{self.port} {public[0]} {public[1]}\n"

    def write_known_hosts(self, path: Path) -> Path:
        path.write_text(self.known_hosts_line())
        return path

    def write_config(self, extra_env: dict[str, str] | None = None) -> None:
        env = {"PATH": f"{self.bin_dir}:/usr/local/bin:/usr/bin:/bin", **(extra_env or {})}
        setenv = " ".join(f"{k}={v}" for k, v in env.items())
        self.config.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {self.host_key}",
                    f"PidFile {self.root / 'sshd.pid'}",
                    f"AuthorizedKeysFile {self.root / 'authorized_keys'}",
                    "UsePAM no",
                    "StrictModes no",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin prohibit-password",
                    "MaxStartups 50",
                    "MaxSessions 30",
                    f"SetEnv {setenv}",
                    "Subsystem sftp internal-sftp",
                    "LogLevel VERBOSE",
                    "",
                ]
            )
        )

    def start(self) -> None:
        if os.geteuid() == 0:
            PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
        log = open(self.root / "sshd.log", "ab")  # noqa: SIM115 - the server's stderr for its life
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(self.config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"sshd exited {self.proc.returncode}: {(self.root / 'sshd.log').read_text()}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("sshd did not start listening")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill_sessions()
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def sessions(self) -> list[int]:
        """Process ids of the per-connection sshd processes (children of the listener), from /proc."""
        if self.proc is None:
            return []
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == self.proc.pid:
                found.append(int(stat.parent.name))
        return found

    def calls(self) -> list[str]:
        """The fake nvidia-smi's log: one line per start and end of a call on the host."""
        log = self.bin_dir / "calls.log"
        return log.read_text().splitlines() if log.exists() else []

    def kill_sessions(self) -> int:
        """Drop every open connection, as a host going away does; returns how many there were."""
        pids = self.sessions()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)


def make_server(root: Path) -> SshServer:
    root.mkdir(parents=True, exist_ok=True)
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI)
    smi.chmod(0o755)
    server = SshServer(
        root=root,
        port=free_port(),
        host_key=keygen(root / "host_ed25519"),
        client_key=keygen(root / "client_ed25519"),
        bin_dir=bin_dir,
    )
    (root / "authorized_keys").write_text(server.client_key.with_suffix(".pub").read_text())
    (root / "authorized_keys").chmod(0o600)
    server.write_config()
    return server
