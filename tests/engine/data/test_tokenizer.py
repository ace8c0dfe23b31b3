"""TargetTokenizer and TokenizePool on small real tokenizers loaded through AutoTokenizer."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from regen.engine.data.row import Row
from regen.engine.data.tokenize_pool import TokenizePool
from regen.engine.data.tokenizer import (
    THINK,
    THINK_END,
    TargetTokenizer,
    TokenizeError,
    TokenizerError,
    TokenizerSpec,
)
from tests.support.rows import unfilled_row
from tests.support.tiktoken_model import build_tiktoken_tokenizer
from tests.support.tokenizers import KIMI_SYSTEM, build_tokenizer

TEXTS = [
    "plain ascii text.",
    "Ünïcödé: café, 東京, Привет, 😀🚀 and ∑ x² ≤ ∞",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n\n\nend",
    "code: def f(x):\n    return x ** 2  # square\n",
    "a word right before a special</think>and right after",
    "",
    "<|im_end|> a special string inside text <think>",
]


# Kimi's shape two ways: a tokenizer.json (a fast tokenizer) and, as Kimi really ships, tiktoken.model
# with its remote-code class (tests/support/tiktoken_model.py). Every test of the Kimi shape runs on both.
SHAPES = ["json", "tiktoken"]


@pytest.fixture(scope="session", params=SHAPES)
def kimi_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if request.param == "tiktoken":
        return build_tiktoken_tokenizer(tmp_path_factory.mktemp("tok") / "kimi-tiktoken")
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "kimi", "kimi")


@pytest.fixture(scope="session")
def json_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tokenizer.json shape alone, for the tests of that shape's files."""
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "kimi", "kimi")


def _remote(folder: Path) -> bool:
    return (folder / "tiktoken.model").is_file()


@pytest.fixture(scope="session")
def chatml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "chatml", "chatml")


@pytest.fixture(scope="session")
def kimi(kimi_dir: Path) -> TargetTokenizer:
    return TargetTokenizer(_spec(kimi_dir))


def _spec(folder: Path, **kwargs: Any) -> TokenizerSpec:
    kwargs.setdefault("template_kwargs", {"thinking": True})
    return TokenizerSpec(folder, trust_remote_code=_remote(folder), **kwargs)


@pytest.fixture(scope="session")
def chatml(chatml_dir: Path) -> TargetTokenizer:
    return TargetTokenizer(TokenizerSpec(chatml_dir, template_kwargs={"thinking": False}))


def _id(tok: TargetTokenizer, token: str) -> int:
    return int(tok._tok.convert_tokens_to_ids(token))


USER = [{"role": "user", "content": "What is 1+1?"}]


# ---------------------------------------------------------------------------------------------
# Loading and special ids


def test_loads_as_fast_tokenizer_with_ids_by_name(kimi: TargetTokenizer) -> None:
    if _remote(kimi.path):
        # The remote code's class, its tiktoken Encoding encoded through directly.
        assert type(kimi._tok).__name__ == "TikTokenTokenizer" and not kimi.is_fast
        assert kimi._direct is not None
        # Kimi's special ids sit right after the ranks, at Kimi's offsets (docs/data-contract.md §8.3).
        base = kimi._tok.model.n_vocab - 256
        assert kimi.end_of_turn_id == base + 2 and kimi.think_end_id == base + 23
    else:
        assert type(kimi._tok).__name__ == "PreTrainedTokenizerFast"
    assert kimi.end_of_turn_id == _id(kimi, "<|im_end|>")
    assert kimi.think_id == _id(kimi, THINK)
    assert kimi.think_end_id == _id(kimi, THINK_END)
    # Special tokens sit after the learned vocabulary, as in Kimi: nothing assumes small ids.
    assert kimi.end_of_turn_id > 200


def test_think_end_is_one_id_in_text(kimi: TargetTokenizer) -> None:
    assert kimi.encode(THINK_END) == [kimi.think_end_id]
    ids = kimi.encode("reasoning</think>answer")
    assert kimi.think_end_id is not None
    assert ids.count(kimi.think_end_id) == 1
    assert kimi.decode(ids) == "reasoning</think>answer"


def test_round_trip(kimi: TargetTokenizer, chatml: TargetTokenizer) -> None:
    for tok in (kimi, chatml):
        for text in TEXTS:
            assert tok.decode(tok.encode(text)) == text
        batch = tok.encode_batch(TEXTS)
        assert batch == [tok.encode(t) for t in TEXTS]
        assert tok.decode_batch(batch) == TEXTS


