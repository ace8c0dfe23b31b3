"""A model's endpoints on OpenRouter, and which of them the settings allow.

Prices arrive as strings of US dollars per token (docs/openrouter.md §9.2); they are kept as
Decimal so that no float drift enters reservations or the planner.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from regen.engine.config.settings import OpenRouterSettings, ProviderSettings
from regen.engine.errors import RegenError
from regen.engine.money.ledger import RoutePrice

if TYPE_CHECKING:
    from regen.engine.backends.openrouter.client import OpenRouterClient

# A requested precision admits its finer-named members (docs/openrouter.md §2.2).
QUANTIZATION_FAMILY = {"fp4": {"fp4", "mxfp4", "nvfp4"}, "fp8": {"fp8", "mxfp8"}}


# Coarse quality order of precisions (docs/openrouter.md §2.2, §10.2): NVFP4 and FP4 sit below INT4.
PRECISION_RANK = {
    "fp4": 1,
    "mxfp4": 1,
    "nvfp4": 1,
    "int4": 2,
    "fp6": 3,
    "int8": 4,
    "fp8": 4,
    "mxfp8": 4,
    "fp16": 5,
    "bf16": 5,
    "fp32": 6,
}


def precision_allowlist(native: str, explicit: Collection[str] | None) -> list[str] | None:
    """The precisions routing may use: the settings' list, else the native precision and finer.

    "unknown" is never implied: a provider that does not say what it serves cannot be checked.
    """
    if explicit is not None:
        return list(explicit)
    floor = PRECISION_RANK.get(native)
    if floor is None:
        return None
    return [q for q, rank in PRECISION_RANK.items() if rank >= floor]


def routing_of(settings: OpenRouterSettings) -> ProviderSettings:
    """The `provider` object requests carry: the settings' routing with the precision allowlist."""
    allowlist = (
        precision_allowlist(settings.native_precision, settings.provider.quantizations)
        if settings.precision_guard
        else settings.provider.quantizations
    )
    return settings.provider.model_copy(update={"quantizations": allowlist})


class CatalogError(RegenError, RuntimeError):
    """The endpoints list could not be read or admits no provider."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One provider's endpoint for the model."""

    provider_name: str
    tag: str
    quantization: str
    prompt_price: Decimal
    completion_price: Decimal
    context_length: int | None
    max_completion_tokens: int | None
    status: int
    uptime_30m: float | None

    @property
    def slug(self) -> str:
        """The routing slug that provider.only/ignore/order match: the tag before any '/'."""
        return self.tag.split("/", 1)[0].lower()

    @property
    def price(self) -> RoutePrice:
        return RoutePrice(self.provider_name, self.prompt_price, self.completion_price)

    def names(self) -> set[str]:
        return {self.slug, self.tag.lower(), self.provider_name.lower()}


def _price(value: Any) -> Decimal:
    try:
        price = Decimal(str(value))
    except (InvalidOperation, ValueError):
        return Decimal(0)
    return price if price.is_finite() and price >= 0 else Decimal(0)


def parse_endpoints(body: Any) -> list[Endpoint]:
    """Endpoints from a /models/{author}/{slug}/endpoints body."""
    data = body.get("data") if isinstance(body, dict) else None
    raw = data.get("endpoints") if isinstance(data, dict) else None
    if not isinstance(raw, list):
        raise CatalogError("endpoints response has no data.endpoints list")
    endpoints = []
    for item in raw:
        if not isinstance(item, dict):
            continue
        pricing = item.get("pricing") or {}
        status = item.get("status")
        endpoints.append(
            Endpoint(
                provider_name=str(item.get("provider_name") or item.get("tag") or "?"),
                tag=str(item.get("tag") or item.get("provider_name") or "?"),
                quantization=str(item.get("quantization") or "unknown").lower(),
                prompt_price=_price(pricing.get("prompt", 0)),
                completion_price=_price(pricing.get("completion", 0)),
                context_length=item.get("context_length"),
                max_completion_tokens=item.get("max_completion_tokens"),
                status=status if isinstance(status, int) else 0,
                uptime_30m=item.get("uptime_last_30m"),
            )
        )
    return endpoints


async def fetch_endpoint_table(
    client: OpenRouterClient, model: str
) -> tuple[list[Endpoint], list[dict[str, Any]]]:
    """The model's endpoints, parsed and as the API sent them (for the fields regen does not model)."""
    if model.count("/") != 1:
        raise CatalogError(f"model {model!r} is not of the form author/slug")
    try:
        status, body = await client.get_json(f"/models/{model}/endpoints")
    except Exception as exc:
        raise CatalogError(f"cannot reach {client.settings.base_url}: {type(exc).__name__}: {exc}") from None
    if status != 200:
        message = body.get("error", {}).get("message") if isinstance(body, dict) else None
        raise CatalogError(f"endpoints for {model}: HTTP {status} {message or ''}".strip())
    endpoints = parse_endpoints(body)
    raw = [item for item in body["data"]["endpoints"] if isinstance(item, dict)]
    return endpoints, raw


