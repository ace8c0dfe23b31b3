"""The stand-in for `python -m sglang.launch_server`: SGLang's command line, model-folder checks, and
the simulator run in the foreground with SGLang's log (docs/sglang.md, "The stand-in launcher").

The parser is argparse with SGLang's flag names and argparse's default prefix matching, so what the
real command line accepts and refuses holds here too: `--tp 8` is `--tp-size 8` (the only flag
starting with --tp), `--cuda-graph-max-bs` is ambiguous (0.5.23 split it into -decode and -prefill),
and an unknown flag ends with `sglang serve: error: unrecognized arguments: ...` and status 2 (0.5.23
names its parser `sglang serve`, server_args.py `prepare_server_args`).

Simulator settings that are no server flag (speeds, output lengths, faults) come from the TOML or
JSON file named by REGEN_SGLANG_SIM_CONFIG; the flags win over the file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["CONFIG_ENV", "build_parser", "main"]

CONFIG_ENV = "REGEN_SGLANG_SIM_CONFIG"
_IGNORE_TERM_ENV = "REGEN_SGLANG_SIM_IGNORE_TERM"

# The helpers stand for SGLang's scheduler and detokenizer processes: in the server's process group,
# gone when the server is (SGLang's children watch their parent the same way).
_CHILD = (
    "import os, signal, sys, time\n"
    "parent = os.getppid()\n"
    f"if os.environ.get('{_IGNORE_TERM_ENV}') == '1':\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "while os.getppid() == parent:\n"
    "    time.sleep(0.2)\n"
)

# (flags, argparse keyword arguments, SimSGLangConfig field or None). Field None: accepted and
# ignored, as the simulator has nothing it changes.
_FLAGS: list[tuple[tuple[str, ...], dict[str, Any], str | None]] = [
    (
        ("--model-path", "--model"),
        {
            "type": str,
            "required": True,
            "help": "The path of the model weights. This can be a local folder or a Hugging Face repo ID.",
        },
        "model_path",
    ),
    (("--tokenizer-path",), {"type": str, "help": "The path of the tokenizer."}, "tokenizer_path"),
    (("--tokenizer-mode",), {"type": str, "default": "auto", "choices": ["auto", "slow"]}, None),
    (("--skip-tokenizer-init",), {"action": "store_true"}, None),
    (("--load-format",), {"type": str, "default": "auto"}, None),
    (("--model-loader-extra-config",), {"type": str, "default": "{}"}, None),
    (("--trust-remote-code",), {"action": "store_true", "default": None}, "trust_remote_code"),
    (("--context-length",), {"type": int}, "context_length"),
    (("--is-embedding",), {"action": "store_true"}, None),
    (("--revision",), {"type": str}, None),
    (("--dtype",), {"type": str, "default": "auto"}, None),
    (("--quantization",), {"type": str}, None),
    (("--kv-cache-dtype",), {"type": str}, "kv_cache_dtype"),
    (("--served-model-name",), {"type": str}, "served_model_name"),
    (("--chat-template",), {"type": str}, None),
    (("--reasoning-parser",), {"type": str}, "reasoning_parser"),
    (("--tool-call-parser",), {"type": str}, "tool_call_parser"),
    (("--sampling-defaults",), {"type": str, "default": "model", "choices": ["model", "openai"]}, None),
    (("--enable-multimodal",), {"action": "store_true"}, None),
    (("--weight-version",), {"type": str}, "weight_version"),
    (("--host",), {"type": str, "default": "127.0.0.1"}, None),
    (("--port",), {"type": int, "default": 30000}, None),
    (("--api-key",), {"type": str}, "api_key"),
    (("--admin-api-key",), {"type": str}, None),
    (("--enable-cache-report",), {"action": "store_true", "default": None}, "enable_cache_report"),
    (("--skip-server-warmup",), {"action": "store_true", "default": None}, "skip_server_warmup"),
    (("--warmups",), {"type": str}, None),
    (("--mem-fraction-static",), {"type": float}, "mem_fraction_static"),
    (("--max-running-requests",), {"type": int}, "max_running_requests"),
    (("--max-queued-requests",), {"type": int}, "max_queued_requests"),
    (("--max-total-tokens",), {"type": int}, "max_total_tokens"),
    (("--chunked-prefill-size",), {"type": int}, "chunked_prefill_size"),
    (("--max-prefill-tokens",), {"type": int}, "max_prefill_tokens"),
    (("--schedule-policy",), {"type": str, "default": "fcfs"}, None),
    (("--schedule-conservativeness",), {"type": float}, "schedule_conservativeness"),
    (("--stream-interval",), {"type": int}, "stream_interval"),
    (
        ("--incremental-streaming-output",),
        {"action": "store_true", "default": None},
        "incremental_streaming_output",
    ),
    (("--random-seed",), {"type": int}, "seed"),
    (("--watchdog-timeout",), {"type": float}, "watchdog_timeout"),
    (("--soft-watchdog-timeout",), {"type": float}, "soft_watchdog_timeout"),
    (("--disable-radix-cache",), {"action": "store_true"}, None),
    (("--tp-size", "--tensor-parallel-size"), {"type": int}, "tp_size"),
    (("--dp-size", "--data-parallel-size"), {"type": int}, "dp_size"),
    (("--ep-size", "--expert-parallel-size"), {"type": int, "default": 1}, None),
    (("--pp-size", "--pipeline-parallel-size"), {"type": int, "default": 1}, None),
    (("--enable-dp-attention",), {"action": "store_true", "default": None}, "enable_dp_attention"),
    (("--nnodes",), {"type": int, "default": 1}, None),
    (("--node-rank",), {"type": int, "default": 0}, None),
    (("--dist-init-addr",), {"type": str}, None),
    (("--attention-backend",), {"type": str}, None),
    (("--disable-cuda-graph",), {"action": "store_true"}, None),
    (("--cuda-graph-max-bs-decode",), {"type": int}, None),
    (("--cuda-graph-max-bs-prefill",), {"type": int}, None),
    (("--disable-flashinfer-autotune",), {"action": "store_true"}, None),
    (("--enable-torch-compile",), {"action": "store_true"}, None),
    (("--enable-metrics",), {"action": "store_true", "default": None}, "enable_metrics"),
    (("--log-level",), {"type": str.lower}, "log_level"),
    (("--log-level-http",), {"type": str.lower}, "log_level_http"),
    (("--log-requests",), {"action": "store_true"}, None),
    (("--log-requests-level",), {"type": int, "default": 2}, None),
    (("--decode-log-interval",), {"type": int}, "decode_log_interval"),
    (("--speculative-algorithm",), {"type": str}, "speculative_algorithm"),
    (("--speculative-draft-model-path", "--speculative-draft-model"), {"type": str}, None),
    (("--speculative-draft-model-revision",), {"type": str}, None),
    (("--speculative-draft-model-quantization",), {"type": str}, None),
    (("--speculative-num-steps",), {"type": int}, None),
    (("--speculative-eagle-topk",), {"type": int}, None),
    (("--speculative-num-draft-tokens",), {"type": int}, None),
    (("--enable-return-hidden-states",), {"action": "store_true"}, None),
    (("--return-hidden-states-mode",), {"type": str, "choices": ["none", "last", "full"]}, None),
]


def build_parser() -> argparse.ArgumentParser:
    """SGLang's parser: argparse defaults (prefix abbreviations allowed), named as 0.5.23 names it."""
    parser = argparse.ArgumentParser(prog="sglang serve")
    for names, kwargs, _field in _FLAGS:
        parser.add_argument(*names, **kwargs)
    return parser


