"""The GPU host pane: per host, the connection, GPUs, disk and the last inspect, from the job's snapshot;
per cluster, its job and each node's server.

The job polls the hosts (engine/host/monitor.py) and watches the clusters (engine/cluster/fleet.py);
this pane only draws the snapshot's ``hosts`` list and the SGLang lane's clusters. Without either it
says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import cast

from textual.widgets import Static

from regen.engine.schema import (
    ClusterView,
    DiskView,
    HostView,
    SGLangAccount,
    SGLangServerView,
    Snapshot,
)

NO_HOST = "no GPU host configured"
# SGLang's startup phases, in order (engine/host/scripts/sglanglog.py), for the progress bar.
PHASES = (
    "weights",
    "weights loaded",
    "kv pool",
    "cuda graphs",
    "cuda graphs captured",
    "scheduler",
    "http",
    "ready",
)


def _gib(mib: float | None) -> str:
    return "?" if mib is None else f"{mib / 1024:.0f}"


def _free(d: DiskView | None) -> str | None:
    free_bytes = None if d is None else d.get("free_bytes")
    if free_bytes is None:
        return None
    free = free_bytes / 1e9
    return f"{free / 1000:.1f}T" if free >= 1000 else f"{free:.0f}G"


def _ago(ts: float | None, now: float) -> str:
    if ts is None:
        return ""
    seconds = max(0, int(now - ts))
    return f"{seconds}s ago" if seconds < 120 else f"{seconds // 60}m ago"


def host_lines(host: HostView, now: float) -> list[str]:
    """A host in a few short lines (the pane is about 42 columns wide)."""
    state = host["state"] or "?"
    retries = host["retries"]
    head = f"{host['name']} {state}" + (f" · {retries} reconnects" if retries else "")
    lines = [head]
    error = host["error"]
    if error and state != "connected":
        lines.append(f"  {error}")
    gpus = host["gpus"]
    if gpus:
        cells = []
        for g in gpus:
            util = g["utilization_pct"]
            cells.append(
                f"{g['index']}:{_gib(g['memory_used_mib'])}/{_gib(g['memory_total_mib'])}G "
                f"{'–' if util is None else f'{util}%'}"
            )
        lines.append("  GPU " + "  ".join(cells))
    elif host["gpu_error"]:
        lines.append(f"  GPU: {host['gpu_error']}")
    disk = host["disk"]
    free = [
        f"{what} {f} free"
        for what, f in (("data", _free(disk.get("data_root"))), ("model", _free(disk.get("model_path"))))
        if f
    ]
    if free:
        lines.append("  disk " + " · ".join(free))
    inspect = host["inspect"]
    if inspect is not None:
        when = _ago(inspect.get("finished_at"), now)
        if inspect["state"] == "running":
            lines.append("  inspecting…" + (f" (last {when})" if when else ""))
        elif inspect["state"] == "failed":
            lines.append(f"  inspect failed: {inspect.get('error')}")
        if "datasets" in inspect:
            invalid = inspect.get("invalid") or 0
            lines.append(
                f"  {inspect['datasets']} datasets · {inspect.get('prompts', 0):,} prompts · "
                f"{invalid:,} invalid" + (f" · {when}" if when and inspect["state"] == "done" else "")
            )
    lines.extend(sglang_lines(host))
    return lines


def _bar(phase: str | None) -> str:
    done = PHASES.index(phase) + 1 if phase in PHASES else 0
    return "▰" * done + "▱" * (len(PHASES) - done)


def sglang_lines(host: HostView) -> list[str]:
    """The host's SGLang server: state and startup phase, version, load, the tunnel, a start or stop."""
    lines: list[str] = []
    server = host["sglang"]
    if server is not None:
        if not server["ok"]:
            lines.append(f"  SGLang: {server['error']}")
        else:
            state = server["state"] or "?"
            head = f"  SGLang {state}"
            version = server["version"] or server["launched_version"]
            if version:
                head += f" {version}"
            phase = server["phase"]
            if state in ("running", "starting", "not answering") or (state == "dead" and phase):
                head += f" {_bar(phase)} {phase or 'launching'}"
            lines.append(head)
            running = server["running"]
            if running is not None:
                kv = server["kv_usage"]
                lines.append(
                    f"  run {running:.0f} · queue {server['queued'] or 0:.0f} · "
                    f"KV {'?' if kv is None else f'{kv:.0%}'} · {server['gen_throughput'] or 0:,.0f} tok/s"
                )
            if server["failure"]:
                lines.append(f"  failed: {server['failure'][:120]}")
    tunnel = host["tunnel"]
    if tunnel is not None:
        drops = tunnel["drops"]
        said = f"  tunnel {tunnel['state']}" + (f" · {drops} drops" if drops else "")
        if tunnel["state"] != "open" and tunnel["error"]:
            said += f": {tunnel['error']}"
        lines.append(said)
    action = host["sglang_action"]
    if action is not None:
        what = "start" if action["what"] == "start" else "stop"
        if action["state"] == "running":
            progress = action["progress"]
            lines.append(f"  {'starting' if what == 'start' else 'stopping'} SGLang…")
            if progress:
                lines.append(f"  {progress[-1].removeprefix(host['name'] + ': ')[:120]}")
        elif action["state"] == "failed":
            lines.append(f"  {what} failed: {(action['message'] or '')[:160]}")
    return lines


