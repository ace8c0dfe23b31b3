"""``regen verify`` and ``regen export``: the command-line side of checking and handing over data.

``add_parsers`` adds both subcommands to regen's parser and ``run`` executes them, returning the
exit code (None for any other command). Heavy imports (transformers, the engine modules) happen
inside ``run`` so ``regen --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from regen.cli.arguments import add_settings_argument
from regen.cli.edge import EXIT_FAILURE, EXIT_OK, UsageError, say

if TYPE_CHECKING:
    from regen.engine.config.settings import Settings
    from regen.engine.data.datasets import Dataset
    from regen.engine.data.tokenizer import TargetTokenizer
    from regen.engine.data.verify import DatasetReport

__all__ = ["add_parsers", "run"]

COMMANDS = ("verify", "export")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def add_parsers(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``verify`` and ``export`` subcommands."""
    verify = commands.add_parser(
        "verify",
        help="check results against prompts: one row per prompt, the invariants of docs/data-contract.md §4",
        description="Check raw_responses.jsonl of each dataset against its prompts.jsonl and the "
        "data contract's invariants. Exit 1 on any violation.",
    )
    add_settings_argument(verify)
    verify.add_argument(
        "datasets",
        nargs="*",
        type=Path,
        metavar="DATASET_DIR",
        help="dataset folders (default: from settings)",
    )
    verify.add_argument(
        "--tokenizer",
        type=Path,
        metavar="PATH",
        help="tokenizer folder (default: tokenizer.path from settings)",
    )
    verify.add_argument(
        "--require-ids", action="store_true", help="rows without token ids are violations, not just counted"
    )
    verify.add_argument(
        "--check-prompts",
        action="store_true",
        help="re-render every prompt and compare with prompt_ids (slower)",
    )
    verify.add_argument(
        "--examples", type=_positive, default=5, metavar="N", help="violations shown per rule"
    )
    verify.add_argument("--json", action="store_true", help="machine-readable output")

    export = commands.add_parser(
        "export",
        help="training-ready files from finished rows",
        description="Write training files from raw_responses.jsonl: SpecForge pre-tokenized records "
        "(default) or chat conversations. Written atomically; nothing partial is left on failure.",
    )
    add_settings_argument(export)
    export.add_argument(
        "datasets",
        nargs="*",
        type=Path,
        metavar="DATASET_DIR",
        help="dataset folders (default: from settings)",
    )
    export.add_argument("--format", choices=("specforge", "conversations"), default="specforge")
    export.add_argument(
        "--status", default="ok", metavar="ok,truncated", help="row statuses to export (default: ok)"
    )
    export.add_argument(
        "--max-length",
        type=_positive,
        default=None,
        metavar="N",
        help="drop (and count) rows longer than N tokens",
    )
    export.add_argument(
        "--output",
        type=Path,
        default=None,
        metavar="FILE",
        help="one file for all datasets (default: <dataset>/export.<format>.jsonl each)",
    )
    export.add_argument(
        "--mask-last-prompt-token",
        action="store_true",
        help="also train on the last prompt token (SpecForge issue #885 workaround)",
    )
    export.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int | None:
    """Run ``verify`` or ``export``; None for any other command."""
    if getattr(args, "command", None) not in COMMANDS:
        return None
    from regen.engine.config.loading import load_settings

    settings = load_settings(args.settings, args.command)
    datasets = _datasets(args, settings)
    if args.command == "verify":
        return _verify(args, settings, datasets)
    return _export(args, datasets)


def _datasets(args: argparse.Namespace, settings: Settings) -> list[Dataset]:
    from regen.engine.data.datasets import discover

    if args.datasets:
        return discover(args.datasets, [])
    found = discover(settings.job.datasets, settings.job.dataset_roots)
    if not found:
        raise UsageError(
            "no datasets: name dataset folders, or set job.datasets / job.dataset_roots in settings"
        )
    return found


# ---------------------------------------------------------------------------------------------
# verify


def _tokenizer(args: argparse.Namespace, settings: Settings) -> TargetTokenizer | None:
    path = args.tokenizer or settings.tokenizer.path
    if path is None:
        return None
    from regen.engine.data.tokenizer import TargetTokenizer

    return TargetTokenizer.from_settings(settings.tokenizer, path=path)