def _dest(names: tuple[str, ...]) -> str:
    return names[0].lstrip("-").replace("-", "_")


def _fail(exc_type: str, message: str) -> int:
    """An exception as SGLang's launcher dies of it: a traceback on stderr, status 1."""
    print(
        "Traceback (most recent call last):\n"
        '  File "<frozen runpy>", line 198, in _run_module_as_main\n'
        '  File "/usr/local/lib/python3.12/dist-packages/sglang/launch_server.py", line 29, in <module>\n'
        "    server_args = prepare_server_args(sys.argv[1:])\n"
        f"{exc_type}: {message}",
        file=sys.stderr,
        flush=True,
    )
    return 1


def _model_config(model: str) -> dict[str, Any] | int:
    folder = Path(model)
    if not folder.is_dir():
        return _fail(
            "OSError",
            f"{model} is not a local folder and is not a valid model identifier listed on "
            "'https://huggingface.co/models'",
        )
    path = folder / "config.json"
    if not path.is_file():
        return _fail(
            "OSError",
            f"{model} does not appear to have a file named config.json. Checkout "
            f"'https://huggingface.co/{model}/tree/None' for available files.",
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return _fail(
            "OSError", f"It looks like the config file at '{path}' is not a valid JSON file. ({exc})"
        )
    if not isinstance(data, dict):
        return _fail("OSError", f"It looks like the config file at '{path}' is not a valid JSON file.")
    return data


def _context_of(model_config: dict[str, Any]) -> int | None:
    for source in (model_config, model_config.get("text_config") or {}):
        if isinstance(source, dict) and isinstance(source.get("max_position_embeddings"), int):
            return int(source["max_position_embeddings"])
    return None


def _spawn_children(n: int, ignore_term: bool) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, _IGNORE_TERM_ENV: "1" if ignore_term else "0"}
    return [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, f"sglang::{'scheduler_TP0' if i == 0 else f'child_{i}'}"],
            stdin=subprocess.DEVNULL,
            env=env,
        )
        for i in range(n)
    ]


