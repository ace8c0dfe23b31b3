"""The SSH connection: host keys verified before anything runs, keys named on failure, drops retried."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from regen.engine.host.errors import AuthFailed, HostKeyRefused, HostSetupError, HostUnreachable
from regen.engine.host.inspect import inspect_host
from regen.engine.host.ssh import HostConnection
from tests.support.hosts import HostFactory, write_settings
from tests.support.processes import free_port, run_regen
from tests.support.sshd import SshServer, keygen


def fingerprint(public_key: Path) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(public_key)], capture_output=True, text=True, check=True)
    return out.stdout.split()[1]


def logins(server: SshServer) -> int:
    return (server.root / "sshd.log").read_text().count("Accepted publickey")


async def refused_before_anything_ran(
    server: SshServer, conn: HostConnection, marker: Path
) -> HostKeyRefused:
    calls, seen = server.calls(), logins(server)
    with pytest.raises(HostKeyRefused) as info:
        await conn.run(lambda c: c.run(f"touch {marker}", check=True), "touch")
    with pytest.raises(HostKeyRefused):
        await conn.hostcmd(["status", "/", ""])
    await conn.close()
    assert not marker.exists(), "a command ran on a host whose key was not verified"
    assert server.calls() == calls and logins(server) == seen, "nothing logged in, nothing ran"
    assert conn.state == "closed"
    return info.value


async def test_an_unknown_host_key_is_refused_with_its_fingerprint_and_how_to_accept_it(
    sshd: SshServer, tree: dict[str, Path], make_host: HostFactory, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    host = make_host(sshd, tree, known_hosts=known)
    error = await refused_before_anything_ran(sshd, HostConnection(host), tmp_path / "ran")
    message = str(error)
    assert "gpu1" in message and "unknown host key" in message and "\n" not in message
    assert fingerprint(sshd.host_key.with_suffix(".pub")) in message
    accept = message.split("then run: ", 1)[1]
    assert accept == f"ssh-keyscan -p {sshd.port} -t ed25519 127.0.0.1 >> {known}"
    # Doing what it says is enough.
    subprocess.run(["bash", "-c", accept], check=True, capture_output=True)
    conn = HostConnection(host)
    try:
        assert (await conn.hostcmd(["status", str(tree["data"]), ""])).one("status")["gpus"]
    finally:
        await conn.close()


async def test_a_missing_known_hosts_file_trusts_nothing(
    sshd: SshServer, tree: dict[str, Path], make_host: HostFactory, tmp_path: Path
) -> None:
    host = make_host(sshd, tree, known_hosts=tmp_path / "absent")
    error = await refused_before_anything_ran(sshd, HostConnection(host), tmp_path / "ran")
    assert "unknown host key" in str(error)


async def test_a_changed_host_key_is_refused_loudly(
    sshd: SshServer, tree: dict[str, Path], make_host: HostFactory, tmp_path: Path
) -> None:
    other = keygen(tmp_path / "other_host_key")
    known = tmp_path / "known_hosts"
    kind, blob = other.with_suffix(".pub").read_text().split()[:2]
    known.write_text(f"[127.0.0.1]:{sshd.port} {kind} {blob}\n")
    host = make_host(sshd, tree, known_hosts=known)
    error = await refused_before_anything_ran(sshd, HostConnection(host), tmp_path / "ran")
    message = str(error)
    assert "HOST KEY CHANGED" in message and fingerprint(sshd.host_key.with_suffix(".pub")) in message
    assert f"ssh-keygen -R '[127.0.0.1]:{sshd.port}' -f {known}" in message


def test_the_cli_refuses_an_unknown_key_exit_1(
    sshd: SshServer, tree: dict[str, Path], make_host: HostFactory, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    settings = write_settings(
        tmp_path / "s.toml", [make_host(sshd, tree, known_hosts=known)], tmp_path / "ws"
    )
    calls = sshd.calls()
    done = run_regen("inspect", "--settings", str(settings))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert fingerprint(sshd.host_key.with_suffix(".pub")) in done.stderr
    assert sshd.calls() == calls


async def test_an_auth_failure_names_the_keys_tried(
    sshd: SshServer, tree: dict[str, Path], make_host: HostFactory, tmp_path: Path
) -> None:
    stranger = keygen(tmp_path / "stranger")
    host = make_host(sshd, tree, key_files=[stranger])
    conn = HostConnection(host)
    with pytest.raises(AuthFailed) as info:
        await conn.connect()
    await conn.close()
    message = str(info.value)
    assert "authentication failed" in message and str(stranger) in message
    assert fingerprint(stranger.with_suffix(".pub")) in message
    assert conn.retries == 0, "a refused key is not retried"


async def test_without_key_files_the_default_keys_are_used_and_named(
    sshd: SshServer,
    tree: dict[str, Path],
    make_host: HostFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    host = make_host(sshd, tree, key_files=[])
    with pytest.raises(
        AuthFailed, match=r"keys tried: none \(no SSH agent, no ~/.ssh/id_\* key; set key_files\)"
    ):
        await HostConnection(host).connect()
    keygen(home / ".ssh" / "id_rsa", "rsa")
    with pytest.raises(AuthFailed, match=f"keys tried: {home}/.ssh/id_rsa \\(SHA256:"):
        await HostConnection(host).connect()
    (home / ".ssh" / "id_ed25519").write_bytes(sshd.client_key.read_bytes())
    (home / ".ssh" / "id_ed25519").chmod(0o600)
    conn = HostConnection(host)
    try:
        await conn.connect()
        assert conn.state == "connected"
    finally:
        await conn.close()


async def test_unusable_key_files_are_named(
    sshd: SshServer, tree: dict[str, Path], make_host: HostFactory, tmp_path: Path
) -> None:
    locked = tmp_path / "locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(locked)], check=True)
    with pytest.raises(HostSetupError, match="passphrase-protected key belongs in the SSH agent"):
        await HostConnection(make_host(sshd, tree, key_files=[locked])).connect()
    with pytest.raises(HostSetupError, match=f"key_files: {tmp_path}/nope does not exist"):
        await HostConnection(make_host(sshd, tree, key_files=[tmp_path / "nope"])).connect()


async def test_an_unreachable_host_is_retried_then_reported(
    sshd: SshServer, tree: dict[str, Path], make_host: HostFactory
) -> None:
    conn = HostConnection(make_host(sshd, tree, port=free_port()), backoff_base_s=0.05)
    began = time.monotonic()
    with pytest.raises(HostUnreachable, match="cannot connect"):
        await conn.connect()
    assert time.monotonic() - began < 5 and conn.state == "unreachable"


async def wait_for(path: Path, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        await asyncio.sleep(0.02)
    return path.read_text().strip()


async def test_a_connection_dropped_during_inspect_is_retried(
    own_sshd: SshServer, tree: dict[str, Path], make_host: HostFactory
) -> None:
    server = own_sshd
    conn = HostConnection(make_host(server, tree), backoff_base_s=0.1)
    await conn.connect()
    (server.bin_dir / "hang-once").write_text("")
    task = asyncio.ensure_future(inspect_host(conn))
    pid = int(await wait_for(server.bin_dir / "hanging"))
    # The host side of the connection dies mid-inspect (the per-connection sshd is killed).
    assert server.kill_sessions() >= 1
    os.kill(pid, signal.SIGKILL)  # the orphaned sleep of the first try
    try:
        record = await asyncio.wait_for(task, 30)
    finally:
        await conn.close()
    assert record["ok"] and record["retries"] == 1 and len(record["datasets"]) == 3
    assert conn.retries == 1 and any("connection lost during inspect" in n for n in conn.notices)
    assert logins(server) == 2, "a new login after the drop"


async def test_a_restarted_sshd_is_reconnected_with_backoff(
    own_sshd: SshServer, tree: dict[str, Path], make_host: HostFactory
) -> None:
    server = own_sshd
    states: list[str] = []
    conn = HostConnection(
        make_host(server, tree), backoff_base_s=0.2, on_change=lambda c: states.append(c.state)
    )
    try:
        await conn.hostcmd(["status", str(tree["data"]), ""])
        server.stop()
        await asyncio.sleep(0.2)
        assert conn.state == "disconnected", "the drop is noticed before the next use"
        run = asyncio.ensure_future(conn.hostcmd(["status", str(tree["data"]), ""]))
        await asyncio.sleep(0.5)
        # A host that was up reads "reconnecting" between tries and during them.
        assert not run.done() and conn.state == "reconnecting"
        assert "connecting" not in states[states.index("disconnected") :]
        server.start()
        result = await asyncio.wait_for(run, 30)
        assert result.one("status")["gpus"]
    finally:
        await conn.close()
    assert "reconnecting" in states and states[-1] == "closed"
    assert conn.retries >= 2, "tries while the server was down, and the one that got back in"


async def test_a_dropped_connection_that_never_comes_back_gives_up(
    own_sshd: SshServer, tree: dict[str, Path], make_host: HostFactory
) -> None:
    server = own_sshd
    conn = HostConnection(make_host(server, tree), reconnects=2, backoff_base_s=0.05)
    await conn.connect()
    (server.bin_dir / "hang-once").write_text("")
    task = asyncio.ensure_future(conn.hostcmd(["status", "/", ""]))
    pid = int(await wait_for(server.bin_dir / "hanging"))
    server.stop()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(HostUnreachable, match="gave up after 2 reconnect tries"):
        await asyncio.wait_for(task, 30)
    await conn.close()


async def test_keepalives_notice_a_host_that_stopped_answering(
    own_sshd: SshServer, tree: dict[str, Path], make_host: HostFactory
) -> None:
    server = own_sshd
    conn = HostConnection(make_host(server, tree), keepalive_interval_s=0.2, keepalive_count_max=2)
    await conn.connect()
    frozen = server.sessions()
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)  # alive but silent, as a host behind a dead link
    try:
        deadline = time.monotonic() + 10
        while conn.state == "connected" and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert conn.state == "disconnected" and "keepalive" in (conn.error or "").lower()
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        await conn.close()
