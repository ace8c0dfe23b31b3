"""What is decided about one generation before its first byte: length, reasoning share, finish
reason, timing and the fault that shapes it. Deterministic from the seed and the prompt, so runs
are reproducible."""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from regen.sim.openrouter.billing import ProviderAttempt
from regen.sim.openrouter.catalog import SimEndpoint, SimModel
from regen.sim.openrouter.config import SimConfig
from regen.sim.openrouter.limits import Hold
from regen.sim.openrouter.routing import matches
from regen.sim.openrouter.tools import ToolAnswer, plan_tool_answer

_ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
# Faults that end a stream early; the share sent first is config.fault_position.
PARTIAL_FAULTS = frozenset({"mid_stream_error", "error_choice_200", "cut_mid_stream", "cut_nonstream_body"})
# Faults that reshape the text itself (empty, degenerate, all reasoning) leave no room for a tool call.
_TEXT_FAULTS = frozenset(
    {"reasoning_exhaustion", "degenerate", "empty_stop", "silent_failure", "error_body_200", "runaway_length"}
)


def rand_id(n: int = 20) -> str:
    # Not seeded: ids must stay unique across simulator restarts that share a seed.
    return "".join(_ALNUM[b % 62] for b in os.urandom(n))


@dataclass(slots=True)
class Plan:
    """Everything decided about one generation before its first byte."""

    gen_id: str
    request_id: str
    created: int
    started: float  # loop time when the request arrived
    started_wall: float
    model: SimModel
    ep: SimEndpoint
    stream: bool
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int  # the first `reasoning_tokens` of the completion are reasoning
    reported_reasoning: int  # what usage says (may exceed completion_tokens, §3.1 oddity)
    finish_reason: str | None
    native_finish_reason: str | None
    fault: str | None
    ttft: float
    tps: float
    off_content: int
    off_reasoning: int
    show_reasoning: bool
    usage_shape: str
    stop_at: int  # tokens produced before a partial fault fires; completion_tokens otherwise
    degenerate: bool = False
    attempts: list[ProviderAttempt] = field(default_factory=list)
    candidates: list[SimEndpoint] = field(default_factory=list)
    session_id: str | None = None
    requested_model: str = ""
    want_metadata: bool = False
    tools: ToolAnswer | None = None  # set: the content part is a preamble plus tool calls
    # An impostor's answer (config.impostor_providers): from this completion token on, the text
    # comes from the `alt` offsets, not the reference's. None: the reference throughout.
    diverge_at: int | None = None
    alt_content: int = 0
    alt_reasoning: int = 0
    hold: Hold | None = None  # the in-flight budget hold this generation's cost settles


