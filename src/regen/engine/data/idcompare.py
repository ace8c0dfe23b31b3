"""Two answers compared in the target tokenizer's ids (docs/fidelity.md, "The canary audit").

At temperature 0 with the same weights, two servers give the same ids for a long way (kernels and
batching make them part eventually); another model leaves after a few tokens. So: the common prefix,
and a token-level similarity of the whole answers.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many ids the two answers share from their start."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def similarity(a: Sequence[int], b: Sequence[int]) -> float:
    """2 x matched ids / all ids (difflib's ratio over the id sequences): 1.0 for the same answer,
    0.0 for two with no id in common in order; two empty answers are the same."""
    if not a and not b:
        return 1.0
    return difflib.SequenceMatcher(None, list(a), list(b), autojunk=False).ratio()


def majority(answers: Sequence[Sequence[int]]) -> int | None:
    """The index of the reference when there is none given: the answer most like the others (the
    one with the greatest summed similarity; the first among equals). None for no answers."""
    if not answers:
        return None
    best, best_score = 0, -1.0
    for i, a in enumerate(answers):
        score = sum(similarity(a, b) for j, b in enumerate(answers) if j != i)
        if score > best_score:
            best, best_score = i, score
    return best
