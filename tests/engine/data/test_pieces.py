"""The piece encoder (engine/data/pieces.py): a rendered prompt's ids piece by piece equal the
tokenizer's own, on real byte-level BPE tokenizers; refused where a tokenizer does not cut that way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from regen.engine.data import pieces
from regen.engine.data.pieces import PieceEncoder
from regen.engine.data.tokenizer import TargetTokenizer, TokenizerSpec
from regen.sim.sglang.tokens import KIMI_SPECIALS
from tests.support.tokenizers import build_tokenizer, corpus


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TargetTokenizer]:
    root = tmp_path_factory.mktemp("pieces")
    return {
        "kimi": TargetTokenizer(
            TokenizerSpec(build_tokenizer(root / "kimi", "kimi"), template_kwargs={"thinking": True})
        ),
        "kimi-instant": TargetTokenizer(TokenizerSpec(root / "kimi", template_kwargs={"thinking": False})),
        "chatml": TargetTokenizer(TokenizerSpec(build_tokenizer(root / "chatml", "chatml"))),
    }


# Text that lands on the seams: special tokens' strings whole and cut, partial markers, whitespace
# runs at either end, non-ASCII, and words the tiny BPE knows.
SEAMS = [
    *KIMI_SPECIALS,
    "<|im_start|>",
    "<|",
    "|>",
    "<think",
    "</",
    " ",
    "  ",
    "\n",
    "\t",
    "\r\n",
    "é",
    "東京",
    "😀",
]
TEXT = st.lists(
    st.one_of(st.sampled_from(SEAMS), st.sampled_from(corpus(20)[:20]), st.text(max_size=12)),
    max_size=8,
).map("".join)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": TEXT})
CONVERSATION = st.tuples(st.one_of(st.none(), TEXT), st.lists(MESSAGE, max_size=3), TEXT).map(
    lambda parts: [
        *([{"role": "system", "content": parts[0]}] if parts[0] is not None else []),
        *parts[1],
        {"role": "user", "content": parts[2]},
    ]
)


@pytest.mark.parametrize("kind", ["kimi", "kimi-instant", "chatml"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=CONVERSATION)
def test_piece_ids_are_the_templates_ids(
    kind: str, tokenizers: dict[str, TargetTokenizer], messages: list[dict[str, Any]]
) -> None:
    tok = tokenizers[kind]
    assert tok._pieces is not None, (
        "these tokenizers cut at every added token: the piece path is the one tested"
    )
    assert tok.render_ids(messages) == tok.prompt_ids(messages)


class _BeforeBatchFast:
    """A tokenizer as tokenizers before 0.21 had it: `encode`, no `encode_batch_fast`."""

    def __init__(self, native: Any) -> None:
        self.encode = native.encode


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXT)
def test_one_call_ids_are_the_same_with_or_without_the_batch_call(
    tokenizers: dict[str, TargetTokenizer], text: str
) -> None:
    native = tokenizers["kimi"]._tok._tokenizer
    assert hasattr(native, "encode_batch_fast"), "the installed tokenizers has the faster call"
    want = native.encode(text, add_special_tokens=False).ids
    assert pieces.encode_whole(native, text) == want
    assert pieces.encode_whole(_BeforeBatchFast(native), text) == want


def test_kept_pieces_are_bounded_and_change_nothing(
    tokenizers: dict[str, TargetTokenizer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pieces, "KEPT_PIECES", 8)
    tok = TargetTokenizer(TokenizerSpec(tokenizers["kimi"].path, template_kwargs={"thinking": True}))
    encoder = tok._pieces
    assert encoder is not None
    for i in range(40):
        messages = [{"role": "user", "content": f"question {i}: why {i * 7919 % 1009}?"}]
        assert tok.render_ids(messages) == tok.prompt_ids(messages)
    assert len(encoder._kept) == 8
    # The template's pieces came first and stayed: the default system prompt among them.
    assert any(piece.startswith("You are Kimi") for piece in encoder._kept)


def _native(tmp_path: Path, *, metaspace_first: bool = False, lstrip: bool = False) -> Any:
    from tokenizers import (  # type: ignore[import-untyped]
        AddedToken,
        Tokenizer,
        models,
        pre_tokenizers,
        trainers,
    )

    tok = Tokenizer(models.BPE())
    if metaspace_first:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
        alphabet: list[str] = []
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator(
        corpus(), trainer=trainers.BpeTrainer(vocab_size=400, initial_alphabet=alphabet, show_progress=False)
    )
    tok.add_special_tokens([AddedToken("<|im_end|>", special=True, normalized=False, lstrip=lstrip)])
    return tok


def test_a_first_piece_rule_is_seen_by_the_probes(tmp_path: Path) -> None:
    # Metaspace with prepend_scheme "first" marks only the input's first piece: a piece after a
    # special token, encoded on its own, would be marked too. The flags cannot say so; the probe does.
    native = _native(tmp_path, metaspace_first=True)
    text = "the quick fox<|im_end|>the lazy dog"
    whole = list(native.encode(text, add_special_tokens=False).ids)
    assert PieceEncoder(native, {"<|im_end|>": native.token_to_id("<|im_end|>")}).encode(text) != whole
    assert PieceEncoder.build(native, [text]) is None


def test_a_stripping_token_is_refused_by_its_flags(tmp_path: Path) -> None:
    assert PieceEncoder.build(_native(tmp_path, lstrip=True), ["a<|im_end|>b"]) is None
    assert PieceEncoder.build(_native(tmp_path), ["a <|im_end|> b"]) is not None


def test_a_template_that_refuses_a_probe_still_loads_and_checks_on_the_others(tmp_path: Path) -> None:
    folder = build_tokenizer(tmp_path / "nosystem", "chatml")
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = (
        "{%- if messages[0]['role'] == 'system' -%}{{ raise_exception('System role not supported') }}{%- endif -%}"
        + config["chat_template"]
    )
    config_path.write_text(json.dumps(config))
    tok = TargetTokenizer(TokenizerSpec(folder))
    assert tok._pieces is not None
    messages = [{"role": "user", "content": "Hi <|im_end|> there"}]
    assert tok.render_ids(messages) == tok.prompt_ids(messages)
