"""Provider routing for the simulator: docs/openrouter.md §2.2-§2.3 and §6.4.

Filters remove endpoints (only, ignore, quantizations, data policy, require_parameters, tools,
max_price, max_tokens/context); an empty set is the real 404. Ordering is `order`, else `sort`, else
a 1/price^2 weighted pick among stable endpoints with the rest kept as fallbacks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from regen.sim.openrouter.catalog import SimEndpoint, SimModel

PROVIDER_KEYS: frozenset[str] = frozenset(
    {
        "order",
        "allow_fallbacks",
        "only",
        "ignore",
        "require_parameters",
        "data_collection",
        "zdr",
        "enforce_distillable_text",
        "quantizations",
        "sort",
        "preferred_min_throughput",
        "preferred_max_latency",
        "max_price",
    }
)

# Request fields that count as "parameters" for require_parameters (docs/openrouter.md §2.1).
PARAMETER_FIELDS: frozenset[str] = frozenset(
    {
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "top_a",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "seed",
        "stop",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "response_format",
        "structured_outputs",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning",
        "include_reasoning",
        "reasoning_effort",
        "verbosity",
    }
)

QUANTIZATIONS: frozenset[str] = frozenset(
    {"int4", "int8", "fp4", "mxfp4", "nvfp4", "fp6", "fp8", "mxfp8", "fp16", "bf16", "fp32", "unknown"}
)
# The docs say `fp4` covers mxfp4 and nvfp4, and `fp8` covers mxfp8.
_QUANT_FAMILY: dict[str, tuple[str, ...]] = {
    "fp4": ("fp4", "mxfp4", "nvfp4"),
    "fp8": ("fp8", "mxfp8"),
}
_SORTS: frozenset[str] = frozenset({"price", "throughput", "latency", "exacto"})
_MILLION = Decimal(1_000_000)
_PRIVACY_URL = "https://openrouter.ai/settings/privacy"


class RequestError(Exception):
    """A 400 the request itself caused (bad provider object, bad max_price...)."""


@dataclass(slots=True)
class NoEndpoints(Exception):
    """Routing left nothing: carries the real 404 body (docs/openrouter.md §6.4)."""

    body: dict[str, Any]


@dataclass(slots=True)
class Prefs:
    order: list[str] | None = None
    allow_fallbacks: bool = True
    only: list[str] | None = None
    ignore: list[str] | None = None
    require_parameters: bool = False
    data_collection: str = "allow"
    zdr: bool = False
    quantizations: list[str] | None = None
    sort: str | None = None
    max_price: dict[str, Decimal] | None = None


def _names(value: Any, field: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RequestError(f"provider.{field} must be an array of strings")
    return value


def parse_prefs(raw: Any) -> Prefs:
    """Validate the `provider` object; unknown keys are a 400 (additionalProperties: false)."""
    prefs = Prefs()
    if raw is None:
        return prefs
    if not isinstance(raw, dict):
        raise RequestError("provider must be an object")
    unknown = sorted(set(raw) - PROVIDER_KEYS)
    if unknown:
        raise RequestError(f"Unrecognized key(s) in object: {', '.join(repr(k) for k in unknown)}")
    prefs.order = _names(raw.get("order"), "order")
    prefs.only = _names(raw.get("only"), "only")
    prefs.ignore = _names(raw.get("ignore"), "ignore")
    quants = _names(raw.get("quantizations"), "quantizations")
    if quants is not None:
        bad = [q for q in quants if q.lower() not in QUANTIZATIONS]
        if bad:
            raise RequestError(f"provider.quantizations has invalid value(s): {bad}")
        prefs.quantizations = quants
    for flag in ("allow_fallbacks", "require_parameters", "zdr"):
        value = raw.get(flag)
        if value is not None and not isinstance(value, bool):
            raise RequestError(f"provider.{flag} must be a boolean")
    if raw.get("allow_fallbacks") is False:
        prefs.allow_fallbacks = False
    prefs.require_parameters = raw.get("require_parameters") is True
    prefs.zdr = raw.get("zdr") is True
    dc = raw.get("data_collection")
    if dc is not None:
        if dc not in ("allow", "deny"):
            raise RequestError('provider.data_collection must be "allow" or "deny"')
        prefs.data_collection = dc
    sort = raw.get("sort")
    if isinstance(sort, dict):
        sort = sort.get("by")
    if sort is not None:
        if sort not in _SORTS:
            raise RequestError(f"provider.sort has invalid value {sort!r}")
        prefs.sort = sort
    max_price = raw.get("max_price")
    if max_price is not None:
        if not isinstance(max_price, dict):
            raise RequestError("provider.max_price must be an object")
        parsed: dict[str, Decimal] = {}
        for key, value in max_price.items():
            if key not in ("prompt", "completion", "request", "image", "audio"):
                raise RequestError(f"provider.max_price has unknown key {key!r}")
            # The docs use numbers, the spec strings; both mean USD per million tokens.
            if isinstance(value, bool) or not isinstance(value, int | float | str):
                raise RequestError(f"provider.max_price.{key} must be a number or string")
            try:
                parsed[key] = Decimal(str(value))
            except InvalidOperation:
                raise RequestError(f"provider.max_price.{key} is not a number") from None
        prefs.max_price = parsed
    return prefs


def matches(ep: SimEndpoint, name: str) -> bool:
    """Base slug, full tag or display name, case-insensitive (docs/openrouter.md §2.2 Names)."""
    n = name.lower()
    return n == ep.slug or n == ep.tag.lower() or n == ep.provider_name.lower()


def matches_any(ep: SimEndpoint, names: list[str]) -> bool:
    return any(matches(ep, n) for n in names)


def completion_price(ep: SimEndpoint) -> float:
    return float(ep.pricing.completion)


def _price_key(ep: SimEndpoint) -> tuple[float, float]:
    # Output-heavy workloads: completion price first, prompt price breaks ties (inferred).
    return (float(ep.pricing.completion), float(ep.pricing.prompt))


def _within(price: str, limit: Decimal | None, scale: Decimal) -> bool:
    return limit is None or Decimal(price) * scale <= limit


def sent_parameters(body: dict[str, Any]) -> set[str]:
    sent = {k for k in body if k in PARAMETER_FIELDS and body[k] is not None}
    if body.get("max_completion_tokens") is not None:
        sent.add("max_tokens")
    return sent


def _quant_allowed(quants: list[str]) -> set[str]:
    allowed: set[str] = set()
    for q in quants:
        allowed.update(_QUANT_FAMILY.get(q.lower(), (q.lower(),)))
    return allowed


def filter_endpoints(
    model: SimModel,
    endpoints: list[SimEndpoint],
    prefs: Prefs,
    body: dict[str, Any],
    prompt_tokens: int,
    max_tokens: int | None,
    rogue: list[str],
) -> list[SimEndpoint]:
    """Apply §2.3 step 2; raise NoEndpoints naming the filter that emptied the set."""
    eps = list(endpoints)
    excluded_by: list[str] = []
    emptied_by: str | None = None

    def apply(name: str, keep: Any) -> None:
        nonlocal eps, emptied_by
        kept = [e for e in eps if keep(e)]
        if len(kept) < len(eps) and name not in excluded_by:
            excluded_by.append(name)
        if not kept and eps and emptied_by is None:
            emptied_by = name
        eps = kept

    if prefs.only is not None:
        only = prefs.only
        apply("allowed_providers", lambda e: matches_any(e, only))
    if prefs.ignore:
        ignore = prefs.ignore
        apply("allowed_providers", lambda e: not matches_any(e, ignore))
    if prefs.order is not None and not prefs.allow_fallbacks:
        order = prefs.order
        apply("allowed_providers", lambda e: matches_any(e, order))
    if prefs.quantizations:
        allowed = _quant_allowed(prefs.quantizations)
        apply(
            "quantization",
            lambda e: (e.quantization or "unknown").lower() in allowed or matches_any(e, rogue),
        )
    if prefs.zdr:
        apply("data_policy:zdr", lambda e: e.zdr)
    if prefs.data_collection == "deny":
        apply("data_policy:training", lambda e: not e.data_collection)
    if prefs.require_parameters:
        wanted = sent_parameters(body)
        apply("require_parameters", lambda e: wanted.issubset(e.supported_parameters))
    if body.get("tools"):
        apply("tools", lambda e: "tools" in e.supported_parameters)
    if prefs.max_price:
        mp = prefs.max_price
        apply(
            "max_price",
            lambda e: (
                _within(e.pricing.prompt, mp.get("prompt"), _MILLION)
                and _within(e.pricing.completion, mp.get("completion"), _MILLION)
                and _within(e.pricing.request, mp.get("request"), Decimal(1))
            ),
        )
    if max_tokens is not None:
        apply(
            "context_length",
            lambda e: e.max_completion_tokens is None or max_tokens <= e.max_completion_tokens,
        )
    apply(
        "context_length",
        lambda e: (
            prompt_tokens + (max_tokens or 0) <= e.context_length
            and (e.max_prompt_tokens is None or prompt_tokens <= e.max_prompt_tokens)
        ),
    )
    if eps:
        return eps
    raise NoEndpoints(_no_endpoints_body(model, endpoints, prefs, emptied_by, excluded_by))


_MESSAGES: dict[str, str] = {
    "quantization": "No endpoints found matching your quantization requirements.",
    "data_policy:zdr": (
        f"No endpoints found matching your data policy (Zero data retention). Configure: {_PRIVACY_URL}"
    ),
    "data_policy:training": (
        f"No endpoints found matching your data policy (Paid model training). Configure: {_PRIVACY_URL}"
    ),
    "require_parameters": "No endpoints found that can handle the requested parameters.",
    "tools": "No endpoints found that support tool use.",
    "max_price": "No endpoints found matching your price constraints (max_price).",
}


def _no_endpoints_body(
    model: SimModel,
    endpoints: list[SimEndpoint],
    prefs: Prefs,
    emptied_by: str | None,
    excluded_by: list[str],
) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    if emptied_by == "allowed_providers":
        requested = prefs.only if prefs.only is not None else prefs.order
        if prefs.order is not None and not prefs.allow_fallbacks and prefs.only is None:
            message = f"No endpoints found for {model.id}."
        else:
            message = "No allowed providers are available for the selected model."
        metadata["available_providers"] = sorted({e.slug for e in endpoints})
        if requested is not None:
            metadata["requested_providers"] = list(requested)
    elif emptied_by == "context_length":
        message = f"No endpoints found for {model.id} that support the requested max_tokens."
    else:
        message = _MESSAGES.get(emptied_by or "", f"No endpoints found for {model.id}.")
    error: dict[str, Any] = {"message": message, "code": 404}
    if metadata:
        error["metadata"] = metadata
    # Newest docs add an `availability` object on top of the older envelope (§6.2).
    error["availability"] = {
        "code": "privacy_restricted"
        if (emptied_by or "").startswith("data_policy")
        else "constraint_filtered",
        "retryable": False,
        "requested_models": [model.id],
        "excluded_by": excluded_by,
        "docs_url": "https://openrouter.ai/docs/errors#constraint_filtered",
    }
    return {"error": error}


def order_endpoints(
    eps: list[SimEndpoint],
    prefs: Prefs,
    rng: random.Random,
    model_sort: str | None = None,
    sticky: str | None = None,
) -> list[SimEndpoint]:
    """§2.3 step 4: the try-order of the surviving endpoints."""
    if prefs.order:
        first: list[SimEndpoint] = []
        for name in prefs.order:
            for e in sorted(eps, key=_price_key):
                if matches(e, name) and e not in first:
                    first.append(e)
        if not prefs.allow_fallbacks:
            return first
        rest = sorted((e for e in eps if e not in first), key=_default_key)
        return first + rest
    sort = prefs.sort or model_sort
    if sort == "throughput":
        ordered = sorted(eps, key=lambda e: -e.tokens_per_s)
    elif sort == "latency":
        ordered = sorted(eps, key=lambda e: e.ttft_s)
    elif sort in ("price", "exacto"):
        ordered = sorted(eps, key=_price_key)
    else:
        ordered = _weighted(eps, rng)
    if sticky is not None:
        for i, e in enumerate(ordered):
            if e.tag == sticky:
                ordered.insert(0, ordered.pop(i))
                break
    return ordered


def _default_key(e: SimEndpoint) -> tuple[bool, float, float]:
    return (e.status < 0, *_price_key(e))


def _weighted(eps: list[SimEndpoint], rng: random.Random) -> list[SimEndpoint]:
    """Pick the primary among stable endpoints by 1/price^2; the rest follow by price, degraded
    (negative status) ones last (docs/openrouter.md §2.2 Default routing)."""
    stable = [e for e in eps if e.status >= 0] or eps
    weights = [1.0 / max(float(e.pricing.prompt) + float(e.pricing.completion), 1e-12) ** 2 for e in stable]
    primary = rng.choices(stable, weights=weights, k=1)[0]
    rest = sorted((e for e in eps if e is not primary), key=_default_key)
    return [primary, *rest]
