"""``regen report``: a run folder's journals as one self-contained HTML page with charts, and a PNG
of each chart beside it (docs/report.md).

``add_parsers`` adds the subcommand and ``run`` executes it, returning the exit code (None for any
other command). matplotlib is imported inside ``run`` (through regen/report/charts.py), so no other
command pays for it at start-up.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from regen.cli.arguments import add_settings_argument
from regen.cli.edge import EXIT_OK, RegenError, UsageError

__all__ = ["add_parsers", "run"]

REPORT_FOLDER, REPORT_FILE = "report", "report.html"


def add_parsers(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    report = commands.add_parser(
        "report",
        help="an HTML report of a run (running, cut short or finished) from its journals, with charts",
        description="Read the run folder's journals (attempts.jsonl, events.jsonl) and write one "
        "self-contained HTML page: throughput, rows and spend over time against the budget, latency by "
        "route, errors by class, outages and holds, both fleets' split and the deadline, waste by cause "
        "and the totals; a PNG of each chart beside it. Works on a running job (a snapshot of now).",
    )
    add_settings_argument(report)
    report.add_argument(
        "run_dir",
        nargs="?",
        type=Path,
        default=None,
        metavar="RUN_DIR",
        help="the run folder (default: job.run_dir from settings)",
    )
    report.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"the HTML file to write (default: RUN_DIR/{REPORT_FOLDER}/{REPORT_FILE}); PNGs beside it",
    )
    report.add_argument("--open", action="store_true", help="open the report in the web browser")


def run(args: argparse.Namespace) -> int | None:
    """Run ``report``; None for any other command."""
    if getattr(args, "command", None) != "report":
        return None
    from regen.engine.config.loading import load_settings

    settings = load_settings(args.settings, "report")
    run_dir: Path = args.run_dir or settings.job.run_dir
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such run folder (give RUN_DIR, or set job.run_dir in settings)")
    if not (run_dir / "attempts.jsonl").exists() and not (run_dir / "events.jsonl").exists():
        raise RegenError(
            f"{run_dir}: no journals (attempts.jsonl, events.jsonl): nothing has run in this folder"
        )
    out: Path = args.out or run_dir / REPORT_FOLDER / REPORT_FILE
    # A journal line regen cannot have written (JsonlError: file:line and what to do) reaches the edge.
    written = write_report(run_dir, out, settings.job.backend)
    print(f"report: {out} ({written} charts, each also as a PNG beside it)")
    if args.open:
        import webbrowser

        webbrowser.open(out.resolve().as_uri())
    return EXIT_OK


def write_report(run_dir: Path, out: Path, default_backend: str) -> int:
    """Read `run_dir`'s journals, draw, and write `out` and the PNGs beside it; the charts' count."""
    from regen.engine.run.report_data import read_report
    from regen.report.charts import draw
    from regen.report.page import render

    data = read_report(run_dir, default_backend)
    charts = draw(data)
    out.parent.mkdir(parents=True, exist_ok=True)
    pngs = {chart.name: f"{out.stem}-{chart.name}.png" for chart in charts}
    for chart in charts:
        _write(out.parent / pngs[chart.name], chart.png)
    _write(out, render(data, charts, pngs).encode())
    return len(charts)


def _write(path: Path, content: bytes) -> None:
    """Whole or not at all: a browser reloading the page never reads half of it."""
    import tempfile

    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
