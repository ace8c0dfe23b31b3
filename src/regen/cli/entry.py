"""The `regen` command's entry point: `regen.cli.main.main`, imported here so that a Ctrl-C during
its imports (a second or more on a cold start: pydantic, aiohttp) exits 130 like one a moment
later, instead of printing a traceback."""

from __future__ import annotations

from regen.engine.errors import EXIT_SIGINT


def main() -> int:
    try:
        from regen.cli.main import main as run
    except KeyboardInterrupt:
        return EXIT_SIGINT
    return run()
