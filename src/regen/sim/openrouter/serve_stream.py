"""A stream answer: SSE events, flushed every `chunk_interval_s` with all the tokens produced since
the last flush (cost scales with chunks, never with tokens), keepalive comments while waiting, then
the finish, usage and [DONE]; or the fault that ends it otherwise (docs/openrouter.md §3, §4.4).
A client that leaves is billed for what its provider produced (§1.4)."""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import Any

from aiohttp import web

from regen.sim.openrouter import edges
from regen.sim.openrouter import faults as fault_bodies
from regen.sim.openrouter.answer import (
    CUT_FAULTS,
    edge_headers,
    endless_text,
    flush_upto,
    router_metadata,
    token_events,
    usage,
)
from regen.sim.openrouter.plan import Plan
from regen.sim.openrouter.settle import bill, bill_cancel
from regen.sim.openrouter.state import OpenRouterState
from regen.sim.openrouter.stream import DONE, KEEPALIVE, ChunkBuilder
from regen.sim.openrouter.wire import cf_headers

# Faults whose whole stream is decided at the first token: an error body, a body that never
# ends, the whole answer at a trickle.
_WHOLE_FAULTS = frozenset({"error_body_200", "endless_body", "trickle"})


class ClientGone(Exception):
    """The client closed the connection while a stream was being written."""


def check_client(request: web.Request) -> None:
    transport = request.transport
    if transport is None or transport.is_closing():
        raise ClientGone


async def serve_stream(
    sim: OpenRouterState, request: web.Request, plan: Plan, summary: dict[str, Any]
) -> web.StreamResponse:
    headers = cf_headers(plan.gen_id)
    headers.update(edge_headers(sim.config, plan))
    headers["Content-Type"] = "text/event-stream"
    headers["Cache-Control"] = "no-cache"
    resp = web.StreamResponse(status=200, headers=headers)
    loop = asyncio.get_running_loop()
    first_at = plan.started + plan.ttft
    sent = 0
    started_tokens = False
    try:
        await resp.prepare(request)
        await resp.write(KEEPALIVE)  # seen on the wire before the first token
        await _wait_first_token(sim, request, resp, first_at)
        cb = ChunkBuilder(plan.gen_id, plan.ep.provider_name, plan.model.canonical_slug, plan.created)
        if plan.fault in _WHOLE_FAULTS:
            await _whole_fault(sim, request, resp, plan, cb, first_at, summary)
            return resp
        await resp.write(cb.role())
        started_tokens = True
        sent = await _pump(sim, request, resp, plan, cb, first_at)
    except (ClientGone, ConnectionError):
        produced = _produced(plan, loop.time(), first_at) if started_tokens else 0
        bill_cancel(sim, plan, max(sent, produced), first_at if started_tokens else None)
        summary["cancelled"] = True
        return resp
    except asyncio.CancelledError:
        # Server shutdown mid-stream: still account for what the provider produced.
        produced = _produced(plan, loop.time(), first_at) if started_tokens else 0
        bill_cancel(sim, plan, max(sent, produced), first_at if started_tokens else None)
        raise
    return await _finish_stream(sim, request, resp, plan, cb, first_at)


async def _whole_fault(
    sim: OpenRouterState,
    request: web.Request,
    resp: web.StreamResponse,
    plan: Plan,
    cb: ChunkBuilder,
    first_at: float,
    summary: dict[str, Any],
) -> None:
    """The stream of a fault in _WHOLE_FAULTS, from its first token on."""
    if plan.fault == "error_body_200":
        bill(sim, plan, 0, 0, None, None, cancelled=False, first_token_at=first_at)
        err = fault_bodies.error_body_200(plan.ep.provider_name, sim.config.user_id)
        await resp.write(cb.error_no_choices(err["error"]) + DONE)
    elif plan.fault == "endless_body":
        text, tokens = endless_text(sim.config, plan)
        await resp.write(cb.role())
        pieces = await edges.endless(request, resp, cb.content(text), sim.config.chunk_interval_s)
        bill_cancel(sim, plan, pieces * tokens, first_at)
        summary["cancelled"] = True
    else:
        # The whole answer, decided and billed now, then sent at the trickle's pace.
        data = cb.role() + token_events(sim, plan, cb, 0, plan.stop_at)
        await edges.trickle(
            request,
            resp,
            data + _stream_tail(sim, plan, cb, first_at),
            sim.config.trickle_bytes_per_s,
        )


