"""Start the console: set Textual's environment first, then import and run the app.

The console always watches a real job: `regen demo` runs one on the built-in simulator with the
console attached, `regen run` and `regen attach` one of yours (`python -m regen.console.launch` only
says so). The console's tests replay what real jobs sent (tests/support/replay.py).
"""

from __future__ import annotations

import sys
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


def main() -> int:
    """`python -m regen.console.launch`: there is no console without a job; say where to find one."""
    print(
        "regen: the console attaches to a running job: `regen demo` runs a real one on the built-in "
        "simulator with the console; `regen run` starts yours, `regen attach` attaches to it",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
