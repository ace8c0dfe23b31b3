"""Token ids for the SGLang simulator: a real tokenizer folder, word cycles encoded once, exact text.

The simulated model "generates" ids, never text: the output is a walk through two fixed word cycles
(content and reasoning, shared with the OpenRouter simulator) encoded with the served tokenizer, plus
the special ids a chat model emits (`</think>`, the end-of-turn token). The response text is then the
decode of those ids, as SGLang's detokenizer produces it (docs/sglang.md, "Token ids and text").

Decoding the growing output on every streamed chunk would cost O(n^2) per request, so each id's text
piece is decoded once; at load the pieces are checked to concatenate to exactly what the tokenizer
decodes for the whole cycle. A tokenizer for which that does not hold (pieces that merge across ids)
is served by really decoding the ids each time: slower, still exact.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regen.sim.openrouter.text import CONTENT_CYCLE, REASONING_CYCLE

__all__ = ["SimTokenizer", "SimTokenizerError", "builtin_tokenizer_folder"]


class SimTokenizerError(ValueError):
    """The tokenizer folder cannot be served; one line naming the folder and the problem."""


def _quiet_transformers() -> None:
    # Without torch, transformers prints an advisory on import that reads like an error.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    # A tiktoken.model is read afresh, never from tiktoken's copy keyed by its path (as the job reads
    # it: docs/data-contract.md §9).
    os.environ["TIKTOKEN_CACHE_DIR"] = ""


@dataclass(frozen=True, slots=True)
class Cycle:
    """One word cycle as ids: `ids[i]` is the i-th token of the walk, `pieces[i]` its text, and
    `starts` the indices where a word begins (outputs start there, not mid-word)."""

    ids: tuple[int, ...]
    pieces: tuple[str, ...]
    starts: tuple[int, ...]


class SimTokenizer:
    """The served tokenizer: encodes prompts given as text, decodes output ids exactly."""

    def __init__(
        self,
        folder: Path,
        *,
        trust_remote_code: bool = False,
        end_of_turn: str = "<|im_end|>",
        think_open: str = "<think>",
        think_close: str = "</think>",
    ) -> None:
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise SimTokenizerError(f"{self.folder}: tokenizer folder does not exist")
        _quiet_transformers()
        try:
            from transformers import AutoTokenizer

            self._tok: Any = AutoTokenizer.from_pretrained(  # type: ignore[no-untyped-call]
                str(self.folder), trust_remote_code=trust_remote_code
            )
        except Exception as exc:  # transformers raises many types for one unusable folder
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise SimTokenizerError(f"{self.folder}: cannot load the tokenizer: {first}") from None
        self.vocab_size = len(self._tok)
        self.eot_id = self._single_id(end_of_turn)
        self.think_open_id = self._single_id(think_open)
        self.think_close_id = self._single_id(think_close)
        self.eos_ids = self._eos_ids()
        emitted = {i for i in (self.eot_id, self.think_close_id, *self.eos_ids) if i is not None}
        self._special_pieces = {i: self._decode([i], skip_special_tokens=False) for i in emitted}
        self.special_ids = frozenset(i for i in emitted if self._decode([i], skip_special_tokens=True) == "")
        self.content = self._cycle(CONTENT_CYCLE)
        self.reasoning = self._cycle(REASONING_CYCLE)
        # Text of each id the model emits, decoded once: (kept specials, skipped specials).
        self._keep: dict[int, str] = {}
        for cycle in (self.content, self.reasoning):
            self._keep.update(zip(cycle.ids, cycle.pieces, strict=True))
        self._keep.update(self._special_pieces)
        self._skip = {i: ("" if i in self.special_ids else text) for i, text in self._keep.items()}
        self.exact_pieces = self._pieces_are_exact()

    # --- loading -------------------------------------------------------------------------------
    def _single_id(self, token: str) -> int | None:
        """The id of a special token by name, or None when the vocabulary has no such single token."""
        ids = self._tok.convert_tokens_to_ids([token])
        tid = ids[0] if ids else None
        unk = getattr(self._tok, "unk_token_id", None)
        if not isinstance(tid, int) or tid < 0 or (unk is not None and tid == unk):
            return None
        return tid

    def _eos_ids(self) -> tuple[int, ...]:
        # SGLang stops on the tokenizer's eos and on generation_config.json's eos_token_id (an int
        # or a list) unless the request sets ignore_eos.
        found: list[int] = []
        eos = getattr(self._tok, "eos_token_id", None)
        if isinstance(eos, int):
            found.append(eos)
        path = self.folder / "generation_config.json"
        if path.is_file():
            try:
                value = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
            except (OSError, ValueError, AttributeError):
                value = None
            values = value if isinstance(value, list) else [value]
            found.extend(v for v in values if isinstance(v, int))
        return tuple(dict.fromkeys(found))

    def _cycle(self, words: Sequence[str]) -> Cycle:
        ids: list[int] = []
        starts: list[int] = []
        for word in words:
            starts.append(len(ids))
            ids.extend(self._tok.encode(word, add_special_tokens=False))
        if not ids:
            raise SimTokenizerError(f"{self.folder}: the tokenizer encodes the simulator's words to nothing")
        distinct = sorted(set(ids))
        piece_of = {i: self._decode([i], skip_special_tokens=False) for i in distinct}
        return Cycle(tuple(ids), tuple(piece_of[i] for i in ids), tuple(starts))

    def _pieces_are_exact(self) -> bool:
        for cycle in (self.content, self.reasoning):
            if "".join(cycle.pieces) != self._decode(list(cycle.ids), skip_special_tokens=False):
                return False
        specials = [i for i in (self.think_close_id, self.eot_id) if i is not None]
        sample = [*self.reasoning.ids[:8], *specials, *self.content.ids[:8], *specials]
        joined = "".join(self.piece(i, skip_special_tokens=False) for i in sample)
        return joined == self._decode(sample, skip_special_tokens=False)

    @property
    def hf(self) -> Any:
        """The underlying transformers tokenizer (tests render chat prompts with it)."""
        return self._tok

    # --- serving -------------------------------------------------------------------------------
    def _decode(self, ids: list[int], *, skip_special_tokens: bool) -> str:
        text: str = self._tok.decode(
            ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )
        return text

    def piece(self, token_id: int, *, skip_special_tokens: bool) -> str:
        """Text of one emitted id, as it appears inside a decoded output."""
        table = self._skip if skip_special_tokens else self._keep
        text = table.get(token_id)
        if text is None:
            text = self._decode([token_id], skip_special_tokens=skip_special_tokens)
            table[token_id] = text
        return text

    def decode(self, ids: list[int], *, skip_special_tokens: bool) -> str:
        return self._decode(ids, skip_special_tokens=skip_special_tokens)

    def encode(self, text: str) -> list[int]:
        """A text prompt as SGLang's tokenizer manager encodes it (the tokenizer's own specials)."""
        ids: list[int] = self._tok.encode(text)
        return ids

    def info(self) -> dict[str, Any]:
        return {
            "folder": str(self.folder),
            "vocab_size": self.vocab_size,
            "end_of_turn_id": self.eot_id,
            "think_open_id": self.think_open_id,
            "think_close_id": self.think_close_id,
            "eos_ids": list(self.eos_ids),
            "exact_pieces": self.exact_pieces,
        }


# The built-in tokenizer: when `regen sim sglang` gets no --tokenizer, it serves a small byte-level
# BPE trained on the simulator's own words, with Kimi K2.5's special tokens and chat format
# (docs/sglang.md, docs/data-contract.md §8), so a bare simulator still speaks in real ids. The
# tests' tokenizers (tests/support/tokenizers.py) use the same tokens and template.
KIMI_SPECIALS = [
    "[BOS]",
    "[EOS]",
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "[EOT]",
    "<|im_system|>",
    "<|im_middle|>",
    "<think>",
    "</think>",
]
KIMI_SYSTEM = "You are Kimi, an AI assistant created by Moonshot AI."
KIMI_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' -%}"
    "<|im_system|>system<|im_middle|>" + KIMI_SYSTEM + "<|im_end|>"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "<|im_system|>system<|im_middle|>{{ message['content'] }}<|im_end|>"
    "{%- elif message['role'] == 'user' -%}"
    "<|im_user|>user<|im_middle|>{{ message['content'] }}<|im_end|>"
    "{%- elif message['role'] == 'assistant' -%}"
    "<|im_assistant|>assistant<|im_middle|><think></think>{{ message['content'] }}<|im_end|>"
    "{%- else -%}"
    "<|im_system|>{{ message['role'] }}<|im_middle|>{{ message['content'] }}<|im_end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "<|im_assistant|>assistant<|im_middle|>"
    "{%- if thinking is defined and not thinking -%}<think></think>{%- else -%}<think>{%- endif -%}"
    "{%- endif -%}"
)


def builtin_tokenizer_folder(folder: Path) -> Path:
    """Write the built-in tokenizer into `folder` (created if needed) and return it."""
    from tokenizers import (  # type: ignore[import-untyped]
        AddedToken,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )

    corpus = ["".join(CONTENT_CYCLE), "".join(REASONING_CYCLE), KIMI_SYSTEM]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in KIMI_SPECIALS])
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
        for t in KIMI_SPECIALS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": [t for t in KIMI_SPECIALS if t not in ("[BOS]", "[EOS]")],
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1048576,
        "chat_template": KIMI_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return folder
