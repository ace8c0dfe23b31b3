"""The run's fleet on a cluster, one look at a time: who joins, who leaves, what the pane shows
(engine/cluster/fleet.py, console/widgets/host.py), and the GPU meter when the fleet changes size.

The cluster here is a scripted one behind the seam (engine/cluster/base.py); the real Slurm, the
router and the job are in tests/integration/cluster/test_slurm_run.py.
"""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Any

from regen.console.widgets.host import cluster_lines
from regen.engine.backends.sglang.meter import ShareMeter
from regen.engine.cluster.base import ClusterStatus, NodeServer, Submitted
from regen.engine.cluster.fleet import ClusterFleet
from regen.engine.config.settings import SGLangSettings
from regen.engine.host.scripts.nodeserver import owns_listener
from regen.engine.schema import SGLangServerView
from tests.support.views import partial

IDENTITY = {"path": "/m", "exists": True, "items": [["config.json", "sha256:aa"]], "error": None}


class Scripted:
    """A cluster whose every look is the next one given."""

    name = "lab"
    kind = "slurm"

    def __init__(self, *looks: list[NodeServer]) -> None:
        self.looks = list(looks)

    async def watch(self) -> ClusterStatus:
        nodes = self.looks.pop(0) if len(self.looks) > 1 else self.looks[0]
        return ClusterStatus("lab", "slurm", "7", "RUNNING", nodes=tuple(nodes), wanted=2)

    async def submit(self) -> Submitted:
        raise AssertionError("the run never submits")

    async def endpoints(self) -> list[NodeServer]:
        return (await self.watch()).ready

    async def cancel(self) -> ClusterStatus:
        raise AssertionError("the run never cancels")


def ready(name: str, port: int, identity: dict[str, Any] | None = IDENTITY) -> NodeServer:
    return NodeServer(name, "ready", phase="ready", url=f"http://10.0.0.1:{port}", identity=identity)


def fleet(
    cluster: Scripted, tmp_path: Path, joins: list[str], events: list[tuple[str, dict[str, Any]]]
) -> ClusterFleet:
    made = ClusterFleet(
        SGLangSettings(), [cluster], run_dir=tmp_path, on_event=lambda name, **f: events.append((name, f))
    )

    async def join(url: str, name: str) -> bool:
        joins.append(name)
        return True

    made.on_join = join
    made.on_leave = lambda name: events.append(("left", {"host": name}))
    return made


def test_a_node_that_becomes_ready_joins_and_one_that_is_lost_leaves_for_good(tmp_path: Path) -> None:
    starting = NodeServer("node2", "starting", phase="weights")
    cluster = Scripted(
        [ready("node1", 1), starting],
        [ready("node1", 1), ready("node2", 2)],
        [ready("node1", 1), NodeServer("node2", "lost", url="http://10.0.0.1:2", failure="its step ended")],
        [ready("node1", 1), ready("node2", 2)],  # the same URL never comes back into this job
    )
    joins: list[str] = []
    events: list[tuple[str, dict[str, Any]]] = []
    made = fleet(cluster, tmp_path, joins, events)

    async def go() -> None:
        made.model = None
        made._add("lab/node1", "http://10.0.0.1:1")
        await made._ready()  # the open's look
        for _ in range(3):
            await made.refresh()

    asyncio.run(go())
    assert joins == ["lab/node2"]
    assert [(name, f.get("host")) for name, f in events] == [
        ("node_joined", "lab/node2"),
        ("left", "lab/node2"),
        ("node_lost", "lab/node2"),
    ]
    assert events[2][1]["reason"] == "lab/node2: lost: its step ended"
    workers = {w.host: w for w in made.workers}
    assert workers["lab/node2"].gone and not workers["lab/node1"].gone
    view = made.view()
    assert [w["state"] for w in view["workers"]] == ["direct", "direct"]
    assert [n["state"] for n in view["clusters"][0]["nodes"]] == ["ready", "ready"]


def test_a_node_with_another_model_is_refused_not_joined(tmp_path: Path) -> None:
    other = {**IDENTITY, "items": [["config.json", "sha256:bb"]]}
    cluster = Scripted([ready("node1", 1), ready("node2", 2, other)])
    joins: list[str] = []
    events: list[tuple[str, dict[str, Any]]] = []
    made = fleet(cluster, tmp_path, joins, events)

    async def go() -> None:
        from regen.engine.cluster.servers import one_model_on

        made.model = one_model_on([ready("node1", 1)], None)
        made._add("lab/node1", "http://10.0.0.1:1")
        await made.refresh()

    asyncio.run(go())
    assert joins == []
    assert events[0][0] == "node_refused" and "config.json differs" in str(events[0][1]["reason"])


def test_the_pane_shows_the_job_and_each_node() -> None:
    lines = cluster_lines(
        {
            "cluster": "lab",
            "kind": "slurm",
            "job_id": "7",
            "job_state": "RUNNING",
            "reason": None,
            "wanted": 3,
            "nodes": [
                {
                    "node": "node1",
                    "worker": "lab/node1",
                    "state": "ready",
                    "phase": "ready",
                    "url": "u",
                    "failure": None,
                },
                {
                    "node": "node2",
                    "worker": "lab/node2",
                    "state": "starting",
                    "phase": "kv pool",
                    "url": None,
                    "failure": None,
                },
                {
                    "node": "node3",
                    "worker": "lab/node3",
                    "state": "lost",
                    "phase": "ready",
                    "url": "v",
                    "failure": "its step ended",
                },
            ],
        },
        {
            "lab/node1": partial(
                SGLangServerView, running=12.0, queued=3.0, kv_usage=0.41, gen_throughput=1800.0
            )
        },
    )
    assert lines == [
        "lab slurm job 7 RUNNING · 1/3 ready",
        "  node1 ready · run 12 · queue 3 · KV 41% · 1,800 tok/s",
        "  node2 starting ▰▰▰▱▱▱▱▱ kv pool",
        "  node3 lost: its step ended",
    ]


def test_the_meter_charges_the_time_so_far_at_the_old_size_after_a_resize() -> None:
    meter = ShareMeter(8, now=0.0)
    mark = meter.enter(now=0.0)
    meter.resize(16, now=10.0)  # a node joined: 16 GPUs from t=10
    assert meter.leave(mark, now=20.0) == 8 * 10 + 16 * 10
    assert meter.busy_gpu_s(now=20.0) == 8 * 10 + 16 * 10


def test_a_node_knows_the_listener_on_its_port_is_its_own_servers() -> None:
    with socket.socket() as mine, socket.socket() as other:
        mine.bind(("127.0.0.1", 0))
        mine.listen()
        other.bind(("127.0.0.1", 0))
        port = mine.getsockname()[1]
        assert owns_listener(os.getpgid(0), port)
        assert not owns_listener(os.getpgid(0), other.getsockname()[1])  # bound, not listening
