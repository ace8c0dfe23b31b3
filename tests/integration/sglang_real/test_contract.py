"""regen against the real sglang package: flags, log lines, metrics, the request body, the info keys.

Each test reads the real wheels (tests/support/sglang_wheel.py) and checks what regen relies on, so a
new sglang release shows here what moved. The releases are 0.5.23 (the one docs/sglang.md follows)
and 0.5.9 (the older spellings regen also reads).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import inspect
import io
from typing import Any

import orjson
import pytest

from regen.engine.backends.sglang.wire import request_body, sampling_params
from regen.engine.host.scripts import sglangctl, sglanglog
from regen.engine.net import sglang_metrics, sglang_server
from regen.sim.sglang import launch
from regen.sim.sglang.sampling import SAMPLING_FIELDS
from tests.support.sglang_wheel import CURRENT, OLDER, RealSGLang, source_says

EOT = 163586  # Kimi's <|im_end|>; any id does for the contract


def regen_launch_flags() -> list[str]:
    """The flags regen's launch passes (engine/host/scripts/sglangctl.py `launch_argv`)."""
    spec = {
        "model_path": "/m",
        "port": 30000,
        "tp": 8,
        "served_model_name": "kimi-k2.5",
        "launch_args": [],
        "stream_interval": sglang_server.LAUNCH_STREAM_INTERVAL,
    }
    return sglangctl._flags_of(sglangctl.launch_argv(spec)[3:])


# ----------------------------------------------------------------------------------- the command line


def test_the_ast_reading_finds_the_flags_argparse_would_build(sglang_current: RealSGLang) -> None:
    # Guards the reading itself: 0.5.23's parser has 559 option strings besides -h/--help (the
    # real parser built with its heavy imports stubbed gave 561, --help and -h included).
    assert len(sglang_current.flags) == 559
    assert {"--tp-size", "--tensor-parallel-size", "--model-path", "--model", "--no-lora-strict-loading"} <= (
        sglang_current.flags
    )


def test_every_flag_regen_passes_is_taken_by_the_real_parser_as_regen_expects(
    sglang_current: RealSGLang,
) -> None:
    expected = {
        "--model-path": "--model-path",
        "--host": "--host",
        "--port": "--port",
        "--tp": "--tp-size",  # a unique prefix: argparse's abbreviation
        "--served-model-name": "--served-model-name",
        "--enable-metrics": "--enable-metrics",
        "--stream-interval": "--stream-interval",
    }
    flags = regen_launch_flags()
    assert flags == list(expected)
    for flag in flags:
        assert sglang_current.parse([flag, "1"]) == expected[flag]
    # regen's own preflight (the --help check on the host) says the same of the real flag set.
    assert sglangctl.flag_problems(flags, sglang_current.flags) == []


def test_regens_prefix_rule_agrees_with_argparse_on_the_real_flags(sglang_current: RealSGLang) -> None:
    for flag in ("--cuda-graph-max-bs", "--tp", "--enable-metrics", "--stream", "--no-such-flag"):
        try:
            sglang_current.parse([flag, "1"])
            argparse_ok = True
        except ValueError:
            argparse_ok = False
        assert (sglangctl.flag_problems([flag], sglang_current.flags) == []) == argparse_ok, flag


def test_the_flags_settings_keep_for_regen_exist_in_the_real_parser(sglang_current: RealSGLang) -> None:
    # engine/config/settings.py refuses these in launch_args because regen passes them itself.
    own = (
        "--model-path",
        "--model",
        "--host",
        "--port",
        "--tp-size",
        "--tensor-parallel-size",
        "--served-model-name",
    )
    assert set(own) <= sglang_current.flags


