"""One simulated generation: its sampling parameters, the ids it produces and how it ends.

The output is decided when the request arrives (length, reasoning share, where it sits in the word
cycles), so the same prompt under the same seed gives the same ids on every run; the scheduler only
decides when each id comes out. Finish rules follow 0.5.23's `Req.update_finish_state`
(docs/sglang.md §4, "Finish rules"): an out-of-vocabulary id first ("NaN happened"), then stop
strings, then the stop ids (which `ignore_eos` switches off, stop_token_ids included), then the
length limit.
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
    "ABORT_IN_WAITING_QUEUE",
    "NAN_HAPPENED",
    "Req",
    "Sampling",
    "finish_abort",
    "finish_length",
    "finish_stop",
    "plan_output",
]

# The front end's message for a request aborted while in the waiting queue (0.5.23 tokenizer manager).
ABORT_IN_WAITING_QUEUE = "Abort in waiting queue"
# A sampled id outside the vocabulary (a NaN in the logits) ends the request as a stop on this string.
NAN_HAPPENED = "NaN happened"


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
    stream_interval: int | None = None  # None: the server's --stream-interval
    stop_token_ids: tuple[int, ...] = ()  # as sent: the id an out-of-vocabulary one is replaced by


@dataclass(frozen=True, slots=True)
class Plan:
    """What the model will say: `reasoning` ids, then </think>, `content` ids, then end-of-turn."""

    thinking: bool
    reasoning: int
    content: int
    reasoning_offset: int
    content_offset: int
    # An impostor's output (config.drift): from this output id on, ids come from the `alt` offsets.
    diverge_at: int | None = None
    alt_reasoning: int = 0
    alt_content: int = 0


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
    drift: float | None = None,
    drift_after: int = 32,
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
    reasoning_offset = rng.choice(tok.reasoning.starts)
    content_offset = rng.choice(tok.content.starts)
    if drift is None:
        return Plan(thinking, reasoning, max(1, length - reasoning), reasoning_offset, content_offset)
    # The impostor's own draws come after the reference's, so its first ids are the reference's.
    length = round(length * (1 + drift))
    reasoning = round(length * reasoning_share) if thinking else 0
    if rng.random() < drift:
        # It never closes its thinking (or never ends its answer): max_new_tokens ends it.
        reasoning = reasoning if not thinking else 1 << 30
        length = 1 << 30
    return Plan(
        thinking,
        reasoning,
        max(1, length - reasoning),
        reasoning_offset,
        content_offset,
        diverge_at=drift_after,
        alt_reasoning=rng.choice(tok.reasoning.starts),
        alt_content=rng.choice(tok.content.starts),
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
    in_queue_abort: bool = False  # aborted in the waiting queue: the front end's short answer
    fault: str | None = None  # "abort" | "drop" | "nan", at `fault_at` output tokens
    fault_at: int = 0
    fault_message: str = "Aborted"
    dropped: bool = False
    internal: bool = False  # the warmup and health probes: not a client's request
    dp_rank: int = 0  # the data-parallel rank the scheduler dealt it to (its metrics' series)
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
        other = p.diverge_at is not None and k >= p.diverge_at
        if p.thinking:
            if k < p.reasoning:
                return _at(tok.reasoning, p.alt_reasoning if other else p.reasoning_offset, k)
            if k == p.reasoning:
                assert tok.think_close_id is not None
                return tok.think_close_id
            k -= p.reasoning + 1
        offset = p.alt_content if other else p.content_offset
        if k < p.content:
            return _at(tok.content, offset, k)
        if k == p.content and tok.eot_id is not None:
            return tok.eot_id
        return _at(tok.content, offset, k)

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
        """Emit one id and apply the finish rules in 0.5.23's order: stop strings, stop ids, then the
        length limit (so an end-of-turn id landing on max_new_tokens is a stop). `text` never holds a
        trimmed stop id's piece, so it is always what the detokenizer would send."""
        out = self.output_ids
        out.append(token_id)
        s = self.sampling
        stop_id = token_id in s.stop_ids
        trimmed = stop_id and not s.no_stop_trim
        if not trimmed or s.stop_strs:
            self._add_piece(token_id)
        if s.stop_strs and self._stop_string():
            return
        if stop_id:
            self.finish = finish_stop(token_id)
            if trimmed and s.stop_strs:
                self._drop_last_piece()
            return
        if len(out) >= s.max_new_tokens:
            self.finish = finish_length(s.max_new_tokens)

    def nan(self) -> None:
        """The model sampled an id outside the vocabulary: SGLang puts the first stop id in its place,
        then the model's eos over that, and ends the request as a stop on the string "NaN happened"
        (schedule_batch.py `_check_vocab_boundary_finish`). The detokenizer finds no such string to
        trim, so the replacement id's piece stays in the text."""
        s = self.sampling
        eos = self.tok.eos_ids
        replacement = eos[0] if eos else (s.stop_token_ids[0] if s.stop_token_ids else 0)
        self.output_ids.append(replacement)
        self._add_piece(replacement)
        self.finish = finish_stop(NAN_HAPPENED)

    def _add_piece(self, token_id: int) -> None:
        s = self.sampling
        if not self.tok.exact_pieces:
            # Pieces merge across ids for this tokenizer: decode for real.
            self._pieces = [self.tok.decode(self.output_ids, skip_special_tokens=s.skip_special_tokens)]
        else:
            self._pieces.append(self.tok.piece(token_id, skip_special_tokens=s.skip_special_tokens))
        self._joined = None

    def _drop_last_piece(self) -> None:
        s = self.sampling
        if not self.tok.exact_pieces:
            self._pieces = [self.tok.decode(self.output_ids[:-1], skip_special_tokens=s.skip_special_tokens)]
        else:
            self._pieces.pop()
        self._joined = None

    def _stop_string(self) -> bool:
        """A stop string in the text's tail ends the request there (trimmed unless no_stop_trim)."""
        s = self.sampling
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
                return True
        return False

    @property
    def text(self) -> str:
        """The output text so far, as the detokenizer sends it (a trimmed stop id never in it)."""
        if self._joined is None:
            self._joined = "".join(self._pieces)
            self._pieces = [self._joined]
        return self._joined
