"""Everything the OpenRouter simulator can be switched to, as one pydantic model.

Defaults follow the current OpenRouter docs (docs/openrouter.md §13); each older or observed
variant is a field. Tests mutate a live simulator's `config` between requests, and the /_sim/config
admin route merges JSON patches into it, so every field is read per request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from regen.sim.configs import read_config_file
from regen.sim.openrouter.catalog import DEFAULT_MODEL_ID, SimModel, default_models

# Faults that fail an attempt before the first byte with a plain HTTP error. When drawn from a
# provider's own rates they trigger OpenRouter's silent fallback to the next endpoint.
HTTP_FAULTS: tuple[str, ...] = (
    "http_429",
    "http_429_retry_after",
    "http_429_ratelimit_reset",
    "http_500",
    "http_502",
    "http_503",
    "http_408",
    "http_524",
    "http_529",
)

FAULT_CLASSES: tuple[str, ...] = (
    *HTTP_FAULTS,
    "http_402_in_flight",
    "error_body_200",
    "error_choice_200",
    "mid_stream_error",
    "silent_failure",
    "reset_before_headers",
    "cut_mid_stream",
    "cut_nonstream_body",
    "reasoning_exhaustion",
    "degenerate",
    "empty_stop",
    "missing_usage",
    "missing_cost",
    "slow_first_token",
)

# Answers past the edge of anything sane (docs/faults.md, "Responses past the edge"). Drawn from the
# same `faults` rates, but kept out of FAULT_CLASSES: a client survives them only through its own
# limits (bytes per attempt, total time, header size), so an attempt that meets one may last as
# long as the client's request timeout, by design.
EDGE_FAULTS: tuple[str, ...] = (
    "runaway_length",  # the provider ignores max_tokens and sends runaway_tokens
    "trickle",  # the whole answer, at trickle_bytes_per_s
    "endless_body",  # content that never ends, endless_chunk_bytes every chunk_interval_s
    "huge_headers",  # huge_header_bytes of response headers, in huge_header_count headers
)
ALL_FAULTS: tuple[str, ...] = (*FAULT_CLASSES, *EDGE_FAULTS)

UsageShape = Literal["A", "B", "C"]


class SimConfigError(ValueError):
    """A config file the simulator cannot use; the message names the file and the problem."""


def _check_rates(rates: dict[str, float], where: str) -> dict[str, float]:
    for name, p in rates.items():
        if name not in ALL_FAULTS:
            raise ValueError(f"unknown fault class {name!r} in {where}")
        if not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"fault {name!r} probability {p} is outside 0..1 in {where}")
    return rates


class SimConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False)

    # --- auth and money -------------------------------------------------------------------
    api_keys: list[str] = Field(default_factory=lambda: ["sk-sim-test"])
    management_key: str = "sk-sim-management"
    credits: float = 1000.0  # total credits bought, USD; balance = credits - usage
    key_limit: float | None = None  # per-key spending limit, USD
    key_limit_reset: Literal["daily", "weekly", "monthly"] | None = None
    credits_require_management_key: bool = True  # current docs; False = older docs
    user_id: str = "user_2simSimSimSimSimSimSimSim00"
    zero_completion_insurance: bool = True
    byok: bool = False  # cost becomes OpenRouter's fee (0); provider charge in upstream cost
    # /key and /credits report the ledger as of this many seconds ago: costs settle after requests
    # end, so the live figures lag (§7.1 freshness, §13.7). 0: live.
    account_staleness_s: float = Field(0.0, ge=0)

    # --- in-flight spending budget (§6.5 item 2, §13.9) --------------------------------------
    # Off: only the random `http_402_in_flight` fault exists. On: each paid request holds its
    # pre-flight estimate while it runs and its real cost for a settlement window after it ends;
    # the holds may not exceed min(fraction x balance, ceiling). The numbers are unpublished.
    in_flight_budget: bool = False
    in_flight_budget_fraction: float = Field(0.5, gt=0, le=1)  # share of the balance that may be held
    in_flight_budget_ceiling: float = Field(20.0, ge=0)  # USD cap on the budget whatever the balance
    in_flight_settlement_s: float = Field(5.0, ge=0)  # a finished request's cost stays held this long
    # The budget applies only below this balance (OpenRouter: low-balance prepaid accounts); None: always.
    in_flight_balance_threshold: float | None = None

    # --- platform and provider rate limits (§7.3, §13.10, §13.24) ----------------------------
    free_model_limits: bool = False  # enforce the `:free` variants' per-minute and per-day limits
    free_model_rpm: int = Field(20, ge=1)  # FREE_MODEL_RATE_LIMIT_RPM
    # Whether $10 or more of credits were ever bought (1000/day, else 50/day); None: credits >= 10.
    free_model_credits_bought: bool | None = None
    free_model_rpd_no_credits: int = Field(50, ge=1)  # FREE_MODEL_NO_CREDITS_RPD
    free_model_rpd_with_credits: int = Field(1000, ge=1)  # FREE_MODEL_HAS_CREDITS_RPD
    # The docs add Retry-After to a platform 429 only in some cases; X-RateLimit-* always come.
    free_model_retry_after: bool = False
    # Requests per second each provider accepts, keyed like endpoint_overrides; one token bucket per
    # model and endpoint. An empty bucket fails that attempt with an upstream 429, and OpenRouter
    # falls back to the next endpoint when allowed. Empty dict: unlimited.
    provider_rate_limits: dict[str, float] = Field(default_factory=dict)
    provider_rate_burst_s: float = Field(1.0, gt=0)  # bucket depth, in seconds of its rate
    provider_rate_retry_after: bool = True  # the final upstream 429 carries Retry-After

    # --- catalog ---------------------------------------------------------------------------
    models: list[SimModel] = Field(default_factory=default_models)
    default_model: str = DEFAULT_MODEL_ID  # used when a request names no model
    # Per-endpoint field overrides keyed by tag, base slug or display name (case-insensitive),
    # e.g. {"fireworks": {"tokens_per_s": 500, "ttft_s": 0}}; easier to patch than `models`.
    endpoint_overrides: dict[str, dict[str, Any]] = Field(default_factory=dict)

    # --- timing ----------------------------------------------------------------------------
    time_scale: float = 1.0  # multiplies every TTFT and per-token delay; tests use ~0.01
    chunk_interval_s: float = 0.05  # a stream flushes the tokens produced so far this often
    # 0: a flush sends one reasoning and one content event, however many tokens it holds, so a
    # busy client sees fewer, larger events. N > 0: events of N tokens (aligned to multiples of N),
    # so a completion's events do not depend on timing; benchmarks compare clients this way.
    tokens_per_event: int = Field(0, ge=0)
    keepalive_interval_s: float = 1.0  # ": OPENROUTER PROCESSING" while no token is due
    generation_lookup_delay_s: float = 2.0  # GET /generation is 404 until this after completion

    # --- completions -------------------------------------------------------------------------
    min_completion_tokens: int = 32
    max_completion_tokens: int = 512
    reasoning_share: float = 0.3  # fraction of the completion that is reasoning (if enabled)
    usage_shape: UsageShape = "A"  # A: choices:[] + cost; B: one choice, no cost; C: none
    # Share of completions that call tools when a request carries `tools` (tool_choice "required"
    # or a named function always does, "none" never); 0 keeps text answers for every request.
    tool_call_share: float = 0.0
    max_parallel_tool_calls: int = Field(2, ge=1)  # calls in one answer, unless parallel_tool_calls:false
    seed: int = 0

    # --- faults ----------------------------------------------------------------------------
    faults: dict[str, float] = Field(default_factory=dict)  # class -> probability per request
    # Per-provider rates keyed like endpoint_overrides, drawn per attempt; an HTTP fault here
    # fails only that attempt and OpenRouter falls back when allowed.
    provider_faults: dict[str, dict[str, float]] = Field(default_factory=dict)
    rogue_providers: list[str] = Field(default_factory=list)  # ignore quantizations filter
    # Impostors (docs/fidelity.md): providers that declare the model and its precision but serve
    # another, keyed like endpoint_overrides, each with its drift in 0..1. Their answers follow the
    # reference for `impostor_prefix_tokens` tokens and then say something else; their lengths grow
    # by the drift, and that share of their answers runs on to the length cap (finish "length").
    impostor_providers: dict[str, float] = Field(default_factory=dict)
    impostor_prefix_tokens: int = Field(32, ge=0)
    # Providers that render another chat template (a system prompt of their own, say), keyed like
    # endpoint_overrides: their usage.prompt_tokens (and the prompt tokens billed) count this many
    # more than the others' (docs/fidelity.md, "prompt_tokens").
    prompt_token_offsets: dict[str, int] = Field(default_factory=dict)
    slow_first_token_factor: float = 20.0
    fault_position: float = 0.5  # share of the completion sent before a mid-stream fault
    retry_after_s: int = 2  # Retry-After seconds on 429/503/402-in-flight faults
    done_after_error: bool = True  # send [DONE] after a mid-stream error chunk
    # The edge faults (EDGE_FAULTS); only read when one is drawn.
    runaway_tokens: int = Field(
        default=200_000, ge=1
    )  # `runaway_length`: tokens sent whatever max_tokens says
    trickle_bytes_per_s: float = Field(default=1.0, gt=0)  # `trickle`: real time, not scaled by time_scale
    endless_chunk_bytes: int = Field(default=65536, ge=1)  # `endless_body`: written every chunk_interval_s
    huge_header_bytes: int = Field(default=1 << 20, ge=1)  # `huge_headers`: header bytes in all
    huge_header_count: int = Field(default=1, ge=1)  # `huge_headers`: how many headers share them
    requests_maxlen: int = 100_000

    @field_validator("faults")
    @classmethod
    def _valid_faults(cls, v: dict[str, float]) -> dict[str, float]:
        return _check_rates(v, "faults")

    @field_validator("provider_faults")
    @classmethod
    def _valid_provider_faults(cls, v: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        for provider, rates in v.items():
            _check_rates(rates, f"provider_faults[{provider!r}]")
        return v

    @field_validator("impostor_providers")
    @classmethod
    def _drifts(cls, v: dict[str, float]) -> dict[str, float]:
        for provider, drift in v.items():
            if not 0.0 <= float(drift) <= 1.0:
                raise ValueError(f"impostor_providers[{provider!r}] drift {drift} is outside 0..1")
        return v

    @field_validator("min_completion_tokens", "max_completion_tokens")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v < 0:
            raise ValueError("must be >= 0")
        return v

    @field_validator("provider_rate_limits")
    @classmethod
    def _positive_rates(cls, v: dict[str, float]) -> dict[str, float]:
        for provider, rate in v.items():
            if not float(rate) > 0:
                raise ValueError(f"provider_rate_limits[{provider!r}] must be > 0 requests per second")
        return v

    @field_validator("reasoning_share", "fault_position", "tool_call_share")
    @classmethod
    def _share(cls, v: float) -> float:
        if not 0.0 <= v <= 1.0:
            raise ValueError("must be within 0..1")
        return v


def load_sim_config(path: Path | None) -> SimConfig:
    """Read a TOML or JSON config file; None gives the defaults."""
    if path is None:
        return SimConfig()
    path = Path(path)
    data = read_config_file(path, "openrouter", SimConfigError)
    try:
        return SimConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}" for err in exc.errors()
        )
        raise SimConfigError(f"{path}: {problems}") from None
