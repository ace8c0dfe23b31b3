"""Small real tokenizers for tests: byte-level BPE folders that load through AutoTokenizer.

No model can be downloaded here, so tests train a tiny byte-level BPE with the ``tokenizers``
library and save it the way a model repository ships one: ``tokenizer.json`` plus a
``tokenizer_config.json`` holding the chat template and the special tokens. ``kimi`` is shaped like
Kimi K2.5 (docs/data-contract.md §8): its special tokens sit after the learned vocabulary and its template
reproduces §8.2. ``chatml`` is a plain ChatML model with no thinking, to show nothing is Kimi-only.
Rows for tests come from ``regen.engine.job.rows.build_row`` itself, so they carry the job's exact schema.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from regen.engine.data.datasets import Dataset, Prompt, canonical_sha256
from regen.engine.data.row import Row, RowStatus
from regen.engine.data.scan import iter_prompts

# Kimi K2.5's special tokens and chat format (docs/data-contract.md §8.2): no newlines between turns,
# no BOS, the default system prompt when the first message is not a system one, earlier assistant
# turns as <think></think>content, the `thinking` switch at the end. One definition, shared with the
# SGLang simulator's built-in tokenizer.
from regen.sim.sglang.tokens import KIMI_SPECIALS, KIMI_SYSTEM, KIMI_TEMPLATE

CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|im_start|>{{ message['role'] }}{{ '\\n' }}{{ message['content'] }}<|im_end|>{{ '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant{{ '\\n' }}{%- endif -%}"
)

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Mixture-of-experts layers route each token to a few experts; a gate picks them.",
    "def add(a: int, b: int) -> int:\n    return a + b\n",
    "for i in range(10):\n\tprint(i ** 2)  # squares\n",
    "Ünïcödé: café, naïve, Straße, 東京, Привет мир, 😀🚀, ∑ x² ≤ ∞",
    "The user wants a short answer. Let me think about the routing step first.",
    "Speculative decoding drafts tokens with a small model and verifies them with the target.",
    "   leading spaces, trailing spaces   \n\n\nand blank lines\r\n",
    '{"json": [1, 2.5, null, true], "nested": {"k": "v"}}',
    "SELECT name, count(*) FROM users GROUP BY name ORDER BY 2 DESC;",
    "What is 1+1? It is 2. Explain MoE routing in two sentences.",
]


def corpus(extra: int = 200) -> list[str]:
    """A small, varied training corpus (deterministic)."""
    words = " ".join(_CORPUS).split()
    lines = list(_CORPUS)
    for i in range(extra):
        lines.append(" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12 + i % 9)))
    return lines


def build_tokenizer(
    folder: Path,
    kind: str = "kimi",
    *,
    vocab_size: int = 1200,
    texts: list[str] | None = None,
) -> Path:
    """Train a byte-level BPE and save it as a model repository's tokenizer folder."""
    from tokenizers import (  # type: ignore[import-untyped]  # as src/regen/sim/sglang/tokens.py
        AddedToken,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )

    if kind == "kimi":
        specials, template = KIMI_SPECIALS, KIMI_TEMPLATE
        bos, eos = "[BOS]", "[EOS]"
        extra = [t for t in specials if t not in (bos, eos)]
    elif kind == "chatml":
        specials, template = CHATML_SPECIALS, CHATML_TEMPLATE
        bos, eos = None, "<|endoftext|>"
        extra = ["<|im_start|>", "<|im_end|>"]
    else:
        raise ValueError(kind)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts if texts is not None else corpus(), trainer=trainer)
    # Added after training, so (as in Kimi) the special ids sit after the learned vocabulary.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])

    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    added = {
        str(tok.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "single_word": False,
            "special": True,
        }
        for t in specials
    }
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": extra,
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": None,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1048576,
        "chat_template": template,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    return folder


def write_prompts(folder: Path, conversations: list[list[dict[str, Any]]]) -> Dataset:
    """A dataset folder holding ``prompts.jsonl`` with one line per conversation."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "prompts.jsonl", "w", encoding="utf-8") as fh:
        for messages in conversations:
            fh.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
    return Dataset(name=folder.name, folder=folder)


def sample_conversations(n: int) -> list[list[dict[str, Any]]]:
    texts = corpus(50)
    out: list[list[dict[str, Any]]] = []
    for i in range(n):
        user = {"role": "user", "content": f"{texts[i % len(texts)]} (#{i})"}
        if i % 3 == 1:
            out.append([{"role": "system", "content": "Be brief."}, user])
        elif i % 3 == 2:
            out.append(
                [
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello! How can I help?"},
                    user,
                ]
            )
        else:
            out.append([user])
    return out


def prompts_of(dataset: Dataset) -> list[Prompt]:
    return list(iter_prompts(dataset))


def make_row(
    prompt: Prompt,
    *,
    reasoning: str = "Let me think about it.",
    content: str = "The answer is 2.",
    finish_reason: str = "stop",
    cost: float = 0.001,
    tokenizer: Any = None,
    thinking: bool | None = None,
) -> Row:
    """A raw_responses row built by ``regen.engine.job.rows.build_row``, ids filled by ``tokenizer``."""
    from regen.engine.backends.base import AttemptOutcome
    from regen.engine.backends.openrouter.backend import OpenRouterBackend
    from regen.engine.config.settings import Settings
    from regen.engine.job.rows import build_row

    result = AttemptOutcome(
        route="Sim",
        handle=f"gen-{prompt.id}",
        served_model="moonshotai/kimi-k2.5-0127",
        finish_reason=finish_reason,
        native_finish_reason=finish_reason,
        content=content,
        reasoning=reasoning,
        usage={"prompt_tokens": 10, "completion_tokens": 20, "reasoning_tokens": None, "cached_tokens": None},
        is_byok=False,
        e2e_s=1.0,
    )
    status: RowStatus = "ok" if finish_reason == "stop" else "truncated"
    now = time.time()
    row = build_row(
        prompt,
        result,
        status,
        OpenRouterBackend(Settings()),
        cost=cost,
        cost_estimated=False,
        started_at=now,
        attempts=1,
        now=now,
    )
    if tokenizer is not None:
        think = tokenizer.thinking if thinking is None else thinking
        prompt_ids = tokenizer.prompt_ids(prompt.messages)
        output_ids, appended = tokenizer.retokenize(reasoning, content, finish_reason, think)
        info = tokenizer.info()
        info["template_kwargs"] = {**info["template_kwargs"], "thinking": think}
        row["prompt_ids"] = prompt_ids
        row["output_ids"] = output_ids
        row["output_ids_source"] = "retokenized"
        row["terminator_appended"] = appended
        row["num_prompt_tokens"] = len(prompt_ids)
        row["num_output_tokens"] = len(output_ids)
        row["tokenizer"] = info
    return row


def write_rows(dataset: Dataset, rows: Sequence[Mapping[str, Any]]) -> Path:
    path = dataset.results_path
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


__all__ = [
    "CHATML_TEMPLATE",
    "KIMI_SYSTEM",
    "KIMI_TEMPLATE",
    "build_tokenizer",
    "canonical_sha256",
    "corpus",
    "make_row",
    "prompts_of",
    "sample_conversations",
    "write_prompts",
    "write_rows",
]
