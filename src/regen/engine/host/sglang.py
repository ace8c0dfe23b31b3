"""SGLang on a GPU host, seen from here: start (preflight, launch, readiness), status, stop.

The host side is ``engine/host/scripts/sglangctl.py`` (run over the host's one SSH connection); the
server's HTTP is reached through a ``Tunnel`` to its 127.0.0.1 port. docs/sglang.md §12 has the
rules: what the preflight refuses, how the server is detached, what "ready" means (a 200 from
``/health_generate``, asked from the launch on, so no log level can hide it; the log's phases are
the progress, its ready line the cue), how a failed launch is told within seconds, when a start is
a no-op (the server regen started is up with the same flags), and how a stop leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from regen.engine.config.settings import HostSettings, SGLangSettings, served_model_name
from regen.engine.host.errors import HostError, HostSetupError, RemoteError
from regen.engine.host.scripts.sglanglog import PHASE_NAMES, LogState
from regen.engine.host.ssh import HostConnection
from regen.engine.host.tunnel import Tunnel
from regen.engine.net.sglang_metrics import parse_metrics
from regen.engine.net.sglang_server import KEEPALIVE_S, LAUNCH_STREAM_INTERVAL, streaming_problem

ENTRY = "regen.engine.host.scripts.sglangctl"
MODULES = (
    "regen.engine.errors",
    "regen.engine.data.datasets",
    "regen.engine.host.scripts.probe",
    "regen.engine.host.scripts.sglanglog",
)
# The served name when no model folder's name can be one (a model_path of "/" or "~").
FALLBACK_SERVED_NAME = "model"
DEFAULT_WORK_DIR = "regen-sglang"  # under the remote user's home
# The preflight imports sglang and runs its --help on the host (torch loads: tens of seconds).
START_TIMEOUT_S = 960.0
WATCH_INTERVAL_S = 0.25
TAIL_LINES = 15
# After the ready line, /health_generate gets this long to answer 200 (one probe through the
# scheduler; a server that cannot pass it is not ready, whatever its log says).
HEALTH_TIMEOUT_S = 120.0
# Seconds between the readiness asks of /health_generate while the server starts (503 until ready).
HEALTH_POLL_S = 1.0
# A process still alive this long after its log showed a failure signature is stopped by regen.
DYING_GRACE_S = 5.0
_HTTP_TIMEOUT = aiohttp.ClientTimeout(total=30.0, sock_connect=10.0)

Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """One host's server, as the settings describe it."""

    host: str
    port: int
    model_path: str
    tp: int
    served_model_name: str
    launch_args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    work_dir: str
    ready_timeout_s: float
    grace_s: float

    @classmethod
    def of(cls, sglang: SGLangSettings, host: HostSettings, fleet: Sequence[HostSettings] = ()) -> ServerSpec:
        """``host``'s server; ``fleet`` is every host of the job (``host`` alone when empty), whose
        servers all get one --served-model-name (engine/config/settings.py `served_model_name`)."""
        if not host.model_path:
            raise HostSetupError(
                f"{host.name}: model_path is not set in its [[hosts]] table: SGLang needs the model folder"
            )
        return cls(
            host=host.name,
            port=host.sglang_port or sglang.port,
            model_path=host.model_path,
            tp=sglang.tp,
            served_model_name=served_model_name(sglang, fleet or [host]) or FALLBACK_SERVED_NAME,
            launch_args=tuple(sglang.launch_args),
            env=tuple(sorted(sglang.env.items())),
            work_dir=sglang.work_dir or DEFAULT_WORK_DIR,
            ready_timeout_s=sglang.ready_timeout_s,
            grace_s=sglang.stop_grace_s,
        )

    def arg(self, **extra: Any) -> str:
        """The spec as the host script's one JSON argv entry."""
        return json.dumps(
            extra
            | {
                "port": self.port,
                "model_path": self.model_path,
                "tp": self.tp,
                "served_model_name": self.served_model_name,
                "launch_args": list(self.launch_args),
                "stream_interval": LAUNCH_STREAM_INTERVAL,
                "env": dict(self.env),
                "work_dir": self.work_dir,
                "grace_s": self.grace_s,
            }
        )