def _verify(args: argparse.Namespace, settings: Settings, datasets: list[Dataset]) -> int:
    import orjson

    from regen.engine.data.verify import verify_dataset
    from regen.engine.run.recovery import journal_spend
    from regen.engine.run.segments import history

    tokenizer = _tokenizer(args, settings)
    attempts = settings.job.run_dir / "attempts.jsonl"
    # The file, or only its segments: a rotation a crash cut short (engine/run/segments.py).
    spend = journal_spend(attempts) if any(part.is_file() for part in history(attempts)) else None
    reports = []
    for ds in datasets:
        # A journal from another run says nothing about this dataset's money.
        journal = spend if spend is not None and ds.name in spend else None
        report = verify_dataset(
            ds,
            tokenizer,
            require_ids=args.require_ids,
            check_prompts=args.check_prompts,
            journal=journal,
            examples_per_rule=args.examples,
        )
        if journal is None:
            report.notes.append("no attempt journal for this dataset: cost not compared")
        reports.append(report)
        if not args.json:
            _print_report(report)
    failed = [r for r in reports if r.failed]
    if args.json:
        out: dict[str, Any] = {"ok": not failed, "tokenizer": tokenizer.info() if tokenizer else None}
        out["datasets"] = [r.to_dict() for r in reports]
        sys.stdout.buffer.write(orjson.dumps(out, option=orjson.OPT_INDENT_2) + b"\n")
        sys.stdout.flush()
    else:
        total = sum(sum(r.violations.values()) for r in failed)
        if failed:
            names = ", ".join(r.name for r in failed)
            print(f"verify: {total} violation(s) in {len(failed)} of {len(reports)} dataset(s): {names}")
        else:
            print(f"verify: {len(reports)} dataset(s), no violations")
    return EXIT_FAILURE if failed else EXIT_OK


def _n(value: int) -> str:
    return f"{value:,}"


def _print_report(r: DatasetReport) -> None:
    print(
        f"{r.name}: {_n(r.rows)} rows (ok {_n(r.ok)}, truncated {_n(r.truncated)}); "
        f"{_n(r.missing)} of {_n(r.prompts - r.invalid_prompts)} valid prompts without a row"
        + (f"; {_n(r.invalid_prompts)} invalid prompt lines" if r.invalid_prompts else "")
    )
    print(
        f"  tokens: prompt {_n(r.prompt_tokens)}, output {_n(r.output_tokens)}"
        f" (backend's completion count {_n(r.native_completion_tokens)})"
    )
    journal = "" if r.journal_spend is None else f" (attempt journal ${r.journal_spend:.6f})"
    no_cost = f", {_n(r.rows_without_cost)} rows without cost" if r.rows_without_cost else ""
    print(f"  cost: ${r.cost:.6f}{journal}{no_cost}")
    if r.not_tokenized:
        print(f"  not tokenized: {_n(r.not_tokenized)}")
    if r.flags:
        print("  flags: " + ", ".join(f"{name} {_n(count)}" for name, count in sorted(r.flags.items())))
    for note in r.notes:
        print(f"  note: {note}")
    if not r.violations:
        print("  violations: none")
        return
    print(f"  violations: {_n(sum(r.violations.values()))}")
    for rule, count in sorted(r.violations.items()):
        print(f"    {rule}: {_n(count)}")
        for v in r.examples.get(rule, []):
            print(f"      {v}")


# ---------------------------------------------------------------------------------------------
# export


def _export(args: argparse.Namespace, datasets: list[Dataset]) -> int:
    import orjson

    from regen.engine.data.export import KIMI_REASONING_WARNING, export

    statuses = [s.strip() for s in args.status.split(",") if s.strip()]
    bad = sorted(set(statuses) - {"ok", "truncated"})
    if bad or not statuses:
        raise UsageError(f"--status: unknown status {', '.join(bad) or '(none)'} (use ok, truncated)")
    if args.format == "conversations":
        say(f"warning: {KIMI_REASONING_WARNING}")
    reports = export(
        datasets,
        args.format,
        output=args.output,
        statuses=statuses,
        max_length=args.max_length,
        mask_last_prompt_token=args.mask_last_prompt_token,
    )
    if args.json:
        out: dict[str, Any] = {"datasets": [r.to_dict() for r in reports]}
        sys.stdout.buffer.write(orjson.dumps(out, option=orjson.OPT_INDENT_2) + b"\n")
        sys.stdout.flush()
        return EXIT_OK
    for r in reports:
        skipped = ", ".join(f"{status} {_n(c)}" for status, c in sorted(r.skipped_status.items()))
        print(
            f"{r.dataset}: {_n(r.written)} of {_n(r.rows)} rows written to {r.output}"
            f" ({_n(r.input_tokens)} tokens, {_n(r.loss_tokens)} supervised)"
        )
        if r.dropped_too_long:
            print(f"  dropped, longer than {args.max_length} tokens: {_n(r.dropped_too_long)}")
        if skipped:
            print(f"  skipped by status: {skipped}")
    return EXIT_OK
