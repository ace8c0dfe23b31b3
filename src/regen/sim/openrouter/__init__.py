"""The OpenRouter simulator: a real HTTP server on loopback speaking OpenRouter's wire format."""

from __future__ import annotations

from regen.sim.openrouter.billing import BillingBook, GenerationRecord
from regen.sim.openrouter.catalog import DEFAULT_MODEL_ID, Pricing, SimEndpoint, SimModel, default_models
from regen.sim.openrouter.config import (
    EDGE_FAULTS,
    FAULT_CLASSES,
    HTTP_FAULTS,
    SimConfig,
    SimConfigError,
    load_sim_config,
)
from regen.sim.openrouter.server import OpenRouterSim, serve_forever

__all__ = [
    "DEFAULT_MODEL_ID",
    "EDGE_FAULTS",
    "FAULT_CLASSES",
    "HTTP_FAULTS",
    "BillingBook",
    "GenerationRecord",
    "OpenRouterSim",
    "Pricing",
    "SimConfig",
    "SimConfigError",
    "SimEndpoint",
    "SimModel",
    "default_models",
    "load_sim_config",
    "serve_forever",
]
