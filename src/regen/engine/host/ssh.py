"""One SSH connection per GPU host: verified host key, keepalives, reconnection with backoff.

Everything a command or a run does on a host goes over channels of the one connection that
``HostConnection`` holds (docs/gpu-host.md, "The connection"). The host key is checked against
known_hosts before anything runs; an unknown or changed key is refused with the server's
fingerprint and how to accept it, and no setting turns the check off. A connection that drops
during an operation is opened again with backoff and the operation retried; each retry is counted
and said, so the console and the command line show it.
"""

from __future__ import annotations

import asyncio
import base64
import getpass
import hashlib
import os
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import asyncssh

from regen.engine.config.settings import HostSettings
from regen.engine.host.errors import AuthFailed, HostError, HostKeyRefused, HostSetupError, HostUnreachable
from regen.engine.host.remote import ScriptResult, run_hostcmd
from regen.engine.schema import ConnectionView

T = TypeVar("T")

# Like OpenSSH's ServerAliveInterval 15 / ServerAliveCountMax 3: a dead link is noticed in ~45 s.
KEEPALIVE_INTERVAL_S = 15.0
KEEPALIVE_COUNT_MAX = 3
# A first connection is tried twice (a blip should not fail a command); a dropped one up to
# RECONNECTS times, waiting a doubling, jittered delay between tries.
CONNECT_ATTEMPTS = 2
RECONNECTS = 5
BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 10.0
# The key files OpenSSH offers by default, in its order, when no key_files are set.
DEFAULT_KEY_FILES = ("id_ecdsa_sk", "id_ed25519_sk", "id_ed25519", "id_ecdsa", "id_rsa")
DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")
# Ciphers offered, in order of preference: asyncssh's own list with the AES-GCM ones moved first.
ENCRYPTION_ALGS = [
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    *(
        a.decode()
        for a in asyncssh.encryption.get_default_encryption_algs()
        if a not in (b"aes128-gcm@openssh.com", b"aes256-gcm@openssh.com")
    ),
]

_DROPPED = (
    asyncssh.ConnectionLost,
    asyncssh.SFTPConnectionLost,
    BrokenPipeError,
    ConnectionResetError,
    ConnectionAbortedError,
)


def known_hosts_path(host: HostSettings) -> Path:
    return (host.known_hosts or DEFAULT_KNOWN_HOSTS).expanduser()


def known_hosts_name(host: HostSettings) -> str:
    """How known_hosts names this host: ``address``, or ``[address]:port`` off port 22."""
    return host.address if host.port == 22 else f"[{host.address}]:{host.port}"


def _keyscan_type(algorithm: str) -> str:
    for word, kind in (("ed25519", "ed25519"), ("ecdsa", "ecdsa"), ("rsa", "rsa"), ("dss", "dsa")):
        if word in algorithm:
            return kind
    return algorithm


def backoff_s(attempt: int, base: float = BACKOFF_BASE_S, most: float = BACKOFF_MAX_S) -> float:
    """Delay before try ``attempt`` (1-based): doubling from ``base``, capped, jittered down by up to half."""
    bound = min(most, base * 2.0 ** (attempt - 1))
    return float(bound * (0.5 + random.random() / 2))


class _Client(asyncssh.SSHClient):
    """Records the key the server offered when known_hosts does not vouch for it, and losses."""

    def __init__(self, owner: HostConnection) -> None:
        self.owner = owner
        self.offered: asyncssh.SSHKey | None = None
        self.addr = ""

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        # Called only for a key known_hosts does not trust: refuse it, and remember it for the message.
        self.offered = key
        self.addr = addr
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner._lost(self, exc)


