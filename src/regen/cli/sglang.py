"""``regen sglang start|status|stop``: SGLang on the GPU hosts, from the command line.

Exit codes: 0 when every chosen host did what was asked (start: ready; status: answered; stop:
nothing of the server's process group left), 1 when a host did not (the message says which and
why), 2 for bad usage or settings. docs/sglang.md §12 has the rules.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import TYPE_CHECKING, Any

from regen.cli.arguments import add_settings_argument, chosen_hosts
from regen.cli.edge import EXIT_FAILURE, EXIT_OK, UsageError, fail, say

if TYPE_CHECKING:
    from regen.engine.config.settings import HostSettings, Settings

__all__ = ["add_parsers", "run"]


def add_parsers(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    sglang = commands.add_parser(
        "sglang",
        help="SGLang on the GPU hosts: preflight, launch, readiness, status, stop",
        description="Start, watch and stop the SGLang server on each [[hosts]] table's host.",
    )
    actions = sglang.add_subparsers(dest="sglang_command", metavar="ACTION", required=True)
    start = actions.add_parser(
        "start",
        help="preflight, launch detached, follow the startup to ready (exit 0 when every host is ready)",
        description="On each host: refuse with the reason unless the GPUs are free, the port is free, sglang "
        "imports, every flag regen passes is in launch_server --help and the model folder has its config.json; "
        "then launch in its own process group and follow the log's phases until the ready line and a 200 from "
        "/health_generate through an SSH tunnel. A server regen started that is up with the same flags is "
        "reported, not started again.",
    )
    status = actions.add_parser(
        "status", help="process, phase, readiness, version, model, load and GPUs per host"
    )
    status.add_argument("--json", action="store_true", help="machine-readable output")
    stop = actions.add_parser(
        "stop", help="TERM to the server's process group, a grace period, then KILL; nothing left after"
    )
    for sub in (start, status, stop):
        add_settings_argument(sub)
        sub.add_argument("--host", metavar="NAME", help="only this host (default: every [[hosts]] table)")
        sub.add_argument(
            "--cluster",
            metavar="NAME",
            help="only this [[clusters]] table: its job and one server per node (docs/clusters.md)",
        )
    start.add_argument("--json", action="store_true", help="machine-readable result after the progress lines")


def run(args: argparse.Namespace) -> int | None:
    """Run ``regen sglang ...``; None for any other command."""
    if getattr(args, "command", None) != "sglang":
        return None
    from regen.engine.config.loading import load_settings
    from regen.engine.runtime import run as run_loop

    settings = load_settings(args.settings, args.command)
    if args.cluster is not None or (args.host is None and settings.clusters and not settings.hosts):
        return _run_clusters(args, settings)
    hosts = chosen_hosts(settings, args.host, need_model=True)
    if args.sglang_command == "start":
        return run_loop(_start(args, settings, hosts))
    if args.sglang_command == "status":
        return run_loop(_status(args, settings, hosts))
    return run_loop(_stop(settings, hosts))


def _run_clusters(args: argparse.Namespace, settings: Settings) -> int:
    """The same actions on a cluster's nodes (cli/sglang_cluster.py)."""
    from regen.cli import sglang_cluster
    from regen.engine.runtime import run as run_loop

    if args.host is not None:
        raise UsageError("--host and --cluster: choose one")
    clusters = sglang_cluster.chosen_clusters(settings, args.cluster)
    if args.sglang_command == "start":
        return run_loop(sglang_cluster.start(settings, clusters, args.json))
    if args.sglang_command == "status":
        return run_loop(sglang_cluster.status(settings, clusters, args.json))
    return run_loop(sglang_cluster.stop(settings, clusters))


def _say(line: str) -> None:
    print(line, flush=True)


def _say_err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def _each(settings: Settings, hosts: list[HostSettings], work: Any) -> list[Any]:
    """``work(conn, spec)`` on every host at once, each over its own connection."""
    from regen.cli.hosts import _say_notices
    from regen.engine.host.sglang import ServerSpec
    from regen.engine.host.ssh import HostConnection

    notices = _say_notices()

    async def one(host: HostSettings) -> Any:
        conn = HostConnection(host, on_change=notices)
        try:
            return await work(conn, ServerSpec.of(settings.sglang, host, settings.hosts))
        finally:
            await conn.close()

    return list(await asyncio.gather(*(one(h) for h in hosts)))