def test_the_flags_regen_refuses_exist_in_the_release_each_names(releases: dict[str, RealSGLang]) -> None:
    for flag, key, release in sglang_server.INCREMENTAL_FLAGS:
        real = releases[release]
        assert flag in real.flags, (flag, release)
        assert key in real.fields(), (key, release)  # the /server_info key regen reads
    for real in releases.values():
        assert "--log-level" in real.flags
    # 0.5.23 dropped 0.5.9's spelling: there it is no flag at all.
    assert "--stream-output" not in releases[CURRENT].flags


def test_every_flag_of_the_stand_in_launcher_is_a_real_flag(sglang_current: RealSGLang) -> None:
    standin = {name for names, _kwargs, _field in launch._FLAGS for name in names}
    assert standin - sglang_current.flags == set()
    assert launch.build_parser().prog == "sglang serve"
    assert 'prog="sglang serve"' in sglang_current.source("srt/server_args.py")


# -------------------------------------------------------------------------------------- log lines

# Markers that come from other programs than sglang, each with where it is checked.
ARGPARSE = (
    "error: unrecognized arguments",
    "error: the following arguments are required",
    "error: ambiguous option",
)
TRANSFORMERS = (
    "does not appear to have a file named config.json",
    "is not a local folder and is not a valid model identifier",
)
ASYNCIO = ("error while attempting to bind on address",)
ELSEWHERE = {
    "Uvicorn running on": "uvicorn's own startup line (uvicorn/server.py), printed through sglang's log format",
    "torch.OutOfMemoryError": "torch's exception, in the traceback under 'Scheduler hit an exception'",
    "Watchdog timeout (": "releases before 0.5 (sglang issue 3752); 0.5.x says '<name> watchdog timeout ('",
}


def regen_log_markers() -> list[str]:
    markers = [m for _name, ms in sglanglog.PHASES for m in ms]
    markers += [m for m, _where in sglanglog.FAILURES]
    return [*markers, *sglanglog.NOT_FAILURES, sglanglog.RETRACTION]


def test_every_log_line_regen_reads_is_one_sglang_prints(releases: dict[str, RealSGLang]) -> None:
    unknown = []
    for marker in regen_log_markers():
        if marker in ARGPARSE + TRANSFORMERS + ASYNCIO or marker in ELSEWHERE:
            continue
        if not any(real.says(marker) for real in releases.values()):
            unknown.append(marker)
    assert unknown == [], f"no message of sglang {CURRENT} or {OLDER} holds these"


def test_the_readiness_and_capture_lines_are_0_5_23s(sglang_current: RealSGLang) -> None:
    for line in (
        "The server is fired up and ready to roll!",
        "Load weight begin",
        "KV Cache is allocated",
        "Capture target decode CUDA graph begin",
        "Capture target verify CUDA graph end",
        "Capture draft extend CUDA graph begin",
        "max_total_num_tokens=",
        "Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=True)",
        "SIGTERM received.",
        "Abort in waiting queue",
    ):
        assert sglang_current.says(line), line


def test_the_argument_errors_regen_reads_are_argparses() -> None:
    parser = argparse.ArgumentParser(prog="sglang serve")
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--cuda-graph-max-bs-decode")
    parser.add_argument("--cuda-graph-max-bs-prefill")
    said = []
    for argv in (["--model-path", "m", "--nope", "1"], [], ["--model-path", "m", "--cuda-graph-max-bs", "1"]):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
            parser.parse_args(argv)
        said.append(err.getvalue())
    for marker in ARGPARSE:
        assert any(marker in text for text in said), marker


def test_the_model_folder_and_bind_errors_regen_reads_are_the_libraries() -> None:
    import asyncio.base_events

    import transformers.utils.hub

    for marker in TRANSFORMERS:
        assert source_says(inspect.getsource(transformers.utils.hub), marker), marker
    for marker in ASYNCIO:
        assert source_says(inspect.getsource(asyncio.base_events), marker), marker


