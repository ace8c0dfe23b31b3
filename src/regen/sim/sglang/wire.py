"""SGLang's /generate on the wire: the request's gates, response bodies, error bodies (docs/sglang.md §4).

Shapes follow SGLang 0.5.23. A request passes three gates, and where it is refused decides what the
client sees:

- FastAPI's parse of the body: wrong JSON types get the validation form `{"object": "error",
  "message", "type": "Bad Request", "param": null, "code": 400}`;
- the JSON contract (sampling.py): 400 `{"error": "<text>"}`;
- the front end's ValueErrors (`front_end_checks`, in the order the tokenizer manager raises them):
  400 `{"error": {"message": ...}}`, or, for a stream, a 200 whose one event is the error and
  `[DONE]` (http_server.py `stream_results`), which `error_event` writes.

The simulator is stricter than SGLang in one way: a request it would not simulate faithfully
(batches, logprobs, constrained decoding) is refused with a 400 that says so, never half-served.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from regen.sim.sglang.request import Sampling
from regen.sim.sglang.sampling import (
    BATCH,
    ContractError,
    NotSimulated,
    RequestValueError,
    decode_sampling,
    not_simulated,
    verify_sampling,
)

__all__ = [
    "GenerateError",
    "Parsed",
    "RequestValueError",
    "error_400",
    "error_event",
    "front_end_checks",
    "http_error",
    "json_response",
    "not_found",
    "parse_generate",
    "read_json_body",
    "validation_error",
]


class GenerateError(Exception):
    """A /generate body refused before anything runs; `response` is what goes back."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.status)
        self.response = response


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


async def not_found(request: web.Request) -> web.StreamResponse:
    """FastAPI's answer for a path it has no route for (or a route this config turns off)."""
    return json_response({"detail": "Not Found"}, 404)


async def read_json_body(request: web.Request) -> Any:
    """A control route's JSON body: {} when empty, None when it is not JSON."""
    raw = await request.read()
    if not raw:
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def error_400(message: str) -> web.Response:
    """What SGLang's /generate answers a non-stream request for a ValueError."""
    return json_response({"error": {"message": message}}, 400)


def error_event(message: str, code: int = 400) -> bytes:
    """A stream's answer to a ValueError: the error as its one event, then [DONE]."""
    error = {"message": message, "type": "invalid_request_error", "code": code, "retryable": False}
    return b"data: " + orjson.dumps({"error": error}) + b"\n\ndata: [DONE]\n\n"


def validation_error(message: str) -> web.Response:
    """FastAPI's request-validation answer, which SGLang turns from 422 into 400."""
    return json_response(
        {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}, 400
    )


def http_error(status: int, message: str) -> web.Response:
    """An HTTPException's answer (SGLang's handler: type is the status as a string)."""
    return json_response(
        {"object": "error", "message": message, "type": str(status), "param": None, "code": status}, status
    )


@dataclass(frozen=True, slots=True)
class Parsed:
    """A body past FastAPI and the contract: what the front end's own checks then look at."""

    rid: str
    given: tuple[str, ...]  # which of text, input_ids, input_embeds are set
    input_ids: list[int] | None
    text: str | None
    sampling: dict[str, Any]  # the contract's decode: the non-null sampling values
    stream: bool
    return_prompt_token_ids: bool
    log_metrics: bool
    return_hidden_states: bool


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_generate(body: Any) -> Parsed:
    """FastAPI's and the contract's gates; raises GenerateError with the response to send."""
    if not isinstance(body, dict):
        raise GenerateError(validation_error("Input should be a valid dictionary or object"))
    text, input_ids, rid = body.get("text"), body.get("input_ids"), body.get("rid")
    if isinstance(text, list):
        raise GenerateError(error_400(BATCH.format(what="text")))
    if text is not None and not isinstance(text, str):
        raise GenerateError(validation_error("text: Input should be a valid string"))
    if input_ids is not None:
        if not isinstance(input_ids, list):
            raise GenerateError(validation_error("input_ids: Input should be a valid list"))
        if input_ids and isinstance(input_ids[0], list):
            raise GenerateError(error_400(BATCH.format(what="input_ids")))
        if not all(_is_int(t) for t in input_ids):
            raise GenerateError(validation_error("input_ids: Input should be a list of integers"))
    if isinstance(rid, list):
        raise GenerateError(error_400(BATCH.format(what="rid")))
    if rid is not None and not isinstance(rid, str):
        raise GenerateError(validation_error("rid: Input should be a valid string"))
    for key in ("stream", "return_prompt_token_ids", "log_metrics", "return_hidden_states"):
        if body.get(key) is not None and not isinstance(body[key], bool):
            raise GenerateError(validation_error(f"{key}: Input should be a valid boolean"))
    try:
        sampling = decode_sampling(body.get("sampling_params"))
        not_simulated(sampling)
    except ContractError as exc:
        raise GenerateError(json_response({"error": str(exc)}, 400)) from None
    except NotSimulated as exc:
        raise GenerateError(error_400(str(exc))) from None
    if body.get("return_logprob"):
        raise GenerateError(error_400("return_logprob is not simulated"))
    if body.get("input_embeds") is not None:
        raise GenerateError(error_400("input_embeds is not simulated; send text or input_ids"))
    return Parsed(
        rid=rid if rid is not None else uuid.uuid4().hex,
        given=tuple(k for k in ("text", "input_ids", "input_embeds") if body.get(k) is not None),
        input_ids=input_ids,
        text=text,
        sampling=sampling,
        stream=body.get("stream") is True,
        return_prompt_token_ids=body.get("return_prompt_token_ids") is True,
        log_metrics=body.get("log_metrics") is not False,
        return_hidden_states=body.get("return_hidden_states") is True,
    )


def front_end_checks(
    parsed: Parsed,
    *,
    live: bool,
    prompt_len: int | None,
    context_len: int,
    vocab_size: int,
    eos_ids: tuple[int, ...],
) -> Sampling:
    """The tokenizer manager's ValueErrors, in its order: the input (normalize), a live duplicate
    rid, hidden states, the context (prompt, then prompt plus max_new_tokens), the sampling values.
    `prompt_len` is None until the prompt is known (then only the first checks run)."""
    if len(parsed.given) != 1:
        raise RequestValueError("Either text, input_ids or input_embeds should be provided.")
    if parsed.input_ids is not None and not parsed.input_ids:
        raise RequestValueError("input_ids cannot be empty.")
    if live:
        raise RequestValueError(f"Duplicate request ID detected: {parsed.rid}")
    if parsed.return_hidden_states:
        raise RequestValueError(
            "The server is not configured to return hidden states. Please set "
            "`--return-hidden-states-mode last`, `--return-hidden-states-mode full`, or the legacy "
            "`--enable-return-hidden-states` flag."
        )
    for tid in parsed.input_ids or ():
        if not 0 <= tid < vocab_size:
            raise RequestValueError(
                f"Token id {tid} in input_ids is out of the vocabulary (size {vocab_size})."
            )
    n = prompt_len or 0
    if n >= context_len:
        raise RequestValueError(
            f"The input ({n} tokens) is longer than the model's context length ({context_len} tokens)."
        )
    max_new = parsed.sampling.get("max_new_tokens")
    if max_new is not None and n + max_new > context_len:
        raise RequestValueError(
            f"Requested token count exceeds the model's maximum context length of {context_len} tokens. "
            f"You requested a total of {n + max_new} tokens: {n} tokens from the input messages and "
            f"{max_new} tokens for the completion. Please reduce the number of tokens in the input "
            "messages or the completion to fit within the limit."
        )
    return verify_sampling(parsed.sampling, eos_ids)
