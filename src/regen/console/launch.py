"""Start the console: set Textual's environment first, then import and run the app.

`python -m regen.console.launch` runs the console on a scripted, simulated job (no job, no socket):
for trying keys and themes, and for screenshots.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from regen.console.options import ConsoleOptions, configure_environment

if TYPE_CHECKING:
    from regen.console.source import JobSource


def run_console(
    source: JobSource,
    *,
    fps: int | None = None,
    no_mouse: bool = False,
    color_system: str | None = None,
    options: ConsoleOptions | None = None,
) -> int:
    """Run the console on `source` until the operator detaches (q); the job keeps running. Returns 0."""
    configure_environment(fps=fps, color_system=color_system)
    from regen.console.app import RegenApp

    options = options or ConsoleOptions()
    if no_mouse:
        options.mouse = False
    app = RegenApp(source, options, freeze_gc=True)
    app.run(mouse=options.mouse)
    return app.return_code or 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m regen.console.launch", description="The console on a simulated job."
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--readonly", action="store_true")
    parser.add_argument("--no-mouse", action="store_true")
    parser.add_argument("--fps", type=int, default=None)
    parser.add_argument("--color-system", default=None)
    parser.add_argument("--theme", default="regen-dark")
    parser.add_argument("--fleets", action="store_true", help="both fleets: SGLang workers and OpenRouter")
    parser.add_argument("--deadline", default="1h", help="the deadline of a --fleets job (none: no deadline)")
    args = parser.parse_args(argv)
    from regen.console.scripted import ScriptedSource, SimulatedJob

    job = None
    if args.fleets:
        job = SimulatedJob(args.seed, fleets=True, deadline=None if args.deadline == "none" else args.deadline)
    source = ScriptedSource(seed=args.seed, count=None, readonly=args.readonly, job=job)
    return run_console(
        source,
        fps=args.fps,
        no_mouse=args.no_mouse,
        color_system=args.color_system,
        options=ConsoleOptions(theme=args.theme),
    )


if __name__ == "__main__":
    sys.exit(main())
