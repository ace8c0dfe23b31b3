"""Running the SGLang simulator as a process: the body of `regen sim sglang` (sim/runner.py is
the one entry point of the simulators) and of the stand-in `sglang.launch_server`.

`serve()` runs one simulator until SIGINT/SIGTERM or until it dies, and returns the exit status:
0 after a signal, or the crash status (negative: the signal SGLang's process tree is killed with).
SIGTERM is SGLang's graceful exit: /health turns 503 at once, requests in flight get
`sigterm_drain_s` to finish, then the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from regen.sim.sglang.config import SimConfigError, SimSGLangConfig, load_sim_config
from regen.sim.sglang.logs import SimLog
from regen.sim.sglang.server import SGLangSim
from regen.sim.sglang.tokens import SimTokenizer, SimTokenizerError, builtin_tokenizer_folder

__all__ = ["load_tokenizer", "run_sim", "serve"]

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


def load_tokenizer(config: SimSGLangConfig, path: Path | None) -> tuple[SimTokenizer, Path | None]:
    """The served tokenizer: `path`, else config.tokenizer_path, else the built-in one (written to
    a temporary folder, returned second so the caller can remove it)."""
    folder = path if path is not None else (Path(config.tokenizer_path) if config.tokenizer_path else None)
    scratch: Path | None = None
    if folder is None:
        scratch = Path(tempfile.mkdtemp(prefix="regen-sim-sglang-tok-"))
        folder = builtin_tokenizer_folder(scratch)
    try:
        tok = SimTokenizer(
            folder,
            trust_remote_code=config.trust_remote_code,
            end_of_turn=config.end_of_turn,
            think_open=config.think_open,
            think_close=config.think_close,
        )
    except SimTokenizerError:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        raise
    return tok, scratch


async def serve(
    sim: SGLangSim,
    host: str,
    port: int,
    *,
    on_signal: Callable[[], None] | None = None,
) -> int:
    """Run `sim` until a signal or its death; returns the process exit status."""
    await sim.start(host, port)
    assert sim.crashed is not None
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_term() -> None:
        if sim.config.faults.ignore_sigterm:
            return
        if on_signal is not None:
            on_signal()
        if not sim.shutting_down:
            sim.begin_shutdown()
        stop.set()

    installed: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_term)
            installed.append(sig)
    stopper: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
    waiting: list[asyncio.Future[Any]] = [stopper, sim.crashed]
    try:
        await asyncio.wait(waiting, return_when="FIRST_COMPLETED")
        if sim.crashed.done():
            return sim.crashed.result()
        drain = sim.config.sigterm_drain_s * sim.config.time_scale
        deadline = loop.time() + drain
        while sim.scheduler.live and loop.time() < deadline:
            await asyncio.sleep(0.05)
        return EXIT_OK
    finally:
        stopper.cancel()
        for sig in installed:
            loop.remove_signal_handler(sig)
        await sim.stop()


def run_sim(
    port: int,
    host: str = "127.0.0.1",
    config_path: Path | None = None,
    tokenizer_path: Path | None = None,
    *,
    prog: str = "regen",
) -> int:
    """Blocking entry point of the command line; messages on stderr, exit codes 0, 1, 2."""
    from regen.engine.runtime import run

    try:
        config = load_sim_config(config_path)
        tok, scratch = load_tokenizer(config, tokenizer_path)
    except (SimConfigError, SimTokenizerError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    sim = SGLangSim(config, tok, log=SimLog(sys.stderr))
    sim.on_listening = lambda url: print(f"regen sim sglang listening on {url}", flush=True)
    try:
        status = run(serve(sim, host, port))
    except OSError as exc:
        print(f"{prog}: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        status = EXIT_OK
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    if status != EXIT_OK:
        print(
            f"{prog}: the simulated SGLang server died (exit status {status}); its log says why",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    return EXIT_OK
