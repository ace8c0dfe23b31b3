"""How a failed OpenRouter attempt is classified, and what the job does about it.

The shapes are those of docs/openrouter.md §3.5, §4.4 and §6: three generations of error
metadata, HTTP 200 bodies that carry errors, and retry hints in headers or inside the body.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from regen.engine.backends.base import Disposition


class ErrorClass(StrEnum):
    """Why an attempt produced no row; the headless line and the snapshot count by these."""

    RATE_LIMITED = "rate_limited"  # 429
    OVERLOADED = "overloaded"  # 503, 529
    IN_FLIGHT_BUDGET = "in_flight_budget"  # 402 with Retry-After from OpenRouter's in-flight hold
    SERVER = "server"  # 500, 502, 408, 524 and other 5xx
    NETWORK = "network"  # connection refused or reset, timeouts, a stream cut without [DONE]
    STREAM_ERROR = "stream_error"  # an error chunk after the stream started
    ERROR_BODY = "error_body"  # HTTP 200 carrying an error
    EMPTY = "empty"  # no text at all, or a failure visible only in native_finish_reason
    FINISH = "finish"  # a finish reason the settings do not accept (content_filter, error, ...)
    BAD_REQUEST = "bad_request"  # 400, 413, 422: this prompt will never succeed unchanged
    AUTH = "auth"  # 401, 403: the key or the account is refused
    NO_ENDPOINTS = "no_endpoints"  # 404: routing constraints leave no provider
    CREDITS = "credits"  # 402 that is not the in-flight hold: the account cannot pay
    TOO_COSTLY = "too_costly"  # 402 weight_exceeds_budget: one request's worst case is above the hold


# Gateway statuses (and Cloudflare's 52x) that OpenRouter's own edge answers when it is down.
EDGE_STATUSES = frozenset({502, 504, *range(520, 531)})
THROTTLE_CLASSES = frozenset({ErrorClass.RATE_LIMITED, ErrorClass.OVERLOADED, ErrorClass.IN_FLIGHT_BUDGET})


@dataclass(slots=True)
class AttemptError:
    """A classified failure with what the server said."""

    error_class: ErrorClass
    disposition: Disposition
    message: str
    http_status: int | None = None
    retry_after_s: float | None = None
    # A platform limit (the free-model quotas, §7.3) applies to every request of the key: the
    # whole dispatch waits for its reset, instead of each prompt spending attempts against it.
    platform_limit: bool = False
    provider: str | None = None  # the upstream provider an error body names (metadata.provider_name)
    # OpenRouter itself could not be reached or failed at its own edge (docs/faults.md, outages):
    # no connection, or a 5xx that no upstream provider answered.
    unreachable: bool = False
    sent: bool = True  # False: the request never left this machine (nothing can have been billed)


def parse_retry_after(headers: Mapping[str, str], body: Mapping[str, Any] | None = None) -> float | None:
    """Seconds to wait from Retry-After (seconds or HTTP-date), retry-after-ms or X-RateLimit-Reset.

    X-RateLimit-Reset is epoch milliseconds and may hide inside error.metadata.headers of a body.
    """
    sources: list[Mapping[str, Any]] = [headers]
    error = body.get("error") if isinstance(body, Mapping) else None
    if isinstance(error, Mapping):
        meta = error.get("metadata")
        if isinstance(meta, Mapping) and isinstance(meta.get("headers"), Mapping):
            sources.append(meta["headers"])
        availability = error.get("availability")
        if isinstance(availability, Mapping) and availability.get("retry_after") is not None:
            try:
                return max(0.0, float(availability["retry_after"]))
            except (TypeError, ValueError):
                pass
    for source in sources:
        lowered = {str(k).lower(): v for k, v in source.items()}
        if "retry-after-ms" in lowered:
            try:
                return max(0.0, float(lowered["retry-after-ms"]) / 1000.0)
            except (TypeError, ValueError):
                pass
        if "retry-after" in lowered:
            value = str(lowered["retry-after"]).strip()
            try:
                return max(0.0, float(value))
            except ValueError:
                try:
                    when = email.utils.parsedate_to_datetime(value)
                    return max(0.0, when.timestamp() - time.time())
                except (TypeError, ValueError):
                    pass
        if "x-ratelimit-reset" in lowered:
            try:
                return max(0.0, float(lowered["x-ratelimit-reset"]) / 1000.0 - time.time())
            except (TypeError, ValueError):
                pass
    return None


def error_message(body: Any, fallback: str) -> str:
    """The readable message of an error body, with the upstream cause when OpenRouter masks it."""
    if not isinstance(body, Mapping):
        return fallback
    error = body.get("error")
    if not isinstance(error, Mapping):
        return fallback
    message = str(error.get("message") or fallback)
    meta = error.get("metadata")
    if isinstance(meta, Mapping):
        provider = meta.get("provider_name")
        raw = meta.get("raw")
        if raw:
            raw_text = str(raw)
            message = (
                f"{message} ({provider}: {raw_text[:200]})" if provider else f"{message} ({raw_text[:200]})"
            )
        elif provider:
            message = f"{message} ({provider})"
    return message


def _error_code(body: Any) -> int | None:
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        code = body["error"].get("code")
        if isinstance(code, int):
            return code
        if isinstance(code, str) and code.isdigit():
            return int(code)
    return None


def classify_status(status: int, body: Any, headers: Mapping[str, str]) -> AttemptError:
    """Classify an HTTP error status (or a 200 carrying an error, with its embedded code)."""
    message = error_message(body, f"HTTP {status}")
    retry_after = parse_retry_after(headers, body if isinstance(body, Mapping) else None)
    error = body.get("error") if isinstance(body, Mapping) else None
    availability = error.get("availability") if isinstance(error, Mapping) else None
    meta = error.get("metadata") if isinstance(error, Mapping) else None
    retryable_hint = availability.get("retryable") if isinstance(availability, Mapping) else None

    provider = meta.get("provider_name") if isinstance(meta, Mapping) else None

    def make(cls: ErrorClass, disposition: Disposition) -> AttemptError:
        if retryable_hint is True and disposition is not Disposition.RETRY:
            disposition = Disposition.RETRY
        return AttemptError(
            cls,
            disposition,
            message,
            status,
            retry_after,
            provider=provider if isinstance(provider, str) else None,
        )

    if status == 429:
        limited = make(ErrorClass.RATE_LIMITED, Disposition.RETRY)
        limited.platform_limit = _is_platform_limit(headers, meta, message)
        return limited
    if status in (503, 529):
        return make(ErrorClass.OVERLOADED, Disposition.RETRY)
    if status == 402:
        limit_source = meta.get("limit_source") if isinstance(meta, Mapping) else None
        reason = meta.get("reason") if isinstance(meta, Mapping) else None
        in_flight = limit_source == "openrouter_in_flight_budget" or reason == "in_flight_budget_exhausted"
        if in_flight and retry_after is not None:
            return make(ErrorClass.IN_FLIGHT_BUDGET, Disposition.RETRY)
        if reason == "weight_exceeds_budget":
            # Waiting does not help this prompt, and other (shorter) prompts may still fit.
            return AttemptError(ErrorClass.TOO_COSTLY, Disposition.GIVE_UP, message, status)
        return AttemptError(ErrorClass.CREDITS, Disposition.FATAL, message, status, retry_after)
    if status in (401, 403):
        return make(ErrorClass.AUTH, Disposition.FATAL)
    if status == 404:
        return make(ErrorClass.NO_ENDPOINTS, Disposition.FATAL)
    if status in (400, 413, 422):
        return make(ErrorClass.BAD_REQUEST, Disposition.GIVE_UP)
    if status == 408 or status >= 500:
        failed = make(ErrorClass.SERVER, Disposition.RETRY)
        # An upstream's failure names its provider or carries OpenRouter's JSON error; a gateway
        # page or an empty body from the edge itself means OpenRouter is down, not a provider.
        failed.unreachable = status in EDGE_STATUSES and provider is None and not isinstance(error, Mapping)
        return failed
    return make(ErrorClass.SERVER, Disposition.RETRY)


def _is_platform_limit(headers: Mapping[str, str], meta: Any, message: str) -> bool:
    """A 429 of OpenRouter's own quotas: X-RateLimit-* headers (maybe only inside the body's
    metadata.headers) or the free-models message; upstream providers' 429s carry neither."""
    sources: list[Any] = [headers]
    if isinstance(meta, Mapping):
        sources.append(meta.get("headers"))
    for source in sources:
        if isinstance(source, Mapping) and any(str(k).lower() == "x-ratelimit-reset" for k in source):
            return True
    return "free-models-per-" in message


def classify_error_in_ok_response(body: Mapping[str, Any], *, streamed: bool) -> AttemptError:
    """A 200 response (or stream chunk) carrying a top-level error: classify by its embedded code."""
    code = _error_code(body)
    cls = ErrorClass.STREAM_ERROR if streamed else ErrorClass.ERROR_BODY
    message = error_message(body, "error in response")
    if code in (401, 403):
        return AttemptError(ErrorClass.AUTH, Disposition.FATAL, message, code)
    if code == 402:
        embedded = classify_status(402, body, {})
        if embedded.error_class is ErrorClass.CREDITS:
            return embedded
    if code in (400, 413, 422):
        return AttemptError(ErrorClass.BAD_REQUEST, Disposition.GIVE_UP, message, code)
    if code == 429:
        cls = ErrorClass.RATE_LIMITED
    elif code in (503, 529):
        cls = ErrorClass.OVERLOADED
    return AttemptError(cls, Disposition.RETRY, message, code, parse_retry_after({}, body))
