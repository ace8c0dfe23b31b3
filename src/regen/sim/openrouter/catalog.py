"""Model and endpoint fixture tables for the OpenRouter simulator.

The numbers follow docs/openrouter.md §10.2 ("Simulator fixture for K2.5"): eleven endpoints
mixing the native int4, several fp8, one fp4, one nvfp4, one bf16, one "unknown" and one null
quantization, priced as USD-per-token strings like the live API. Performance profiles are
simulator-only and never appear on the wire except as the latency/throughput percentiles of
/endpoints.
"""

from __future__ import annotations

from decimal import Decimal

from pydantic import BaseModel, ConfigDict, Field

# Parameters a K2.x endpoint typically declares; require_parameters checks against these.
_K2_PARAMS: list[str] = [
    "max_tokens",
    "temperature",
    "top_p",
    "stop",
    "frequency_penalty",
    "presence_penalty",
    "seed",
    "response_format",
    "structured_outputs",
    "tools",
    "tool_choice",
    "reasoning",
    "include_reasoning",
    "reasoning_effort",
]


class Pricing(BaseModel):
    """USD per token as decimal strings, exactly as /models and /endpoints spell them."""

    model_config = ConfigDict(extra="forbid")

    prompt: str
    completion: str
    request: str = "0"
    image: str = "0"
    input_cache_read: str | None = None


class SimEndpoint(BaseModel):
    """One provider endpoint of a model, plus the simulator's performance profile."""

    model_config = ConfigDict(extra="forbid")

    provider_name: str  # display name, echoed as the response's `provider`
    tag: str  # routing slug; its base (before "/") is what only/ignore/order match
    quantization: str | None
    pricing: Pricing
    context_length: int
    max_completion_tokens: int | None
    max_prompt_tokens: int | None = None
    supported_parameters: list[str] = Field(default_factory=lambda: list(_K2_PARAMS))
    status: int = 0
    uptime_last_5m: float | None = 100.0
    uptime_last_30m: float | None = 99.5
    uptime_last_1d: float | None = 99.7
    supports_implicit_caching: bool = False
    # Data policy flags for provider.data_collection / provider.zdr filters.
    data_collection: bool = False
    zdr: bool = True
    # Simulator-only performance profile.
    ttft_s: float = Field(default=0.8, ge=0)
    ttft_jitter: float = Field(default=0.2, ge=0)
    tokens_per_s: float = Field(default=60.0, gt=0)
    supports_cancellation: bool = False

    @property
    def slug(self) -> str:
        return self.tag.split("/", 1)[0].lower()


class SimModel(BaseModel):
    """A model as /models lists it, with its endpoint table."""

    model_config = ConfigDict(extra="forbid")

    id: str
    canonical_slug: str
    name: str
    hugging_face_id: str | None = None
    created: int = 1769472000
    description: str = ""
    context_length: int = 262144
    input_modalities: list[str] = Field(default_factory=lambda: ["text", "image"])
    tokenizer: str = "Other"
    reasoning: bool = True  # whether the model emits reasoning text by default
    # Used by the pre-flight 402 when a request names no max_tokens (docs/openrouter.md §6.5).
    default_max_completion_tokens: int = 65535
    endpoints: list[SimEndpoint]
    # Endpoints (names as in provider.only) that also serve the `:free` variant at zero price;
    # empty: the model has no free variant and `<id>:free` is an unknown model.
    free_providers: list[str] = Field(default_factory=list)


def _ep(
    provider_name: str,
    tag: str,
    quantization: str | None,
    prompt_per_m: str,
    completion_per_m: str,
    max_completion_tokens: int | None,
    *,
    status: int = 0,
    ttft_s: float,
    tokens_per_s: float,
    cancellation: bool,
    context_length: int = 262144,
    caching: bool = False,
    data_collection: bool = False,
    zdr: bool = True,
) -> SimEndpoint:
    return SimEndpoint(
        provider_name=provider_name,
        tag=tag,
        quantization=quantization,
        pricing=Pricing(prompt=_per_token(prompt_per_m), completion=_per_token(completion_per_m)),
        context_length=context_length,
        max_completion_tokens=max_completion_tokens,
        max_prompt_tokens=None,
        status=status,
        uptime_last_5m=100.0 if status == 0 else 87.0,
        uptime_last_30m=99.4 if status == 0 else 91.2,
        uptime_last_1d=99.7 if status == 0 else 94.8,
        supports_implicit_caching=caching,
        data_collection=data_collection,
        zdr=zdr,
        ttft_s=ttft_s,
        ttft_jitter=ttft_s / 4,
        tokens_per_s=tokens_per_s,
        supports_cancellation=cancellation,
    )


def _per_token(per_million: str) -> str:
    """ "2.20" ($/M) -> "0.0000022" ($/token), computed in decimal so the string is exact."""
    value = Decimal(per_million) / Decimal(1_000_000)
    return format(value.normalize(), "f")