def test_info_block(kimi: TargetTokenizer, kimi_dir: Path) -> None:
    info = kimi.info()
    assert info["name"] == kimi_dir.name
    files = {"tokenizer.json", "tokenizer_config.json"}
    if _remote(kimi_dir):
        files = {"tiktoken.model", "tokenization_kimi.py", "tokenizer_config.json", "chat_template.jinja"}
    assert set(info["files_sha256"]) == files
    assert all(len(h) == 64 for h in info["files_sha256"].values())
    assert info["template_kwargs"] == {"thinking": True}
    assert info["add_generation_prompt"] is True


def test_files_hash_changes_with_the_template(tmp_path: Path) -> None:
    a = build_tokenizer(tmp_path / "a", "kimi")
    b = build_tokenizer(tmp_path / "b", "kimi")
    config = json.loads((b / "tokenizer_config.json").read_text())
    config["chat_template"] += " "
    (b / "tokenizer_config.json").write_text(json.dumps(config))
    ha = TargetTokenizer(TokenizerSpec(a, template_kwargs={"thinking": True})).files_sha256
    hb = TargetTokenizer(TokenizerSpec(b, template_kwargs={"thinking": True})).files_sha256
    assert ha["tokenizer.json"] == hb["tokenizer.json"]
    assert ha["tokenizer_config.json"] != hb["tokenizer_config.json"]


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"nope: tokenizer folder does not exist"):
        TargetTokenizer(TokenizerSpec(tmp_path / "nope"))


def test_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="no tokenizer files"):
        TargetTokenizer(TokenizerSpec(tmp_path))


def test_broken_files(tmp_path: Path, json_dir: Path) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text((json_dir / "tokenizer_config.json").read_text())
    (folder / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match=r"broken: cannot load the tokenizer") as err:
        TargetTokenizer(TokenizerSpec(folder))
    assert "\n" not in str(err.value)


def test_remote_code_needs_trust(tmp_path: Path, json_dir: Path) -> None:
    folder = tmp_path / "remote"
    folder.mkdir()
    config = json.loads((json_dir / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}
    config["tokenizer_class"] = "TikTokenTokenizer"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "tokenization_kimi.py").write_text("raise RuntimeError('must not run')\n")
    with pytest.raises(TokenizerError) as err:
        TargetTokenizer(TokenizerSpec(folder, trust_remote_code=False))
    message = str(err.value)
    assert str(folder) in message
    assert "set tokenizer.trust_remote_code = true" in message
    assert "\n" not in message


def test_thinking_needs_think_end(chatml_dir: Path) -> None:
    with pytest.raises(TokenizerError, match=r"set tokenizer\.thinking = false"):
        TargetTokenizer(TokenizerSpec(chatml_dir, template_kwargs={"thinking": True}))


def test_end_of_turn_falls_back_to_eos(chatml_dir: Path) -> None:
    tok = TargetTokenizer(TokenizerSpec(chatml_dir, template_kwargs={}, end_of_turn="<|eot_id|>"))
    assert tok.end_of_turn_text == "<|endoftext|>"
    assert tok.end_of_turn_id == _id(tok, "<|endoftext|>")


def test_end_of_turn_must_be_special(chatml_dir: Path, chatml: TargetTokenizer) -> None:
    # A learned byte-level token such as "Ġthe" has an id, but the text "Ġthe" never encodes to it.
    learned = next(t for t in chatml._tok.get_vocab() if t.startswith("Ġ") and len(t) > 2)
    with pytest.raises(TokenizerError, match="must be a special token"):
        TargetTokenizer(TokenizerSpec(chatml_dir, template_kwargs={}, end_of_turn=learned))


def test_from_settings(kimi_dir: Path) -> None:
    from regen.engine.config.settings import TokenizerSettings

    settings = TokenizerSettings(
        path=kimi_dir,
        name="moonshotai/Kimi-K2.5",
        chat_template_kwargs={"x": 1},
        trust_remote_code=_remote(kimi_dir),
    )
    tok = TargetTokenizer.from_settings(settings)
    assert tok.info()["name"] == "moonshotai/Kimi-K2.5"
    assert tok.template_kwargs == {"thinking": True, "x": 1}
    with pytest.raises(TokenizerError, match=r"set tokenizer\.path"):
        TargetTokenizer.from_settings(TokenizerSettings())