async def _start(args: argparse.Namespace, settings: Settings, hosts: list[HostSettings]) -> int:
    import orjson

    from regen.cli.hosts import _say_notices
    from regen.engine.host.errors import HostError
    from regen.engine.host.identity import one_model
    from regen.engine.host.sglang import ServerSpec, start_server
    from regen.engine.host.ssh import HostConnection

    began = time.monotonic()
    # With --json, stdout holds only the JSON; the progress lines go to stderr.
    progress = _say_err if args.json else _say
    notices = _say_notices()
    conns = [HostConnection(h, on_change=notices) for h in hosts]
    try:
        # One model on every host, by content, before anything is launched on any of them.
        try:
            model = await one_model(conns, settings.sglang.weight_version)
        except HostError as exc:
            return fail(f"{exc}; nothing was launched")
        if model is not None:
            progress(f"model {model.digest} on {', '.join(h.name for h in hosts)}")
        specs = [ServerSpec.of(settings.sglang, h, settings.hosts) for h in hosts]
        results = list(
            await asyncio.gather(*(start_server(c, s, progress) for c, s in zip(conns, specs, strict=True)))
        )
    finally:
        await asyncio.gather(*(c.close() for c in conns))
    if args.json:
        sys.stdout.buffer.write(
            orjson.dumps({"hosts": [r.to_dict() for r in results]}, option=orjson.OPT_INDENT_2) + b"\n"
        )
        sys.stdout.flush()
    failed = [r for r in results if not r.ok]
    for r in results:
        if r.ok:
            progress(r.message)
    for r in failed:
        say(r.message)
        if r.tail:
            say(f"{r.host}: the log's last lines ({r.log}):")
            for line in r.tail:
                print(f"  {line}", file=sys.stderr)
    if failed:
        return EXIT_FAILURE
    progress(f"every host ready ({len(results)}) in {time.monotonic() - began:.1f} s")
    return EXIT_OK


def format_status(record: dict[str, Any]) -> list[str]:
    """A host's server in a few lines."""
    name = record["host"]
    if not record.get("ok"):
        return [f"{name}: {record.get('error')}"]
    state = record.get("state")
    head = f"{name}: {state}"
    if record.get("pid"):
        head += f" · pid {record['pid']}"
    if record.get("phase"):
        head += f" · phase {record['phase']}"
    head += f" · port {record['port']}"
    lines = [head]
    if record.get("version") or record.get("model_path"):
        lines.append(
            f"  sglang {record.get('version') or '?'} · {record.get('served_model_name') or '?'} "
            f"({record.get('model_path') or '?'})"
        )
    if record.get("running") is not None:
        lines.append(
            f"  running {record['running']:.0f} · queued {record['queued']:.0f} · "
            f"{record['gen_throughput']:.0f} tok/s · KV {record['kv_usage']:.0%} · "
            f"{record['retractions']:.0f} retractions"
        )
    elif record.get("metrics_error") and record.get("alive"):
        lines.append(f"  {record['metrics_error']}")
    if record.get("failure"):
        lines.append(f"  failure: {record['failure']}")
    gpus = record.get("gpus") or []
    if gpus:
        busy = sum(1 for g in gpus if g.get("processes"))
        lines.append(f"  GPUs {len(gpus)} · {busy} with compute processes")
    elif record.get("gpu_error"):
        lines.append(f"  GPUs: {record['gpu_error']}")
    return lines


async def _status(args: argparse.Namespace, settings: Settings, hosts: list[HostSettings]) -> int:
    import orjson

    from regen.engine.host.sglang import server_status

    records = await _each(settings, hosts, server_status)
    if args.json:
        sys.stdout.buffer.write(orjson.dumps({"hosts": records}, option=orjson.OPT_INDENT_2) + b"\n")
        sys.stdout.flush()
    else:
        print("\n".join(line for r in records for line in format_status(r)))
    failed = [r for r in records if not r["ok"]]
    for r in failed:
        say(r["error"])
    return EXIT_FAILURE if failed else EXIT_OK


async def _stop(settings: Settings, hosts: list[HostSettings]) -> int:
    from regen.engine.host.sglang import stop_server

    records = await _each(settings, hosts, stop_server)
    for r in records:
        if r["ok"]:
            print(r["message"], flush=True)
        else:
            say(r["message"])
    return EXIT_OK if all(r["ok"] for r in records) else EXIT_FAILURE
