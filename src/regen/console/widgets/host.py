"""The GPU host pane: per host, the connection, GPUs, disk and the last inspect, from the job's snapshot.

The job polls the hosts (engine/host/monitor.py); this pane only draws the snapshot's ``hosts``
list. Without hosts it says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from textual.widgets import Static

NO_HOST = "no GPU host configured"
# SGLang's startup phases, in order (engine/host/scripts/sglanglog.py), for the progress bar.
PHASES = ("weights", "weights loaded", "kv pool", "cuda graphs", "cuda graphs captured", "scheduler", "http", "ready")


def _gib(mib: Any) -> str:
    return f"{mib / 1024:.0f}" if isinstance(mib, int | float) else "?"


def _free(d: Any) -> str | None:
    if not isinstance(d, dict) or not isinstance(d.get("free_bytes"), int):
        return None
    free = d["free_bytes"] / 1e9
    return f"{free / 1000:.1f}T" if free >= 1000 else f"{free:.0f}G"


def _ago(ts: Any, now: float) -> str:
    if not isinstance(ts, int | float):
        return ""
    seconds = max(0, int(now - ts))
    return f"{seconds}s ago" if seconds < 120 else f"{seconds // 60}m ago"


def host_lines(host: dict[str, Any], now: float) -> list[str]:
    """A host in a few short lines (the pane is about 42 columns wide)."""
    state = str(host.get("state") or "?")
    retries = host.get("retries") or 0
    head = f"{host.get('name')} {state}" + (f" · {retries} reconnects" if retries else "")
    lines = [head]
    error = host.get("error")
    if error and state != "connected":
        lines.append(f"  {error}")
    gpus = host.get("gpus") or []
    if gpus:
        cells = []
        for g in gpus:
            util = g.get("utilization_pct")
            cells.append(
                f"{g.get('index')}:{_gib(g.get('memory_used_mib'))}/{_gib(g.get('memory_total_mib'))}G "
                f"{'–' if util is None else f'{util}%'}"
            )
        lines.append("  GPU " + "  ".join(cells))
    elif host.get("gpu_error"):
        lines.append(f"  GPU: {host['gpu_error']}")
    disk = host.get("disk") or {}
    free = [
        f"{what} {f} free"
        for what, key in (("data", "data_root"), ("model", "model_path"))
        if (f := _free(disk.get(key)))
    ]
    if free:
        lines.append("  disk " + " · ".join(free))
    inspect = host.get("inspect")
    if isinstance(inspect, dict):
        when = _ago(inspect.get("finished_at"), now)
        if inspect.get("state") == "running":
            lines.append("  inspecting…" + (f" (last {when})" if when else ""))
        elif inspect.get("state") == "failed":
            lines.append(f"  inspect failed: {inspect.get('error')}")
        if "datasets" in inspect:
            invalid = inspect.get("invalid") or 0
            lines.append(
                f"  {inspect.get('datasets')} datasets · {inspect.get('prompts', 0):,} prompts · "
                f"{invalid:,} invalid" + (f" · {when}" if when and inspect.get("state") == "done" else "")
            )
    lines.extend(sglang_lines(host))
    return lines


def _bar(phase: Any) -> str:
    done = PHASES.index(phase) + 1 if phase in PHASES else 0
    return "▰" * done + "▱" * (len(PHASES) - done)


def sglang_lines(host: dict[str, Any]) -> list[str]:
    """The host's SGLang server: state and startup phase, version, load, the tunnel, a start or stop."""
    lines: list[str] = []
    server = host.get("sglang")
    if isinstance(server, dict):
        if not server.get("ok", True):
            lines.append(f"  SGLang: {server.get('error')}")
        else:
            state = server.get("state") or "?"
            head = f"  SGLang {state}"
            version = server.get("version") or server.get("launched_version")
            if version:
                head += f" {version}"
            phase = server.get("phase")
            if state in ("running", "starting", "not answering") or (state == "dead" and phase):
                head += f" {_bar(phase)} {phase or 'launching'}"
            lines.append(head)
            if server.get("running") is not None:
                kv = server.get("kv_usage")
                lines.append(
                    f"  run {server['running']:.0f} · queue {server.get('queued') or 0:.0f} · "
                    f"KV {'?' if kv is None else f'{kv:.0%}'} · {server.get('gen_throughput') or 0:,.0f} tok/s"
                )
            if server.get("failure"):
                lines.append(f"  failed: {str(server['failure'])[:120]}")
    tunnel = host.get("tunnel")
    if isinstance(tunnel, dict):
        drops = tunnel.get("drops") or 0
        said = f"  tunnel {tunnel.get('state')}" + (f" · {drops} drops" if drops else "")
        if tunnel.get("state") != "open" and tunnel.get("error"):
            said += f": {tunnel['error']}"
        lines.append(said)
    action = host.get("sglang_action")
    if isinstance(action, dict):
        what = "start" if action.get("what") == "start" else "stop"
        if action.get("state") == "running":
            progress = action.get("progress") or []
            lines.append(f"  {'starting' if what == 'start' else 'stopping'} SGLang…")
            if progress:
                lines.append(f"  {str(progress[-1]).removeprefix(str(host.get('name')) + ': ')[:120]}")
        elif action.get("state") == "failed":
            lines.append(f"  {what} failed: {str(action.get('message') or '')[:160]}")
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

    def show(self, snap: dict[str, Any]) -> None:
        """Repaint from the snapshot's "hosts" list (and only when the text changed)."""
        hosts = snap.get("hosts")
        if not isinstance(hosts, list) or not hosts:
            text = NO_HOST
        else:
            now = self.clock()
            text = "\n".join(line for h in hosts if isinstance(h, dict) for line in host_lines(h, now))
        if text != self.text:
            self.text = text
            self.update(text)
