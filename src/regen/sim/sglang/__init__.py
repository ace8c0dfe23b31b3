"""The SGLang simulator: SGLang's native HTTP API, its scheduler's load behaviour, its log and its
failures, on loopback and without a GPU (docs/sglang.md)."""

from __future__ import annotations

from regen.sim.sglang.config import FaultConfig, SimConfigError, SimSGLangConfig, load_sim_config
from regen.sim.sglang.logs import SimLog
from regen.sim.sglang.runner import load_tokenizer, run_sim, serve
from regen.sim.sglang.server import SGLangSim
from regen.sim.sglang.tokens import SimTokenizer, SimTokenizerError, builtin_tokenizer_folder

__all__ = [
    "FaultConfig",
    "SGLangSim",
    "SimConfigError",
    "SimLog",
    "SimSGLangConfig",
    "SimTokenizer",
    "SimTokenizerError",
    "builtin_tokenizer_folder",
    "load_sim_config",
    "load_tokenizer",
    "run_sim",
    "serve",
]
