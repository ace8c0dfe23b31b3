"""One simulated generation: its sampling parameters, the ids it produces and how it ends.

The output is decided when the request arrives (length, reasoning share, where it sits in the word
cycles), so the same prompt under the same seed gives the same ids on every run; the scheduler only
decides when each id comes out. Finish rules follow SGLang's `Req.check_finished` (docs/sglang.md,
"Finish reasons"): the length limit first, then the stop ids (which `ignore_eos` switches off,
stop_token_ids included), then stop strings.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
from dataclasses import dataclass, field
from typing import Any

from regen.sim.sglang.tokens import Cycle, SimTokenizer

__all__ = [
    "ABORT_BEFORE_PREFILL",
    "Req",
    "Sampling",
    "finish_abort",
    "finish_length",
    "finish_stop",
    "plan_output",
]

ABORT_BEFORE_PREFILL = "Abort before prefill"


def finish_stop(matched: int | str) -> dict[str, Any]:
    return {"type": "stop", "matched": matched}


def finish_length(length: int) -> dict[str, Any]:
    return {"type": "length", "length": length}


def finish_abort(
    message: str = "Aborted", status_code: int | None = None, err_type: str | None = None
) -> dict[str, Any]:
    return {"type": "abort", "message": message, "status_code": status_code, "err_type": err_type}


@dataclass(frozen=True, slots=True)
class Sampling:
    """The sampling parameters the simulation acts on; the rest are validated and echoed only."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    stop_ids: frozenset[int] = frozenset()
    stop_strs: tuple[str, ...] = ()
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    """What the model will say: `reasoning` ids, then </think>, `content` ids, then end-of-turn."""

    thinking: bool
    reasoning: int
    content: int
    reasoning_offset: int
    content_offset: int


def plan_output(
    prompt_ids: list[int],
    sampling: Sampling,
    tok: SimTokenizer,
    *,
    seed: int,
    dist: str,
    lo: int,
    hi: int,
    median: int,
    sigma: float,
    reasoning_share: float,
) -> Plan:
    """Deterministic from the seed, the prompt and the request's sampling seed (not the rid, so a
    retried attempt says the same thing)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(seed.to_bytes(8, "little", signed=True))
    h.update(b",".join(str(i).encode() for i in prompt_ids[-512:]))
    h.update(str(len(prompt_ids)).encode())
    if sampling.seed is not None:
        h.update(b"s" + str(sampling.seed).encode())
    rng = random.Random(int.from_bytes(h.digest(), "little"))
    if dist == "lognormal":
        length = round(rng.lognormvariate(math.log(median), sigma))
    else:
        length = rng.randint(lo, hi)
    length = max(lo, min(hi, length))
    thinking = (
        tok.think_open_id is not None
        and tok.think_close_id is not None
        and bool(prompt_ids)
        and prompt_ids[-1] == tok.think_open_id
    )
    reasoning = round(length * reasoning_share) if thinking else 0
    return Plan(
        thinking=thinking,
        reasoning=reasoning,
        content=max(1, length - reasoning),
        reasoning_offset=rng.choice(tok.reasoning.starts),
        content_offset=rng.choice(tok.content.starts),
    )


def _at(cycle: Cycle, offset: int, k: int) -> int:
    return cycle.ids[(offset + k) % len(cycle.ids)]


@dataclass(eq=False, slots=True)
class Req:
    """A request's whole life: queued, running (possibly retracted and queued again), finished."""

    rid: str
    prompt_ids: list[int]
    sampling: Sampling
    plan: Plan
    tok: SimTokenizer
    stream: bool = False
    log_metrics: bool = True
    arrived: float = 0.0
    output_ids: list[int] = field(default_factory=list)
    _pieces: list[str] = field(default_factory=list)
    _joined: str | None = None
    finish: dict[str, Any] | None = None
    status: str = "waiting"  # waiting | running | finished
    cached_tokens: int = 0
    num_retractions: int = 0
    admitted_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    prefilled: bool = False
    before_prefill: bool = False  # aborted while still queued: SGLang reports no tokens at all
    fault: str | None = None  # "abort" | "drop", at `fault_at` output tokens
    fault_at: int = 0
    fault_message: str = "Aborted"
    dropped: bool = False
    internal: bool = False  # the warmup and health probes: not a client's request
    event: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def n_prompt(self) -> int:
        return len(self.prompt_ids)

    @property
    def kv_tokens(self) -> int:
        """Tokens this request holds in the KV pool while it runs."""
        return len(self.prompt_ids) + len(self.output_ids)

    def next_id(self) -> int:
        """The id the model emits next, past its end-of-turn too (the model keeps talking when the
        request does not stop on it)."""
        k = len(self.output_ids)
        p = self.plan
        tok = self.tok
        if p.thinking:
            if k < p.reasoning:
                return _at(tok.reasoning, p.reasoning_offset, k)
            if k == p.reasoning:
                assert tok.think_close_id is not None
                return tok.think_close_id
            k -= p.reasoning + 1
        if k < p.content:
            return _at(tok.content, p.content_offset, k)
        if k == p.content and tok.eot_id is not None:
            return tok.eot_id
        return _at(tok.content, p.content_offset, k)

    def reasoning_tokens(self) -> int:
        """Ids before </think> (SGLang counts them only with a reasoning parser set)."""
        if not self.plan.thinking:
            return 0
        return min(len(self.output_ids), self.plan.reasoning)

    def step(self) -> None:
        """Emit the next id. A stop id is masked while min_new_tokens is not reached, as SGLang's
        sampler does, so the model says another word instead."""
        token_id = self.next_id()
        if token_id in self.sampling.stop_ids and len(self.output_ids) < self.sampling.min_new_tokens:
            token_id = _at(self.tok.content, self.plan.content_offset, len(self.output_ids))
        self.append(token_id)

    def append(self, token_id: int) -> None:
        """Emit one id and apply the finish rules. `text` never holds a trimmed stop id's piece, so
        it is always what the detokenizer would send."""
        out = self.output_ids
        out.append(token_id)
        s = self.sampling
        if len(out) >= s.max_new_tokens:
            self.finish = finish_length(s.max_new_tokens)
        elif token_id in s.stop_ids:
            self.finish = finish_stop(token_id)
            if not s.no_stop_trim:
                return  # the matched stop id stays in output_ids but not in the text
        if not self.tok.exact_pieces:
            # Pieces merge across ids for this tokenizer: decode for real.
            self._pieces = [self.tok.decode(out, skip_special_tokens=s.skip_special_tokens)]
        else:
            self._pieces.append(self.tok.piece(token_id, skip_special_tokens=s.skip_special_tokens))
        self._joined = None
        if s.stop_strs and self.finish is None:
            longest = max(len(stop) for stop in s.stop_strs)
            tail = ""
            for piece in reversed(self._pieces):
                tail = piece + tail
                if len(tail) >= longest + len(self._pieces[-1]):
                    break
            for stop in s.stop_strs:
                at = tail.find(stop)
                if at >= 0:
                    self.finish = finish_stop(stop)
                    if not s.no_stop_trim:
                        text = self.text
                        cut = len(text) - len(tail) + at
                        self._pieces = [text[:cut]]
                        self._joined = None
                    break

    @property
    def text(self) -> str:
        """The output text so far, as the detokenizer sends it (a trimmed stop id never in it)."""
        if self._joined is None:
            self._joined = "".join(self._pieces)
            self._pieces = [self._joined]
        return self._joined