def make_plan(
    config: SimConfig,
    want_metadata: bool,
    body: dict[str, Any],
    gen_id: str,
    model: SimModel,
    ep: SimEndpoint,
    prompt_tokens: int,
    max_tokens: int | None,
    fault: str | None,
    attempts: list[ProviderAttempt],
    candidates: list[SimEndpoint],
) -> Plan:
    """Decide length, reasoning, finish, timing and fault effects for one generation."""
    cfg = config
    digest = hashlib.blake2b(
        cfg.seed.to_bytes(8, "little", signed=True) + orjson.dumps(body["messages"]),
        digest_size=16,
    ).digest()
    lo = cfg.min_completion_tokens
    hi = max(lo, cfg.max_completion_tokens)
    length = lo + int.from_bytes(digest[0:4], "little") % (hi - lo + 1)
    drift = impostor_drift(ep, cfg.impostor_providers)
    cap = max_tokens or ep.max_completion_tokens or model.default_max_completion_tokens
    # An impostor's own draws, apart from the reference's so its first tokens and timing stay the same.
    other = bytes(12)
    if drift is not None:
        other = hashlib.blake2b(digest, digest_size=12, person=b"impostor").digest()
        length = round(length * (1 + drift))
        if int.from_bytes(other[0:4], "little") / 2**32 < drift:
            length = cap + 1  # runs on to the cap
    reasoning_on, show = reasoning_mode(body, model)
    reasoning = round(length * cfg.reasoning_share) if reasoning_on else 0
    finish: str | None = "stop"
    native: str | None = "stop"
    if length > cap:
        completion = cap
        reasoning = min(reasoning, cap)
        finish = native = "length"
    else:
        completion = length
    tools = None
    if body.get("tools") and fault not in _TEXT_FAULTS:
        tools = plan_tool_answer(body, digest, cfg.tool_call_share, cfg.max_parallel_tool_calls)
        # A call that would not fit in max_tokens is not made: the model answers in text instead.
        if tools is not None and reasoning + tools.preamble + tools.call_tokens <= cap:
            completion = reasoning + tools.preamble + tools.call_tokens
            finish = native = "tool_calls"
        else:
            tools = None
    reported_reasoning = reasoning
    shape = cfg.usage_shape
    is_degenerate = False
    if fault == "reasoning_exhaustion":
        completion = cap if max_tokens else length
        reasoning = completion
        # Detail counts need not be consistent: reasoning_tokens > completion_tokens (§3.1).
        reported_reasoning = completion + 3
        finish = native = "length"
        show = True
    elif fault == "degenerate":
        reasoning = reported_reasoning = 0
        is_degenerate = True
        finish = native = "stop"
    elif fault == "empty_stop":
        completion = reasoning
        finish = native = "stop"
    elif fault == "silent_failure":
        completion = reasoning = reported_reasoning = 0
        finish, native = "stop", "network_error"
    elif fault == "runaway_length":
        # A provider that ignores max_tokens: it stops only when it is done, far past the cap.
        completion = cfg.runaway_tokens
        reasoning = reported_reasoning = min(reasoning, completion)
        finish = native = "stop"
    elif fault == "missing_usage":
        shape = "C"
    elif fault == "missing_cost":
        shape = "B"
    jitter = int.from_bytes(digest[12:16], "little") / 2**32 * 2 - 1
    ttft = max(0.0, ep.ttft_s + ep.ttft_jitter * jitter) * cfg.time_scale
    if fault == "slow_first_token":
        ttft *= cfg.slow_first_token_factor
    tps = max(ep.tokens_per_s, 1e-6) / cfg.time_scale if cfg.time_scale > 0 else math.inf
    stop_at = completion
    if fault in PARTIAL_FAULTS:
        stop_at = min(completion, max(1, int(completion * cfg.fault_position)))
    return Plan(
        gen_id=gen_id,
        request_id=f"req-{int(time.time())}-{rand_id()}",
        created=int(time.time()),
        started=asyncio.get_running_loop().time(),
        started_wall=time.time(),
        model=model,
        ep=ep,
        stream=body.get("stream") is True,
        prompt_tokens=prompt_tokens + prompt_offset(ep, cfg.prompt_token_offsets),
        completion_tokens=completion,
        reasoning_tokens=reasoning,
        reported_reasoning=reported_reasoning,
        finish_reason=finish,
        native_finish_reason=native,
        fault=fault,
        ttft=ttft,
        tps=tps,
        off_content=int.from_bytes(digest[4:8], "little"),
        off_reasoning=int.from_bytes(digest[8:12], "little"),
        show_reasoning=show,
        usage_shape=shape,
        stop_at=stop_at,
        degenerate=is_degenerate,
        attempts=list(attempts),
        candidates=candidates,
        want_metadata=want_metadata,
        tools=tools,
        diverge_at=None if drift is None else cfg.impostor_prefix_tokens,
        alt_content=int.from_bytes(other[4:8], "little"),
        alt_reasoning=int.from_bytes(other[8:12], "little"),
    )


def prompt_offset(ep: SimEndpoint, offsets: dict[str, int]) -> int:
    """The prompt tokens the endpoint counts beyond the estimate (config.prompt_token_offsets: a
    provider that renders another template or runs another tokenizer); later matching keys win."""
    found = 0
    for name, offset in offsets.items():
        if matches(ep, name):
            found = int(offset)
    return found


def impostor_drift(ep: SimEndpoint, impostors: dict[str, float]) -> float | None:
    """The endpoint's drift when it is an impostor (later matching keys win, as in
    endpoint_overrides); None for an honest one."""
    found: float | None = None
    for name, drift in impostors.items():
        if matches(ep, name):
            found = float(drift)
    return found


def reasoning_mode(body: dict[str, Any], model: SimModel) -> tuple[bool, bool]:
    """(reasoning happens, reasoning text is returned) from reasoning / legacy fields (§2.4)."""
    on, show = model.reasoning, True
    r = body.get("reasoning")
    if isinstance(r, dict):
        if r.get("enabled") is True or r.get("effort") not in (None, "none"):
            on = True
        if r.get("effort") == "none" or r.get("enabled") is False:
            on = False
        if r.get("exclude") is True:
            show = False
    if body.get("reasoning_effort") == "none":
        on = False
    if body.get("include_reasoning") is False:
        show = False
    return on, show
