"""A cluster's servers from the command line: start (submit and follow every node to ready), stop.

``regen sglang start --cluster NAME`` is ``start_servers``: it submits (or finds the job already
there), then follows the queue and every node's state file, saying each change once: the job's
state and the reason it waits, each node's phases, each node's ready (its URL and time) or its
failure (the node, the reason, the log and its last lines). It ends when every node is ready, when
a node failed, or when the job left the queue; a job still waiting for nodes is waited for, the
readiness time counting from when the job started running (docs/clusters.md, "Starting").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from regen.engine.cluster.base import Cluster, ClusterStatus, NodeServer
from regen.engine.host.errors import ModelMismatch
from regen.engine.host.identity import ModelIdentity, mismatch
from regen.engine.host.scripts.sglanglog import PHASE_NAMES

Say = Callable[[str], None]
POLL_S = 1.0


@dataclass(slots=True)
class StartOutcome:
    ok: bool
    message: str
    status: ClusterStatus
    failed: list[NodeServer] = field(default_factory=list)
    already: bool = False


def node_identities(nodes: list[NodeServer], weight_version: str | None) -> list[ModelIdentity]:
    """Each node's model identity, from what the node found in its folder (its state file)."""
    return [
        ModelIdentity.of(n.node, dict(n.identity), weight_version) for n in nodes if n.identity is not None
    ]


def one_model_on(nodes: list[NodeServer], weight_version: str | None) -> ModelIdentity | None:
    """The nodes' one model (the first node's identity), or ModelMismatch naming two nodes and the item."""
    identities = node_identities(nodes, weight_version)
    problem = mismatch(identities)
    if problem is not None:
        raise ModelMismatch(problem)
    return identities[0] if identities else None


class Follower:
    """Says what changed between two looks at a cluster, each change once."""

    def __init__(self, say: Say) -> None:
        self.say = say
        self.job: tuple[str | None, str | None] | None = None
        self.phases: dict[str, int] = {}
        self.states: dict[str, str] = {}

    def look(self, status: ClusterStatus) -> None:
        job = (status.job_state, status.reason)
        if job != self.job:
            self.job = job
            waiting = f" ({status.reason})" if status.reason else ""
            self.say(f"{status.cluster}: job {status.job_id} {status.job_state}{waiting}")
        for node in status.nodes:
            if node.state == "pending":
                continue
            seen = self.phases.get(node.node, 0)
            for phase, after in node.phases[seen:]:
                step = PHASE_NAMES.index(phase) + 1 if phase in PHASE_NAMES else 0
                self.say(f"{node.node}: [{step}/{len(PHASE_NAMES)}] {phase} after {after:.1f} s")
            self.phases[node.node] = len(node.phases)
            if self.states.get(node.node) == node.state:
                continue
            self.states[node.node] = node.state
            if node.state == "ready":
                took = f" in {node.ready_after_s:.1f} s" if node.ready_after_s is not None else ""
                self.say(f"{node.node}: ready at {node.url}{took} (sglang {node.version or '?'})")
            elif node.state == "starting" and node.phase:
                self.say(f"{node.node}: starting ({node.phase})")


def failure_lines(node: NodeServer) -> list[str]:
    lines = [
        f"{node.node}: {node.state}: {node.failure or 'no reason given'}"
        + (f" (log {node.log})" if node.log else "")
    ]
    lines.extend(f"  {line}" for line in node.tail)
    return lines


async def start_servers(
    cluster: Cluster, say: Say, *, ready_timeout_s: float, weight_version: str | None = None
) -> StartOutcome:
    """Submit and follow until every node is ready, one fails, or the job ends (never raises for
    the nodes' trouble; the cluster's own refusal is a ClusterError)."""
    submitted = await cluster.submit()
    status = submitted.status
    if submitted.already:
        say(f"{cluster.name}: job {status.job_id} is already {status.job_state}: not submitted again")
    else:
        say(
            f"{cluster.name}: submitted job {status.job_id} ({status.wanted} nodes, files in {status.folder})"
        )
    follow = Follower(say)
    running_since: float | None = None
    while True:
        follow.look(status)
        if status.job_state == "RUNNING" and running_since is None:
            running_since = time.monotonic()
        ended = status.ended
        if ended:
            return StartOutcome(
                False,
                f"{cluster.name}: {len(ended)} of {status.wanted} nodes failed",
                status,
                ended,
                submitted.already,
            )
        if not status.queued:
            return StartOutcome(
                False,
                f"{cluster.name}: job {status.job_id} is {status.job_state}"
                + (f" ({status.reason})" if status.reason else "")
                + " before every node was ready",
                status,
                already=submitted.already,
            )
        ready = status.ready
        if len(ready) >= status.wanted:
            try:
                model = one_model_on(ready, weight_version)
            except ModelMismatch as exc:
                return StartOutcome(False, f"{cluster.name}: {exc}", status, already=submitted.already)
            digest = f", model {model.digest[:19]}" if model is not None else ""
            return StartOutcome(
                True,
                f"{cluster.name}: every node ready ({len(ready)}) in job {status.job_id}{digest}",
                status,
                already=submitted.already,
            )
        if running_since is not None and time.monotonic() - running_since > ready_timeout_s:
            slow = ", ".join(f"{n.node} ({n.phase or n.state})" for n in status.nodes if n.state != "ready")
            return StartOutcome(
                False,
                f"{cluster.name}: not every node ready {ready_timeout_s:.0f} s after the job started "
                f"(sglang.ready_timeout_s): {slow}; the job is left running: regen sglang stop --cluster {cluster.name} ends it",
                status,
                already=submitted.already,
            )
        await asyncio.sleep(POLL_S)
        status = await cluster.watch()


__all__ = ["Follower", "StartOutcome", "failure_lines", "node_identities", "one_model_on", "start_servers"]