@dataclass(slots=True)
class StartResult:
    host: str
    ok: bool
    message: str
    already: bool = False
    pid: int | None = None
    version: str | None = None
    log: str | None = None
    phases: list[tuple[str, float]] = field(default_factory=list)  # phase, seconds since launch
    tail: list[str] = field(default_factory=list)
    failure: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "ok": self.ok,
            "message": self.message,
            "already_running": self.already,
            "pid": self.pid,
            "version": self.version,
            "log": self.log,
            "phases": [{"phase": p, "seconds": round(s, 2)} for p, s in self.phases],
            "failure": self.failure,
            "tail": self.tail,
        }


async def _ctl(
    conn: HostConnection,
    command: str,
    spec: ServerSpec,
    *extra: str,
    timeout: float = 60.0,
    gpus: bool = True,
) -> dict[str, Any]:
    result = await conn.script(ENTRY, MODULES, [command, spec.arg(gpus=gpus), *extra], timeout=timeout)
    kinds = {
        "start": ("running", "refused", "launched", "exited"),
        "watch": ("watch",),
        "status": ("state",),
        "stop": ("stopped",),
    }
    for record in reversed(result.records):
        if record.get("type") in kinds[command]:
            if command == "start":
                record["checks"] = result.of_type("check")
            return dict(record)
    raise RemoteError(f"{conn.name}: sglangctl {command} gave no answer")


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int | None, Any, str]:
    """``(status, parsed JSON or None, text)``; status None when nothing answered."""
    try:
        async with session.get(url, timeout=_HTTP_TIMEOUT) as resp:
            raw = await resp.read()
            text = raw.decode("utf-8", "replace")
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            return resp.status, body, text
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        return None, None, f"{type(exc).__name__}: {exc}"


def _session() -> aiohttp.ClientSession:
    # Idle connections close before the server closes them (engine/net/sglang_server.py).
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(keepalive_timeout=KEEPALIVE_S))


class HealthPoll:
    """``/health_generate`` asked every ``interval_s`` until it answers 200 (a token went through the
    scheduler); ``said`` is its last answer."""

    def __init__(self, url: str, interval_s: float = 0.5) -> None:
        self.url = url
        self.interval_s = interval_s
        self.ok = False
        self.said = "not asked yet"
        self._nudged = asyncio.Event()

    def nudge(self) -> None:
        """Ask again now rather than at the next interval (the log just said ready)."""
        self._nudged.set()

    async def run(self, timeout_s: float, alive: Callable[[], bool] | None = None) -> bool:
        deadline = time.monotonic() + timeout_s
        async with _session() as session:
            while True:
                status, _, text = await get(session, self.url + "/health_generate")
                if status == 200:
                    self.ok, self.said = True, "200"
                    return True
                self.said = f"HTTP {status}" if status is not None else text
                if time.monotonic() >= deadline or (alive is not None and not alive()):
                    return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._nudged.wait(), self.interval_s)
                self._nudged.clear()


async def wait_healthy(
    url: str, timeout_s: float, alive: Callable[[], bool] | None = None
) -> tuple[bool, str]:
    """Until ``/health_generate`` answers 200 (a token went through the scheduler), or the time is up."""
    poll = HealthPoll(url)
    ok = await poll.run(timeout_s, alive)
    return ok, poll.said


async def wire_problem(url: str) -> str | None:
    """What in the server's ``/server_info`` keeps regen from reading its answers (its streaming
    mode, whoever set it: a flag, a ``--config`` file); None when nothing does or it does not say."""
    async with _session() as session:
        for path in ("/server_info", "/get_server_info"):
            status, body, _ = await get(session, url + path)
            if status == 200 and isinstance(body, dict):
                return streaming_problem(body)
    return None


