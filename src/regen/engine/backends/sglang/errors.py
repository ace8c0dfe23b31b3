"""How a failed SGLang attempt is classified, and what the job does about it (docs/sglang.md §11.5).

An HTTP status from the server (or the router in front of it), an abort in `meta_info.finish_reason`,
an error event inside the stream, or a transport error: each becomes a `Failure` that already says
whether to retry, give up or stop, whether to throttle, and whether the request ever reached a server.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import aiohttp

from regen.engine.backends.base import Disposition, Failure


class ErrorClass(StrEnum):
    """Why an SGLang attempt produced no row; counted per class in the snapshot."""

    OVERLOADED = "overloaded"  # 503: the server (or the router) cannot take it now
    RATE_LIMITED = "rate_limited"  # 429: the router's queue is full
    BAD_REQUEST = "bad_request"  # 400, 413, 422: this prompt will never succeed unchanged
    AUTH = "auth"  # 401, 403: the server wants an API key regen does not send
    NOT_FOUND = "not_found"  # 404: no /generate here, or the router serves another model
    SERVER = "server"  # 500 and other 5xx
    UNREACHABLE = "unreachable"  # no connection: refused, DNS, connect timeout, TLS
    NETWORK = "network"  # the connection dropped, a stream cut before its final chunk, a deadline
    STREAM_ERROR = "stream_error"  # an error event inside the stream (the router's worker died)
    ABORT = "abort"  # finish_reason abort: the server aborted it (memory, shutdown, an abort call)
    NAN = "nan"  # finish "NaN happened": the model sampled an id outside the vocabulary
    BAD_PROMPT = "bad_prompt"  # the chat template could not render the prompt locally
    OVER_CONTEXT = "over_context"  # its ids and max_tokens exceed the served context: never sent


# The router's own answers when no worker can be reached: the request never reached a GPU.
_NO_WORKER = ("no_available_workers", "call_upstream_connection_failed")

_HINT_400 = (
    "every request is refused as bad: check that sglang.urls points at SGLang's native API and "
    "that the prompts plus openrouter.max_tokens fit the model's context"
)


def error_text(body: Any, fallback: str) -> str:
    """The readable message of an SGLang or router error body."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str) and error:
            return error
        for key in ("message", "detail"):
            if body.get(key):
                return str(body[key])
    return fallback


def for_status(status: int, body: Any, raw: bytes, url: str) -> Failure:
    """An HTTP error status from `url` (a server, or the router in front of several)."""
    text = error_text(body, raw[:200].decode("utf-8", "replace").strip() or f"HTTP {status}")
    message = f"HTTP {status} from {url}: {text}"[:300]
    no_worker = any(marker in text or marker in raw.decode("utf-8", "replace") for marker in _NO_WORKER)
    if status >= 500 and no_worker:
        # The router is up but has no worker to send it to: like a refused connection, nothing ran.
        return Failure(Disposition.RETRY, ErrorClass.UNREACHABLE, message, outage=True, sent=False)
    if status == 503:
        return Failure(Disposition.RETRY, ErrorClass.OVERLOADED, message, throttle=True)
    if status == 429:
        return Failure(Disposition.RETRY, ErrorClass.RATE_LIMITED, message, throttle=True)
    if status in (400, 413, 422):
        return Failure(
            Disposition.GIVE_UP, ErrorClass.BAD_REQUEST, message, refused=True, streak_hint=_HINT_400
        )
    if status in (401, 403):
        return Failure(Disposition.FATAL, ErrorClass.AUTH, message)
    if status == 404:
        return Failure(Disposition.FATAL, ErrorClass.NOT_FOUND, message)
    return Failure(Disposition.RETRY, ErrorClass.SERVER, message)


def for_abort(finish: dict[str, Any], url: str) -> Failure:
    """`finish_reason: {"type": "abort", ...}`: retried, unless the server says the request is bad;
    a 503 (its queue is full, or the request waited too long in it) also throttles, as a 503 does."""
    detail = str(finish.get("message") or "aborted")
    status = finish.get("status_code")
    message = f"aborted by {url}: {detail}"[:300]
    if isinstance(status, int) and 400 <= status < 500 and status != 429:
        return Failure(
            Disposition.GIVE_UP, ErrorClass.BAD_REQUEST, message, refused=True, streak_hint=_HINT_400
        )
    return Failure(Disposition.RETRY, ErrorClass.ABORT, message, throttle=status in (429, 503))


def for_stream_error(payload: dict[str, Any], url: str) -> Failure:
    """An error event where a chunk should be. SGLang sends its request errors this way once a stream
    has begun (a prompt past the context, bad sampling values: `code` 400, `retryable` false), so those
    are bad requests like a 400; an event without them (the router's, when its worker died) is retried."""
    text = error_text(payload, "error event")
    error = payload.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    retryable = error.get("retryable") if isinstance(error, dict) else None
    code = code if isinstance(code, int) and not isinstance(code, bool) else None
    if retryable is False or (code is not None and 400 <= code < 500 and code != 429):
        return Failure(
            Disposition.GIVE_UP,
            ErrorClass.BAD_REQUEST,
            f"refused by {url} ({code or 'error event'}): {text}"[:300],
            refused=True,
            streak_hint=_HINT_400,
        )
    message = f"error in the stream from {url}: {text}"[:300]
    if code in (429, 503):
        return Failure(Disposition.RETRY, ErrorClass.OVERLOADED, message, throttle=True)
    return Failure(Disposition.RETRY, ErrorClass.STREAM_ERROR, message)


def nan(url: str) -> Failure:
    """`{"type": "stop", "matched": "NaN happened"}`: the model sampled an id outside the vocabulary
    and the server ended the request there, an eos id in its place; the answer is not the model's."""
    return Failure(
        Disposition.RETRY,
        ErrorClass.NAN,
        f"{url} ended the answer with 'NaN happened': the model sampled an id outside its vocabulary",
    )


def for_exception(exc: BaseException, url: str) -> Failure:
    """A transport error. Only a failed connect proves the request never reached the server."""
    what = type(exc).__name__ if not str(exc) else f"{type(exc).__name__}: {exc}"
    message = f"{what} ({url})"[:300]
    # aiohttp's only limit here is the connect one, so a TimeoutError is a connect that never happened.
    if isinstance(exc, aiohttp.ClientConnectorError | TimeoutError):
        return Failure(Disposition.RETRY, ErrorClass.UNREACHABLE, message, outage=True, sent=False)
    return Failure(Disposition.RETRY, ErrorClass.NETWORK, message)


def over_context(prompt_tokens: int, max_tokens: int, context: int, url: str) -> Failure:
    """A prompt whose rendered ids and max_tokens do not fit the context `url` serves: the server would
    refuse it (docs/sglang.md, "The context before sending"), so it is given up before it is sent."""
    return Failure(
        Disposition.GIVE_UP,
        ErrorClass.OVER_CONTEXT,
        f"over_context: {prompt_tokens} prompt tokens + max_tokens {max_tokens} = "
        f"{prompt_tokens + max_tokens} exceed the {context} tokens of context {url} serves; not sent",
        sent=False,
    )


def network(message: str) -> Failure:
    """A stream that ended without its final chunk, or a deadline."""
    return Failure(Disposition.RETRY, ErrorClass.NETWORK, message[:300])
