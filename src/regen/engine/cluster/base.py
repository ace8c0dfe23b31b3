"""The seam between regen and a cluster manager: a cluster turns its settings into servers.

Four verbs, nothing more (docs/clusters.md, "The seam"):

- ``submit``: ask the cluster for the nodes and start one server on each (no-op when its job is
  still there);
- ``watch``: the job's state and every node's server as the cluster and the node itself say;
- ``endpoints``: the servers that answer now, each with its node's name and model identity;
- ``cancel``: end the job and wait until nothing of it is left.

Placement, queueing and recovery of nodes are the cluster's; membership in the router and the
requests are regen's (engine/cluster/fleet.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from regen.engine.errors import RegenError

NodeState = Literal["pending", "starting", "ready", "failed", "stopped", "lost"]
# A node's server in these states will not become ready in this job.
ENDED: frozenset[str] = frozenset({"failed", "stopped", "lost"})


class ClusterError(RegenError):
    """The cluster refused or could not do what was asked; the message names the cluster."""


@dataclass(frozen=True, slots=True)
class NodeServer:
    """One node's server, as the node's own state file and the cluster's queue tell it."""

    node: str
    state: NodeState
    phase: str | None = None
    url: str | None = None
    failure: str | None = None
    log: str | None = None
    version: str | None = None
    # The model folder's identity taken on the node (engine/host/scripts/identity.py `survey`).
    identity: dict[str, Any] | None = None
    tail: tuple[str, ...] = ()
    phases: tuple[tuple[str, float], ...] = ()
    ready_after_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "state": self.state,
            "phase": self.phase,
            "url": self.url,
            "failure": self.failure,
            "log": self.log,
            "version": self.version,
            "tail": list(self.tail),
            "ready_after_s": self.ready_after_s,
        }


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    """The job and its nodes at one moment. ``job_state`` is the cluster's own word (Slurm's
    PENDING, RUNNING, COMPLETING, CANCELLED, ...), None when no job of regen's is known."""

    cluster: str
    kind: str
    job_id: str | None
    job_state: str | None
    reason: str | None = None
    nodes: tuple[NodeServer, ...] = ()
    folder: str | None = None
    wanted: int = 0

    @property
    def queued(self) -> bool:
        """The job is known to the cluster and not over."""
        return self.job_state is not None and self.job_state in LIVE_JOB_STATES

    @property
    def ready(self) -> list[NodeServer]:
        return [n for n in self.nodes if n.state == "ready"]

    @property
    def ended(self) -> list[NodeServer]:
        return [n for n in self.nodes if n.state in ENDED]

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "kind": self.kind,
            "job_id": self.job_id,
            "job_state": self.job_state,
            "reason": self.reason,
            "folder": self.folder,
            "nodes_wanted": self.wanted,
            "nodes": [n.to_dict() for n in self.nodes],
        }


# Job states in which the job still holds (or waits for) its nodes; Slurm's words, which the other
# kinds map theirs onto.
LIVE_JOB_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
    }
)


@dataclass(slots=True)
class Submitted:
    """What ``submit`` did: a new job, or the one already there (``already``)."""

    status: ClusterStatus
    already: bool = False
    script: str | None = None
    notes: list[str] = field(default_factory=list)


class Cluster(Protocol):
    """A cluster manager behind regen's four verbs."""

    name: str
    kind: str

    async def submit(self) -> Submitted: ...

    async def watch(self) -> ClusterStatus: ...

    async def endpoints(self) -> list[NodeServer]: ...

    async def cancel(self) -> ClusterStatus: ...


__all__ = [
    "ENDED",
    "LIVE_JOB_STATES",
    "Cluster",
    "ClusterError",
    "ClusterStatus",
    "NodeServer",
    "NodeState",
    "Submitted",
]
