"""A tokenizer folder shaped as Kimi K2 / K2.5 ships one: ``tiktoken.model`` and remote code.

The model the first users train drafters for ships no ``tokenizer.json`` (docs/data-contract.md §8.1):
its folder holds ``tiktoken.model`` (one ``base64(token bytes) rank`` line per learned token),
``tokenization_kimi.py`` (a ``TikTokenTokenizer(PreTrainedTokenizer)`` over ``tiktoken.Encoding``,
loaded through ``auto_map`` with ``trust_remote_code``), ``tokenizer_config.json`` (the special tokens
in ``added_tokens_decoder``, after the ranks) and ``chat_template.jinja``. Nothing can be downloaded
here, so ``build_tiktoken_tokenizer`` trains a small byte-level BPE itself and writes those four files,
with a tokenizer class written for these tests in the same shape as Kimi's (encode with no options
goes straight to tiktoken with every special token allowed; with options, through the slow
``PreTrainedTokenizer`` path; 256 reserved special ids after the learned ones, named ones among them
at Kimi's offsets).
"""

from __future__ import annotations

import base64
import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

from regen.sim.sglang.tokens import KIMI_TEMPLATE
from tests.support.tokenizers import corpus

__all__ = [
    "KIMI_NAMED_OFFSETS",
    "PAT_STR",
    "RESERVED",
    "build_tiktoken_tokenizer",
    "ranks_of_fast",
    "train_ranks",
    "write_tiktoken_model",
]