def _end_children(children: list[subprocess.Popen[bytes]], sig: signal.Signals) -> None:
    for child in children:
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(sig)
    for child in children:
        try:
            child.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            child.kill()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    model_config = _model_config(args.model_path)
    if isinstance(model_config, int):
        return model_config

    from regen.engine.runtime import run
    from regen.sim.sglang.config import SimConfigError, load_sim_config
    from regen.sim.sglang.logs import SimLog
    from regen.sim.sglang.runner import load_tokenizer, serve
    from regen.sim.sglang.server import SGLangSim
    from regen.sim.sglang.tokens import SimTokenizerError

    overrides: dict[str, Any] = {}
    for names, _kwargs, field in _FLAGS:
        if field is not None:
            value = getattr(args, _dest(names))
            if value is not None:
                overrides[field] = value
    if args.disable_radix_cache:
        overrides["radix_cache"] = False
    # SGLang's own defaults where the simulator's standalone defaults differ.
    overrides["enable_metrics"] = bool(args.enable_metrics)
    overrides.setdefault("tp_size", 1)
    overrides.setdefault("dp_size", 1)
    # The model's own limit; --context-length (as given, or None) is what /server_info reports.
    overrides["model_context_length"] = _context_of(model_config)
    archs = model_config.get("architectures")
    if isinstance(archs, list) and archs:
        overrides["architectures"] = [str(a) for a in archs]
    if isinstance(model_config.get("model_type"), str):
        overrides["model_type"] = model_config["model_type"]
    file = os.environ.get(CONFIG_ENV)
    try:
        config = load_sim_config(Path(file) if file else None, **overrides)
    except SimConfigError as exc:
        return _fail("ValueError", f"{CONFIG_ENV}: {exc}")
    tokenizer_dir = Path(args.tokenizer_path or args.model_path)
    try:
        tok, _ = load_tokenizer(config, tokenizer_dir)
    except SimTokenizerError as exc:
        return _fail("OSError", str(exc))

    sim = SGLangSim(config, tok, log=SimLog(sys.stderr))
    sim.defer_bind_errors = True
    children = _spawn_children(config.child_processes, config.faults.ignore_sigterm)
    try:
        status = run(serve(sim, args.host, args.port))
    except BaseException:
        _end_children(children, signal.SIGKILL)
        raise
    if status < 0:
        # SGLang's sigquit handler kills the whole process tree, itself included.
        _end_children(children, signal.SIGKILL)
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), -status)
        return 128 - status
    _end_children(children, signal.SIGTERM)
    return status
