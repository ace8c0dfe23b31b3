"""Running the simulator standalone: `regen sim openrouter` and `python -m engine.sim`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path

from engine.sim.openrouter.config import SimConfigError, load_sim_config
from engine.sim.openrouter.server import serve_forever


def run_sim(port: int = 8765, host: str = "127.0.0.1", config_path: Path | None = None) -> int:
    """Blocking entry point; returns an exit code (2 for a bad config file, message on stderr)."""
    try:
        config = load_sim_config(config_path)
    except SimConfigError as exc:
        print(f"regen sim openrouter: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # uvloop is optional on platforms without it
        runner = asyncio.run
    with contextlib.suppress(KeyboardInterrupt):
        runner(serve_forever(config, host, port))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.sim", description="Run the OpenRouter simulator.")
    parser.add_argument("kind", nargs="?", default="openrouter", choices=["openrouter"])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--config", type=Path, default=None, help="TOML or JSON SimConfig file")
    args = parser.parse_args(argv)
    return run_sim(args.port, args.host, args.config)