def kimi_k25_endpoints() -> list[SimEndpoint]:
    # Parasail is the cheapest endpoint at or above native precision: $2.20/M completion.
    # DeepInfra (fp4) and GMICloud (nvfp4) are the two below-native ones an operator ignores.
    return [
        _ep(
            "Moonshot AI",
            "moonshotai/int4",
            "int4",
            "0.60",
            "2.50",
            65535,
            ttft_s=1.2,
            tokens_per_s=45.0,
            cancellation=False,
            caching=True,
        ),
        _ep(
            "Fireworks",
            "fireworks/fp8",
            "fp8",
            "0.55",
            "2.40",
            None,
            ttft_s=0.6,
            tokens_per_s=110.0,
            cancellation=True,
            caching=True,
        ),
        _ep(
            "Together",
            "together/fp8",
            "fp8",
            "1.00",
            "3.00",
            32768,
            ttft_s=0.8,
            tokens_per_s=80.0,
            cancellation=True,
        ),
        _ep(
            "Parasail",
            "parasail/fp8",
            "fp8",
            "0.50",
            "2.20",
            65536,
            ttft_s=0.9,
            tokens_per_s=60.0,
            cancellation=False,
        ),
        _ep(
            "BaseTen",
            "baseten/fp8",
            "fp8",
            "0.60",
            "2.60",
            131072,
            ttft_s=0.7,
            tokens_per_s=95.0,
            cancellation=False,
        ),
        _ep(
            "Chutes",
            "chutes/fp8",
            "fp8",
            "0.50",
            "2.35",
            None,
            status=-2,
            ttft_s=2.0,
            tokens_per_s=35.0,
            cancellation=True,
            context_length=131072,
            data_collection=True,
            zdr=False,
        ),
        _ep(
            "DeepInfra",
            "deepinfra/fp4",
            "fp4",
            "0.45",
            "2.20",
            16384,
            ttft_s=0.8,
            tokens_per_s=70.0,
            cancellation=True,
        ),
        _ep(
            "GMICloud",
            "gmicloud/nvfp4",
            "nvfp4",
            "0.48",
            "2.30",
            65536,
            ttft_s=0.5,
            tokens_per_s=120.0,
            cancellation=False,
        ),
        _ep(
            "Novita",
            "novita/bf16",
            "bf16",
            "1.20",
            "3.00",
            32768,
            ttft_s=1.5,
            tokens_per_s=30.0,
            cancellation=True,
        ),
        _ep(
            "Atlas Cloud",
            "atlas-cloud",
            "unknown",
            "0.70",
            "2.80",
            None,
            ttft_s=1.0,
            tokens_per_s=50.0,
            cancellation=False,
            data_collection=True,
            zdr=False,
        ),
        _ep(
            "SiliconFlow",
            "siliconflow",
            None,
            "0.58",
            "2.29",
            16384,
            status=-2,
            ttft_s=1.4,
            tokens_per_s=40.0,
            cancellation=False,
        ),
    ]


def kimi_k2_thinking_endpoints() -> list[SimEndpoint]:
    return [
        _ep(
            "Moonshot AI",
            "moonshotai",
            "int4",
            "0.60",
            "2.50",
            262144,
            ttft_s=1.2,
            tokens_per_s=40.0,
            cancellation=False,
        ),
        _ep(
            "Novita",
            "novita/bf16",
            "bf16",
            "0.60",
            "2.50",
            131072,
            ttft_s=1.3,
            tokens_per_s=35.0,
            cancellation=True,
        ),
        _ep(
            "DeepInfra",
            "deepinfra/fp8",
            "fp8",
            "0.55",
            "2.50",
            None,
            ttft_s=0.9,
            tokens_per_s=60.0,
            cancellation=True,
        ),
    ]


DEFAULT_MODEL_ID = "moonshotai/kimi-k2.5"


def default_models() -> list[SimModel]:
    """Fresh copies each call, so one simulator's edits never leak into another's."""
    return [
        SimModel(
            id="moonshotai/kimi-k2.5",
            canonical_slug="moonshotai/kimi-k2.5-0127",
            name="MoonshotAI: Kimi K2.5",
            hugging_face_id="moonshotai/Kimi-K2.5",
            created=1769472000,
            description="Kimi K2.5, a native multimodal MoE model with thinking (simulated).",
            context_length=262144,
            endpoints=kimi_k25_endpoints(),
            # The historical kimi-k2:free was served by Chutes and Parasail (docs/openrouter.md §10.1).
            free_providers=["chutes", "parasail"],
        ),
        SimModel(
            id="moonshotai/kimi-k2-thinking",
            canonical_slug="moonshotai/kimi-k2-thinking-20251106",
            name="MoonshotAI: Kimi K2 Thinking",
            hugging_face_id="moonshotai/Kimi-K2-Thinking",
            created=1762387200,
            description="Kimi K2 Thinking (simulated).",
            context_length=262144,
            input_modalities=["text"],
            default_max_completion_tokens=262144,
            endpoints=kimi_k2_thinking_endpoints(),
        ),
    ]
