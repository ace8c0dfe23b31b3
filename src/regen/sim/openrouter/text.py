"""Deterministic text for simulated completions: one token is one word.

Text comes from two fixed word cycles (content and reasoning) built once at import, so a request's
text is a slice at an offset derived from its seed and prompt: no per-request generation work, and
the same prompt gives the same text on every run.
"""

from __future__ import annotations

import random

_CONTENT_WORDS = [
    "the",
    "a",
    "model",
    "layer",
    "expert",
    "router",
    "token",
    "attention",
    "weight",
    "gradient",
    "batch",
    "training",
    "data",
    "sequence",
    "output",
    "input",
    "value",
    "vector",
    "matrix",
    "query",
    "key",
    "head",
    "block",
    "network",
    "system",
    "each",
    "every",
    "many",
    "several",
    "some",
    "most",
    "large",
    "small",
    "fast",
    "efficient",
    "sparse",
    "dense",
    "mixture",
    "of",
    "and",
    "or",
    "but",
    "while",
    "because",
    "so",
    "then",
    "when",
    "where",
    "which",
    "that",
    "this",
    "these",
    "those",
    "with",
    "without",
    "into",
    "from",
    "over",
    "under",
    "between",
    "across",
    "through",
    "during",
    "after",
    "before",
    "can",
    "will",
    "may",
    "should",
    "must",
    "uses",
    "selects",
    "computes",
    "routes",
    "returns",
    "improves",
    "reduces",
    "increases",
    "balances",
    "learns",
    "predicts",
    "stores",
    "reads",
    "writes",
    "sends",
    "combines",
    "splits",
    "merges",
    "scales",
    "runs",
    "checks",
    "measures",
    "compares",
    "result",
    "answer",
    "example",
    "reason",
    "method",
    "approach",
    "step",
    "detail",
    "number",
    "memory",
    "compute",
    "cost",
    "time",
    "speed",
    "quality",
    "accuracy",
    "loss",
    "function",
    "parameter",
    "context",
    "window",
    "length",
    "budget",
    "provider",
    "request",
    "response",
    "stream",
    "chunk",
    "draft",
    "target",
    "decoder",
    "encoder",
    "cache",
    "prefix",
]

_REASONING_WORDS = [
    "the",
    "user",
    "wants",
    "me",
    "to",
    "explain",
    "first",
    "let",
    "consider",
    "what",
    "is",
    "being",
    "asked",
    "here",
    "so",
    "I",
    "should",
    "check",
    "whether",
    "this",
    "means",
    "that",
    "we",
    "need",
    "think",
    "about",
    "how",
    "answer",
    "clearly",
    "maybe",
    "also",
    "note",
    "key",
    "points",
    "then",
    "summarize",
    "okay",
    "so",
    "approach",
    "would",
    "be",
    "start",
    "with",
    "definition",
    "and",
    "give",
    "example",
    "hmm",
    "wait",
    "actually",
    "better",
    "to",
    "keep",
    "short",
    "since",
    "they",
    "asked",
    "two",
    "sentences",
    "right",
    "plan",
    "outline",
    "draft",
    "verify",
    "recall",
    "facts",
    "compare",
    "options",
    "pick",
    "simplest",
    "correct",
    "version",
]

_CYCLE_LEN = 4099  # prime, so offsets never line up with sentence lengths


def _build_cycle(words: list[str], seed: int) -> tuple[str, ...]:
    rng = random.Random(seed)
    out: list[str] = []
    left = 0
    for _ in range(_CYCLE_LEN):
        word = rng.choice(words)
        if left == 0:
            left = rng.randint(6, 16)
            word = word.capitalize()
        left -= 1
        out.append(" " + word + ("." if left == 0 else ""))
    return tuple(out)


CONTENT_CYCLE = _build_cycle(_CONTENT_WORDS, 11)
REASONING_CYCLE = _build_cycle(_REASONING_WORDS, 23)
DEGENERATE_TOKEN = "!!!!"


def span(cycle: tuple[str, ...], offset: int, start: int, end: int) -> str:
    """Text of tokens [start, end) of a completion whose first token sits at `offset`."""
    if end <= start:
        return ""
    n = len(cycle)
    a = (offset + start) % n
    count = end - start
    if a + count <= n:
        text = "".join(cycle[a : a + count])
    else:
        parts: list[str] = [*cycle[a:]]
        count -= n - a
        while count > 0:
            take = min(count, n)
            parts.extend(cycle[:take])
            count -= take
        text = "".join(parts)
    # The first token of a completion carries no leading space.
    return text[1:] if start == 0 else text


def degenerate(start: int, end: int) -> str:
    return DEGENERATE_TOKEN * max(0, end - start)