def test_the_soft_watchdogs_line_is_not_a_failure_and_the_hard_ones_is() -> None:
    # The real f-string (srt/utils/watchdog.py) rendered both ways.
    soft = sglanglog.scan(
        "[2026-12-01 10:00:00 TP0] Scheduler watchdog timeout (self.watchdog_timeout=60, self.soft=True)\n"
    )
    hard = sglanglog.scan(
        "[2026-12-01 10:00:00 TP0] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)\n"
    )
    assert soft.failure is None
    assert hard.failure_where == "running"


# ----------------------------------------------------------------------------------------- metrics


def test_every_metric_regen_reads_is_one_the_real_collector_exports(releases: dict[str, RealSGLang]) -> None:
    paths = {CURRENT: "srt/observability/metrics_collector.py", OLDER: "srt/metrics/collector.py"}
    for release, real in releases.items():
        names = {
            node.value
            for node in ast.walk(real.tree(paths[release]))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        }
        for family in (*sglang_metrics._GAUGES, *sglang_metrics._COUNTERS):
            assert family in names or family + "_total" in names, (release, family)
    labels = {
        node.value
        for node in ast.walk(releases[CURRENT].tree(paths[CURRENT]))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    # The ranks regen tells a scheduler group's own series apart by, and the data-parallel rank.
    assert set(sglang_metrics._RANK_LABELS) | {"dp_rank"} <= labels


# ----------------------------------------------------------------------------------- the /generate body


def regen_body(max_tokens: int = 16384) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads(
        request_body([1, 2, 3], sampling_params(max_tokens, 1.0, 0.95, EOT), "B-1#0")
    )
    return body


def test_the_body_regen_sends_passes_the_real_contract(sglang_current: RealSGLang) -> None:
    api = sglang_current.api_types()
    body = regen_body()
    assert "stream_interval" in body["sampling_params"]
    api.decode_GenerateRequest(body)
    # The router re-serialises the body with keys of its own (shared reference: router).
    routed = {**body, "model": "unknown", "log_metrics": True, "background": False, "no_logs": False,
              "return_bytes": False, "return_entropy": False, "return_text_in_logprobs": False}  # fmt: skip
    api.decode_GenerateRequest(routed)
    # The checker is live: a key regen must never send is refused, with the text the simulator says.
    with pytest.raises(api.JsonContractError) as refused:
        api.decode_GenerateRequest({**body, "sampling_params": {"max_tokens": 5}})
    assert str(refused.value).startswith("unknown field `max_tokens`, expected one of `max_new_tokens`")


def test_the_simulators_sampling_keys_are_the_real_contracts(sglang_current: RealSGLang) -> None:
    tree = sglang_current.tree("api/v1/api_types.py")
    real = next(
        ast.literal_eval(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "_FIELDS_SamplingParams" for t in node.targets)
    )
    assert tuple(real) == SAMPLING_FIELDS


def test_the_older_release_takes_every_sampling_key_regen_sends(sglang_older: RealSGLang) -> None:
    # 0.5.9 has no contract gate: its SamplingParams(**params) takes the keys, or the request is a 400.
    init = next(
        node
        for node in ast.walk(sglang_older.tree("srt/sampling/sampling_params.py"))
        if isinstance(node, ast.FunctionDef) and node.name == "__init__"
    )
    accepted = {a.arg for a in init.args.args + init.args.kwonlyargs}
    assert set(regen_body()["sampling_params"]) <= accepted


# -------------------------------------------------------------------------------------- /server_info


def test_the_server_info_keys_regen_reads_are_server_arguments(releases: dict[str, RealSGLang]) -> None:
    read = ("tp_size", "pp_size", "dp_size", "enable_dp_attention", "context_length", "max_running_requests",
            "served_model_name", "model_path", "weight_version")  # fmt: skip
    for release, real in releases.items():
        missing = set(read) - real.fields()
        assert missing == set(), (release, missing)
    # context_length is the command line's: None unless --context-length was passed, so the context
    # regen checks max_tokens against is /v1/models' max_model_len.
    assert "max_model_len" in releases[CURRENT].source("srt/entrypoints/http_server.py")
