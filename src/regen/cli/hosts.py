"""``regen inspect``, ``regen pull`` and ``regen push``: the command-line side of the GPU hosts.

``add_parsers`` adds the subcommands to regen's parser and ``run`` executes them, returning the
exit code (None for any other command). Exit codes: 0 when every host answered (bad prompt lines
are findings), 1 when a host could not be reached, refused its key or a transfer was refused
(the other hosts are still reported), 2 for bad usage or settings.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from regen.cli.arguments import add_settings_argument, chosen_hosts
from regen.cli.edge import EXIT_FAILURE, EXIT_OK, fail, say

if TYPE_CHECKING:
    from regen.engine.config.settings import HostSettings, Settings
    from regen.engine.host.ssh import HostConnection

__all__ = ["add_parsers", "run"]

COMMANDS = ("inspect", "pull", "push")


def add_parsers(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``inspect``, ``pull`` and ``push`` subcommands."""
    inspect = commands.add_parser(
        "inspect",
        help="SSH to the GPU hosts: every dataset, every line validated, GPUs, disk, model",
        description="Validate every line of every dataset under each host's data_root on the host itself, "
        "and report its GPUs, free disk, model folder and library versions. Exit 0 when every host "
        "answered (invalid lines are findings), 1 when a host could not be reached.",
    )
    add_settings_argument(inspect)
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    inspect.add_argument("--host", metavar="NAME", help="only this host (default: every [[hosts]] table)")

    for name, help_text, description in (
        (
            "pull",
            "datasets and tokenizer files from a GPU host into the workspace",
            "Copy datasets to <workspace>/datasets/<name>/prompts.jsonl and the model's tokenizer files to "
            "<workspace>/tokenizer/ over SFTP, verified by sha256; an interrupted pull resumes.",
        ),
        (
            "push",
            "results back beside their prompts on the GPU host, only ever appending",
            "Send each <workspace>/datasets/<name>/raw_responses.jsonl to the host beside its prompts.jsonl: "
            "the missing tail is appended when the host's file is a prefix of the local one; anything else "
            "is refused. Verified by sha256.",
        ),
    ):
        sub = commands.add_parser(name, help=help_text, description=description)
        add_settings_argument(sub)
        sub.add_argument("--host", metavar="NAME", help="the host (needed when there are several)")
        sub.add_argument("--json", action="store_true", help="machine-readable output")
        sub.add_argument("datasets", nargs="*", metavar="DATASET", help="dataset names (default: all)")


def run(args: argparse.Namespace) -> int | None:
    """Run ``inspect``, ``pull`` or ``push``; None for any other command."""
    if getattr(args, "command", None) not in COMMANDS:
        return None
    from regen.engine.config.loading import load_settings
    from regen.engine.runtime import run as run_loop

    settings = load_settings(args.settings, args.command)
    if args.command == "inspect":
        return run_loop(_inspect(args, settings, chosen_hosts(settings, args.host)))
    host = chosen_hosts(settings, args.host, one=True)[0]
    return run_loop(_transfer(args, settings, host))


def _say_notices() -> Any:
    """An on_change callback that prints each new reconnect notice once, as it happens."""
    said: dict[int, int] = {}

    def on_change(conn: HostConnection) -> None:
        start = said.get(id(conn), 0)
        for notice in conn.notices[start:]:
            print(f"regen: {notice}", file=sys.stderr, flush=True)
        said[id(conn)] = len(conn.notices)

    return on_change


async def _inspect(args: argparse.Namespace, settings: Settings, hosts: list[HostSettings]) -> int:
    import orjson

    from regen.engine.host.inspect import format_report, inspect_hosts

    records = await inspect_hosts(
        hosts, on_change=_say_notices(), weight_version=settings.sglang.weight_version
    )
    if args.json:
        sys.stdout.buffer.write(orjson.dumps({"hosts": records}, option=orjson.OPT_INDENT_2) + b"\n")
        sys.stdout.flush()
    else:
        print("\n".join(format_report(records)))
    failed = [r for r in records if not r["ok"]]
    for r in failed:
        say(r["error"])
    return EXIT_FAILURE if failed else EXIT_OK


async def _transfer(args: argparse.Namespace, settings: Settings, host: HostSettings) -> int:
    import orjson

    from regen.engine.host.errors import HostError
    from regen.engine.host.ssh import HostConnection
    from regen.engine.host.transfer import Outcome, pull, push

    def said(outcome: Outcome) -> None:
        if not args.json:
            detail = f" ({outcome.detail})" if outcome.detail else ""
            print(f"{host.name}: {outcome.what}: {outcome.action}{detail}", flush=True)

    conn = HostConnection(host, on_change=_say_notices())
    try:
        step = pull if args.command == "pull" else push
        report = await step(conn, settings.workspace, args.datasets, on_outcome=said)
    except HostError as exc:
        if args.json:
            out = {"host": host.name, "ok": False, "error": str(exc), "files": [], "warnings": []}
            sys.stdout.buffer.write(orjson.dumps(out, option=orjson.OPT_INDENT_2) + b"\n")
            sys.stdout.flush()
        return fail(str(exc))
    finally:
        await conn.close()
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2) + b"\n")
        sys.stdout.flush()
    for warning in report.warnings:
        say(f"warning: {warning}")
    refused = [o for o in report.outcomes if not o.ok]
    for o in refused:
        say(f"{host.name}: {o.what}: {o.detail}")
    if args.command == "pull" and report.ok and not report.warnings and not args.json:
        print(
            f"{host.name}: workspace {settings.workspace} ready: a run with no datasets or tokenizer set uses it"
        )
    return EXIT_FAILURE if refused else EXIT_OK


def fetch_tokenizer_for_run(settings: Settings) -> int | None:
    """`regen run` with SGLang and a tokenizer to fetch: the files from a host's model folder into the
    workspace (engine/host/transfer.py `fetch_tokenizer`, what `regen pull` does for them), one line
    when anything came, and the settings pointed at them. None to go on, else the exit code.

    A tokenizer the workspace holds already is checked against the host again (``up to date`` costs
    a few hashes): an earlier fetch cut short is finished, a host whose files changed is refused.
    """
    from regen.engine.config.needs import tokenizer_hosts
    from regen.engine.config.workspace import tokenizer_dir

    folder = tokenizer_dir(settings.workspace)
    wanted = settings.tokenizer.path is None or settings.tokenizer.path == folder
    if "sglang" not in settings.job.chosen_backends or not wanted or not tokenizer_hosts(settings):
        return None
    # Imported past the return: asyncssh costs an OpenRouter-only start a fifth of a second.
    from regen.engine.host.errors import HostError
    from regen.engine.host.transfer import fetch_tokenizer
    from regen.engine.runtime import run as run_loop

    try:
        report = run_loop(fetch_tokenizer(settings.hosts, settings.workspace, on_change=_say_notices()))
    except HostError as exc:
        return fail(str(exc))
    for warning in report.warnings:
        say(f"warning: {warning}")
    refused = [o for o in report.outcomes if not o.ok]
    for o in refused:
        say(f"{report.host}: {o.what}: {o.detail}")
    if refused or not report.outcomes:
        return fail(f"{report.host}: no usable tokenizer files fetched; tokenizer.path is empty")
    came = [o for o in report.outcomes if o.action != "up to date"]
    if came:
        print(
            f"regen: tokenizer.path is empty: fetched {len(came)} tokenizer files ({sum(o.bytes for o in came):,} bytes) "
            f"from {report.host}'s model folder into {folder}, sha256-verified",
            file=sys.stderr,
            flush=True,
        )
    settings.tokenizer.path = folder
    return None
