"""SGLang's /generate on the wire: request checks, response bodies, error bodies (docs/sglang.md).

Shapes follow SGLang 0.5.x. Errors the front end raises as ValueError come back as 400
`{"error": {"message": ...}}`; a body that is not even the right JSON types gets FastAPI's
validation form `{"object": "error", "message", "type": "Bad Request", "param": null, "code": 400}`.
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

__all__ = [
    "GenerateError",
    "Parsed",
    "error_400",
    "http_error",
    "json_response",
    "not_found",
    "parse_generate",
    "read_json_body",
    "validation_error",
]

_SAMPLING_KEYS = frozenset(
    {
        "max_new_tokens",
        "min_new_tokens",
        "stop",
        "stop_token_ids",
        "stop_regex",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "n",
        "json_schema",
        "regex",
        "ebnf",
        "structural_tag",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "custom_params",
        "stream_interval",
        "logit_bias",
        "sampling_seed",
    }
)
_CONSTRAINED = ("json_schema", "regex", "ebnf", "structural_tag", "stop_regex")
_BATCH = (
    "regen's SGLang simulator serves one prompt per /generate request; batched {what} lists are not "
    "simulated (send one request per prompt)"
)


class GenerateError(Exception):
    """A /generate body the server refuses; `response` is what goes back."""

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
    """What SGLang's /generate answers for a ValueError raised while handling the request."""
    return json_response({"error": {"message": message}}, 400)


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
    rid: str
    prompt_ids: list[int] | None
    text: str | None
    sampling: Sampling
    stream: bool
    return_prompt_token_ids: bool
    log_metrics: bool


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _sampling(raw: Any, eos_ids: tuple[int, ...]) -> Sampling:
    if raw is None:
        raw = {}
    if isinstance(raw, list):
        raise GenerateError(error_400(_BATCH.format(what="sampling_params")))
    if not isinstance(raw, dict):
        raise GenerateError(validation_error("sampling_params: Input should be a valid dictionary"))
    for key in raw:
        if key not in _SAMPLING_KEYS:
            raise GenerateError(
                error_400(f"SamplingParams.__init__() got an unexpected keyword argument '{key}'")
            )
    for key in _CONSTRAINED:
        if raw.get(key) is not None:
            raise GenerateError(error_400(f"{key}: constrained decoding is not simulated"))
    if raw.get("n", 1) not in (1, None):
        raise GenerateError(error_400("n > 1 is not simulated (send one request per sample)"))

    def num(key: str, default: float) -> float:
        v = raw.get(key)
        if v is None:
            return default
        if not _is_num(v):
            raise GenerateError(validation_error(f"sampling_params.{key}: Input should be a valid number"))
        return float(v)

    def integer(key: str, default: int) -> int:
        v = raw.get(key)
        if v is None:
            return default
        if not _is_int(v):
            raise GenerateError(validation_error(f"sampling_params.{key}: Input should be a valid integer"))
        return int(v)

    def flag(key: str, default: bool) -> bool:
        v = raw.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise GenerateError(validation_error(f"sampling_params.{key}: Input should be a valid boolean"))
        return v

    max_new = integer("max_new_tokens", 128)
    min_new = integer("min_new_tokens", 0)
    temperature = num("temperature", 1.0)
    top_p = num("top_p", 1.0)
    top_k = integer("top_k", -1)
    min_p = num("min_p", 0.0)
    checks = (
        (max_new < 0, f"max_new_tokens must be at least 0, got {max_new}."),
        (temperature < 0, f"temperature must be non-negative, got {temperature}."),
        (not 0 < top_p <= 1, f"top_p must be in (0, 1], got {top_p}."),
        (top_k < -1 or top_k == 0, f"top_k must be -1 (disable), or at least 1, got {top_k}."),
        (not 0 <= min_p <= 1, f"min_p must be in [0, 1], got {min_p}."),
        (not -2 <= num("frequency_penalty", 0.0) <= 2, "frequency_penalty must be in [-2, 2]."),
        (not -2 <= num("presence_penalty", 0.0) <= 2, "presence_penalty must be in [-2, 2]."),
        (not 0 < num("repetition_penalty", 1.0) <= 2, "repetition_penalty must be in (0, 2]."),
        (not 0 <= min_new <= max_new, f"min_new_tokens must be in [0, max_new_tokens], got {min_new}."),
    )
    for bad, message in checks:
        if bad:
            raise GenerateError(error_400(message))

    stop = raw.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,) if stop else ()
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(s for s in stop if s)
    else:
        raise GenerateError(validation_error("sampling_params.stop: Input should be a string or a list"))
    stop_ids_raw = raw.get("stop_token_ids")
    if stop_ids_raw is None:
        stop_ids_raw = []
    if not isinstance(stop_ids_raw, list) or not all(_is_int(i) for i in stop_ids_raw):
        raise GenerateError(
            validation_error("sampling_params.stop_token_ids: Input should be a list of integers")
        )
    ignore_eos = flag("ignore_eos", False)
    # SGLang checks stop ids (stop_token_ids and the model's eos) only without ignore_eos.
    stop_ids = frozenset() if ignore_eos else frozenset(stop_ids_raw) | frozenset(eos_ids)
    seed = raw.get("sampling_seed")
    if seed is not None and not _is_int(seed):
        raise GenerateError(validation_error("sampling_params.sampling_seed: Input should be a valid integer"))
    return Sampling(
        max_new_tokens=max_new,
        min_new_tokens=min_new,
        stop_ids=stop_ids,
        stop_strs=stops,
        skip_special_tokens=flag("skip_special_tokens", True),
        no_stop_trim=flag("no_stop_trim", False),
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        seed=seed,
    )