async def fetch_endpoints(client: OpenRouterClient, model: str) -> list[Endpoint]:
    """Read the model's endpoint table from the API."""
    return (await fetch_endpoint_table(client, model))[0]


def quantization_allowed(quantization: str, allowed: Collection[str] | None) -> bool:
    if allowed is None:
        return True
    admitted: set[str] = set()
    for q in allowed:
        admitted |= QUANTIZATION_FAMILY.get(q, {q})
    return quantization in admitted


def _precision_reason(quantization: str, allowed: Collection[str]) -> str:
    rank = PRECISION_RANK.get(quantization)
    ranks = [PRECISION_RANK[q] for q in allowed if q in PRECISION_RANK]
    if rank is None:
        return f"precision {quantization}: cannot be checked against the allowlist"
    if ranks and rank < min(ranks):
        lowest = min((q for q in allowed if q in PRECISION_RANK), key=lambda q: PRECISION_RANK[q])
        return f"precision {quantization} below the allowed set ({lowest} and finer)"
    return f"precision {quantization} not in the allowed set ({', '.join(allowed)})"


def exclusion_reason(
    endpoint: Endpoint,
    provider: ProviderSettings,
    excluded: Collection[str],
    max_tokens: int | None = None,
) -> str | None:
    """Why routing would skip this endpoint, or None when it is allowed."""
    names = endpoint.names()
    if names & {name.lower() for name in excluded}:
        return "excluded at run time"
    if names & set(provider.ignore):
        return "named in provider.ignore"
    if provider.only is not None and not names & set(provider.only):
        return "not in provider.only"
    if not quantization_allowed(endpoint.quantization, provider.quantizations):
        return _precision_reason(endpoint.quantization, provider.quantizations or [])
    if provider.max_price:
        per_million = Decimal(1_000_000)
        cap_prompt = provider.max_price.get("prompt")
        cap_completion = provider.max_price.get("completion")
        if cap_prompt is not None and endpoint.prompt_price * per_million > Decimal(str(cap_prompt)):
            return "prompt price above provider.max_price"
        if cap_completion is not None and endpoint.completion_price * per_million > Decimal(
            str(cap_completion)
        ):
            return "completion price above provider.max_price"
    if (
        max_tokens is not None
        and endpoint.max_completion_tokens is not None
        and max_tokens > endpoint.max_completion_tokens
    ):
        return f"max_tokens above its max completion tokens ({endpoint.max_completion_tokens})"
    return None


def verdict(
    endpoint: Endpoint,
    provider: ProviderSettings,
    excluded: Mapping[str, str],
    max_tokens: int | None = None,
) -> tuple[bool, str | None, str | None]:
    """(allowed, word, reason): why routing skips the endpoint (or a caveat about an allowed one),
    as one word for a narrow column (precision, settings, price, max_tokens, guard, operator, down)
    and as a sentence.

    `excluded` maps run-time exclusions to who made them, so the guard's are told apart.
    """
    source = excluded.get(endpoint.slug)
    if source is not None:
        if source == "guard":
            return False, "guard", "excluded by the precision guard"
        return False, source, f"excluded at run time ({source})"
    reason = exclusion_reason(endpoint, provider, excluded, max_tokens)
    if reason is None:
        if endpoint.status < 0:
            return True, "down", f"down or degraded (status {endpoint.status}); routed to only as a fallback"
        return True, None, None
    if reason.startswith("precision"):
        word = "precision"
    elif "max_price" in reason:
        word = "price"
    elif reason.startswith("max_tokens"):
        word = "max_tokens"
    else:
        word = "settings"
    return False, word, reason


def allowed_endpoints(
    endpoints: Iterable[Endpoint],
    provider: ProviderSettings,
    excluded: Collection[str] = (),
    max_tokens: int | None = None,
) -> list[Endpoint]:
    return [e for e in endpoints if exclusion_reason(e, provider, excluded, max_tokens) is None]


def find_endpoint(endpoints: Iterable[Endpoint], name: str) -> Endpoint | None:
    """The endpoint a response's `provider` (display name) or an operator's slug refers to."""
    wanted = name.lower()
    for endpoint in endpoints:
        if wanted in endpoint.names():
            return endpoint
    return None