async def start_server(conn: HostConnection, spec: ServerSpec, say: Say) -> StartResult:
    """Preflight, launch and readiness of one host's server; never raises for the host's trouble."""
    try:
        return await _start(conn, spec, say)
    except HostError as exc:
        return StartResult(spec.host, False, str(exc))


async def _start(conn: HostConnection, spec: ServerSpec, say: Say) -> StartResult:
    name = spec.host
    say(f"{name}: preflight (GPUs free, port {spec.port} free, sglang and its flags, the model folder)")
    answer = await _ctl(conn, "start", spec, timeout=START_TIMEOUT_S)
    for check in answer.get("checks", []):
        say(f"{name}: {'ok' if check['ok'] else 'REFUSED'} {check['check']}: {check['detail']}")
    record = answer.get("record") or {}
    kind = answer["type"]
    if kind == "refused":
        return StartResult(name, False, f"{name}: not launched: {answer['reason']}")
    if kind == "exited":
        tail = list(answer.get("tail") or [])
        state = LogState()
        for line in tail:
            state.feed(line)
        return StartResult(
            name,
            False,
            f"{name}: the launcher exited at once (status {answer['status']})"
            + (f": {state.failure}" if state.failure else ""),
            pid=record.get("pid"),
            log=answer.get("log"),
            tail=tail,
            failure=state.failure,
        )
    version = record.get("version")
    if kind == "running":
        say(f"{name}: already running (pid {record.get('pid')}, same flags): not started again")
        tunnel = Tunnel(conn, spec.port)
        try:
            url = await tunnel.open()
            ok, said = await wait_healthy(url, 30.0)
            problem = await wire_problem(url) if ok else None
        finally:
            await tunnel.close()
        message = (
            f"{name}: already running (pid {record.get('pid')}) but /health_generate answers {said}"
            if not ok
            else f"{name}: already running (pid {record.get('pid')}), ready, but {problem}"
            if problem
            else f"{name}: already running (pid {record.get('pid')}), ready"
        )
        return StartResult(
            name,
            ok and problem is None,
            message,
            already=True,
            pid=record.get("pid"),
            version=version,
            log=answer.get("log"),
        )
    say(
        f"{name}: launched sglang {version or ''} (pid {record.get('pid')}, log {answer.get('log')})".replace(
            "  ", " "
        )
    )
    return await _follow(conn, spec, record, answer.get("log"), say)


async def _follow(
    conn: HostConnection, spec: ServerSpec, record: dict[str, Any], log: str | None, say: Say
) -> StartResult:
    """Follow the log through its phases, and ask /health_generate through a tunnel all along, until
    it answers 200, a failure, the process's end or the timeout. The ready line is a cue, not the
    proof: a quieter --log-level (or a --config file) hides it, and its 200 must come anyway."""
    tunnel = Tunnel(conn, spec.port)
    url = await tunnel.open()
    poll = HealthPoll(url, HEALTH_POLL_S)
    began = time.monotonic()
    polling = asyncio.get_running_loop().create_task(
        poll.run(spec.ready_timeout_s), name=f"health-{spec.host}"
    )
    try:
        result = await _watch_start(conn, spec, record, log, say, poll, polling, began)
        if result.ok:
            problem = await wire_problem(url)
            if problem is not None:
                result.ok = False
                result.message = f"{spec.host}: ready, but {problem}"
        return result
    finally:
        polling.cancel()
        await asyncio.gather(polling, return_exceptions=True)
        await tunnel.close()


