"""The run's way to the SGLang servers on its GPU hosts: a tunnel per host, the router when several.

With ``job.backend = "sglang"``, no ``sglang.urls`` and ``[[hosts]]`` set, the SGLang backend asks
the fleet for its URLs when it opens: each host's server through a ``Tunnel`` over that host's one
SSH connection (the job's own, from the host monitor), and with more than one host the router
(``Router``, smg) in front of the tunnels. Before any tunnel, the hosts' models are compared by
content (engine/host/identity.py): different models are refused, one model at different paths is
one model. While the run lasts the fleet checks every worker's
``/health`` through its tunnel; a worker that stops answering is taken out of the router (the job
carries on with the rest) and put back once it answers again (docs/sglang.md §13).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import aiohttp

from regen.engine.config.settings import HostSettings, SGLangSettings
from regen.engine.host.errors import HostError
from regen.engine.host.identity import ModelIdentity, one_model
from regen.engine.host.router import Router, RouterError
from regen.engine.host.tunnel import Tunnel
from regen.engine.schema import HostFleetView, TunnelView

if TYPE_CHECKING:
    from regen.engine.host.monitor import HostMonitor
    from regen.engine.host.ssh import HostConnection

# A worker is taken out of the router after this many failed health checks in a row, every interval.
HEALTH_INTERVAL_S = 1.0
FAILURES_OUT = 2
_TIMEOUT = aiohttp.ClientTimeout(total=5.0, sock_connect=3.0)
ROUTER_LOG = "router.log"


class Link(Protocol):
    """The way to one worker's server: a tunnel over SSH, or the cluster's own network (engine/cluster/fleet.py)."""

    @property
    def url(self) -> str: ...

    async def open(self) -> str: ...

    async def close(self) -> None: ...

    def view(self) -> TunnelView: ...


@dataclass(slots=True)
class FleetWorker:
    host: str
    tunnel: Link
    failures: int = 0
    out: bool = False  # taken out of the router by regen
    error: str | None = None
    removals: int = 0
    gone: bool = False  # its server will not come back at this URL (a cluster node lost): never put back

    @property
    def url(self) -> str:
        return self.tunnel.url


class Fleet:
    """Tunnels to every host's server and, with several hosts, the router in front of them."""

    def __init__(
        self,
        sglang: SGLangSettings,
        hosts: Sequence[HostSettings],
        *,
        run_dir: Path,
        monitor: HostMonitor | None = None,
        on_reopen: Callable[[str], None] | None = None,
        on_event: Callable[..., None] | None = None,
        health_interval_s: float = HEALTH_INTERVAL_S,
    ) -> None:
        self.on_event = on_event  # (name, **fields): the job's event journal
        self.sglang = sglang
        self.hosts = list(hosts)
        self.run_dir = run_dir
        self.monitor = monitor
        self.on_reopen = on_reopen
        self.health_interval_s = health_interval_s
        self.workers: list[FleetWorker] = []
        self.router: Router | None = None
        # The model on every host, by content (engine/host/identity.py); None when a host has no
        # model_path to take it from.
        self.model: ModelIdentity | None = None
        self._own: list[HostConnection] = []  # connections opened here when there is no monitor

    def _connection(self, host: HostSettings) -> HostConnection:
        if self.monitor is not None and len(self.monitor):
            return self.monitor.connection(host.name)
        from regen.engine.host.ssh import HostConnection

        conn = HostConnection(host)
        self._own.append(conn)
        return conn

    @property
    def entry_url(self) -> str:
        """Where the backend sends its requests: the router, or the one host's tunnel."""
        return self.router.url if self.router is not None else self.workers[0].url

    @property
    def names(self) -> dict[str, str]:
        """Tunnel URL -> host name, so requests and workers are named by their host."""
        return {w.url: w.host for w in self.workers}

    async def open(self) -> None:
        """Open every tunnel (and the router with several hosts); raises HostError with the reason."""
        if not self.hosts:
            raise HostError("no [[hosts]] to reach SGLang on")

        def reopened(tunnel: Tunnel) -> None:
            if self.on_reopen is not None:
                self.on_reopen(tunnel.url)

        try:
            # Different models behind one router would make rows that lie; refused before any tunnel.
            if all(h.model_path for h in self.hosts):
                conns = [self._connection(h) for h in self.hosts]
                self.model = await one_model(conns, self.sglang.weight_version)
        except HostError:
            await self.close()
            raise
        for host in self.hosts:
            tunnel = Tunnel(self._connection(host), host.sglang_port or self.sglang.port, on_reopen=reopened)
            self.workers.append(FleetWorker(host.name, tunnel))
            if self.monitor is not None:
                self.monitor.attach(host.name, tunnel)
        try:
            await asyncio.gather(*(w.tunnel.open() for w in self.workers))
            if len(self.workers) > 1:
                self.router = Router(
                    [w.url for w in self.workers],
                    log=self.run_dir / ROUTER_LOG,
                    request_timeout_s=self.sglang.request_timeout_s,
                )
                await self.router.start()
        except RouterError as exc:
            await self.close()
            raise HostError(str(exc)) from None
        except HostError:
            await self.close()
            raise

    async def watch(self) -> None:
        """Health through each tunnel; take a silent worker out of the router, put it back when it answers."""
        async with aiohttp.ClientSession() as session:
            while True:
                await asyncio.gather(*(self._check(session, w) for w in self.workers if not w.gone))
                await asyncio.sleep(self.health_interval_s)

    async def _check(self, session: aiohttp.ClientSession, worker: FleetWorker) -> None:
        try:
            async with session.get(worker.url + "/health", timeout=_TIMEOUT) as resp:
                await resp.read()
                ok = resp.status == 200
                said = f"/health answered {resp.status}"
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            ok, said = False, f"{type(exc).__name__}: {exc}"
        if ok:
            worker.failures = 0
            worker.error = None
            if worker.out and not worker.gone and self.router is not None:
                with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                    if await self.router.add(worker.url):
                        worker.out = False
                        self._event("worker_in", host=worker.host)
            return
        worker.failures += 1
        worker.error = f"{worker.host}: {said}"[:200]
        if worker.failures >= FAILURES_OUT and not worker.out and self.router is not None:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
                if await self.router.remove(worker.url):
                    worker.out = True
                    worker.removals += 1
                    self._event("worker_out", host=worker.host, reason=worker.error)

    def _event(self, name: str, **fields: object) -> None:
        if self.on_event is not None:
            self.on_event(name, **fields)

    async def close(self) -> None:
        if self.router is not None:
            await self.router.stop()
        await asyncio.gather(*(w.tunnel.close() for w in self.workers), return_exceptions=True)
        await asyncio.gather(*(c.close() for c in self._own), return_exceptions=True)

    def view(self) -> HostFleetView:
        return {
            "router": self.router.view() if self.router is not None else None,
            "workers": [
                {
                    "host": w.host,
                    **w.tunnel.view(),
                    "out": w.out,
                    "health_failures": w.failures,
                    "health_error": w.error,
                    "removals": w.removals,
                }
                for w in self.workers
            ],
            "clusters": [],
        }


__all__ = ["Fleet", "FleetWorker", "Link"]
