"""Kimi's tokenizer shape (tiktoken.model and remote code): its refusals, and the direct tiktoken path
giving the remote class's own ids (engine/data/tiktoken_direct.py, docs/data-contract.md §8.1, §9)."""

from __future__ import annotations

import base64
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from regen.engine.data.tiktoken_direct import RanksFileError, check_ranks_file
from regen.engine.data.tokenizer import THINK_END, TargetTokenizer, TokenizerError, TokenizerSpec
from tests.support.tiktoken_model import KIMI_NAMED_OFFSETS, build_tiktoken_tokenizer


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiktoken_tokenizer(tmp_path_factory.mktemp("tt") / "kimi-tiktoken")


@pytest.fixture(scope="module")
def tok(folder: Path) -> TargetTokenizer:
    return TargetTokenizer(TokenizerSpec(folder, trust_remote_code=True, template_kwargs={"thinking": True}))


def _slow(tok: TargetTokenizer, text: str) -> list[int]:
    """The remote class's ids through transformers' own path, as regen called it before."""
    return [int(i) for i in tok._tok.encode(text, add_special_tokens=False)]


def _slow_decode(tok: TargetTokenizer, ids: list[int]) -> str:
    return str(
        tok._tok.decode(
            ids,
            skip_special_tokens=False,
            clean_up_tokenization_spaces=False,
            spaces_between_special_tokens=False,
        )
    )


# ---------------------------------------------------------------------------------------------
# Refusals


def test_remote_code_off_names_the_setting_and_the_file_and_runs_nothing(
    folder: Path, tmp_path: Path
) -> None:
    copy = shutil.copytree(folder, tmp_path / "kimi")
    marker = tmp_path / "ran"
    (copy / "tokenization_kimi.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    with pytest.raises(TokenizerError) as err:
        TargetTokenizer(TokenizerSpec(copy, template_kwargs={"thinking": True}))
    message = str(err.value)
    assert message.startswith(
        f"{copy}: this tokenizer runs tokenization_kimi.py (auto_map in tokenizer_config.json)"
    )
    assert "set tokenizer.trust_remote_code = true" in message and "\n" not in message
    assert not marker.exists()


def _corrupt(folder: Path, tmp_path: Path, line: int, text: str) -> Path:
    copy = shutil.copytree(folder, tmp_path / "kimi")
    lines = (copy / "tiktoken.model").read_text().splitlines()
    lines[line - 1] = text
    (copy / "tiktoken.model").write_text("\n".join(lines) + "\n")
    return copy


@pytest.mark.parametrize(
    ("line", "text", "says"),
    [
        (57, "aGVsbG8=", "expected 'base64-token rank'"),
        (300, "not*base64 300", "is not base64"),
        (12, "aGVsbG8= twelve", "is not a whole number"),
        (40, "aGVsbG8= 3", "rank 3 again (line 4 has it)"),
        (1, "version https://git-lfs.github.com/spec/v1", "a Git LFS pointer"),
    ],
)
def test_a_tiktoken_model_that_does_not_parse_is_refused_with_its_file_and_line(
    folder: Path, tmp_path: Path, line: int, text: str, says: str
) -> None:
    copy = _corrupt(folder, tmp_path, line, text)
    with pytest.raises(TokenizerError) as err:
        TargetTokenizer(TokenizerSpec(copy, trust_remote_code=True, template_kwargs={"thinking": True}))
    message = str(err.value)
    assert message.startswith(f"{copy / 'tiktoken.model'}:{line}: ") and says in message
    assert "\n" not in message


def test_the_ranks_check_counts_a_good_file_and_refuses_an_empty_or_unreadable_one(
    folder: Path, tmp_path: Path, tok: TargetTokenizer
) -> None:
    assert check_ranks_file(folder / "tiktoken.model") == tok._tok.model.n_vocab - 256
    (tmp_path / "empty.model").write_text("\n\n")
    with pytest.raises(RanksFileError, match="no ranks"):
        check_ranks_file(tmp_path / "empty.model")
    (tmp_path / "dup.model").write_text(
        f"{base64.b64encode(b'a').decode()} 0\n{base64.b64encode(b'a').decode()} 1\n"
    )
    with pytest.raises(RanksFileError, match=r"dup\.model:2: the token of line 1 again"):
        check_ranks_file(tmp_path / "dup.model")
    with pytest.raises(RanksFileError, match="cannot read"):
        check_ranks_file(tmp_path / "missing.model")


def test_a_tiktoken_model_replaced_in_place_is_read_again(tmp_path: Path) -> None:
    # tiktoken keeps a copy of each file it loads, keyed by path; regen turns that copy off, so the
    # second folder's ids are its own and not the first one's under the second one's hash.
    where = tmp_path / "tokenizer"
    first = TargetTokenizer(
        TokenizerSpec(build_tiktoken_tokenizer(where, vocab_size=600), trust_remote_code=True)
    )
    shutil.rmtree(where)
    second = TargetTokenizer(
        TokenizerSpec(build_tiktoken_tokenizer(where, vocab_size=400), trust_remote_code=True)
    )
    assert second.files_sha256["tiktoken.model"] != first.files_sha256["tiktoken.model"]
    assert second.end_of_turn_id == 400 + KIMI_NAMED_OFFSETS["<|im_end|>"] != first.end_of_turn_id


# ---------------------------------------------------------------------------------------------
# The direct path: the class's own ids


SPECIALS = [*sorted(KIMI_NAMED_OFFSETS), "<|reserved_token_5|>", "<|im_", "</think", "[BOS"]
PIECES = st.one_of(
    st.text(max_size=40),
    st.sampled_from(SPECIALS),
    st.sampled_from([" ", "  ", "\n", "\n\n", "\t", "\r\n", "東京", "😀", "é", "1234567", "'s", "don't"]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(PIECES, max_size=12).map("".join))
def test_direct_ids_equal_the_remote_classs_on_any_text(tok: TargetTokenizer, text: str) -> None:
    assert tok._direct is not None
    ids = tok.encode(text)
    assert ids == _slow(tok, text)
    assert tok.decode(ids) == _slow_decode(tok, ids)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(PIECES, max_size=12).map("".join))
def test_text_as_text_equals_the_remote_classs_without_special_tokens(
    tok: TargetTokenizer, text: str
) -> None:
    # Kimi's encode(text, allow_special_tokens=False): special-token strings as the text they spell.
    assert tok.encode_text(text) == tok._tok.encode(text, allow_special_tokens=False)
    assert tok.decode(tok.encode_text(text)) == text


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 1200 + 255), max_size=30))
def test_direct_decode_equals_the_remote_classs_on_any_ids(tok: TargetTokenizer, ids: list[int]) -> None:
    vocab = tok._tok.model.n_vocab
    ids = [i % vocab for i in ids]
    assert tok.decode(ids) == _slow_decode(tok, ids)


