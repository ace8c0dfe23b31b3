"""A rendered prompt's ids, piece by piece: the template's own pieces encoded once.

A fast (Rust) tokenizer cuts its input at every added token before anything else runs (leftmost,
longest first); the normalizer, the pre-tokenizer and the model then see each piece between two
added tokens on its own. So a prompt's ids are its pieces' ids in order, and the pieces the chat
template writes into every prompt (role names, the default system prompt, separators) need not be
encoded again for each one: only the messages' text costs an encode. On the SGLang backend's hot
path that is a quarter of the encode's time (BENCHMARKS.md, "SGLang backend").

This holds only for a tokenizer that cuts that way: every added token matched as written (not
normalized, no stripping, not only as a whole word), special tokens not encoded as text, and no
pre-tokenizer that treats the input's first piece apart from the others (Metaspace's
`prepend_scheme = "first"`). `PieceEncoder.build` checks the flags and then the result itself, on
probe prompts, against the tokenizer's own encode; where either differs it returns None and the
caller encodes whole prompts as before.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

# Pieces kept encoded: the first ones met, which include every piece of the template (it writes
# them into every prompt); a message's text met later is encoded each time, as it must be.
KEPT_PIECES = 512

__all__ = ["PieceEncoder", "encode_whole"]


def encode_whole(native: Any, text: str) -> list[int]:
    """`text`'s ids from the native (Rust) tokenizer in one call, no special tokens added."""
    # tokenizers 0.21 on: the same ids without the offsets an Encoding also carries, a quarter
    # less time a message (15-18 us against 20-25 us on the bench's prompt, BENCHMARKS.md).
    fast = getattr(native, "encode_batch_fast", None)
    if fast is not None:
        ids: list[int] = fast([text], add_special_tokens=False)[0].ids
        return ids
    ids = native.encode(text, add_special_tokens=False).ids
    return ids


class PieceEncoder:
    """`encode(text)` equals `encode_whole(native, text)`."""

    __slots__ = ("_added", "_kept", "_native", "_split")

    def __init__(self, native: Any, added: dict[str, int]) -> None:
        # Longest first: at each place the regex takes the first alternative that matches, so
        # this is the tokenizer's leftmost-longest match.
        pattern = "|".join(re.escape(token) for token in sorted(added, key=len, reverse=True))
        self._split: Callable[[str], list[str]] = re.compile(f"({pattern})").split
        self._added = added
        self._native = native
        self._kept: dict[str, list[int]] = {}

    @classmethod
    def build(cls, native: Any, probes: Iterable[str]) -> PieceEncoder | None:
        """The piece encoder for `native` (a `tokenizers.Tokenizer`), or None where encoding by
        pieces would not give its ids: a flag says so, or one of the rendered `probes` shows it."""
        if getattr(native, "encode_special_tokens", False):
            return None
        try:
            decoder = native.get_added_tokens_decoder()
        except AttributeError:  # pragma: no cover - tokenizers before 0.14
            return None
        added: dict[str, int] = {}
        for tid, token in decoder.items():
            if token.normalized or token.lstrip or token.rstrip or token.single_word:
                return None
            added[str(token.content)] = int(tid)
        if not added:
            return None
        pieces = cls(native, added)
        for text in probes:
            if pieces.encode(text) != encode_whole(native, text):
                return None
        pieces._kept.clear()  # the probes' pieces are not the prompts'
        return pieces

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        added, kept = self._added, self._kept
        for piece in self._split(text):
            if not piece:
                continue
            tid = added.get(piece)  # the split keeps what it cut at: only those are added tokens
            if tid is not None:
                ids.append(tid)
                continue
            known = kept.get(piece)
            if known is None:
                known = encode_whole(self._native, piece)
                if len(kept) < KEPT_PIECES:
                    kept[piece] = known
            ids.extend(known)
        return ids
