"""What a planned answer says, in either form (one JSON body or a stream of events): its text,
its token events, its usage object and router metadata, and the headers an edge fault adds."""

from __future__ import annotations

from typing import Any

from regen.sim.openrouter import edges
from regen.sim.openrouter.config import SimConfig
from regen.sim.openrouter.plan import Plan
from regen.sim.openrouter.state import OpenRouterState
from regen.sim.openrouter.stream import ChunkBuilder, usage_object
from regen.sim.openrouter.text import CONTENT_CYCLE, REASONING_CYCLE, degenerate, span
from regen.sim.openrouter.tools import deltas

# Faults that cut the connection part-way, with no error event and no [DONE] (§4.4, §13.17).
CUT_FAULTS = frozenset({"cut_mid_stream", "cut_nonstream_body"})


def content_text(plan: Plan, start: int, end: int) -> str:
    """Content tokens [start, end), counted from the first content token."""
    if plan.degenerate:
        return degenerate(start, end)
    if plan.diverge_at is None:
        return span(CONTENT_CYCLE, plan.off_content, start, end)
    split = max(0, plan.diverge_at - plan.reasoning_tokens)
    return _diverging(CONTENT_CYCLE, plan.off_content, plan.alt_content, split, start, end)


def reasoning_text(plan: Plan, start: int, end: int) -> str:
    """Reasoning tokens [start, end)."""
    if plan.diverge_at is None:
        return span(REASONING_CYCLE, plan.off_reasoning, start, end)
    return _diverging(REASONING_CYCLE, plan.off_reasoning, plan.alt_reasoning, plan.diverge_at, start, end)


def _diverging(cycle: tuple[str, ...], offset: int, alt: int, split: int, start: int, end: int) -> str:
    """An impostor's text: the reference's tokens before `split`, another text's from there on
    (the other text's first token keeps its leading space unless it opens the completion)."""
    head = span(cycle, offset, start, min(end, split)) if start < split else ""
    if end <= split:
        return head
    return head + span(cycle, alt, max(start, split), end)


def token_events(sim: OpenRouterState, plan: Plan, cb: ChunkBuilder, a: int, b: int) -> bytes:
    """Events for tokens [a, b): one reasoning and one content event, or with tokens_per_event
    set, one event per aligned run of that many tokens (so timing never changes the count)."""
    r = plan.reasoning_tokens
    k = sim.config.tokens_per_event or max(b - a, 1)
    out: list[bytes] = []
    pos = a
    while pos < b:
        end = min(b, (pos // k + 1) * k) if sim.config.tokens_per_event else b
        if pos < r < end:
            end = r
        if pos < r:
            if plan.show_reasoning:
                out.append(cb.reasoning(reasoning_text(plan, pos, end)))
        elif plan.tools is None:
            out.append(cb.content(content_text(plan, pos - r, end - r)))
        else:
            out.extend(_tool_answer_events(plan, cb, pos - r, end - r))
        pos = end
    sim.token_events += len(out)
    return b"".join(out)


def _tool_answer_events(plan: Plan, cb: ChunkBuilder, a: int, b: int) -> list[bytes]:
    """Content tokens [a, b) of a tool answer: the preamble's text, then one event per call
    fragment, as in the Kimi captures."""
    assert plan.tools is not None
    p = plan.tools.preamble
    out: list[bytes] = []
    if a < p:
        out.append(cb.content(content_text(plan, a, min(b, p))))
    if b > p:
        out.extend(cb.tool_calls([entry]) for entry in deltas(plan.tools.calls, max(a, p) - p, b - p))
    return out


def flush_upto(config: SimConfig, produced: int, stop_at: int) -> int:
    """How many of the produced tokens to send now: whole events only, unless it is the end."""
    k = config.tokens_per_event
    if k <= 0 or produced >= stop_at:
        return produced
    return produced - produced % k


def usage(
    config: SimConfig, plan: Plan, completion: int, reasoning: int, billed: tuple[float, float, float]
) -> dict[str, Any] | None:
    cost, pc, cc = billed
    return usage_object(
        plan.prompt_tokens,
        completion,
        reasoning,
        cost,
        pc,
        cc,
        shape=plan.usage_shape,
        byok=config.byok,
    )


def router_metadata(config: SimConfig, plan: Plan) -> dict[str, Any]:
    return {
        "requested": plan.requested_model,
        "strategy": "fallback" if plan.attempts else "direct",
        "region": "DFW",
        "summary": f"available={len(plan.candidates)}, selected={plan.ep.provider_name}",
        "attempt": len(plan.attempts) + 1,
        "is_byok": config.byok,
        "endpoints": {
            "total": len(plan.model.endpoints),
            "available": [
                {
                    "provider": e.provider_name,
                    "model": plan.model.canonical_slug,
                    "selected": e is plan.ep,
                }
                for e in plan.candidates
            ],
        },
        "attempts": [
            {"provider": a.provider_name, "model": a.model_permaslug, "status": a.status}
            for a in plan.attempts
        ],
    }


# --- answers past the edge (config.EDGE_FAULTS) ------------------------------------------------------
def edge_headers(config: SimConfig, plan: Plan) -> dict[str, str]:
    if plan.fault != "huge_headers":
        return {}
    return edges.padding_headers(config.huge_header_bytes, config.huge_header_count)


def endless_text(config: SimConfig, plan: Plan) -> tuple[str, int]:
    """About endless_chunk_bytes of content, and the tokens it counts for."""
    tokens = max(1, config.endless_chunk_bytes // 6)
    return content_text(plan, 0, tokens), tokens
