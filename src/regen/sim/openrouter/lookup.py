"""Which model a request's name means, and the endpoints it has under the config's overrides
(variants §7.3, §10.1; per-provider overrides and fault rates)."""

from __future__ import annotations

from typing import Any

from regen.sim.openrouter.catalog import Pricing, SimEndpoint, SimModel
from regen.sim.openrouter.config import SimConfig
from regen.sim.openrouter.routing import matches, matches_any

_VARIANTS = frozenset({"nitro", "floor", "exacto", "free"})
_FREE_PRICING = Pricing(prompt="0", completion="0")


def find_model(config: SimConfig, name: str) -> tuple[SimModel | None, str | None]:
    """The model `name` names and its variant (":free", ...), or (None, None)."""
    base, _, variant = name.partition(":")
    for m in config.models:
        if base in (m.id, m.canonical_slug):
            if variant and (variant not in _VARIANTS or (variant == "free" and not m.free_providers)):
                return None, None
            return m, variant or None
    return None, None


def model_endpoints(config: SimConfig, model: SimModel, variant: str | None = None) -> list[SimEndpoint]:
    eps = _overridden(config, model)
    if variant == "free":
        # The free variant is a few providers' endpoints at zero price (§7.3, §10.1).
        names = model.free_providers
        eps = [e.model_copy(update={"pricing": _FREE_PRICING}) for e in eps if matches_any(e, names)]
    return eps


def _overridden(config: SimConfig, model: SimModel) -> list[SimEndpoint]:
    overrides = config.endpoint_overrides
    if not overrides:
        return model.endpoints
    out: list[SimEndpoint] = []
    for e in model.endpoints:
        update: dict[str, Any] = {}
        for name, fields in overrides.items():
            if matches(e, name):
                update.update(fields)
        if isinstance(update.get("pricing"), dict):
            update["pricing"] = Pricing(**{**e.pricing.model_dump(), **update["pricing"]})
        out.append(e.model_copy(update=update) if update else e)
    return out


def provider_rates(config: SimConfig, ep: SimEndpoint) -> dict[str, float]:
    """The fault rates `provider_faults` gives this endpoint's provider."""
    pf = config.provider_faults
    if not pf:
        return {}
    rates: dict[str, float] = {}
    for name, r in pf.items():
        if matches(ep, name):
            rates.update(r)
    return rates
