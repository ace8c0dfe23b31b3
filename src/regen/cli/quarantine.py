"""``regen quarantine --route NAME [--since TIME]``: a route found bad after the fact (docs/fidelity.md).

Its rows move to quarantine.jsonl, their money becomes waste with cause `fidelity`, and their prompts
are sent again by the next ``regen run``; nothing is deleted. Heavy imports happen inside ``run``.
"""

from __future__ import annotations

import argparse
import datetime as dt

from regen.cli.arguments import add_settings_argument
from regen.cli.edge import EXIT_OK, RegenError

__all__ = ["add_parsers", "run"]


def _instant(text: str) -> float:
    """Epoch seconds from an ISO 8601 time (local unless it names its zone) or a number."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time: {text!r} (e.g. 2026-12-02T09:30 or 2026-12-02T09:30Z)"
        ) from None


def add_parsers(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = commands.add_parser(
        "quarantine",
        help="take back a route's rows: to quarantine.jsonl, their prompts sent again (docs/fidelity.md)",
        description="Move every row a route served (since --since) to the run folder's quarantine.jsonl, "
        "book its money as waste (fidelity) and leave its prompt to the next regen run. Needs no job running.",
    )
    add_settings_argument(parser)
    parser.add_argument(
        "--route", required=True, metavar="NAME", help="the provider as rows name it, e.g. Together"
    )
    parser.add_argument(
        "--since", type=_instant, default=None, metavar="TIME", help="only rows made at or after TIME"
    )
    parser.add_argument("--why", default=None, help="what the journal says (default: the command)")


def run(args: argparse.Namespace) -> int | None:
    if getattr(args, "command", None) != "quarantine":
        return None
    from regen.engine.config.loading import load_settings
    from regen.engine.data.datasets import discover
    from regen.engine.run.requeue import requeue_route
    from regen.engine.run.runlock import RunLock

    settings = load_settings(args.settings, "quarantine")
    datasets = discover(settings.job.datasets, settings.job.dataset_roots)
    run_dir = settings.job.run_dir
    lock = RunLock(run_dir)
    lock.take()  # RunLocked: a job runs in this folder
    why = args.why or f"regen quarantine --route {args.route}" + (
        "" if args.since is None else f" --since {args.since}"
    )
    try:
        rows, amount = requeue_route(run_dir, datasets, args.route, args.since, why)
    except OSError as exc:
        raise RegenError(f"{exc.filename or run_dir}: {exc.strerror or exc}") from None
    finally:
        lock.release()
    if not rows:
        print(f"no rows of {args.route} to take back in {run_dir}")
        return EXIT_OK
    print(
        f"{rows} rows of {args.route} moved to {run_dir / 'quarantine.jsonl'}; ${amount:.4f} booked as waste "
        "(fidelity); the next regen run sends their prompts again"
    )
    return EXIT_OK
