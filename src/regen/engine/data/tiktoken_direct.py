"""Kimi's tokenizer shape: its ``tiktoken.model`` checked line by line, and its ids made by tiktoken.

Kimi K2 / K2.5 ship no ``tokenizer.json``: their remote-code class (``tokenization_kimi.py``, a
``PreTrainedTokenizer``) keeps a ``tiktoken.Encoding`` and hands encoding to it only when called with
no options. regen calls ``encode(text, add_special_tokens=False)``, which takes transformers' slow
path (a Python trie over the added tokens, then the class's encode for each piece, then a dict
look-up per token), and ``apply_chat_template`` does the same. ``DirectTiktoken`` encodes through the
``Encoding`` itself, with every special token's string allowed, as the class does; it is adopted
only where it gives the class's own ids on probe texts (and tests check it on generated text,
tests/engine/data/test_tiktoken_direct.py), and it leaves to the class what the class slices before
encoding (docs/data-contract.md §8.1: inputs past 400k characters, or with a run of more than 25k
whitespace or non-whitespace characters). BENCHMARKS.md, "Tokenizer pool", has what it saves.

A ``tiktoken.model`` that does not parse is refused with its file and line (``check_ranks_file``)
before the class reads it, whose own error (a ``ValueError`` from a tuple unpacking) names neither.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from regen.engine.errors import RegenError

__all__ = ["MAX_DIRECT_CHARS", "DirectTiktoken", "RanksFileError", "check_ranks_file"]

# Kimi's class slices inputs longer than this and runs longer than _MAX_RUN before tiktoken sees them
# (docs/data-contract.md §8.1); slicing changes the ids at a cut, so those texts go through the class.
MAX_DIRECT_CHARS = 400_000
_MAX_RUN = 25_000
# A run of more than _MAX_RUN, matched only from the run's first character so the search is linear.
_LONG_RUN = re.compile(rf"(?<!\S)\S{{{_MAX_RUN + 1}}}|(?<!\s)\s{{{_MAX_RUN + 1}}}")
_LFS_POINTER = "version https://git-lfs"


def _runs(text: str) -> Iterator[str]:
    """``text`` cut so that no slice holds more than _MAX_RUN whitespace or non-whitespace characters
    in a row, where Kimi's class cuts it (a new slice starts at the character past the limit)."""
    start, run, spacey = 0, 0, text[:1].isspace()
    for i, ch in enumerate(text):
        now = ch.isspace()
        if now != spacey:
            run, spacey = 1, now
            continue
        run += 1
        if run > _MAX_RUN:
            yield text[start:i]
            start, run = i, 1
    yield text[start:]


class RanksFileError(RegenError, ValueError):
    """A tiktoken.model line that does not parse: the message names the file and the line."""


def check_ranks_file(path: Path) -> int:
    """The number of ranks in ``path`` (``base64(token bytes) rank`` per line, as tiktoken's
    ``load_tiktoken_bpe`` reads it); ``RanksFileError`` naming the first bad line."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RanksFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError as exc:
        where = data.count(b"\n", 0, exc.start) + 1
        raise RanksFileError(
            f"{path}:{where}: not ASCII: tiktoken.model holds base64 tokens and ranks"
        ) from None
    if text.startswith(_LFS_POINTER):
        raise RanksFileError(
            f"{path}:1: a Git LFS pointer, not the file: fetch the real tiktoken.model (git lfs pull)"
        )
    tokens: dict[bytes, int] = {}
    ranks: dict[int, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line:
            continue  # tiktoken skips blank lines
        fields = line.split()
        if len(fields) != 2:
            raise RanksFileError(f"{path}:{n}: expected 'base64-token rank', got {line[:60]!r}")
        token_text, rank_text = fields
        try:
            token = base64.b64decode(token_text, validate=True)
        except (binascii.Error, ValueError):
            raise RanksFileError(f"{path}:{n}: {token_text[:40]!r} is not base64") from None
        if not token:
            raise RanksFileError(f"{path}:{n}: an empty token")
        if not rank_text.isdigit():
            raise RanksFileError(f"{path}:{n}: rank {rank_text[:20]!r} is not a whole number")
        rank = int(rank_text)
        if token in tokens:
            raise RanksFileError(f"{path}:{n}: the token of line {tokens[token]} again")
        if rank in ranks:
            raise RanksFileError(f"{path}:{n}: rank {rank} again (line {ranks[rank]} has it)")
        tokens[token] = n
        ranks[rank] = n
    if not tokens:
        raise RanksFileError(f"{path}: no ranks in the file")
    return len(tokens)


class DirectTiktoken:
    """``encode``/``decode`` equal to a tiktoken-backed ``PreTrainedTokenizer``'s
    ``encode(text, add_special_tokens=False)`` and ``decode(ids, skip_special_tokens=False)``."""

    __slots__ = ("_decode", "_encode", "_ordinary", "_slow")

    def __init__(self, encoding: Any, slow: Callable[[str], list[int]]) -> None:
        self._encode: Callable[..., list[int]] = encoding.encode
        self._ordinary: Callable[[str], list[int]] = encoding.encode_ordinary
        self._decode: Callable[[list[int]], str] = encoding.decode
        self._slow = slow

    @classmethod
    def build(
        cls,
        tok: Any,
        slow_encode: Callable[[str], list[int]],
        slow_decode: Callable[[Sequence[int]], str],
        probes: Iterable[str],
    ) -> DirectTiktoken | None:
        """The direct path for ``tok`` (a transformers tokenizer), or None: it keeps no
        ``tiktoken.Encoding`` (Kimi's class keeps it as ``model``), or a probe's ids or text differ."""
        try:
            import tiktoken
        except ImportError:  # pragma: no cover - tiktoken is a dependency
            return None
        encoding = getattr(tok, "model", None)
        if not isinstance(encoding, tiktoken.Encoding):
            return None
        direct = cls(encoding, slow_encode)
        for text in probes:
            try:
                ids = direct.encode(text)
                if ids != slow_encode(text) or direct.decode(ids) != slow_decode(ids):
                    return None
            except Exception:  # a class that refuses what tiktoken takes is not this shape
                return None
        return direct

    def encode(self, text: str) -> list[int]:
        if len(text) > _MAX_RUN and (len(text) > MAX_DIRECT_CHARS or _LONG_RUN.search(text)):
            return self._slow(text)
        return self._encode(text, allowed_special="all")

    def encode_text(self, text: str) -> list[int]:
        """Special-token strings as the ordinary text they spell (Kimi's ``encode(text,
        allow_special_tokens=False)``), sliced as Kimi's class slices."""
        if len(text) <= _MAX_RUN:
            return self._ordinary(text)
        ids: list[int] = []
        for start in range(0, len(text), MAX_DIRECT_CHARS):
            for piece in _runs(text[start : start + MAX_DIRECT_CHARS]):
                ids.extend(self._ordinary(piece))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._decode(ids if isinstance(ids, list) else list(ids))
