"""The `regen` command line.

Exit codes: 0 done, 1 a failure the message explains, 2 bad usage or settings, 130/143 after
SIGINT/SIGTERM. Operator mistakes end in one clear line each, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from engine.settings import SettingsError, load_settings

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


def _add_settings(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--settings",
        type=Path,
        default=None,
        metavar="FILE",
        help="settings file (default ./settings.toml when present, else built-in defaults)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="regen", description="Generate LLM training data through OpenRouter or SGLang."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = commands.add_parser("run", help="start (or resume) the job from settings")
    _add_settings(run)
    run.add_argument("--headless", action="store_true", help="print status lines instead of the console")
    run.add_argument("--datasets", metavar="A,B", help="only these datasets (by folder name)")
    run.add_argument(
        "--skip-invalid",
        action="store_true",
        help="skip and journal invalid prompt lines instead of refusing",
    )

    demo = commands.add_parser("demo", help="the job on the built-in simulator and a bundled sample dataset")
    _add_settings(demo)
    demo.add_argument("--headless", action="store_true", help="print status lines instead of the console")
    demo.add_argument(
        "--dir", type=Path, default=Path("regen-demo"), help="scratch folder, replaced on each run"
    )
    demo.add_argument(
        "--speed", type=float, default=1.0, help="run the simulated providers this many times faster"
    )

    sim = commands.add_parser("sim", help="run a simulator standalone on a port")
    sims = sim.add_subparsers(dest="sim", metavar="BACKEND", required=True)
    sim_or = sims.add_parser("openrouter", help="the OpenRouter API simulator")
    sim_or.add_argument("--port", type=int, default=8080)
    sim_or.add_argument("--host", default="127.0.0.1")
    sim_or.add_argument("--config", type=Path, default=None, help="simulator config (TOML or JSON)")
    return parser


def _fail(message: str, code: int = EXIT_FAILURE) -> int:
    for line in message.splitlines() or [message]:
        print(f"regen: {line}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "sim":
            return _sim(args)
        if args.command == "demo":
            from console.demo import run_demo

            return run_demo(args.dir, headless=args.headless, speed=args.speed)
        settings = load_settings(args.settings)
        if args.command == "run":
            return _run(args, settings)
    except SettingsError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        return 130
    return _fail(f"unknown command {args.command}", EXIT_USAGE)


def _run(args: argparse.Namespace, settings: object) -> int:
    from engine.job import Job, JobError
    from engine.runtime import run
    from engine.settings import Settings

    assert isinstance(settings, Settings)
    only = [name.strip() for name in args.datasets.split(",") if name.strip()] if args.datasets else None
    if not args.headless:
        print("regen: the console is not available in this version; running headless", file=sys.stderr)

    async def go() -> int:
        from engine.headless import run_headless

        job = Job(settings, only=only, skip_invalid=args.skip_invalid or None)
        try:
            await job.prepare()
        except JobError as exc:
            return _fail(str(exc))
        outcome = await run_headless(job)
        return outcome.exit_code

    return run(go())


def _sim(args: argparse.Namespace) -> int:
    from engine.runtime import run
    from engine.sim.config import SimConfigError, load_sim_config
    from engine.sim.server import serve_forever

    try:
        config = load_sim_config(args.config)
    except SimConfigError as exc:
        return _fail(str(exc), EXIT_USAGE)
    try:
        run(serve_forever(config, args.host, args.port))
    except OSError as exc:
        return _fail(f"cannot listen on {args.host}:{args.port}: {exc.strerror}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
