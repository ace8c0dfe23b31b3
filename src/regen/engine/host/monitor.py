"""The job's watch over its GPU hosts: connection state, GPUs and disk, the last inspect.

``HostMonitor`` holds one ``HostConnection`` per host and polls each host's GPUs and disk without
overlap: the next poll is scheduled only when the last one has finished, ``poll_interval_s``
later (longer, with backoff, while the host cannot be reached). An inspect of every dataset runs
at start and again on ``inspect_now()``, beside the polls. ``view()`` is plain JSON-able data for
the job's snapshot; the console only draws it (docs/gpu-host.md, "The host pane").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from regen.engine.host.errors import HostError
from regen.engine.schema import GpuView, HostDisks, HostSGLangView, HostView, InspectView, SGLangActionView

if TYPE_CHECKING:
    from regen.engine.config.settings import HostSettings, SGLangSettings
    from regen.engine.host.ssh import HostConnection
    from regen.engine.host.tunnel import Tunnel

# While a host fails, polls back off to at most this (a refused key waits for the operator).
FAILING_POLL_MAX_S = 60.0
# Progress lines of an SGLang start or stop kept for the pane.
PROGRESS_LINES = 12


@dataclass(slots=True)
class _Host:
    settings: HostSettings
    conn: HostConnection
    gpus: list[GpuView] = field(default_factory=list)
    gpu_error: str | None = None
    disk: HostDisks = field(default_factory=lambda: HostDisks())
    polled_at: float | None = None
    polls: int = 0
    poll_error: str | None = None
    failures: int = 0
    inspect: InspectView | None = None
    inspect_task: asyncio.Task[None] | None = None
    poll_task: asyncio.Task[None] | None = None
    tunnel: Tunnel | None = None  # the run's tunnel to this host's SGLang, when the backend opened one
    sglang: dict[str, Any] | None = None  # the last SGLang status (engine/host/sglang.py)
    action: SGLangActionView | None = None  # an SGLang start or stop from the console: what, state, progress
    action_task: asyncio.Task[None] | None = None


class HostMonitor:
    """Polls the configured hosts for the job; does nothing when there are none."""

    def __init__(
        self,
        hosts: Sequence[HostSettings],
        *,
        inspect_at_start: bool = True,
        sglang: SGLangSettings | None = None,
    ) -> None:
        self.inspect_at_start = inspect_at_start
        # With [sglang] settings, each poll also asks after the host's SGLang server.
        self.sglang_settings = sglang
        self._hosts: dict[str, _Host] = {}
        if hosts:
            # Imported only with hosts to watch: SSH costs a job without any a quarter second to start.
            from regen.engine.host.ssh import HostConnection

            self._hosts = {h.name: _Host(h, HostConnection(h)) for h in hosts}
        self._started = False
        self._closed = False

    def __len__(self) -> int:
        return len(self._hosts)

    def _fleet(self) -> list[HostSettings]:
        """Every host's settings: their servers share one served model name."""
        return [h.settings for h in self._hosts.values()]

    def connection(self, name: str) -> HostConnection:
        """The job's one connection to host ``name``, for whatever else runs there."""
        return self._hosts[name].conn

    def attach(self, name: str, tunnel: Tunnel) -> None:
        """The run's tunnel to host ``name``'s server: shown in the pane, used for the server's HTTP."""
        self._hosts[name].tunnel = tunnel

    def start(self) -> None:
        """Begin polling (and the first inspect) in the running loop; returns at once."""
        if self._started or self._closed:
            return
        self._started = True
        loop = asyncio.get_running_loop()
        for host in self._hosts.values():
            host.poll_task = loop.create_task(self._poll_loop(host), name=f"host-poll-{host.settings.name}")
            if self.inspect_at_start:
                self._start_inspect(host)

    async def close(self) -> None:
        """Stop polling and close every connection."""
        self._closed = True
        tasks = [t for h in self._hosts.values() for t in (h.poll_task, h.inspect_task) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        actions = [h.action_task for h in self._hosts.values() if h.action_task is not None]
        for task in actions:
            task.cancel()
        await asyncio.gather(*actions, return_exceptions=True)
        await asyncio.gather(*(h.conn.close() for h in self._hosts.values()), return_exceptions=True)

    # ------------------------------------------------------------------------------- polling

    async def poll_once(self, host: _Host) -> None:
        s = host.settings
        try:
            result = await host.conn.hostcmd(["status", s.data_root, s.model_path or ""])
            status = result.one("status")
        except HostError as exc:
            host.poll_error = str(exc)
            host.failures += 1
            return
        host.gpus = _gpus(status) or []
        host.gpu_error = status.get("gpu_error")
        host.disk = _disks(status) or {}
        host.polled_at = time.time()
        host.polls += 1
        host.poll_error = None
        host.failures = 0
        if self.sglang_settings is not None and s.model_path:
            await self._poll_sglang(host)

    async def _poll_sglang(self, host: _Host) -> None:
        from regen.engine.host.sglang import ServerSpec, server_status

        assert self.sglang_settings is not None
        tunnel = host.tunnel
        url = tunnel.url if tunnel is not None and tunnel.state == "open" else None
        try:
            spec = ServerSpec.of(self.sglang_settings, host.settings, self._fleet())
            host.sglang = await server_status(host.conn, spec, url, gpus=False, tunnel=False)
        except HostError as exc:
            host.sglang = {"ok": False, "error": str(exc)}

    # ------------------------------------------------------------------------------- SGLang

    def sglang_action(self, what: str, name: str | None) -> str:
        """Start or stop SGLang on host ``name`` (every host when None) in the background."""
        if what not in ("start", "stop"):
            raise HostError(f"unknown SGLang action {what!r}")
        if not self._hosts:
            raise HostError("no GPU hosts in the settings: add a [[hosts]] table")
        if self.sglang_settings is None:
            raise HostError("the host monitor has no [sglang] settings")
        if name and name not in self._hosts:
            raise HostError(f"no host named {name!r} (hosts: {', '.join(self._hosts)})")
        if not self._started:
            raise HostError("the host monitor is not running")
        chosen = [self._hosts[name]] if name else list(self._hosts.values())
        busy = [h.settings.name for h in chosen if h.action_task is not None and not h.action_task.done()]
        if busy:
            raise HostError(f"an SGLang start or stop is already running on {', '.join(busy)}")
        loop = asyncio.get_running_loop()
        # One model on every host of the job, by content, before a start launches anything anywhere.
        model = loop.create_task(self._one_model(), name="host-sglang-model") if what == "start" else None
        for host in chosen:
            host.action = {
                "what": what,
                "state": "running",
                "started_at": time.time(),
                "progress": [],
                "message": None,
            }
            host.action_task = loop.create_task(
                self._sglang_action(host, what, model), name=f"host-sglang-{what}-{host.settings.name}"
            )
        names = ", ".join(h.settings.name for h in chosen)
        return f"{'starting' if what == 'start' else 'stopping'} SGLang on {names}"

    async def _one_model(self) -> None:
        from regen.engine.host.identity import one_model

        assert self.sglang_settings is not None
        hosts = [h.conn for h in self._hosts.values() if h.settings.model_path]
        await one_model(hosts, self.sglang_settings.weight_version)

    async def _sglang_action(self, host: _Host, what: str, model: asyncio.Future[None] | None = None) -> None:
        from regen.engine.host.sglang import ServerSpec, start_server, stop_server

        assert self.sglang_settings is not None and host.action is not None
        action = host.action

        def say(line: str) -> None:
            progress = action["progress"]
            progress.append(line)
            del progress[:-PROGRESS_LINES]

        try:
            spec = ServerSpec.of(self.sglang_settings, host.settings, self._fleet())
            if what == "start":
                if model is not None:
                    try:
                        await asyncio.shield(model)
                    except HostError as exc:
                        raise HostError(f"{exc}; nothing was launched") from None
                result = await start_server(host.conn, spec, say)
                ok, message = result.ok, result.message
                if not ok and result.tail:
                    for line in result.tail[-4:]:
                        say(line)
            else:
                stopped = await stop_server(host.conn, spec)
                ok, message = bool(stopped["ok"]), str(stopped["message"])
        except HostError as exc:
            ok, message = False, str(exc)
        except Exception as exc:  # a malformed answer must not end the job's loop
            ok, message = False, f"{type(exc).__name__}: {exc}"
        action["state"] = "done" if ok else "failed"
        action["message"] = message
        action["finished_at"] = time.time()
        await self._poll_sglang(host)

    async def _poll_loop(self, host: _Host) -> None:
        while not self._closed:
            await self.poll_once(host)
            if host.failures:
                from regen.engine.host.ssh import BACKOFF_MAX_S, backoff_s

                delay = min(
                    FAILING_POLL_MAX_S,
                    max(host.settings.poll_interval_s, backoff_s(host.failures, 1.0, BACKOFF_MAX_S * 6)),
                )
            else:
                delay = host.settings.poll_interval_s
            await asyncio.sleep(delay)

    # ------------------------------------------------------------------------------- inspect

    def inspect_now(self, name: str | None = None) -> str:
        """Inspect every dataset again on host ``name`` (all hosts when None); the answer for the operator."""
        if not self._hosts:
            raise HostError("no GPU hosts in the settings: add a [[hosts]] table")
        if name and name not in self._hosts:
            raise HostError(f"no host named {name!r} (hosts: {', '.join(self._hosts)})")
        if not self._started:
            raise HostError("the host monitor is not running")
        chosen = [self._hosts[name]] if name else list(self._hosts.values())
        started: list[str] = []
        busy: list[str] = []
        for host in chosen:
            (started if self._start_inspect(host) else busy).append(host.settings.name)
        parts = []
        if started:
            parts.append(f"inspecting {', '.join(started)}")
        if busy:
            parts.append(f"already inspecting {', '.join(busy)}")
        return "; ".join(parts)

    def _start_inspect(self, host: _Host) -> bool:
        if host.inspect_task is not None and not host.inspect_task.done():
            return False
        began = time.time()
        # The last inspect's counts stay shown while the next one runs.
        kept: InspectView = host.inspect.copy() if host.inspect is not None else {"state": "running"}
        host.inspect = {**kept, "state": "running", "started_at": began}
        host.inspect_task = asyncio.get_running_loop().create_task(
            self._inspect(host, began), name=f"host-inspect-{host.settings.name}"
        )
        return True

    async def _inspect(self, host: _Host, began: float) -> None:
        from regen.engine.host.inspect import inspect_host, summary

        try:
            record = await inspect_host(host.conn)
        except HostError as exc:
            kept: InspectView = host.inspect.copy() if host.inspect is not None else {"state": "failed"}
            host.inspect = {
                **kept,
                "state": "failed",
                "error": str(exc),
                "started_at": began,
                "finished_at": time.time(),
            }
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a malformed answer must not end the job's loop
            host.inspect = {"state": "failed", "error": f"{type(exc).__name__}: {exc}", "started_at": began}
            return
        host.inspect = {
            "state": "done",
            "error": None,
            "started_at": began,
            "finished_at": time.time(),
            "seconds": record["seconds"],
            **summary(record),
        }
        # The inspect saw the GPUs too: as fresh as a poll.
        host.gpus = _gpus(record) or host.gpus
        host.gpu_error = record.get("gpu_error")
        host.disk = _disks(record) or host.disk

    async def wait_inspected(self) -> None:
        """Wait until no inspect is running (for tests and the end of a run)."""
        for host in self._hosts.values():
            if host.inspect_task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(host.inspect_task)

    # ------------------------------------------------------------------------------- view

    def view(self) -> list[HostView]:
        """Per host, plain data: connection state and retries, GPUs, disk, the last inspect, errors."""
        out: list[HostView] = []
        for host in self._hosts.values():
            conn = host.conn.view()
            out.append(
                {
                    **conn,
                    "error": conn["error"] or host.poll_error,
                    "gpus": host.gpus,
                    "gpu_error": host.gpu_error,
                    "disk": host.disk,
                    "polled_at": host.polled_at,
                    "polls": host.polls,
                    "inspect": host.inspect.copy() if host.inspect is not None else None,
                    "tunnel": host.tunnel.view() if host.tunnel is not None else None,
                    "sglang": _sglang_view(host.sglang),
                    "sglang_action": host.action.copy() if host.action is not None else None,
                }
            )
        return out


# hostcmd's `status` and an inspect's record write the GPUs and disks as engine/host/scripts/probe.py
# `gpus` and `disk` make them, regen's own scripts run on the host: the schema's GpuView and DiskView.


def _gpus(answer: dict[str, Any]) -> list[GpuView] | None:
    return cast("list[GpuView] | None", answer.get("gpus"))


def _disks(answer: dict[str, Any]) -> HostDisks | None:
    return cast("HostDisks | None", answer.get("disk"))


def _sglang_view(status: dict[str, Any] | None) -> HostSGLangView | None:
    """The pane's part of an SGLang status (no log tail, no GPUs: those are polled already)."""
    if status is None:
        return None
    get = status.get
    return {
        "ok": get("ok"),
        "error": get("error"),
        "state": get("state"),
        "pid": get("pid"),
        "alive": get("alive"),
        "phase": get("phase"),
        "failure": get("failure"),
        "ready": get("ready"),
        "version": get("version"),
        "launched_version": get("launched_version"),
        "served_model_name": get("served_model_name"),
        "running": get("running"),
        "queued": get("queued"),
        "gen_throughput": get("gen_throughput"),
        "kv_usage": get("kv_usage"),
        "retractions": get("retractions"),
        "port": get("port"),
    }