async def _watch_start(
    conn: HostConnection,
    spec: ServerSpec,
    record: dict[str, Any],
    log: str | None,
    say: Say,
    poll: HealthPoll,
    polling: asyncio.Task[bool],
    began: float,
) -> StartResult:
    name = spec.host
    deadline = began + spec.ready_timeout_s
    state = LogState()
    recent: list[str] = []
    phases: list[tuple[str, float]] = []
    offset = 0
    pid = record.get("pid")

    def result(ok: bool, message: str, tail: list[str] | None = None) -> StartResult:
        return StartResult(
            name,
            ok,
            message,
            pid=pid,
            version=record.get("version"),
            log=log,
            phases=phases,
            tail=tail if tail is not None else recent[-TAIL_LINES:],
            failure=state.failure,
        )

    failed_at: float | None = None
    ready_line_at: float | None = None
    while True:
        # Read before the log: a server logs its ready line before it first answers 200, so a read
        # that follows a 200 holds the ready line unless its level hides it.
        healthy = poll.ok
        watch = await _ctl(conn, "watch", spec, str(offset))
        offset = int(watch["offset"])
        for line in str(watch.get("text") or "").splitlines():
            if line.strip():
                recent.append(line)
                del recent[:-200]
            entered = state.feed(line)
            if entered is not None:
                phases.append((entered, time.monotonic() - began))
                step = PHASE_NAMES.index(entered) + 1
                say(f"{name}: [{step}/{len(PHASE_NAMES)}] {entered}: {line.strip()[:160]}")
        alive = bool(watch.get("alive"))
        if state.failure is not None:
            if not alive or (failed_at is not None and time.monotonic() - failed_at > DYING_GRACE_S):
                if alive:
                    stopped = await _ctl(conn, "stop", spec, timeout=spec.grace_s + 30)
                    say(
                        f"{name}: stopped the failed server's process group ({', '.join(stopped.get('signals') or [])})"
                    )
                tail = list(watch.get("tail") or []) or recent[-TAIL_LINES:]
                where = state.phase or "startup"
                return result(False, f"{name}: launch failed after {where}: {state.failure}", tail)
            failed_at = failed_at or time.monotonic()
        elif not alive:
            tail = list(watch.get("tail") or []) or recent[-TAIL_LINES:]
            return result(
                False, f"{name}: the server exited during {state.phase or 'startup'} without saying why", tail
            )
        elif healthy:
            quiet = (
                "" if state.ready else "; its log did not say so (a --log-level above info hides the phases)"
            )
            return result(
                True,
                f"{name}: ready in {time.monotonic() - began:.1f} s, /health_generate answers 200 "
                f"(sglang {record.get('version') or '?'}, pid {pid})" + quiet,
            )
        if state.ready and ready_line_at is None:
            ready_line_at = time.monotonic()
            poll.nudge()
            say(
                f"{name}: ready line seen after {ready_line_at - began:.1f} s; waiting for /health_generate through the tunnel"
            )
        given_up = polling.done() and not poll.ok
        if ready_line_at is not None and (time.monotonic() - ready_line_at > HEALTH_TIMEOUT_S or given_up):
            return result(False, f"{name}: the log says ready but /health_generate answers {poll.said}")
        if time.monotonic() >= deadline:
            return result(
                False,
                f"{name}: not ready after {spec.ready_timeout_s:.0f} s (sglang.ready_timeout_s), last phase "
                f"{state.phase or 'none'}; the server is left running: regen sglang stop ends it",
            )
        if len(str(watch.get("text") or "")) < 64 * 1024:
            await asyncio.sleep(WATCH_INTERVAL_S)


# ------------------------------------------------------------------------------------- status


async def server_status(
    conn: HostConnection, spec: ServerSpec, url: str | None = None, *, gpus: bool = True, tunnel: bool = True
) -> dict[str, Any]:
    """What the host and the server say: process, phase, ready, version, model, load, GPUs.

    ``url`` is an open tunnel's; without one (and with ``tunnel``) a tunnel is opened for the HTTP
    questions. ``gpus`` False leaves nvidia-smi out (the host monitor polls the GPUs already).
    """
    out: dict[str, Any] = {"host": spec.host, "port": spec.port, "ok": True, "error": None}
    try:
        state = await _ctl(conn, "status", spec, gpus=gpus)
    except HostError as exc:
        return {**out, "ok": False, "error": str(exc)}
    record = state.get("record") or {}
    out.update(
        {
            "pid": record.get("pid"),
            "pgid": record.get("pgid"),
            "alive": bool(state.get("alive")),
            "group": state.get("group") or [],
            "phase": state.get("phase"),
            "failure": state.get("failure"),
            "launched_version": record.get("version"),
            "started_at": record.get("started_at"),
            "log": state.get("log"),
            "tail": state.get("tail") or [],
            "gpus": state.get("gpus") or [],
            "gpu_error": state.get("gpu_error"),
            "state": "running" if state.get("alive") else ("stopped" if not record else "dead"),
        }
    )
    if url is None and (not out["alive"] or not tunnel):
        out.update(_no_http())
        return out
    own: Tunnel | None = None
    if url is None:
        own = Tunnel(conn, spec.port)
        try:
            url = await own.open()
        except HostError as exc:
            return {**out, **_no_http(), "error": str(exc)}
    try:
        out.update(await http_status(url))
    finally:
        if own is not None:
            await own.close()
    if out["alive"] and out.get("ready"):
        out["state"] = "ready"
    elif out["alive"]:
        out["state"] = "starting" if out.get("phase") != "ready" else "not answering"
    return out