def test_texts_the_class_slices_go_through_the_class(tok: TargetTokenizer) -> None:
    # Runs past 25k characters are cut by the class before tiktoken sees them (docs/data-contract.md
    # §8.1); the direct path hands those texts to it, and short neighbours stay direct.
    for text in ("a" * 30_000 + " tail", "word " + " " * 26_000 + "x" + THINK_END, "short " * 6_000):
        assert tok.encode(text) == _slow(tok, text)
    assert tok.encode_batch(["a" * 30_000, "b"]) == [_slow(tok, "a" * 30_000), _slow(tok, "b")]
    for text in ("a" * 60_000 + "<|im_end|>", "x " + "\n" * 25_001 + "</think>y"):
        assert tok.encode_text(text) == tok._tok.encode(text, allow_special_tokens=False)


def test_rendered_prompts_are_apply_chat_templates_ids(tok: TargetTokenizer) -> None:
    conversations = [
        [{"role": "user", "content": "What is 1+1? <|im_end|> kept as text </think>"}],
        [
            {"role": "system", "content": "Be brief.\n"},
            {"role": "user", "content": "Hi 東京"},
            {"role": "assistant", "content": "Hello!  "},
            {"role": "user", "content": "   spaces\n\n\ttabs   "},
        ],
    ]
    for messages in conversations:
        expected = tok._tok.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True, thinking=True
        )
        assert tok.render_ids(messages) == tok.prompt_ids(messages) == list(expected)
