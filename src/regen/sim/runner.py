"""Running a simulator standalone: the one entry point of `regen sim KIND` and `python -m regen.sim`.

Exit codes as everywhere in regen: 0 after SIGINT/SIGTERM, 1 when the port cannot be had (or the
simulated server died), 2 for a bad config file (one line naming the file, never a traceback).
Both simulators run on engine/runtime.py's loop.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path

from regen.engine.runtime import run

KINDS = ("openrouter", "sglang")
DEFAULT_PORTS = {"openrouter": 8080, "sglang": 30000}


def run_sim(
    kind: str,
    port: int,
    host: str = "127.0.0.1",
    config_path: Path | None = None,
    tokenizer: Path | None = None,
) -> int:
    """Serve the `kind` simulator until a signal; returns the exit code (messages on stderr)."""
    if kind == "sglang":
        from regen.sim.sglang.runner import run_sim as run_sglang

        return run_sglang(port, host, config_path, tokenizer, prog="regen")
    from regen.sim.openrouter.config import SimConfigError, load_sim_config
    from regen.sim.openrouter.server import serve_forever

    try:
        config = load_sim_config(config_path)
    except SimConfigError as exc:
        print(f"regen: {exc}", file=sys.stderr)
        return 2
    try:
        with contextlib.suppress(KeyboardInterrupt):
            run(serve_forever(config, host, port))
    except OSError as exc:
        print(f"regen: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


def add_arguments(parser: argparse.ArgumentParser, kind: str) -> None:
    parser.add_argument("--port", type=int, default=DEFAULT_PORTS[kind], help="0 for any free port (printed)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--config", type=Path, default=None, help="simulator config (TOML or JSON)")
    if kind == "sglang":
        parser.add_argument(
            "--tokenizer", type=Path, default=None, help="tokenizer folder (default: built-in)"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m regen.sim", description="Run a simulator standalone.")
    parser.add_argument("kind", nargs="?", default="openrouter", choices=KINDS)
    parser.add_argument("--port", type=int, default=None, help="0 for any free port (printed)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--config", type=Path, default=None, help="simulator config (TOML or JSON)")
    parser.add_argument("--tokenizer", type=Path, default=None, help="sglang: tokenizer folder")
    args = parser.parse_args(argv)
    port = DEFAULT_PORTS[args.kind] if args.port is None else args.port
    return run_sim(args.kind, port, args.host, args.config, args.tokenizer)
