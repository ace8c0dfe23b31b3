"""``regen sglang start|status|stop --cluster NAME``: SGLang on a cluster's nodes (docs/clusters.md).

Exit codes as for hosts (cli/sglang.py): 0 when the cluster did what was asked (start: every node
ready; status: the cluster answered; stop: the job and every step gone), 1 when it did not (the
message names the cluster, the node and why), 2 for bad usage or settings.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import TYPE_CHECKING, Any

import orjson

from regen.cli.edge import EXIT_FAILURE, EXIT_OK, UsageError, say

if TYPE_CHECKING:
    from regen.engine.cluster.base import ClusterStatus, NodeServer
    from regen.engine.config.settings import ClusterSettings, Settings

__all__ = ["chosen_clusters", "format_cluster", "start", "status", "stop"]


def chosen_clusters(settings: Settings, name: str | None) -> list[ClusterSettings]:
    """``--cluster NAME``'s table, else every [[clusters]] table; a UsageError says what is missing."""
    clusters = list(settings.clusters)
    if not clusters:
        raise UsageError("no clusters in the settings: add a [[clusters]] table (see settings.example.toml)")
    if name is None:
        return clusters
    chosen = [c for c in clusters if c.name == name]
    if not chosen:
        raise UsageError(
            f"--cluster {name}: no such cluster (clusters: {', '.join(c.name for c in clusters)})"
        )
    return chosen


def _json(payload: dict[str, Any]) -> None:
    sys.stdout.buffer.write(orjson.dumps(payload, option=orjson.OPT_INDENT_2) + b"\n")
    sys.stdout.flush()


async def start(settings: Settings, clusters: list[ClusterSettings], as_json: bool) -> int:
    from regen.engine.cluster.kinds import cluster_of
    from regen.engine.cluster.servers import failure_lines, start_servers

    began = time.monotonic()
    progress = (lambda line: print(line, file=sys.stderr, flush=True)) if as_json else _say_out

    async def one(table: ClusterSettings) -> Any:
        cluster = cluster_of(table, settings.sglang)
        return await start_servers(
            cluster,
            progress,
            ready_timeout_s=settings.sglang.ready_timeout_s,
            weight_version=settings.sglang.weight_version,
        )

    outcomes = list(await asyncio.gather(*(one(c) for c in clusters)))
    if as_json:
        _json({"clusters": [{**o.status.to_dict(), "ok": o.ok, "message": o.message} for o in outcomes]})
    failed = [o for o in outcomes if not o.ok]
    for outcome in outcomes:
        if outcome.ok:
            progress(outcome.message)
    for outcome in failed:
        say(outcome.message)
        for node in outcome.failed:
            for line in failure_lines(node):
                print(line, file=sys.stderr)
        if outcome.status.queued:
            say(f"the job is left as it is: regen sglang stop --cluster {outcome.status.cluster} ends it")
    if failed:
        return EXIT_FAILURE
    progress(f"every cluster ready ({len(outcomes)}) in {time.monotonic() - began:.1f} s")
    return EXIT_OK


def _say_out(line: str) -> None:
    print(line, flush=True)


def _node_lines(node: NodeServer, load: dict[str, Any] | None) -> list[str]:
    head = f"  {node.node}: {node.state}"
    if node.phase and node.state != "ready":
        head += f" · phase {node.phase}"
    if node.url:
        head += f" · {node.url}"
    if node.version:
        head += f" · sglang {node.version}"
    lines = [head]
    if load and load.get("running") is not None:
        lines.append(
            f"    running {load['running']:.0f} · queued {load['queued']:.0f} · "
            f"{load['gen_throughput']:.0f} tok/s · KV {load['kv_usage']:.0%}"
        )
    elif load and load.get("metrics_error"):
        lines.append(f"    {load['metrics_error']}")
    if node.failure:
        lines.append(f"    {node.failure}" + (f" (log {node.log})" if node.log else ""))
    return lines


def format_cluster(status: ClusterStatus, loads: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """A cluster's job and its nodes in a few lines."""
    if status.job_id is None:
        return [
            f"{status.cluster}: no job of regen's ({status.kind}); regen sglang start --cluster {status.cluster}"
        ]
    waiting = f" ({status.reason})" if status.reason else ""
    head = (
        f"{status.cluster}: {status.kind} job {status.job_id} {status.job_state}{waiting} · "
        f"{len(status.ready)} of {status.wanted} nodes ready · files {status.folder}"
    )
    lines = [head]
    for node in status.nodes:
        lines.extend(_node_lines(node, (loads or {}).get(node.node)))
    return lines


async def status(settings: Settings, clusters: list[ClusterSettings], as_json: bool) -> int:
    from regen.engine.cluster.kinds import cluster_of
    from regen.engine.host.sglang import http_status

    async def one(table: ClusterSettings) -> tuple[ClusterStatus, dict[str, dict[str, Any]]]:
        state = await cluster_of(table, settings.sglang).watch()
        ready = state.ready
        answers = await asyncio.gather(*(http_status(str(n.url)) for n in ready))
        return state, {n.node: a for n, a in zip(ready, answers, strict=True)}

    looks = list(await asyncio.gather(*(one(c) for c in clusters)))
    if as_json:
        _json(
            {
                "clusters": [
                    {**s.to_dict(), "nodes": [{**n.to_dict(), "server": loads.get(n.node)} for n in s.nodes]}
                    for s, loads in looks
                ]
            }
        )
    else:
        print("\n".join(line for s, loads in looks for line in format_cluster(s, loads)), flush=True)
    return EXIT_OK


async def stop(settings: Settings, clusters: list[ClusterSettings]) -> int:
    from regen.engine.cluster.kinds import cluster_of

    async def one(table: ClusterSettings) -> str:
        cluster = cluster_of(table, settings.sglang)
        before = await cluster.watch()
        if not before.queued:
            return f"{table.name}: no job of regen's is running" + (
                f" (job {before.job_id} is {before.job_state})" if before.job_id else ""
            )
        after = await cluster.cancel()
        return (
            f"{table.name}: job {after.job_id} cancelled ({after.job_state}); "
            f"{len(before.nodes)} nodes' servers and steps are gone"
        )

    for line in await asyncio.gather(*(one(c) for c in clusters)):
        print(line, flush=True)
    return EXIT_OK