def _no_http() -> dict[str, Any]:
    return {
        "ready": False,
        "version": None,
        "model_path": None,
        "served_model_name": None,
        "running": None,
        "queued": None,
        "gen_throughput": None,
        "kv_usage": None,
        "retractions": None,
        "generation_tokens_total": None,
        "metrics_error": None,
    }


async def http_status(url: str) -> dict[str, Any]:
    """The server's own answers: /health, version and model (new paths, then the old ones), /metrics."""
    out = _no_http()
    async with _session() as session:
        status, _, _ = await get(session, url + "/health")
        out["ready"] = status == 200
        for path in ("/server_info", "/get_server_info"):
            code, body, _ = await get(session, url + path)
            if code == 200 and isinstance(body, dict):
                out["version"] = body.get("version")
                out["tp_size"] = body.get("tp_size")
                break
        for path in ("/model_info", "/get_model_info"):
            code, body, _ = await get(session, url + path)
            if code == 200 and isinstance(body, dict):
                out["model_path"] = body.get("model_path")
                out["served_model_name"] = body.get("served_model_name")
                break
        code, _, text = await get(session, url + "/metrics")
        if code == 200:
            try:
                load = parse_metrics(text)
            except (ValueError, TypeError) as exc:
                out["metrics_error"] = f"unreadable /metrics: {exc}"[:200]
            else:
                out.update(
                    running=load.running,
                    queued=load.queued,
                    gen_throughput=load.gen_throughput,
                    kv_usage=load.kv_usage,
                    retractions=load.retracted_total,
                    generation_tokens_total=load.generation_tokens_total,
                )
        else:
            out["metrics_error"] = f"/metrics answered {code if code is not None else text}"
    return out


# --------------------------------------------------------------------------------------- stop


async def stop_server(conn: HostConnection, spec: ServerSpec) -> dict[str, Any]:
    """TERM to the server's process group, ``grace_s``, then KILL; what was there and what is left."""
    try:
        answer = await _ctl(conn, "stop", spec, timeout=spec.grace_s + 60)
    except HostError as exc:
        return {"host": spec.host, "ok": False, "message": str(exc), "left": None}
    record = answer.get("record") or {}
    left = answer.get("left") or []
    if not answer.get("was_running"):
        message = f"{spec.host}: no server regen started is running on port {spec.port}"
    elif left:
        message = f"{spec.host}: processes of group {record.get('pgid')} are still there after KILL: {left}"
    else:
        message = (
            f"{spec.host}: stopped (pid {record.get('pid')}, {len(answer.get('processes') or [])} processes, "
            f"{' then '.join(answer.get('signals') or [])}); nothing of its process group is left"
        )
    return {
        "host": spec.host,
        "ok": not left,
        "message": message,
        "was_running": bool(answer.get("was_running")),
        "signals": answer.get("signals") or [],
        "processes": answer.get("processes") or [],
        "left": left,
    }


__all__ = [
    "ServerSpec",
    "StartResult",
    "http_status",
    "server_status",
    "start_server",
    "stop_server",
    "wait_healthy",
]