# A split pattern in the spirit of Kimi's (Han runs apart, words with their leading mark, numbers in
# threes, punctuation runs, whitespace): tiktoken's regex engine runs it, as it runs Kimi's.
PAT_STR = "|".join(
    [
        r"[\p{Han}]+",
        r"[^\r\n\p{L}\p{N}]?\p{L}+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)

RESERVED = 256  # as Kimi's num_reserved_special_tokens
# Named special tokens by offset after the learned ranks. The offsets of [BOS], [EOS], <|im_end|>,
# <|im_user|>, <|im_assistant|>, <|im_system|>, <|im_middle|>, <think> and </think> are Kimi K2.5's
# (docs/data-contract.md §8.3: 163584 + offset); the others are placed where no named one is.
KIMI_NAMED_OFFSETS: dict[str, int] = {
    "[BOS]": 0,
    "[EOS]": 1,
    "<|im_end|>": 2,
    "<|im_user|>": 3,
    "<|im_assistant|>": 4,
    "<|start_header_id|>": 6,
    "<|end_header_id|>": 7,
    "[EOT]": 9,
    "<|im_system|>": 10,
    "<|im_middle|>": 17,
    "<think>": 22,
    "</think>": 23,
    "[UNK]": RESERVED - 2,
    "[PAD]": RESERVED - 1,
}
ADDITIONAL = [
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "[EOT]",
    "<|im_system|>",
    "<|im_middle|>",
]

# The remote code, written into the folder as tokenization_kimi.py: what AutoTokenizer imports with
# trust_remote_code. Its text is this test suite's, its shape Kimi's.
TOKENIZATION_KIMI = '''"""A tiktoken tokenizer for transformers, in the shape of Kimi K2's tokenization_kimi.py."""

import os
from pathlib import Path

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode
from transformers.tokenization_utils import PreTrainedTokenizer

VOCAB_FILES_NAMES = {"vocab_file": "tiktoken.model"}
# tiktoken panics on very long inputs; Kimi's class encodes them in slices (docs/data-contract.md §8.1).
MAX_ENCODE_CHARS = 400_000
MAX_RUN_CHARS = 25_000


def _runs(text, limit):
    """Slices of text none of which holds more than limit whitespace or non-whitespace in a row."""
    start, run, spacey = 0, 0, text[:1].isspace()
    for i, ch in enumerate(text):
        now = ch.isspace()
        if now != spacey:
            run, spacey = 1, now
            continue
        run += 1
        if run > limit:
            yield text[start:i]
            start, run = i, 1
    yield text[start:]


class TikTokenTokenizer(PreTrainedTokenizer):
    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names = ["input_ids", "attention_mask"]
    num_reserved_special_tokens = %(reserved)d
    pat_str = %(pat)r

    def __init__(
        self,
        vocab_file,
        bos_token="[BOS]",
        eos_token="[EOS]",
        unk_token=None,
        pad_token=None,
        additional_special_tokens=None,
        added_tokens_decoder=None,
        **kwargs,
    ):
        assert os.path.isfile(vocab_file), vocab_file
        if additional_special_tokens is None:
            additional_special_tokens = %(additional)r
        named = {int(i): str(getattr(t, "content", t)) for i, t in (added_tokens_decoder or {}).items()}
        self.vocab_file = vocab_file
        ranks = load_tiktoken_bpe(vocab_file)
        base = len(ranks)
        self.special_tokens = {
            named.get(i, "<|reserved_token_%%d|>" %% i): i
            for i in range(base, base + self.num_reserved_special_tokens)
        }
        self.model = tiktoken.Encoding(
            name=Path(vocab_file).name,
            pat_str=self.pat_str,
            mergeable_ranks=ranks,
            special_tokens=self.special_tokens,
        )
        self.n_words = self.model.n_vocab
        self.bos_id = self.special_tokens[str(bos_token)]
        self.eos_id = self.special_tokens[str(eos_token)]
        self.unk_id = self.special_tokens.get(str(unk_token), -1)
        byte_encoder = bytes_to_unicode()
        self.byte_decoder = {v: k for k, v in byte_encoder.items()}
        self.decoder = {
            i: "".join(byte_encoder[b] for b in self.model.decode_single_token_bytes(i))
            for i in range(self.n_words)
        }
        self.encoder = {text: i for i, text in self.decoder.items()}
        super().__init__(
            bos_token=bos_token,
            eos_token=eos_token,
            unk_token=unk_token,
            pad_token=pad_token,
            additional_special_tokens=additional_special_tokens,
            **kwargs,
        )

    def encode(self, text, allow_special_tokens=True, **kwargs):
        # With options, transformers' own path (which calls back here for each piece); without,
        # tiktoken directly, special-token strings encoded as their ids.
        if kwargs:
            return super().encode(text, **kwargs)
        ids = []
        for i in range(0, len(text), MAX_ENCODE_CHARS):
            for piece in _runs(text[i : i + MAX_ENCODE_CHARS], MAX_RUN_CHARS):
                if allow_special_tokens:
                    ids.extend(self.model.encode(piece, allowed_special="all"))
                else:
                    ids.extend(self.model.encode(piece, disallowed_special=()))
        return ids

    def decode(self, token_ids, **kwargs):
        if kwargs:
            return super().decode(token_ids, **kwargs)
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        return self.model.decode(list(token_ids))

    @property
    def vocab_size(self):
        return self.n_words

    def get_vocab(self):
        return dict(self.encoder)

    def _tokenize(self, text, **kwargs):
        return [self.decoder[t] for t in self.encode(text)]

    def _convert_token_to_id(self, token):
        return self.encoder.get(token, self.unk_id)

    def _convert_id_to_token(self, index):
        return self.decoder.get(index)

    def convert_tokens_to_string(self, tokens):
        return bytearray(self.byte_decoder[c] for c in "".join(tokens)).decode("utf-8", "replace")

    def save_vocabulary(self, save_directory, filename_prefix=None):
        name = (filename_prefix + "-" if filename_prefix else "") + VOCAB_FILES_NAMES["vocab_file"]
        out = os.path.join(save_directory, name)
        if os.path.abspath(out) != os.path.abspath(self.vocab_file):
            with open(self.vocab_file, "rb") as src, open(out, "wb") as dst:
                dst.write(src.read())
        return (out,)
'''


def train_ranks(texts: list[str], vocab_size: int, pat_str: str = PAT_STR) -> dict[bytes, int]:
    """A byte-level BPE's ranks, as tiktoken.model stores them: the 256 bytes, then each merge in the
    order it was learned (the most frequent adjacent pair of the pieces ``pat_str`` cuts; ties by
    bytes, so the same texts give the same ranks)."""
    import regex  # type: ignore[import-untyped]  # transformers depends on it

    ranks: dict[bytes, int] = {bytes([b]): b for b in range(256)}
    words: Counter[tuple[bytes, ...]] = Counter()
    for text in texts:
        for piece in regex.findall(pat_str, text):
            words[tuple(bytes([b]) for b in piece.encode("utf-8"))] += 1
    while len(ranks) < vocab_size:
        pairs: Counter[tuple[bytes, bytes]] = Counter()
        for word, n in words.items():
            for pair in itertools.pairwise(word):
                pairs[pair] += n
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merged = best[0] + best[1]
        ranks.setdefault(merged, len(ranks))
        joined: Counter[tuple[bytes, ...]] = Counter()
        for word, n in words.items():
            out: list[bytes] = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            joined[tuple(out)] += n
        words = joined
    return ranks


def ranks_of_fast(tokenizer_json: Path) -> dict[bytes, int]:
    """A byte-level BPE ``tokenizer.json``'s learned vocabulary as tiktoken ranks (its ids, which the
    trainer gave in the order it learned the merges): the same tokens, for a benchmark of the two
    shapes on one vocabulary (bench/tokenizer_stage.py)."""
    from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

    doc = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    added = {t["content"] for t in doc.get("added_tokens", [])}
    byte_of = {ch: b for b, ch in bytes_to_unicode().items()}
    learned = sorted((i, t) for t, i in doc["model"]["vocab"].items() if t not in added)
    return {bytes(byte_of[c] for c in token): rank for rank, (_, token) in enumerate(learned)}


def write_tiktoken_model(path: Path, ranks: dict[bytes, int]) -> Path:
    """``ranks`` as tiktoken.model lines: ``base64(token) rank``, in rank order."""
    lines = [
        f"{base64.b64encode(token).decode()} {rank}"
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1])
    ]
    path.write_text("\n".join(lines) + "\n", encoding="ascii")
    return path


