"""POST/PUT /generate: check the request against the context, draw its fault, hand it to the
scheduler, then answer with one body or a stream of cumulative events (docs/sglang.md, "/generate");
and the sweep that aborts requests whose client has gone, as SGLang's disconnect checks do."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from aiohttp import web

from regen.sim.sglang.request import Req
from regen.sim.sglang.state import SGLangState
from regen.sim.sglang.wire import (
    GenerateError,
    Parsed,
    error_400,
    http_error,
    parse_generate,
    validation_error,
)

__all__ = ["generate", "out_dict", "sweep_clients"]


async def generate(sim: SGLangState, request: web.Request) -> web.StreamResponse:
    sim.http_requests += 1
    sim.in_flight += 1
    sim.peak_in_flight = max(sim.peak_in_flight, sim.in_flight)
    try:
        return await _generate(sim, request)
    finally:
        sim.in_flight -= 1


async def _generate(sim: SGLangState, request: web.Request) -> web.StreamResponse:
    parsed = await _read(sim, request)
    if isinstance(parsed, web.Response):
        return parsed
    prompt_ids = (
        parsed.prompt_ids if parsed.prompt_ids is not None else sim.tokenizer.encode(parsed.text or "")
    )
    refused = _check_fits(sim, len(prompt_ids), parsed.sampling.max_new_tokens)
    if refused is not None:
        return refused
    if parsed.rid in sim.scheduler.live:
        return error_400(f"Duplicate request ID detected: {parsed.rid}")
    req = sim.new_req(
        parsed.rid, prompt_ids, parsed.sampling, stream=parsed.stream, log_metrics=parsed.log_metrics
    )
    if _draw_fault(sim, req) == "http_503":
        return http_error(503, "Service Unavailable")
    sim.clients[req] = request.transport
    sim.scheduler.submit(req)
    sim.peak_queue = max(sim.peak_queue, len(sim.scheduler.waiting))
    try:
        if parsed.stream:
            return await _stream(sim, request, req, parsed.return_prompt_token_ids)
        return await _wait(sim, request, req, parsed.return_prompt_token_ids)
    finally:
        sim.clients.pop(req, None)


async def _read(sim: SGLangState, request: web.Request) -> Parsed | web.Response:
    """The request's body, parsed and checked (wire.parse_generate), or the error that refuses it."""
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        return validation_error(f"JSON decode error: {exc}")
    tok = sim.tokenizer
    try:
        return parse_generate(body, vocab_size=tok.vocab_size, eos_ids=tok.eos_ids)
    except GenerateError as exc:
        return exc.response


def _check_fits(sim: SGLangState, n: int, max_new: int) -> web.Response | None:
    """The 400 of a prompt, or a prompt and its completion, longer than the context."""
    ctx = sim.context_len
    if n >= ctx:
        return error_400(f"The input ({n} tokens) is longer than the model's context length ({ctx} tokens).")
    if n + max_new > ctx:
        return error_400(
            f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
            f"You requested a total of {n + max_new} tokens: {n} tokens from the input messages and "
            f"{max_new} tokens for the completion. Please reduce the number of tokens in the input "
            "messages or the completion to fit within the limit."
        )
    return None


def _draw_fault(sim: SGLangState, req: Req) -> str | None:
    f = sim.config.faults
    for name, rate in (("http_503", f.http_503_rate), ("abort", f.abort_rate), ("drop", f.drop_rate)):
        if rate > 0 and sim.rng.random() < rate:
            sim.faults_injected[name] = sim.faults_injected.get(name, 0) + 1
            if name != "http_503":
                p = req.plan
                planned = p.reasoning + (1 if p.thinking else 0) + p.content + 1
                length = min(req.sampling.max_new_tokens, planned)
                req.fault = name
                req.fault_at = int(length * f.fault_position)
                req.fault_message = f.abort_message if name == "abort" else "Aborted"
            return name
    return None


def out_dict(sim: SGLangState, req: Req, *, final: bool, prompt_ids: bool = False) -> dict[str, Any]:
    """One response object: the whole text and ids so far (SGLang streams cumulatively)."""
    cfg = sim.config
    if req.before_prefill:
        # The front end answers a request aborted in the queue itself, with no tokens at all.
        return {
            "text": "",
            "output_ids": [],
            "meta_info": {
                "id": req.rid,
                "finish_reason": req.finish,
                "prompt_tokens": 0,
                "completion_tokens": 0,
                "cached_tokens": 0,
                "weight_version": cfg.weight_version,
            },
        }
    meta: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": req.finish if final else None,
        "prompt_tokens": req.n_prompt,
        "weight_version": cfg.weight_version,
        "num_retractions": req.num_retractions,
        "reasoning_tokens": req.reasoning_tokens() if cfg.reasoning_parser else 0,
        "completion_tokens": len(req.output_ids),
        "cached_tokens": req.cached_tokens,
    }
    if final:
        end = req.finished_at if req.finished_at is not None else time.monotonic()
        meta["e2e_latency"] = end - req.arrived
    out: dict[str, Any] = {"text": req.text, "output_ids": req.output_ids, "meta_info": meta}
    if prompt_ids:
        out["prompt_token_ids"] = req.prompt_ids
    return out


async def _wait(sim: SGLangState, request: web.Request, req: Req, prompt_ids: bool) -> web.StreamResponse:
    while req.finish is None:
        req.event.clear()
        await req.event.wait()
    if req.dropped:
        if request.transport is not None:
            request.transport.close()
        return web.Response(status=200)
    body = orjson.dumps(out_dict(sim, req, final=True, prompt_ids=prompt_ids))
    return web.Response(status=200, body=body, content_type="application/json")


async def _stream(sim: SGLangState, request: web.Request, req: Req, prompt_ids: bool) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
    interval = max(1, sim.config.stream_interval)
    sent = 0
    try:
        await resp.prepare(request)
        while True:
            if req.finish is None and not req.dropped and len(req.output_ids) - sent < interval:
                req.event.clear()
                await req.event.wait()
            if req.dropped:
                if request.transport is not None:
                    request.transport.close()
                return resp
            if req.finish is not None:
                break
            n = len(req.output_ids)
            if n - sent >= interval:
                await resp.write(b"data: " + orjson.dumps(out_dict(sim, req, final=False)) + b"\n\n")
                sent = n
        final = orjson.dumps(out_dict(sim, req, final=True, prompt_ids=prompt_ids))
        await resp.write(b"data: " + final + b"\n\ndata: [DONE]\n\n")
    except (ConnectionError, RuntimeError):
        # The client went away: SGLang aborts the request in the scheduler.
        sim.scheduler.abort_req(req)
    return resp


async def sweep_clients(sim: SGLangState) -> None:
    """Abort requests whose client has gone, as SGLang's disconnect checks do."""
    while True:
        await asyncio.sleep(0.25)
        for req, transport in list(sim.clients.items()):
            if req.finish is None and (transport is None or transport.is_closing()):
                sim.scheduler.abort_req(req)
        sched = sim.scheduler
        sim.peak_running = max(sim.peak_running, len(sched.running))
        sim.peak_queue = max(sim.peak_queue, len(sched.waiting))
