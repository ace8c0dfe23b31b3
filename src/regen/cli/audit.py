"""``regen audit [--json]``: the canary audit (docs/fidelity.md, "The canary audit").

The plan (prompts, providers, what it costs at worst) is printed before anything is sent; an audit
that does not fit in what job.budget_usd has left is refused (exit 1). Heavy imports happen in ``run``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from regen.cli.arguments import add_settings_argument
from regen.cli.edge import EXIT_OK, RegenError, UsageError

__all__ = ["add_parsers", "run"]


def add_parsers(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = commands.add_parser(
        "audit",
        help="send a seeded sample of the prompts to each allowed provider alone at temperature 0, "
        "and compare the answers in token ids (docs/fidelity.md)",
    )
    add_settings_argument(parser)
    parser.add_argument(
        "--prompts", type=int, default=8, metavar="N", help="prompts in the sample (default 8)"
    )
    parser.add_argument("--seed", type=int, default=0, help="picks the sample, and is sent as `seed`")
    parser.add_argument("--max-tokens", type=int, default=256, metavar="N", help="output cap per answer")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int | None:
    if getattr(args, "command", None) != "audit":
        return None
    from regen.engine.backends.openrouter.audit import plan_audit, run_audit
    from regen.engine.config.loading import load_settings
    from regen.engine.data.tokenizer import TargetTokenizer
    from regen.engine.run.runlock import RunLock
    from regen.engine.runtime import run as run_loop

    if args.prompts < 1 or args.max_tokens < 1:
        raise UsageError("--prompts and --max-tokens must be at least 1")
    settings = load_settings(args.settings, "audit")
    path = settings.tokenizer.path
    if path is None:
        raise UsageError(
            "tokenizer.path: empty, but the audit compares answers in the target tokenizer's ids; "
            "set it (or run regen pull)"
        )
    tokenizer = TargetTokenizer.from_settings(settings.tokenizer, path=path)
    plan = run_loop(plan_audit(settings, args.prompts, args.seed, args.max_tokens))
    print(plan.describe(), file=sys.stderr if args.json else sys.stdout, flush=True)
    if not plan.fits:
        raise RegenError(f"the audit could cost ${plan.worst_usd:.4f}, more than job.budget_usd has left")
    lock = RunLock(settings.job.run_dir)
    lock.take()  # its money goes into the run's journal: not while a job writes it (RunLocked)
    try:
        report: dict[str, Any] = run_loop(run_audit(settings, plan, tokenizer.encode))
    finally:
        lock.release()
    if args.json:
        print(json.dumps(report, indent=2))
        return EXIT_OK
    for row in report["providers"]:
        prefix = "-" if row["prefix_median"] is None else f"{row['prefix_median']:.0f}"
        similar = "-" if row["similarity_mean"] is None else f"{row['similarity_mean']:.2f}"
        print(
            f"  {row['provider']:<16} {row['verdict']:<10} common prefix (median) {prefix:>5} ids, "
            f"similarity {similar} to the {report['reference']} ({row['answers']} answers)"
        )
    print(f"spent ${report['spent_usd']:.4f} (planned at most ${report['plan_usd']:.4f})")
    return EXIT_OK
