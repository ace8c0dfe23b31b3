"""`regen sglang start` against what the real 0.5.23 server does: a log level that hides the phases, the
soft watchdog's line during a start, a server whose stream sends only what is new, a speculative
server's capture lines, and the launch flags the settings refuse."""

from __future__ import annotations

from pathlib import Path

import pytest

from regen.engine.config.settings import SGLangSettings
from regen.engine.host.scripts.sglanglog import LogState
from regen.sim.sglang.logs import SimLog
from regen.sim.sglang.tokens import SimTokenizer
from tests.support.gpuhost import GpuHost
from tests.support.gpuhost import settings_file as settings
from tests.support.processes import run_regen as regen
from tests.support.sglang_sim import fast_config, model_folder, running_sim


def test_a_server_whose_log_level_hides_ready_is_ready_by_health_generate(
    host: GpuHost, tmp_path: Path
) -> None:
    # As a --config file on the host would set it: the launch flags regen checks do not show it.
    host.set_sim(log_level="warning")
    conf = settings(host, tmp_path, ready_timeout_s=30.0)
    started = regen("sglang", "start", "--settings", str(conf), timeout=120)
    assert started.returncode == 0, started.stderr + started.stdout
    assert "gpu1: ready in" in started.stdout and "/health_generate answers 200" in started.stdout
    assert "its log did not say so" in started.stdout
    assert "[8/8] ready" not in started.stdout and "fired up" not in host.log()


def test_the_soft_watchdogs_line_during_a_start_is_not_a_failure(host: GpuHost, tmp_path: Path) -> None:
    host.set_sim(soft_watchdog_timeout=5.0)  # the weights phase (20 simulated s) outlasts it
    conf = settings(host, tmp_path)
    started = regen("sglang", "start", "--settings", str(conf), timeout=120)
    assert started.returncode == 0, started.stderr + started.stdout
    assert "self.soft=True" in host.log()
    assert "[8/8] ready" in started.stdout and "launch failed" not in started.stderr


def test_a_server_streaming_deltas_is_reported_when_it_is_ready(host: GpuHost, tmp_path: Path) -> None:
    host.set_sim(incremental_streaming_output=True)
    conf = settings(host, tmp_path)
    started = regen("sglang", "start", "--settings", str(conf), timeout=120)
    assert started.returncode == 1, started.stdout
    assert "gpu1: ready, but it runs with --incremental-streaming-output" in started.stderr


async def test_every_capture_line_of_a_speculative_server_is_a_phase(tmp_path: Path) -> None:
    log = SimLog()
    tok = SimTokenizer(model_folder(tmp_path / "model"))
    async with running_sim(fast_config(speculative_algorithm="EAGLE3"), tok, log=log):
        pass
    state = LogState()
    seen = [phase for line in log.lines if (phase := state.feed(line))]
    assert seen.count("cuda graphs") == 3 and seen.count("cuda graphs captured") == 3  # verify, draft x2
    assert seen[-1] == "ready" and state.failure is None


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--incremental-streaming-output"], "--incremental-streaming-output (sglang 0.5.23)"),
        (["--incremental"], "--incremental-streaming-output (sglang 0.5.23)"),  # argparse's abbreviation
        (["--stream-output"], "--stream-output (sglang 0.5.9)"),
        (["--log-level", "warning"], "'--log-level warning'"),
        (["--log-level=ERROR"], "'--log-level ERROR'"),
    ],
)
def test_launch_args_that_change_what_regen_reads_are_refused(args: list[str], why: str) -> None:
    with pytest.raises(ValueError, match="launch_args") as refused:
        SGLangSettings(launch_args=args)
    assert why in str(refused.value)


def test_launch_args_that_change_nothing_regen_reads_are_kept() -> None:
    args = ["--log-level-http", "warning", "--log-level", "debug", "--stream-interval", "8"]
    assert SGLangSettings(launch_args=args).launch_args == args