def parse_generate(body: Any, *, vocab_size: int, eos_ids: tuple[int, ...]) -> Parsed:
    """Check a /generate body; raises GenerateError with the response to send."""
    if not isinstance(body, dict):
        raise GenerateError(validation_error("Input should be a valid dictionary or object"))
    text = body.get("text")
    input_ids = body.get("input_ids")
    given = [k for k in ("text", "input_ids", "input_embeds") if body.get(k) is not None]
    if len(given) != 1:
        raise GenerateError(error_400("Either text, input_ids or input_embeds should be provided."))
    if given[0] == "input_embeds":
        raise GenerateError(error_400("input_embeds is not simulated; send text or input_ids"))
    prompt_ids: list[int] | None = None
    if given[0] == "text":
        if isinstance(text, list):
            raise GenerateError(error_400(_BATCH.format(what="text")))
        if not isinstance(text, str):
            raise GenerateError(validation_error("text: Input should be a valid string"))
    else:
        if not isinstance(input_ids, list):
            raise GenerateError(validation_error("input_ids: Input should be a valid list"))
        if input_ids and isinstance(input_ids[0], list):
            raise GenerateError(error_400(_BATCH.format(what="input_ids")))
        if not input_ids:
            raise GenerateError(error_400("input_ids is empty"))
        for tid in input_ids:
            if not _is_int(tid):
                raise GenerateError(validation_error("input_ids: Input should be a list of integers"))
            if not 0 <= tid < vocab_size:
                raise GenerateError(
                    error_400(f"Token id {tid} in input_ids is out of the vocabulary (size {vocab_size}).")
                )
        prompt_ids = input_ids
    rid = body.get("rid")
    if isinstance(rid, list):
        raise GenerateError(error_400(_BATCH.format(what="rid")))
    if rid is not None and not isinstance(rid, str):
        raise GenerateError(validation_error("rid: Input should be a valid string"))
    if body.get("return_logprob"):
        raise GenerateError(error_400("return_logprob is not simulated"))
    if body.get("return_hidden_states"):
        raise GenerateError(
            error_400(
                "The server is not configured to return hidden states. Please set "
                "`--enable-return-hidden-states` to enable this feature."
            )
        )
    for key in ("stream", "return_prompt_token_ids", "log_metrics"):
        if body.get(key) is not None and not isinstance(body[key], bool):
            raise GenerateError(validation_error(f"{key}: Input should be a valid boolean"))
    return Parsed(
        rid=rid if rid is not None else uuid.uuid4().hex,
        prompt_ids=prompt_ids,
        text=text if given[0] == "text" else None,
        sampling=_sampling(body.get("sampling_params"), eos_ids),
        stream=body.get("stream") is True,
        return_prompt_token_ids=body.get("return_prompt_token_ids") is True,
        log_metrics=body.get("log_metrics") is not False,
    )