# ---------------------------------------------------------------------------------------------
# Prompts (§5.1, §8.2)


def test_kimi_thinking_prompt(kimi: TargetTokenizer) -> None:
    ids = kimi.prompt_ids(USER)
    text = kimi.decode(ids)
    assert text == (
        f"<|im_system|>system<|im_middle|>{KIMI_SYSTEM}<|im_end|>"
        "<|im_user|>user<|im_middle|>What is 1+1?<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>"
    )
    tail = [
        _id(kimi, "<|im_assistant|>"),
        *kimi.encode("assistant"),
        _id(kimi, "<|im_middle|>"),
        kimi.think_id,
    ]
    assert ids[-len(tail) :] == tail
    assert kimi.prompt_ids(USER) == kimi.encode(kimi.render(USER))


def test_kimi_instant_prompt(kimi: TargetTokenizer) -> None:
    ids = kimi.prompt_ids(USER, thinking=False)
    assert kimi.decode(ids).endswith("<|im_assistant|>assistant<|im_middle|><think></think>")
    assert ids[-2:] == [kimi.think_id, kimi.think_end_id]


def test_kimi_system_and_history(kimi: TargetTokenizer) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    text = kimi.decode(kimi.prompt_ids(messages))
    assert KIMI_SYSTEM not in text
    assert text.startswith("<|im_system|>system<|im_middle|>Be brief.<|im_end|>")
    assert "<|im_assistant|>assistant<|im_middle|><think></think>Hello!<|im_end|>" in text
    assert text.endswith(
        "<|im_user|>user<|im_middle|>Bye<|im_end|><|im_assistant|>assistant<|im_middle|><think>"
    )


def test_generation_suffix(kimi: TargetTokenizer, chatml: TargetTokenizer) -> None:
    assert kimi.decode(kimi.generation_suffix()) == "<|im_end|><|im_assistant|>assistant<|im_middle|><think>"
    assert kimi.decode(kimi.generation_suffix(False)).endswith("<think></think>")
    assert chatml.decode(chatml.generation_suffix()) == "<|im_end|>\n<|im_start|>assistant\n"


