"""The `regen` command line.

Exit codes (engine/errors.py): 0 done, 1 a failure the message explains, 2 bad usage or settings,
130/143 after SIGINT/SIGTERM. Operator mistakes end in one clear line each, never a traceback: every
command runs inside cli/edge.py `guarded`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from regen.cli.arguments import add_settings_argument
from regen.cli.audit import add_parsers as add_audit_parsers
from regen.cli.audit import run as run_audit_command
from regen.cli.data import add_parsers as add_data_parsers
from regen.cli.data import run as run_data_command
from regen.cli.edge import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, fail, guarded, say
from regen.cli.hosts import add_parsers as add_host_parsers
from regen.cli.hosts import fetch_tokenizer_for_run
from regen.cli.hosts import run as run_host_command
from regen.cli.quarantine import add_parsers as add_quarantine_parsers
from regen.cli.quarantine import run as run_quarantine_command
from regen.cli.report import add_parsers as add_report_parsers
from regen.cli.report import run as run_report_command
from regen.cli.sglang import add_parsers as add_sglang_parsers
from regen.cli.sglang import run as run_sglang_command
from regen.engine.config.loading import load_settings
from regen.engine.config.settings import Settings
from regen.sim.runner import add_arguments as add_sim_arguments


def _add_console_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--readonly", action="store_true", help="watch without the power to steer")
    parser.add_argument("--no-mouse", action="store_true", help="no mouse reporting (slow links)")
    parser.add_argument("--fps", type=int, default=None, help="screen updates per second at most")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="regen", description="Generate LLM training data through OpenRouter or SGLang."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = commands.add_parser("run", help="start (or resume) the job from settings")
    add_settings_argument(run)
    run.add_argument("--headless", action="store_true", help="print status lines instead of the console")
    run.add_argument("--datasets", metavar="A,B", help="only these datasets (by folder name)")
    run.add_argument(
        "--skip-invalid",
        action="store_true",
        help="skip and journal invalid prompt lines instead of refusing",
    )
    _add_console_options(run)

    job = commands.add_parser("job-process")  # internal: the detached job; no help, so not listed
    add_settings_argument(job)
    job.add_argument("--datasets", default=None)
    job.add_argument("--skip-invalid", action="store_true")

    attach = commands.add_parser("attach", help="attach the console to the running job")
    add_settings_argument(attach)
    _add_console_options(attach)

    stop = commands.add_parser("stop", help="gracefully stop the running job (drain requests in flight)")
    add_settings_argument(stop)
    stop.add_argument("--cancel", action="store_true", help="cancel requests in flight instead of draining")

    catalog = commands.add_parser(
        "catalog", help="providers for the model: price, precision, status; budget plan"
    )
    add_settings_argument(catalog)
    catalog.add_argument("--json", action="store_true", help="machine-readable output")

    add_data_parsers(commands)
    add_quarantine_parsers(commands)
    add_audit_parsers(commands)
    add_report_parsers(commands)
    add_host_parsers(commands)
    add_sglang_parsers(commands)

    demo = commands.add_parser("demo", help="the job on the built-in simulator and a bundled sample dataset")
    add_settings_argument(demo)
    demo.add_argument("--headless", action="store_true", help="print status lines instead of the console")
    demo.add_argument(
        "--dir", type=Path, default=Path("regen-demo"), help="scratch folder, replaced on each run"
    )
    demo.add_argument(
        "--speed", type=float, default=1.0, help="run the simulated providers this many times faster"
    )
    demo.add_argument("--prepared", action="store_true", help=argparse.SUPPRESS)
    demo.add_argument(
        "--backend",
        choices=("openrouter", "sglang"),
        default="openrouter",
        help="rehearse OpenRouter (default) or SGLang, each on its built-in simulator",
    )
    demo.add_argument(
        "--fleets",
        action="store_true",
        help="rehearse both fleets in one job: the GPUs first, OpenRouter paced to a deadline they alone would miss",
    )

    sim = commands.add_parser("sim", help="run a simulator standalone on a port")
    sims = sim.add_subparsers(dest="sim", metavar="BACKEND", required=True)
    add_sim_arguments(sims.add_parser("openrouter", help="the OpenRouter API simulator"), "openrouter")
    add_sim_arguments(
        sims.add_parser("sglang", help="the SGLang server simulator (native API, metrics, faults)"), "sglang"
    )
    return parser


COMMANDS: tuple[Callable[[argparse.Namespace], int | None], ...] = (
    run_data_command,
    run_quarantine_command,
    run_audit_command,
    run_report_command,
    run_host_command,
    run_sglang_command,
)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return guarded(lambda: _command(args))


def _command(args: argparse.Namespace) -> int:
    if args.command == "sim":
        return _sim(args)
    for command in COMMANDS:  # each answers None when the command is not its own
        code = command(args)
        if code is not None:
            return code
    if args.command == "demo":
        from regen.cli.demo import run_demo

        return run_demo(
            args.dir,
            headless=args.headless,
            speed=args.speed,
            prepared=args.prepared,
            backend="fleets" if args.fleets else args.backend,
        )
    settings = load_settings(args.settings, args.command)
    if args.command == "job-process":  # `regen run` fetched what it needed before starting it
        return _run(args, settings)
    if args.command == "run":
        fetched = fetch_tokenizer_for_run(settings)
        if fetched is not None:
            return fetched
        return _run(args, settings) if args.headless else _run_detached(args, settings)
    if args.command == "catalog":
        return _catalog(args, settings)
    if args.command == "attach":
        return _attach(args, settings)
    if args.command == "stop":
        return _stop(args, settings.job.run_dir)
    return fail(f"unknown command {args.command}", EXIT_USAGE)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    from regen.engine.job.job import Job
    from regen.engine.runtime import run

    only = [name.strip() for name in args.datasets.split(",") if name.strip()] if args.datasets else None

    async def go() -> int:
        from regen.engine.control.headless import run_headless

        job = Job(settings, only=only, skip_invalid=args.skip_invalid or None)
        # A JobError, or a JsonlError (a results file or journal holds garbage), reaches the edge.
        outcome = await run_headless(job)  # prepares it, a signal meanwhile heard
        return outcome.exit_code

    return run(go())


def _run_detached(args: argparse.Namespace, settings: Settings) -> int:
    """Start the job in its own session, then attach to it."""
    from regen.cli.attach import JOB_LOG, start_detached

    job_args = ["job-process"]
    if args.settings is not None:
        job_args += ["--settings", str(args.settings.resolve())]
    if args.datasets:
        job_args += ["--datasets", args.datasets]
    if args.skip_invalid:
        job_args.append("--skip-invalid")
    code, said = start_detached(settings.job.run_dir, job_args)
    if code != 0:
        return fail(said or f"the job ended at once (exit {code})", code)
    print(
        f"regen: job started; it keeps running after this console (log: {settings.job.run_dir / JOB_LOG})",
        file=sys.stderr,
    )
    return _attach(args, settings)


def _attach(args: argparse.Namespace, settings: Settings) -> int:
    from regen.cli.attach import follow_lines
    from regen.console.client import SocketSource
    from regen.engine.control.server import SOCKET_NAME
    from regen.engine.runtime import run

    run_dir = settings.job.run_dir
    source = SocketSource(run_dir / SOCKET_NAME, readonly=args.readonly)
    if sys.stdout.isatty():
        from regen.console.launch import run_console
        from regen.console.options import ConsoleOptions

        chosen = settings.console
        options = ConsoleOptions(
            theme=chosen.theme,
            theme_dirs=list(chosen.theme_dirs),
            keymap=dict(chosen.keymap),
            mouse=chosen.mouse and not args.no_mouse,
            export_dir=chosen.export_dir or run_dir,
            stale_after_s=chosen.stale_after_s,
            repaint_interval_s=chosen.repaint_interval_s,
            log_max_lines=chosen.log_max_lines,
            concurrency_step=chosen.concurrency_step,
            budget_warn_fraction=chosen.budget_warn_fraction,
        )
        return run_console(source, fps=args.fps or chosen.fps, no_mouse=not options.mouse, options=options)

    async def go() -> int:
        await source.connect()  # a ControlError says why it cannot
        try:
            return await follow_lines(source)
        finally:
            await source.close()

    return run(go())


def _stop(args: argparse.Namespace, run_dir: Path) -> int:
    from regen.console.client import SocketSource
    from regen.engine.control.headless import status_line
    from regen.engine.control.server import SOCKET_NAME
    from regen.engine.runtime import run

    async def go() -> int:
        source = SocketSource(run_dir / SOCKET_NAME)
        await source.connect()  # a ControlError says why it cannot
        try:
            reply = await source.command("stop", cancel=args.cancel)
            say(reply["message"])
            if not reply["ok"]:
                return EXIT_FAILURE
            last = None
            async for snap in source.snapshots():
                last = snap
            if last is not None:
                print(status_line(last))
            return EXIT_OK
        finally:
            await source.close()

    return run(go())


def _catalog(args: argparse.Namespace, settings: Settings) -> int:
    import orjson

    from regen.engine.backends.openrouter.report import build_catalog, format_catalog
    from regen.engine.runtime import run

    report = run(build_catalog(settings))  # a CatalogError or DatasetError reaches the edge
    if args.json:
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print("\n".join(format_catalog(report)))
    return EXIT_OK


def _sim(args: argparse.Namespace) -> int:
    from regen.sim.runner import run_sim

    return run_sim(args.sim, args.port, args.host, args.config, getattr(args, "tokenizer", None))


if __name__ == "__main__":
    sys.exit(main())