class HostConnection:
    """The one connection to ``host``, opened on first use and reopened after a drop."""

    def __init__(
        self,
        host: HostSettings,
        *,
        reconnects: int = RECONNECTS,
        backoff_base_s: float = BACKOFF_BASE_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        keepalive_interval_s: float = KEEPALIVE_INTERVAL_S,
        keepalive_count_max: int = KEEPALIVE_COUNT_MAX,
        on_change: Callable[[HostConnection], None] | None = None,
    ) -> None:
        self.host = host
        self.keepalive_interval_s = keepalive_interval_s
        self.keepalive_count_max = keepalive_count_max
        self.name = host.name
        self.reconnects = reconnects
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.on_change = on_change
        self.state = "idle"
        self.error: str | None = None
        # Reconnections after a drop, over this object's life; shown by the console.
        self.retries = 0
        self.connected_at: float | None = None
        self.notices: list[str] = []
        self._conn: asyncssh.SSHClientConnection | None = None
        self._client: _Client | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    @property
    def where(self) -> str:
        h = self.host
        return f"{h.name} ({h.user or getpass.getuser()}@{h.address}:{h.port})"

    def _set(self, state: str, error: str | None = None) -> None:
        self.state = state
        self.error = error
        if self.on_change is not None:
            self.on_change(self)

    def _notice(self, text: str) -> None:
        self.notices.append(text)
        if self.on_change is not None:
            self.on_change(self)

    def _lost(self, client: _Client, exc: Exception | None) -> None:
        if client is not self._client:
            return
        self._conn = None
        self._client = None
        if not self._closed:
            self._set("disconnected", f"connection lost ({exc})" if exc else "connection closed by the host")

    # ------------------------------------------------------------------------------ opening

    async def connect(self) -> asyncssh.SSHClientConnection:
        """The open connection, opening it when there is none.

        A first connection gets CONNECT_ATTEMPTS tries; once one has been up, a lost connection
        gets ``reconnects`` tries with backoff, each counted in ``retries``.
        """
        async with self._lock:
            if self._closed:
                raise HostUnreachable(f"{self.where}: connection closed")
            if self._conn is not None:
                return self._conn
            again = self.connected_at is not None
            attempts = max(1, self.reconnects) if again else CONNECT_ATTEMPTS
            attempt = 0
            while True:
                attempt += 1
                if again:
                    self.retries += 1
                try:
                    return await self._open(again)
                except HostError as exc:
                    if not exc.retryable or attempt >= attempts:
                        if again and exc.retryable:
                            exc = HostUnreachable(f"{exc}; gave up after {attempt} reconnect tries")
                        self._set(exc.state, str(exc))
                        raise exc from None
                    delay = backoff_s(attempt, self.backoff_base_s, self.backoff_max_s)
                    self._set("reconnecting", f"{exc}; trying again in {delay:.1f} s")
                    await asyncio.sleep(delay)

    async def _open(self, again: bool = False) -> asyncssh.SSHClientConnection:
        host = self.host
        # The last failure stays shown while the next try runs; a host that was up reads
        # "reconnecting" through every try, not flickering to "connecting" between them.
        self._set("reconnecting" if again else "connecting", self.error)
        keys, tried, agent = await self._client_keys()
        path = known_hosts_path(host)
        try:
            known: str | bytes = str(path) if path.is_file() else b""
            client = _Client(self)
            try:
                conn = await asyncio.wait_for(
                    asyncssh.connect(
                        host.address,
                        host.port,
                        username=host.user or getpass.getuser(),
                        client_factory=lambda: client,
                        known_hosts=known,
                        client_keys=keys,
                        agent_path=None,
                        # Only these settings decide; an ~/.ssh/config must not weaken the checks.
                        config=None,
                        password=None,
                        kbdint_auth=False,
                        gss_auth=False,
                        # AES-GCM first: one AEAD call per packet with AES-NI, where asyncssh's default
                        # chacha20-poly1305 makes two; the tunnel carries every token (docs/gpu-host.md).
                        encryption_algs=ENCRYPTION_ALGS,
                        keepalive_interval=self.keepalive_interval_s,
                        keepalive_count_max=self.keepalive_count_max,
                        connect_timeout=host.connect_timeout_s,
                        login_timeout=host.connect_timeout_s,
                    ),
                    host.connect_timeout_s * 2,
                )
            except asyncssh.HostKeyNotVerifiable:
                raise self._key_refused(client, path) from None
            except asyncssh.PermissionDenied:
                raise AuthFailed(f"{self.where}: authentication failed; keys tried: {tried}") from None
            except asyncssh.ConnectionLost as exc:
                raise HostUnreachable(f"{self.where}: connection lost while logging in ({exc})") from None
            except asyncssh.DisconnectError as exc:
                raise HostError(f"{self.where}: SSH handshake failed: {exc}") from None
            except (TimeoutError, OSError) as exc:
                raise HostUnreachable(f"{self.where}: cannot connect: {_os_reason(exc)}") from None
        finally:
            if agent is not None:
                agent.close()
        self._conn = conn
        self._client = client
        self.connected_at = time.time()
        self._set("connected")
        return conn

    def _key_refused(self, client: _Client, path: Path) -> HostKeyRefused:
        host = self.host
        key = client.offered
        if key is None:
            return HostKeyRefused(f"{self.where}: host key not verified; nothing was run")
        algorithm = key.get_algorithm()
        fingerprint = key.get_fingerprint("sha256")
        known_entry = known_hosts_name(host)
        keyscan = f"ssh-keyscan -p {host.port} -t {_keyscan_type(algorithm)} {host.address} >> {path}"
        try:
            matched = asyncssh.match_known_hosts(
                str(path) if path.is_file() else b"",
                host.address,
                client.addr,
                host.port if host.port != 22 else None,
            )
            changed = bool(matched[0]) or bool(matched[1])
        except (OSError, ValueError):
            changed = False
        if changed:
            return HostKeyRefused(
                f"{self.where}: HOST KEY CHANGED: the server offered {algorithm} {fingerprint}, which is not the "
                f"key {path} holds for {known_entry}; nothing was run. If the host was reinstalled and you have "
                f"checked that fingerprint on it (ssh-keygen -lf /etc/ssh/ssh_host_{_keyscan_type(algorithm)}_key.pub), "
                f"remove the old entry with: ssh-keygen -R '{known_entry}' -f {path}; then add the new one with: {keyscan}"
            )
        return HostKeyRefused(
            f"{self.where}: unknown host key: the server offered {algorithm} {fingerprint} and {path} has no "
            f"entry for {known_entry}; nothing was run. To accept it, check that fingerprint on the host "
            f"(ssh-keygen -lf /etc/ssh/ssh_host_{_keyscan_type(algorithm)}_key.pub), then run: {keyscan}"
        )

    async def _client_keys(self) -> tuple[list[asyncssh.SSHKeyPair], str, Any]:
        """The keys to offer, a description of them for an authentication failure, the agent if used."""
        host = self.host
        if host.key_files:
            keys: list[asyncssh.SSHKeyPair] = []
            named = []
            for path in host.key_files:
                try:
                    loaded = list(asyncssh.load_keypairs([str(path)]))
                except FileNotFoundError:
                    raise HostSetupError(f"{self.name}: key_files: {path} does not exist") from None
                except OSError as exc:
                    raise HostSetupError(f"{self.name}: key_files: {path}: {_os_reason(exc)}") from None
                except (asyncssh.KeyImportError, asyncssh.KeyEncryptionError) as exc:
                    raise HostSetupError(
                        f"{self.name}: key_files: {path} cannot be loaded ({exc}); a passphrase-protected key "
                        "belongs in the SSH agent, with key_files left empty"
                    ) from None
                keys.extend(loaded)
                named.append(f"{path} ({_fingerprint(loaded[0])})" if loaded else f"{path} (no key in it)")
            return keys, ", ".join(named), None
        keys = []
        said = []
        agent = None
        if os.environ.get("SSH_AUTH_SOCK"):
            try:
                agent = await asyncssh.connect_agent()
                agent_keys = list(await agent.get_keys())
            except (OSError, asyncssh.Error) as exc:
                said.append(f"the SSH agent (not reachable: {_os_reason(exc)})")
                agent_keys = []
            else:
                keys.extend(agent_keys)
                said.append(f"the SSH agent ({len(agent_keys)} keys)")
        for name in DEFAULT_KEY_FILES:
            path = Path("~", ".ssh", name).expanduser()
            if not path.is_file():
                continue
            try:
                loaded = list(asyncssh.load_keypairs([str(path)], ignore_encrypted=True))
            except (OSError, asyncssh.KeyImportError):
                continue
            if loaded:
                keys.extend(loaded)
                said.append(f"{path} ({_fingerprint(loaded[0])})")
        if not said:
            said.append("none (no SSH agent, no ~/.ssh/id_* key; set key_files)")
        return keys, ", ".join(said), agent

    # ------------------------------------------------------------------------------ using

    async def run(self, operation: Callable[[asyncssh.SSHClientConnection], Awaitable[T]], what: str) -> T:
        """Run ``operation`` on the connection; after a drop, reconnect with backoff and run it again.

        ``operation`` must be safe to repeat (every host script and transfer step here is).
        """
        drops = 0
        while True:
            conn = await self.connect()
            try:
                return await operation(conn)
            except _DROPPED as exc:
                reason = str(exc) or type(exc).__name__
            except (asyncssh.ChannelOpenError, asyncssh.DisconnectError, OSError) as exc:
                if not conn.is_closed() and self._conn is conn:
                    raise HostError(f"{self.where}: {what} failed: {_os_reason(exc)}") from None
                reason = str(exc) or type(exc).__name__
            self._forget(conn)
            drops += 1
            if drops > self.reconnects:
                error = f"{self.where}: connection lost during {what} ({reason}) {drops} times; gave up"
                self._set("unreachable", error)
                raise HostUnreachable(error)
            self._notice(f"{self.name}: connection lost during {what} ({reason}); reconnecting")
            self._set("reconnecting", f"connection lost during {what}")

    async def hostcmd(self, argv: Sequence[str], *, timeout: float | None = None) -> ScriptResult:
        """``hostcmd.py ARGV...`` on the host (engine/host/scripts), retried after a drop."""
        return await self.run(
            lambda conn: run_hostcmd(conn, self.host.python, argv, timeout=timeout), argv[0]
        )

    async def script(
        self, entry: str, modules: Sequence[str], argv: Sequence[str], *, timeout: float | None = None
    ) -> ScriptResult:
        """Another host script (``entry``, shipped with ``modules``), retried after a drop like hostcmd."""
        return await self.run(
            lambda conn: run_hostcmd(
                conn, self.host.python, argv, timeout=timeout, entry=entry, modules=modules
            ),
            argv[0] if argv else entry,
        )

    def forget(self, conn: asyncssh.SSHClientConnection) -> None:
        """Drop ``conn`` (found closed by a user of it); the next ``connect`` opens a new one."""
        self._forget(conn)

    def _forget(self, conn: asyncssh.SSHClientConnection) -> None:
        if self._conn is conn:
            self._conn = None
            self._client = None
        conn.abort()

    async def close(self) -> None:
        self._closed = True
        conn = self._conn
        self._conn = None
        self._client = None
        if conn is not None:
            conn.close()
            try:
                await asyncio.wait_for(conn.wait_closed(), 5.0)
            except (TimeoutError, OSError, asyncssh.Error):
                conn.abort()
        self._set("closed")

    def view(self) -> ConnectionView:
        return {
            "name": self.name,
            "address": f"{self.host.address}:{self.host.port}",
            "state": self.state,
            "error": self.error,
            "retries": self.retries,
            "connected_at": self.connected_at,
        }


def _fingerprint(key: asyncssh.SSHKeyPair) -> str:
    """OpenSSH's SHA256 fingerprint of a key: the unpadded base64 of the sha256 of its public blob."""
    digest = hashlib.sha256(key.public_data).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _os_reason(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
