"""The SGLang simulator under load: the Kimi-like tokenizer it serves (tests/support/sglang_sim.py)."""

from __future__ import annotations

import pytest

from regen.sim.sglang.tokens import SimTokenizer
from tests.support.sglang_sim import model_folder


@pytest.fixture(scope="session")
def kimi_tok(tmp_path_factory: pytest.TempPathFactory) -> SimTokenizer:
    return SimTokenizer(model_folder(tmp_path_factory.mktemp("kimi-model")))