async def _wait_first_token(
    sim: OpenRouterState, request: web.Request, resp: web.StreamResponse, first_at: float
) -> None:
    loop = asyncio.get_running_loop()
    keepalive = max(sim.config.keepalive_interval_s, 0.01)
    while True:
        remaining = first_at - loop.time()
        if remaining <= 0:
            return
        await asyncio.sleep(min(remaining, keepalive))
        check_client(request)
        if loop.time() < first_at:
            await resp.write(KEEPALIVE)


def _produced(plan: Plan, now: float, first_at: float) -> int:
    if now < first_at:
        return 0
    if plan.tps == math.inf:
        return plan.stop_at
    return min(plan.stop_at, int((now - first_at) * plan.tps) + 1)


async def _pump(
    sim: OpenRouterState,
    request: web.Request,
    resp: web.StreamResponse,
    plan: Plan,
    cb: ChunkBuilder,
    first_at: float,
) -> int:
    """Flush produced tokens every chunk interval until `stop_at`; returns tokens sent."""
    loop = asyncio.get_running_loop()
    cfg = sim.config
    interval = max(cfg.chunk_interval_s, 0.001)
    keepalive = max(cfg.keepalive_interval_s, 0.01)
    sent = 0
    last_write = loop.time()
    while sent < plan.stop_at:
        now = loop.time()
        produced = flush_upto(sim.config, _produced(plan, now, first_at), plan.stop_at)
        if produced > sent:
            data = token_events(sim, plan, cb, sent, produced)
            sent = produced
            if data:
                await resp.write(data)
                last_write = now
        if now - last_write >= keepalive:
            await resp.write(KEEPALIVE)
            last_write = now
        if sent >= plan.stop_at:
            break
        # Sleep a whole interval, or until the next token if tokens are slower than that.
        next_token = first_at + sent / plan.tps
        await asyncio.sleep(max(interval, min(next_token - loop.time(), keepalive)))
        check_client(request)
    return sent


async def _finish_stream(
    sim: OpenRouterState,
    request: web.Request,
    resp: web.StreamResponse,
    plan: Plan,
    cb: ChunkBuilder,
    first_at: float,
) -> web.StreamResponse:
    if plan.fault in CUT_FAULTS:
        # The connection drops with no error event and no [DONE] (§4.4, §13.17).
        bill_cancel(sim, plan, plan.stop_at, first_at)
        if request.transport is not None:
            request.transport.close()
        return resp
    tail = _stream_tail(sim, plan, cb, first_at)
    with contextlib.suppress(ConnectionError):
        await resp.write(tail)
    return resp


def _stream_tail(sim: OpenRouterState, plan: Plan, cb: ChunkBuilder, first_at: float) -> bytes:
    """Bill the generation and return the events that end its stream (finish, usage, [DONE])."""
    if plan.fault in ("mid_stream_error", "error_choice_200"):
        return _error_tail(sim, plan, cb, first_at)
    completion, reasoning = plan.completion_tokens, plan.reported_reasoning
    billed = bill(
        sim,
        plan,
        completion,
        reasoning,
        plan.finish_reason,
        plan.native_finish_reason,
        cancelled=False,
        first_token_at=first_at,
    )
    answer_usage = usage(sim.config, plan, completion, reasoning, billed)
    extra: dict[str, Any] = {}
    if plan.want_metadata:
        extra["openrouter_metadata"] = router_metadata(sim.config, plan)
    tail: list[bytes] = []
    if answer_usage is None:
        tail.append(cb.finish(plan.finish_reason, plan.native_finish_reason, **extra))
    else:
        tail.append(cb.finish(plan.finish_reason, plan.native_finish_reason))
        if plan.usage_shape == "B":
            tail.append(cb.usage_b(answer_usage, **extra))
        else:
            tail.append(cb.usage_a(answer_usage, **extra))
    tail.append(DONE)
    return b"".join(tail)


def _error_tail(sim: OpenRouterState, plan: Plan, cb: ChunkBuilder, first_at: float) -> bytes:
    """A stream that errors part-way: billed for what was produced, then the error event (in the
    choice, or on its own with [DONE] only when `done_after_error`)."""
    produced = plan.stop_at
    bill(
        sim,
        plan,
        produced,
        min(produced, plan.reasoning_tokens),
        "error",
        "error",
        cancelled=False,
        first_token_at=first_at,
    )
    err = fault_bodies.provider_disconnected()
    if plan.fault == "mid_stream_error":
        if sim.config.done_after_error:
            return cb.error(err) + DONE
        return cb.error(err)
    return cb.error_in_choice(err) + DONE