def build_tiktoken_tokenizer(
    folder: Path,
    *,
    vocab_size: int = 1200,
    texts: list[str] | None = None,
    template: str = KIMI_TEMPLATE,
    ranks: dict[bytes, int] | None = None,
) -> Path:
    """A Kimi-shaped tiktoken tokenizer folder: tiktoken.model, tokenization_kimi.py,
    tokenizer_config.json (auto_map, added_tokens_decoder) and chat_template.jinja; its ranks
    trained here on ``texts``, or ``ranks`` given."""
    if ranks is None:
        ranks = train_ranks(texts if texts is not None else corpus(), vocab_size)
    folder.mkdir(parents=True, exist_ok=True)
    write_tiktoken_model(folder / "tiktoken.model", ranks)
    (folder / "tokenization_kimi.py").write_text(
        TOKENIZATION_KIMI % {"reserved": RESERVED, "pat": PAT_STR, "additional": ADDITIONAL}, encoding="utf-8"
    )
    base = len(ranks)
    # Every special id is listed, the reserved ones too, as Kimi's tokenizer_config.json lists them.
    names = {offset: token for token, offset in KIMI_NAMED_OFFSETS.items()}
    added: dict[str, Any] = {
        str(base + offset): {
            "content": names.get(offset, f"<|reserved_token_{base + offset}|>"),
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for offset in range(RESERVED)
    }
    config: dict[str, Any] = {
        "added_tokens_decoder": added,
        "additional_special_tokens": ADDITIONAL,
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "bos_token": "[BOS]",
        "clean_up_tokenization_spaces": False,
        "eos_token": "[EOS]",
        "extra_special_tokens": {},
        "model_max_length": 1048576,
        "pad_token": "[PAD]",
        "tokenizer_class": "TikTokenTokenizer",
        "unk_token": "[UNK]",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
    return folder