def clusters_of(snap: Snapshot) -> tuple[list[ClusterView], dict[str, SGLangServerView]]:
    """The clusters the SGLang lane's fleet comes from, and its servers by worker name."""
    clusters: list[ClusterView] = []
    servers: dict[str, SGLangServerView] = {}
    for lane in snap["lanes"]:
        if lane["account"].get("kind") != "sglang":
            continue
        account = cast(SGLangAccount, lane["account"])
        fleet = account["fleet"]
        if fleet is not None:
            clusters.extend(fleet["clusters"])
        servers.update({server["worker"]: server for server in account["servers"]})
    return clusters, servers


def cluster_lines(cluster: ClusterView, servers: dict[str, SGLangServerView]) -> list[str]:
    """A cluster's job and a line per node: its state, startup phase or load (docs/clusters.md)."""
    ready = sum(1 for n in cluster["nodes"] if n["state"] == "ready")
    waiting = f" ({cluster['reason']})" if cluster["reason"] else ""
    lines = [
        f"{cluster['cluster']} {cluster['kind']} job {cluster['job_id'] or '-'} {cluster['job_state'] or '?'}"
        f"{waiting} · {ready}/{cluster['wanted']} ready"
    ]
    for node in cluster["nodes"]:
        line = f"  {node['node']} {node['state']}"
        server = servers.get(node["worker"])
        if node["state"] == "starting":
            line += f" {_bar(node['phase'])} {node['phase'] or 'launching'}"
        elif node["state"] == "ready" and server is not None and server["running"] is not None:
            kv = server["kv_usage"]
            line += (
                f" · run {server['running']:.0f} · queue {server['queued'] or 0:.0f} · "
                f"KV {'?' if kv is None else f'{kv:.0%}'} · {server['gen_throughput'] or 0:,.0f} tok/s"
            )
        elif node["failure"] and node["state"] != "ready":
            line += f": {node['failure'][:100]}"
        lines.append(line)
    return lines


def sglang_stop_text(hosts: list[str]) -> str:
    """What stopping SGLang from the console does, for its confirmation."""
    where = ", ".join(hosts) if hosts else "every GPU host"
    return (
        f"TERM to the SGLang server's process group on {where}, then KILL after sglang.stop_grace_s. "
        "Requests in flight there fail and are sent again once a server answers (to another host behind "
        "the router). Only the server regen started is touched (its pid file), never a process by name."
    )


class HostPane(Static):
    """Shows each GPU host the job reports, else that there is none."""

    DEFAULT_CSS = """
    HostPane {
        padding: 0 1;
        background: $surface;
        color: $text-muted;
    }
    """

    def __init__(self, *, id: str | None = None, clock: Callable[[], float] = time.time) -> None:
        super().__init__(NO_HOST, id=id, markup=False)
        self.border_title = "Host"
        self.text = NO_HOST
        self.clock = clock

    def show(self, snap: Snapshot) -> None:
        """Repaint from the snapshot's "hosts" list (and only when the text changed)."""
        hosts = snap["hosts"]
        clusters, servers = clusters_of(snap)
        if not hosts and not clusters:
            text = NO_HOST
        else:
            now = self.clock()
            lines = [line for h in hosts for line in host_lines(h, now)]
            lines += [line for c in clusters for line in cluster_lines(c, servers)]
            text = "\n".join(lines)
        if text != self.text:
            self.text = text
            self.update(text)