def test_prompt_ids_accepts_batch_encoding(kimi: TargetTokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import BatchEncoding

    expected = kimi.prompt_ids(USER)
    real = kimi._tok.apply_chat_template

    def as_mapping(*args: Any, **kwargs: Any) -> Any:
        return BatchEncoding({"input_ids": real(*args, **kwargs)})

    monkeypatch.setattr(kimi._tok, "apply_chat_template", as_mapping)
    assert kimi.prompt_ids(USER) == expected


def test_chatml_prompt(chatml: TargetTokenizer) -> None:
    text = chatml.decode(chatml.prompt_ids(USER))
    assert text == "<|im_start|>user\nWhat is 1+1?<|im_end|>\n<|im_start|>assistant\n"
    assert chatml.think_id is None and chatml.think_end_id is None


# ---------------------------------------------------------------------------------------------
# Outputs (§5.3 OpenRouter, §5.2 SGLang)

R, C = "The user asks 1+1. 東京 😀", "It is 2.\n\nDone."


def test_openrouter_stop(kimi: TargetTokenizer) -> None:
    ids, appended = kimi.retokenize(R, C, "stop")
    assert appended is True
    assert ids[-1] == kimi.end_of_turn_id
    assert kimi.think_end_id is not None
    assert ids.count(kimi.think_end_id) == 1
    assert kimi.think_id not in ids
    assert kimi.decode(ids) == R + THINK_END + C + "<|im_end|>"


def test_special_token_look_alikes_in_the_text_stay_text(
    kimi: TargetTokenizer, chatml: TargetTokenizer
) -> None:
    # A provider's text never holds the special tokens themselves: a "<|im_end|>" in it was written in
    # ordinary tokens, and the retokenized ids keep it so (docs/data-contract.md §5.3).
    reasoning = "They wrote <think> and </think> in the question"
    content = "Use <|im_end|> to end a turn, </think> to close; <|im_assistant|> too."
    ids, appended = kimi.retokenize(reasoning, content, "stop")
    assert appended and ids.count(kimi.end_of_turn_id) == 1 and ids[-1] == kimi.end_of_turn_id
    assert kimi.think_end_id is not None and kimi.think_id not in ids
    assert ids.count(kimi.think_end_id) == 1
    assert kimi.decode(ids) == reasoning + THINK_END + content + "<|im_end|>"
    # The prompt is another matter: the template's own special tokens are special ids.
    assert kimi.encode("<|im_end|>") == [kimi.end_of_turn_id] != kimi.encode_text("<|im_end|>")
    assert kimi.decode(kimi.encode_text(content)) == content
    ids, _ = chatml.retokenize("", content, "stop")
    assert ids.count(chatml.end_of_turn_id) == 1 and chatml.decode(ids) == content + "<|im_end|>"
    # The switch the fast tokenizer uses is put back: prompts still get their special ids.
    assert kimi.render_ids(USER) == kimi.prompt_ids(USER)
    assert kimi.end_of_turn_id in kimi.render_ids(USER)


def test_openrouter_length_with_content(kimi: TargetTokenizer) -> None:
    ids, appended = kimi.retokenize(R, C, "length")
    assert appended is False
    assert ids[-1] != kimi.end_of_turn_id
    assert kimi.decode(ids) == R + THINK_END + C


def test_openrouter_length_without_content(kimi: TargetTokenizer) -> None:
    ids, appended = kimi.retokenize(R, "", "length")
    assert appended is False
    assert kimi.think_end_id not in ids
    assert kimi.decode(ids) == R


def test_openrouter_instant_mode(kimi: TargetTokenizer) -> None:
    ids, appended = kimi.retokenize("ignored reasoning", C, "stop", thinking=False)
    assert appended is True
    assert kimi.decode(ids) == C + "<|im_end|>"
    ids, appended = kimi.retokenize("", C, "length", thinking=False)
    assert (kimi.decode(ids), appended) == (C, False)


def test_openrouter_bad_finish(kimi: TargetTokenizer) -> None:
    with pytest.raises(TokenizeError, match="abort"):
        kimi.retokenize(R, C, "abort")


def test_chatml_outputs(chatml: TargetTokenizer) -> None:
    ids, appended = chatml.retokenize("", C, "stop")
    assert appended and chatml.decode(ids) == C + "<|im_end|>"
    _, appended, reasoning, content = chatml.keep_server_ids(chatml.encode(C), "stop")
    assert (appended, reasoning, content) == (True, "", C)


def test_sglang_appends_missing_terminator(kimi: TargetTokenizer) -> None:
    body = kimi.encode(R + THINK_END + C)
    ids, appended, reasoning, content = kimi.keep_server_ids(body, "stop")
    assert appended is True and ids == [*body, kimi.end_of_turn_id]
    assert (reasoning, content) == (R, C)


def test_sglang_keeps_present_terminator(kimi: TargetTokenizer) -> None:
    body = [*kimi.encode(R + THINK_END + C), kimi.end_of_turn_id]
    ids, appended, reasoning, content = kimi.keep_server_ids(body, "stop")
    assert appended is False and ids == body
    assert (reasoning, content) == (R, C)


def test_sglang_splits_at_first_think_end(kimi: TargetTokenizer) -> None:
    body = kimi.encode("first" + THINK_END + "middle" + THINK_END + "last")
    _, _, reasoning, content = kimi.keep_server_ids(body, "stop")
    assert reasoning == "first"
    assert content == "middle</think>last"


def test_sglang_truncated_inside_thinking(kimi: TargetTokenizer) -> None:
    body = kimi.encode("still thinking about")
    ids, appended, reasoning, content = kimi.keep_server_ids(body, "length")
    assert (ids, appended, reasoning, content) == (body, False, "still thinking about", "")


# ---------------------------------------------------------------------------------------------
# The pool


def _rows() -> list[tuple[Row, list[dict[str, str]]]]:
    cases = []
    for i in range(150):
        messages = [{"role": "user", "content": f"question {i} " + "é" * (i % 7)}]
        if i % 4 == 3:
            messages = [{"role": "system", "content": "Be brief."}, *messages]
        finish = "length" if i % 5 == 0 else "stop"
        content = "" if i % 10 == 0 else f"answer {i} 😀"
        row = unfilled_row(i, "T", finish_reason=finish, reasoning="think " * (i % 13), content=content)
        cases.append((row, messages))
    return cases


async def test_pool_matches_direct_calls(kimi_dir: Path, kimi: TargetTokenizer) -> None:
    spec = _spec(kimi_dir)
    async with TokenizePool(spec, workers=3, max_batch=16) as pool:
        assert pool.info == kimi.info()
        cases = _rows()
        filled = await asyncio.gather(*(pool.fill(row.copy(), msgs) for row, msgs in cases))
        assert pool.batches >= len(cases) // 16
        for (row, msgs), out in zip(cases, filled, strict=True):
            ids, appended = kimi.retokenize(row["reasoning"], row["content"], row["finish_reason"])
            assert out["prompt_ids"] == kimi.prompt_ids(msgs)
            assert out["output_ids"] == ids
            assert out["terminator_appended"] is appended
            assert out["num_prompt_tokens"] == len(out["prompt_ids"])
            assert out["num_output_tokens"] == len(ids)
            assert out["output_ids_source"] == "retokenized"
            assert out["tokenizer"] == kimi.info()

        # SGLang rows keep the server's ids and get their text from them.
        body = kimi.encode(R + THINK_END + C)
        row = unfilled_row(0, "S", backend="sglang", output_ids=body, output_ids_source="server")
        out = await pool.fill(row, USER)
        assert out["output_ids"] == [*body, kimi.end_of_turn_id]
        assert out["terminator_appended"] is True
        assert (out["reasoning"], out["content"]) == (R, C)
        assert out["output_ids_source"] == "server"

        # One bad row fails alone, with its id in the message; its batch neighbours succeed.
        bad = unfilled_row(id="T-bad", finish_reason="abort", reasoning="", content="")
        good = unfilled_row(id="T-good", finish_reason="stop", reasoning="", content="x")
        results = await asyncio.gather(pool.fill(bad, USER), pool.fill(good, USER), return_exceptions=True)
        assert isinstance(results[0], TokenizeError) and "T-bad" in str(results[0])
        assert isinstance(results[1], dict) and results[1]["output_ids"][-1] == kimi.end_of_turn_id

        # A row generated in the other thinking mode would get a prompt the model never saw.
        instant = unfilled_row(id="T-instant", reasoning="", content="x", request={"thinking": False})
        with pytest.raises(TokenizeError, match="thinking=False"):
            await pool.fill(instant, USER)

        # The loop stays responsive while workers tokenize.
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        task = asyncio.create_task(ticker())
        await asyncio.gather(*(pool.fill(row.copy(), msgs) for row, msgs in cases * 4))
        task.cancel()
        assert ticks > 3
    with pytest.raises(TokenizeError):
        await pool.fill(cases[0][0].copy(), cases[0][1])


async def test_pool_start_reports_load_failure(tmp_path: Path) -> None:
    pool = TokenizePool(TokenizerSpec(tmp_path / "missing"), workers=1)
    with pytest.raises(TokenizerError, match="tokenizer folder does not exist"):
        await pool.start()
    await pool.close()
    assert not multiprocessing.active_children()


async def test_a_pool_refuses_a_loaded_tokenizer_of_another_spec(
    kimi_dir: Path, kimi: TargetTokenizer
) -> None:
    pool = TokenizePool(_spec(kimi_dir, template_kwargs={"thinking": False}), workers=1)
    with pytest.raises(ValueError, match="the loaded tokenizer is"):
        await pool.start(loaded=kimi)
    await pool.close()


async def test_a_pool_started_without_workers_starts_them_with_the_first_row_that_needs_one(
    kimi_dir: Path, kimi: TargetTokenizer
) -> None:
    spec = _spec(kimi_dir)
    async with TokenizePool(spec, workers=2) as pool:
        assert len(multiprocessing.active_children()) == 2, "a pool started plainly has its workers"
    pool = TokenizePool(spec, workers=2)
    await pool.start(loaded=kimi)  # the backend's, already loaded: the pool loads no copy
    try:
        assert pool.info == kimi.info() and not multiprocessing.active_children()
        # A row that brings its ids (the SGLang backend's) needs no worker.
        prompt = kimi.prompt_ids(USER)
        sent = unfilled_row(1, "S", output_ids_source="server", prompt_ids=prompt, output_ids=[5, 6])
        out = await pool.fill(sent, USER)
        assert out["num_prompt_tokens"] == len(prompt) and out["tokenizer"] == kimi.info()
        assert not multiprocessing.active_children(), "no worker for a row that brings its ids"
        # A row that needs ids starts one, and gets what a direct call makes.
        row = unfilled_row(1, "T", reasoning="think", content="answer")
        out = await pool.fill(row, USER)
        assert out["output_ids"] == kimi.retokenize("think", "answer", "stop")[0]
        assert out["prompt_ids"] == prompt
        assert multiprocessing.active_children()
    finally:
        await pool.close()
    assert not multiprocessing.active_children()
