"""A non-stream answer: one chat.completion body after the whole generation's time, billed in
full whether or not the client is still there (docs/openrouter.md §1.4), or the fault that
replaces it (an error body, a cut, a trickle, a body that never ends)."""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import Any

import orjson
from aiohttp import web

from regen.sim.openrouter import edges
from regen.sim.openrouter import faults as fault_bodies
from regen.sim.openrouter.answer import (
    CUT_FAULTS,
    content_text,
    edge_headers,
    endless_text,
    reasoning_text,
    router_metadata,
    usage,
)
from regen.sim.openrouter.plan import Plan
from regen.sim.openrouter.settle import bill, bill_cancel
from regen.sim.openrouter.state import OpenRouterState
from regen.sim.openrouter.stream import reasoning_details
from regen.sim.openrouter.tools import message_calls
from regen.sim.openrouter.wire import cf_headers, json_response


async def serve_json(sim: OpenRouterState, request: web.Request, plan: Plan) -> web.StreamResponse:
    fault = plan.fault
    if fault == "endless_body":
        return await _endless_json(sim, request, plan)
    produced = plan.stop_at
    if fault == "error_body_200":
        produced = 0
    delay = plan.ttft + (produced / plan.tps if plan.tps != math.inf else 0.0)
    if delay > 0:
        await asyncio.sleep(delay)
    # Billed whether or not the client is still there: non-stream is billed in full (§1.4).
    first_at = plan.started + plan.ttft
    headers = cf_headers(plan.gen_id)
    headers.update(edge_headers(sim.config, plan))
    if fault == "error_body_200":
        bill(sim, plan, 0, 0, None, None, cancelled=False, first_token_at=first_at)
        return json_response(
            200, fault_bodies.error_body_200(plan.ep.provider_name, sim.config.user_id), headers
        )
    out = _completion(sim, plan, produced, first_at)
    if fault == "trickle":
        return await _trickle(sim, request, orjson.dumps(out), headers, "application/json")
    if fault not in CUT_FAULTS:
        return json_response(200, out, headers)
    return await _cut(sim, request, orjson.dumps(out), headers)


def _completion(sim: OpenRouterState, plan: Plan, produced: int, first_at: float) -> dict[str, Any]:
    """Bill the generation and return its chat.completion body (an error choice for a fault that
    errors part-way)."""
    fault = plan.fault
    errored = fault in ("error_choice_200", "mid_stream_error")
    finish: str | None
    native: str | None
    if errored:
        completion, reasoning = produced, min(produced, plan.reasoning_tokens)
        finish = native = "error"
    else:
        completion, reasoning = plan.completion_tokens, plan.reported_reasoning
        finish, native = plan.finish_reason, plan.native_finish_reason
    billed = bill(sim, plan, completion, reasoning, finish, native, cancelled=False, first_token_at=first_at)
    r = min(plan.reasoning_tokens, completion)
    content_tokens = completion - r if not errored else max(0, produced - r)
    choice: dict[str, Any] = {
        "index": 0,
        "logprobs": None,
        "finish_reason": finish,
        "native_finish_reason": native,
        "message": _message(plan, r, content_tokens),
    }
    if errored:
        choice["error"] = fault_bodies.provider_disconnected()
    out: dict[str, Any] = {
        "id": plan.gen_id,
        "object": "chat.completion",
        "created": plan.created,
        "model": plan.model.canonical_slug,
        "provider": plan.ep.provider_name,
        "system_fingerprint": None,
        "service_tier": None,
        "choices": [choice],
    }
    answer_usage = usage(sim.config, plan, completion, reasoning, billed)
    if answer_usage is not None:
        out["usage"] = answer_usage
    if plan.want_metadata:
        out["openrouter_metadata"] = router_metadata(sim.config, plan)
    return out


def _message(plan: Plan, reasoning_tokens: int, content_tokens: int) -> dict[str, Any]:
    """The assistant message: content (or a tool answer's preamble), reasoning, tool calls."""
    message: dict[str, Any] = {"role": "assistant"}
    text_tokens = content_tokens if plan.tools is None else min(content_tokens, plan.tools.preamble)
    if text_tokens == 0 and (plan.fault == "reasoning_exhaustion" or plan.tools is not None):
        message["content"] = None
    else:
        message["content"] = content_text(plan, 0, text_tokens)
    message["refusal"] = None
    if reasoning_tokens and plan.show_reasoning:
        rtext = reasoning_text(plan, 0, reasoning_tokens)
        message["reasoning"] = rtext
        message["reasoning_details"] = reasoning_details(rtext)
    else:
        message["reasoning"] = None
    if plan.tools is not None and content_tokens > text_tokens:
        message["tool_calls"] = message_calls(plan.tools.calls, content_tokens - text_tokens)
    return message


async def _cut(
    sim: OpenRouterState, request: web.Request, data: bytes, headers: dict[str, str]
) -> web.StreamResponse:
    """Cut part-way: a Content-Length the body never reaches, then the connection closes."""
    headers["Content-Type"] = "application/json"
    resp = web.StreamResponse(status=200, headers=headers)
    resp.content_length = len(data)
    with contextlib.suppress(ConnectionError):
        await resp.prepare(request)
        await resp.write(data[: max(1, int(len(data) * sim.config.fault_position))])
    if request.transport is not None:
        request.transport.close()
    return resp


async def _endless_json(sim: OpenRouterState, request: web.Request, plan: Plan) -> web.StreamResponse:
    """A chat.completion whose content string never closes (chunked, no length)."""
    first_at = plan.started + plan.ttft
    if plan.ttft > 0:
        await asyncio.sleep(plan.ttft)
    headers = cf_headers(plan.gen_id)
    headers["Content-Type"] = "application/json"
    resp = web.StreamResponse(status=200, headers=headers)
    head = orjson.dumps({"id": plan.gen_id, "object": "chat.completion", "provider": plan.ep.provider_name})
    head = head[:-1] + b',"choices":[{"index":0,"message":{"role":"assistant","content":"'
    text, tokens = endless_text(sim.config, plan)
    pieces = 0
    with contextlib.suppress(ConnectionError):
        await resp.prepare(request)
        await resp.write(head)
        pieces = await edges.endless(request, resp, orjson.dumps(text)[1:-1], sim.config.chunk_interval_s)
    bill_cancel(sim, plan, pieces * tokens, first_at)
    return resp


async def _trickle(
    sim: OpenRouterState, request: web.Request, data: bytes, headers: dict[str, str], content_type: str
) -> web.StreamResponse:
    headers["Content-Type"] = content_type
    resp = web.StreamResponse(status=200, headers=headers)
    resp.content_length = len(data)
    with contextlib.suppress(ConnectionError):
        await resp.prepare(request)
        await edges.trickle(request, resp, data, sim.config.trickle_bytes_per_s)
    return resp
