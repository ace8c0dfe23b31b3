"""POST/PUT /generate: the request's gates, its fault, the scheduler, then one body or a stream
(docs/sglang.md §4); and the sweep that aborts requests whose client has gone, as SGLang's
disconnect checks do.

A stream follows 0.5.23's output streamer: the first id at once, then a chunk whenever at least
`stream_interval` ids are unsent (the request's `sampling_params.stream_interval`, else the
server's `--stream-interval`), and the final chunk. Each chunk is cumulative (the whole text and
`output_ids` so far), unless the server runs with `--incremental-streaming-output`, where each
holds only what is new.
"""

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
    RequestValueError,
    error_400,
    error_event,
    front_end_checks,
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
    parsed = await _read(request)
    if isinstance(parsed, web.Response):
        return parsed
    prompt_ids = _prompt_ids(sim, parsed)
    tok = sim.tokenizer
    try:
        sampling = front_end_checks(
            parsed,
            live=parsed.rid in sim.scheduler.live,
            prompt_len=None if prompt_ids is None else len(prompt_ids),
            context_len=sim.context_len,
            vocab_size=tok.vocab_size,
            eos_ids=tok.eos_ids,
        )
    except RequestValueError as exc:
        sim.log.main(f"[http_server] Error: {exc}", level="error")
        return await _refuse(sim, request, parsed, str(exc))
    except GenerateError as exc:
        return exc.response
    assert prompt_ids is not None
    req = sim.new_req(parsed.rid, prompt_ids, sampling, stream=parsed.stream, log_metrics=parsed.log_metrics)
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


async def _read(request: web.Request) -> Parsed | web.Response:
    """The body through FastAPI's and the contract's gates (wire.parse_generate), or the refusal."""
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        return validation_error(f"JSON decode error: {exc}")
    try:
        return parse_generate(body)
    except GenerateError as exc:
        return exc.response


def _prompt_ids(sim: SGLangState, parsed: Parsed) -> list[int] | None:
    if parsed.given == ("text",):
        return sim.tokenizer.encode(parsed.text or "")
    if parsed.given == ("input_ids",):
        return parsed.input_ids
    return None


async def _refuse(sim: SGLangState, request: web.Request, parsed: Parsed, message: str) -> web.StreamResponse:
    """A ValueError of the front end: 400 for a plain request; for a stream, HTTP 200 with the
    error as its one event, then [DONE] (it is raised inside the streaming response)."""
    if not parsed.stream:
        return error_400(message)
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    data = error_event(message)
    sim.generate_bytes += len(data)
    await resp.write(data)
    return resp


def _draw_fault(sim: SGLangState, req: Req) -> str | None:
    f = sim.config.faults
    rates = (
        ("http_503", f.http_503_rate),
        ("abort", f.abort_rate),
        ("drop", f.drop_rate),
        ("nan", f.nan_rate),
    )
    for name, rate in rates:
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


def out_dict(
    sim: SGLangState, req: Req, *, final: bool, prompt_ids: bool = False, since: tuple[int, int] | None = None
) -> dict[str, Any]:
    """One response object: the whole text and ids so far, or with `since` (ids, characters
    already sent) only what is new, as an incremental stream sends."""
    cfg = sim.config
    if req.in_queue_abort:
        return _queue_abort_dict(sim, req, since)
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
    text, ids = req.text, req.output_ids
    if since is not None:
        text, ids = text[since[1] :], ids[since[0] :]
    out: dict[str, Any] = {"text": text, "output_ids": ids, "meta_info": meta}
    if prompt_ids:
        out["prompt_token_ids"] = req.prompt_ids
    return out


def _queue_abort_dict(sim: SGLangState, req: Req, since: tuple[int, int] | None) -> dict[str, Any]:
    """The front end's own answer for a request aborted in the waiting queue (0.5.23
    `_handle_abort_req`): the output it had, and a short meta_info."""
    end = req.finished_at if req.finished_at is not None else time.monotonic()
    meta = {
        "id": req.rid,
        "finish_reason": req.finish,
        "weight_version": sim.config.weight_version,
        "e2e_latency": end - req.arrived,
        "completion_tokens": len(req.output_ids),
    }
    ids = req.output_ids
    if since is not None:
        ids = ids[-1:]  # an incremental stream gets the last id only
    return {"text": req.text, "output_ids": ids, "meta_info": meta}


async def _wait(sim: SGLangState, request: web.Request, req: Req, prompt_ids: bool) -> web.StreamResponse:
    while req.finish is None:
        req.event.clear()
        await req.event.wait()
    if req.dropped:
        if request.transport is not None:
            request.transport.close()
        return web.Response(status=200)
    body = orjson.dumps(out_dict(sim, req, final=True, prompt_ids=prompt_ids))
    sim.generate_bytes += len(body)
    return web.Response(status=200, body=body, content_type="application/json")


async def _stream(sim: SGLangState, request: web.Request, req: Req, prompt_ids: bool) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
    incremental = sim.config.incremental_streaming_output
    sent = (0, 0)  # ids and text characters sent so far
    try:
        await resp.prepare(request)
        while True:
            interval = req.sampling.stream_interval or sim.config.stream_interval
            if req.finish is None and not req.dropped and not _due(len(req.output_ids), sent[0], interval):
                req.event.clear()
                await req.event.wait()
            if req.dropped:
                if request.transport is not None:
                    request.transport.close()
                return resp
            if req.finish is not None:
                break
            if _due(len(req.output_ids), sent[0], interval):
                chunk = out_dict(sim, req, final=False, since=sent if incremental else None)
                await _write(sim, resp, b"data: " + orjson.dumps(chunk) + b"\n\n")
                sent = (len(req.output_ids), len(req.text))
        final = out_dict(sim, req, final=True, prompt_ids=prompt_ids, since=sent if incremental else None)
        await _write(sim, resp, b"data: " + orjson.dumps(final) + b"\n\ndata: [DONE]\n\n")
    except (ConnectionError, RuntimeError):
        # The client went away: SGLang aborts the request in the scheduler.
        sim.scheduler.abort_req(req)
    return resp


def _due(n: int, sent: int, interval: int) -> bool:
    """0.5.23's rule: every step at interval 1; else the first id at once, then whenever at least
    `interval` ids are unsent."""
    unsent = n - sent
    return unsent > 0 and (interval <= 1 or unsent >= interval or sent == 0)


async def _write(sim: SGLangState, resp: web.StreamResponse, data: bytes) -> None:
    sim.generate_bytes += len(data)
    await resp.write(data)


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
