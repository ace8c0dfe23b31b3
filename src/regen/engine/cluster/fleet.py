"""The run's way to a cluster's servers: the router in front of every ready node, membership kept live.

With ``job.backend = "sglang"``, no ``sglang.urls``, no ``[[hosts]]`` and ``[[clusters]]`` set, the
SGLang backend's fleet is this one (docs/clusters.md, "The run"). The nodes are reached directly over
the cluster's network (no tunnel: regen runs on the cluster's login node), always through the router,
so that nodes can join and leave while the job runs:

- at open, every ready node of every cluster, one model by content (each node's identity from its
  state file), or the job does not start;
- every ``refresh_s`` the clusters are watched again: a node that became ready (late, or started
  again) joins once the backend has read it and found the same model, version and served name
  (``on_join``), journaled as ``node_joined``; a node whose server is failed, stopped or lost
  leaves the router for good (``node_lost``, never put back at that URL; the health checks may
  have taken it out first, ``worker_out``). Its requests in flight
  come back as cut streams or refused connections and are retried elsewhere, each attempt ended
  once in the journal, so no prompt is lost or written twice.

The health checks of engine/host/fleet.py go on as for hosts: a silent node is taken out and put
back when it answers, until its cluster says it is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import aiohttp

from regen.engine.cluster.base import ENDED, Cluster, ClusterError, ClusterStatus, NodeServer
from regen.engine.cluster.servers import one_model_on
from regen.engine.config.settings import SGLangSettings
from regen.engine.host.errors import HostError, ModelMismatch
from regen.engine.host.fleet import Fleet, FleetWorker
from regen.engine.host.identity import mismatch
from regen.engine.host.router import Router, RouterError
from regen.engine.schema import HostFleetView, TunnelView

REFRESH_S = 2.0
ROUTER_LOG = "router.log"

# (url, worker name) -> whether the backend took the server (same model, version, served name).
Join = Callable[[str, str], Awaitable[bool]]
# (worker name) -> the backend stops counting the server (its GPUs leave the meter).
Leave = Callable[[str], None]


class DirectLink:
    """A node's server reached over the cluster's network: nothing to open or close."""

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self._url = url.rstrip("/")

    @property
    def url(self) -> str:
        return self._url

    async def open(self) -> str:
        return self._url

    async def close(self) -> None:
        return None

    def view(self) -> TunnelView:
        port = self._url.rsplit(":", 1)[-1]
        return {
            "host": self.name,
            "url": self._url,
            "remote_port": int(port) if port.isdigit() else 0,
            "state": "direct",
            "error": None,
            "drops": 0,
            "reopens": 0,
            "connections": 0,
        }


class ClusterFleet(Fleet):
    """The router in front of every ready node of ``clusters``, membership following the clusters."""

    def __init__(
        self,
        sglang: SGLangSettings,
        clusters: Sequence[Cluster],
        *,
        run_dir: Path,
        on_event: Callable[..., None] | None = None,
        refresh_s: float = REFRESH_S,
    ) -> None:
        super().__init__(sglang, [], run_dir=run_dir, on_event=on_event)
        self.clusters = list(clusters)
        self.refresh_s = refresh_s
        self.on_join: Join | None = None
        self.on_leave: Leave | None = None
        self.refresh_error: str | None = None
        self.looks: dict[str, ClusterStatus] = {}  # each cluster as last watched

    @staticmethod
    def worker_name(cluster: Cluster, node: NodeServer) -> str:
        return f"{cluster.name}/{node.node}"

    async def _ready(self) -> list[tuple[str, NodeServer]]:
        found = []
        for cluster in self.clusters:
            look = await cluster.watch()
            self.looks[cluster.name] = look
            for node in look.nodes:
                found.append((self.worker_name(cluster, node), node))
        return found

    def view(self) -> HostFleetView:
        view = super().view()
        view["clusters"] = [
            {
                "cluster": look.cluster,
                "kind": look.kind,
                "job_id": look.job_id,
                "job_state": look.job_state,
                "reason": look.reason,
                "wanted": look.wanted,
                "nodes": [
                    {
                        "node": n.node,
                        "worker": f"{look.cluster}/{n.node}",
                        "state": n.state,
                        "phase": n.phase,
                        "url": n.url,
                        "failure": n.failure,
                    }
                    for n in look.nodes
                ],
            }
            for look in self.looks.values()
        ]
        return view

    async def open(self) -> None:
        try:
            seen = await self._ready()
        except ClusterError as exc:
            raise HostError(str(exc)) from None
        ready = [(name, node) for name, node in seen if node.state == "ready" and node.url]
        if not ready:
            names = ", ".join(c.name for c in self.clusters)
            raise HostError(
                f"no node's server is ready on cluster {names}: start them with regen sglang start --cluster NAME"
            )
        self.model = one_model_on([n for _, n in ready], self.sglang.weight_version)
        for name, node in ready:
            self._add(name, str(node.url))
        try:
            self.router = Router(
                [w.url for w in self.workers],
                log=self.run_dir / ROUTER_LOG,
                request_timeout_s=self.sglang.request_timeout_s,
            )
            await self.router.start()
        except RouterError as exc:
            await self.close()
            raise HostError(str(exc)) from None

    def _add(self, name: str, url: str) -> FleetWorker:
        worker = FleetWorker(name, DirectLink(name, url))
        self.workers.append(worker)
        return worker

    async def watch(self) -> None:
        await asyncio.gather(super().watch(), self._follow())

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.refresh()
                self.refresh_error = None
            except (ClusterError, OSError) as exc:
                self.refresh_error = str(exc)[:200]

    async def refresh(self) -> None:
        """One look at the clusters: nodes that became ready join, nodes that ended leave."""
        current = {w.host: w for w in self.workers if not w.gone}
        for name, node in await self._ready():
            worker = current.get(name)
            if worker is not None and (
                node.state in ENDED or (node.url and node.url.rstrip("/") != worker.url)
            ):
                await self._leave(worker, f"{name}: {node.state}: {node.failure or 'its server moved'}")
                worker = None
            # A URL seen once is never taken again: a worker gone from this job stays gone.
            if (
                worker is None
                and node.state == "ready"
                and node.url
                and node.url.rstrip("/") not in {w.url for w in self.workers}
            ):
                await self._join(name, node)

    async def _join(self, name: str, node: NodeServer) -> None:
        problem = self._other_model(node)
        if problem is not None:
            self._event("node_refused", host=name, reason=problem)
            return
        url = str(node.url).rstrip("/")
        if self.on_join is not None and not await self.on_join(url, name):
            return
        worker = self._add(name, url)
        if self.router is not None:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                if not await self.router.add(url):
                    worker.out = True
        self._event("node_joined", host=name, url=url)

    def _other_model(self, node: NodeServer) -> str | None:
        if self.model is None or node.identity is None:
            return None
        try:
            theirs = one_model_on([node], self.sglang.weight_version)
        except (ModelMismatch, HostError) as exc:
            return str(exc)
        return None if theirs is None else mismatch([self.model, theirs])

    async def _leave(self, worker: FleetWorker, reason: str) -> None:
        """The cluster says the node's server is over: out of the router (if the health checks have
        not taken it out already) and never put back at that URL."""
        worker.gone = True
        worker.error = reason[:200]
        if not worker.out and self.router is not None:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
                await self.router.remove(worker.url)
            worker.out = True
            worker.removals += 1
        if self.on_leave is not None:
            self.on_leave(worker.host)
        self._event("node_lost", host=worker.host, reason=worker.error)


__all__ = ["ClusterFleet", "DirectLink"]
