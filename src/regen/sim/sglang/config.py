"""Everything the SGLang simulator can be set to, as one pydantic model (docs/sglang.md, "Simulator").

Server fields carry the names of the `launch_server` flags they stand for (max_running_requests,
max_total_tokens, ...), so the stand-in launcher maps flags onto them one to one. Timing, output
lengths and faults are the simulator's own. A live simulator re-reads `config` on every scheduler
step and request, and the /_sim/config admin route merges JSON patches into it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from regen.sim.configs import merge_patch, patched, read_config_file

__all__ = [
    "DEFAULT_CONTEXT",
    "DEFAULT_MAX_RUNNING",
    "STARTUP_PHASES",
    "FaultConfig",
    "SimConfigError",
    "SimSGLangConfig",
    "load_sim_config",
    "merge_patch",
    "patched",
]

# The startup phases in the order the server passes them (docs/sglang.md, "Startup").
STARTUP_PHASES: tuple[str, ...] = ("weights", "kv_pool", "cuda_graph", "http", "warmup")
StartupPhase = Literal["weights", "kv_pool", "cuda_graph", "http", "warmup"]
LogLevel = Literal["debug", "info", "warning", "error", "critical"]
# What the simulated server uses when neither the flag nor the model folder says.
DEFAULT_CONTEXT = 131072
DEFAULT_MAX_RUNNING = 256


class SimConfigError(ValueError):
    """A config the simulator cannot use; the message names the file and the setting."""


class FaultConfig(BaseModel):
    """Faults, all off by default. Rates are probabilities per /generate request."""

    model_config = ConfigDict(extra="forbid")

    abort_rate: float = Field(default=0.0, ge=0, le=1)  # the server aborts the request mid-generation
    abort_message: str = "Aborted"
    http_503_rate: float = Field(default=0.0, ge=0, le=1)  # 503 before anything is generated
    drop_rate: float = Field(default=0.0, ge=0, le=1)  # the connection is closed mid-generation
    # The model samples an id outside the vocabulary: the request ends {"type": "stop", "matched":
    # "NaN happened"} with an eos id in its place (docs/sglang.md §4).
    nan_rate: float = Field(default=0.0, ge=0, le=1)
    fault_position: float = Field(default=0.5, ge=0, le=1)  # share of the output produced before abort/drop
    # The scheduler's forward hangs from this point on: the watchdog then crashes the server once
    # a batch has been stuck for watchdog_timeout (seconds since ready, or requests admitted).
    watchdog_after_s: float | None = Field(default=None, ge=0)
    watchdog_after_requests: int | None = Field(default=None, ge=0)
    # A hang the watchdog sees too, switched at run time: no forward completes while it is on.
    stall: bool = False
    # Startup stops at this phase with the phase's failure signature, then the process exits.
    startup_fail_at: StartupPhase | None = None
    # The process and its children ignore SIGTERM, so only SIGKILL ends them.
    ignore_sigterm: bool = False


class SimSGLangConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # --- what the server says about itself (launch_server flags of the same names) ---------------
    model_path: str = "sim/kimi-k2.5"
    served_model_name: str | None = None  # None: the model path, as SGLang does
    tokenizer_path: str | None = None
    version: str = "0.5.23"  # sglang.__version__ reported by /server_info and the stand-in
    tp_size: int = Field(default=8, ge=1)
    dp_size: int = Field(default=1, ge=1)
    # Data-parallel attention: each of the dp_size ranks exports its own scheduler series (its
    # tp_rank and dp_rank); the simulator's one scheduler deals its requests to them in turn.
    enable_dp_attention: bool = False
    # --context-length as given: None unless passed, and so in /server_info (as 0.5.23 reports it);
    # the limit is then the model's own, which /v1/models' max_model_len always says.
    context_length: int | None = Field(default=None, ge=16)
    model_context_length: int | None = Field(default=None, ge=16)  # config.json's; None: 131072
    # --max-running-requests as given: None lets the server choose (256 here), and so in /server_info.
    max_running_requests: int | None = Field(default=None, ge=1)
    max_queued_requests: int | None = Field(default=None, ge=1)  # a newcomer past it: a 503 abort
    max_total_tokens: int = Field(default=1_000_000, ge=64)  # the KV token pool
    chunked_prefill_size: int = Field(default=8192, ge=1)
    max_prefill_tokens: int = Field(default=16384, ge=1)
    schedule_conservativeness: float = Field(default=1.0, gt=0)
    watchdog_timeout: float = Field(default=300.0, gt=0)
    # The soft watchdog: the same line with self.soft=True, and the server runs on (simulated seconds).
    soft_watchdog_timeout: float | None = Field(default=None, gt=0)
    speculative_algorithm: str | None = None  # e.g. EAGLE3: the capture lines of a speculative server
    stream_interval: int = Field(default=1, ge=1)  # a request's sampling_params.stream_interval wins
    # --incremental-streaming-output: each chunk holds only what is new (0.5.9: --stream-output).
    incremental_streaming_output: bool = False
    decode_log_interval: int = Field(default=40, ge=1)
    enable_metrics: bool = True
    log_level: LogLevel = "info"  # lines below it are not logged: INFO hides the phases and "ready"
    log_level_http: LogLevel | None = None  # uvicorn's lines; None: log_level
    enable_cache_report: bool = False
    skip_server_warmup: bool = False
    api_key: str | None = None
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    mem_fraction_static: float = Field(default=0.85, gt=0, le=1)
    kv_cache_dtype: str = "auto"
    trust_remote_code: bool = False
    weight_version: str = "default"
    architectures: list[str] = Field(default_factory=lambda: ["KimiK25ForConditionalGeneration"])
    model_type: str = "kimi_k25"
    # "both": /server_info, /model_info and the deprecated /get_* paths (0.5.23); "legacy": only
    # the /get_* paths with the older, smaller /get_model_info body.
    info_paths: Literal["both", "legacy"] = "both"
    # Capture lines of 0.5.23, or of older releases ("Capture cuda graph begin. This can take...").
    legacy_capture_log: bool = False
    access_log: bool = False  # uvicorn's per-request lines; off keeps big runs' logs small
    # uvicorn closes a keep-alive connection idle this long (SGLANG_TIMEOUT_KEEP_ALIVE, real seconds).
    timeout_keep_alive: float = Field(default=5.0, gt=0)

    # --- timing ------------------------------------------------------------------------------------
    time_scale: float = Field(default=1.0, gt=0)  # multiplies every simulated duration; tests use ~0.01
    speed: float = Field(default=1.0, gt=0)  # decode and prefill run this many times faster (run-time knob)
    decode_tokens_per_s: float = Field(default=40.0, gt=0)  # one request alone
    max_gen_throughput: float = Field(default=20_000.0, gt=0)  # the whole batch, tokens/s
    prefill_tokens_per_s: float = Field(default=50_000.0, gt=0)
    # A forward shorter than this (real seconds) carries several tokens per request instead, so a
    # fast simulator costs steps, not tokens.
    min_step_s: float = Field(default=0.01, gt=0)
    forward_sleep_s: float = Field(default=0.0, ge=0)  # /slow_down: extra sleep per forward, real seconds
    health_check_timeout_s: float = Field(default=20.0, gt=0)
    startup_weights_s: float = Field(default=2.0, ge=0)
    startup_kv_pool_s: float = Field(default=0.3, ge=0)
    startup_cuda_graph_s: float = Field(default=1.0, ge=0)
    startup_http_s: float = Field(default=0.1, ge=0)
    startup_warmup_s: float = Field(default=0.1, ge=0)
    sigterm_drain_s: float = Field(default=0.0, ge=0)  # requests in flight may finish this long after TERM

    # --- generation ----------------------------------------------------------------------------------
    seed: int = 0
    output_len_dist: Literal["uniform", "lognormal"] = "uniform"
    output_len_min: int = Field(default=16, ge=1)
    output_len_max: int = Field(default=256, ge=1)
    output_len_median: int = Field(default=64, ge=1)  # lognormal only
    output_len_sigma: float = Field(default=0.8, gt=0)  # lognormal only
    reasoning_share: float = Field(default=0.5, ge=0, le=1)  # of the output, when the prompt opens <think>
    # An impostor worker (docs/fidelity.md): it serves another model under the same name. Its output
    # follows the reference's ids for `drift_after_tokens` ids, then other ids; its lengths grow by
    # `drift` and that share of its answers never closes its thinking and runs on to max_new_tokens.
    drift: float | None = Field(default=None, ge=0, le=1)
    drift_after_tokens: int = Field(default=32, ge=0)
    end_of_turn: str = "<|im_end|>"
    think_open: str = "<think>"
    think_close: str = "</think>"
    radix_cache: bool = True
    cache_block_tokens: int = Field(default=16, ge=1)
    cache_max_blocks: int = Field(default=200_000, ge=0)
    child_processes: int = Field(default=2, ge=0)  # the stand-in's helper processes in its group
    requests_maxlen: int = Field(default=10_000, ge=1)  # request summaries kept for /_sim/state
    # The summaries also hold each request's prompt and output ids: the server's own record of what it
    # received and generated, for tests of a server in another process (behind a tunnel, a router).
    record_ids: bool = False

    faults: FaultConfig = Field(default_factory=lambda: FaultConfig())

    @model_validator(mode="after")
    def _lengths(self) -> SimSGLangConfig:
        if self.output_len_min > self.output_len_max:
            raise ValueError(
                f"output_len_min ({self.output_len_min}) is above output_len_max ({self.output_len_max})"
            )
        return self

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.model_path

    @property
    def context_len(self) -> int:
        """The context the server enforces: the flag, else the model's own."""
        return self.context_length or self.model_context_length or DEFAULT_CONTEXT

    @property
    def running_cap(self) -> int:
        """The running requests the scheduler allows at most."""
        return self.max_running_requests or DEFAULT_MAX_RUNNING


def problems(exc: ValidationError) -> str:
    """A pydantic error as one line: `field.path: message; ...`."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}" for err in exc.errors()
    )


def load_sim_config(path: Path | None, **overrides: Any) -> SimSGLangConfig:
    """Read a TOML or JSON config file (None: the defaults); `overrides` win over the file."""
    data: Any = {}
    if path is not None:
        path = Path(path)
        data = read_config_file(path, "sglang", SimConfigError)
    data = merge_patch(data, {k: v for k, v in overrides.items() if v is not None})
    try:
        return SimSGLangConfig.model_validate(data)
    except ValidationError as exc:
        where = str(path) if path is not None else "simulator settings"
        raise SimConfigError(f"{where}: {problems(exc)}") from None
