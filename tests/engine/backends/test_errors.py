"""Error classification: every shape of docs/openrouter.md §6 lands in the right class."""

from __future__ import annotations

import time

import pytest

from regen.engine.backends.base import Disposition
from regen.engine.backends.openrouter.errors import (
    ErrorClass,
    classify_error_in_ok_response,
    classify_status,
    parse_retry_after,
)


@pytest.mark.parametrize(
    ("status", "body", "cls", "disposition"),
    [
        (
            429,
            {"error": {"code": 429, "message": "Rate limit exceeded"}},
            ErrorClass.RATE_LIMITED,
            Disposition.RETRY,
        ),
        (
            503,
            {"error": {"code": 503, "message": "Service temporarily unavailable"}},
            ErrorClass.OVERLOADED,
            Disposition.RETRY,
        ),
        (
            529,
            {"error": {"code": 529, "message": "Provider returned error"}},
            ErrorClass.OVERLOADED,
            Disposition.RETRY,
        ),
        (
            502,
            {"error": {"code": 502, "message": "Provider returned error"}},
            ErrorClass.SERVER,
            Disposition.RETRY,
        ),
        (500, None, ErrorClass.SERVER, Disposition.RETRY),
        (
            408,
            {"error": {"code": 408, "message": "Operation timed out."}},
            ErrorClass.SERVER,
            Disposition.RETRY,
        ),
        (
            524,
            {"error": {"code": 524, "message": "Request timed out."}},
            ErrorClass.SERVER,
            Disposition.RETRY,
        ),
        (
            400,
            {"error": {"code": 400, "message": "Invalid request parameters"}},
            ErrorClass.BAD_REQUEST,
            Disposition.GIVE_UP,
        ),
        (
            401,
            {"error": {"code": 401, "message": "No auth credentials found"}},
            ErrorClass.AUTH,
            Disposition.FATAL,
        ),
        (
            403,
            {"error": {"code": 403, "message": "Workspace budget exceeded"}},
            ErrorClass.AUTH,
            Disposition.FATAL,
        ),
        (
            404,
            {"error": {"code": 404, "message": "No endpoints found matching your data policy"}},
            ErrorClass.NO_ENDPOINTS,
            Disposition.FATAL,
        ),
        (
            402,
            {"error": {"code": 402, "message": "This request requires more credits, or fewer max_tokens."}},
            ErrorClass.CREDITS,
            Disposition.FATAL,
        ),
    ],
)
def test_status_classes(status: int, body: object, cls: ErrorClass, disposition: Disposition) -> None:
    error = classify_status(status, body, {})
    assert (error.error_class, error.disposition) == (cls, disposition)


def test_in_flight_budget_402_is_retried_only_with_retry_after() -> None:
    body = {
        "error": {
            "code": 402,
            "message": "would exceed",
            "metadata": {
                "reason": "in_flight_budget_exhausted",
                "limit_source": "openrouter_in_flight_budget",
            },
        }
    }
    retried = classify_status(402, body, {"Retry-After": "3"})
    assert retried.error_class is ErrorClass.IN_FLIGHT_BUDGET and retried.disposition is Disposition.RETRY
    assert retried.retry_after_s == 3.0
    assert classify_status(402, body, {}).disposition is Disposition.FATAL


def test_availability_retryable_wins() -> None:
    body = {
        "error": {
            "message": "transient",
            "availability": {"code": "no_endpoints", "retryable": True, "retry_after": 7},
        }
    }
    error = classify_status(404, body, {})
    assert error.disposition is Disposition.RETRY and error.retry_after_s == 7.0


def test_provider_returned_error_shows_the_upstream_cause() -> None:
    body = {
        "error": {
            "code": 502,
            "message": "Provider returned error",
            "metadata": {"raw": '{"error":"upstream exploded"}', "provider_name": "Crucible"},
        }
    }
    assert "Crucible" in classify_status(502, body, {}).message
    assert "upstream exploded" in classify_status(502, body, {}).message


def test_retry_hints() -> None:
    assert parse_retry_after({"Retry-After": "12"}) == 12.0
    assert parse_retry_after({"retry-after-ms": "1500"}) == 1.5
    reset_ms = (time.time() + 30) * 1000
    assert 28 < (parse_retry_after({"X-RateLimit-Reset": str(reset_ms)}) or 0) <= 30
    body = {"error": {"metadata": {"headers": {"X-RateLimit-Reset": str(reset_ms)}}}}
    assert 28 < (parse_retry_after({}, body) or 0) <= 30
    date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 60))
    assert 55 < (parse_retry_after({"Retry-After": date}) or 0) <= 61
    assert parse_retry_after({}) is None


def test_errors_inside_200() -> None:
    top = {
        "error": {"message": "Provider returned error", "code": 429, "metadata": {"raw": "error code: 1015"}}
    }
    assert classify_error_in_ok_response(top, streamed=False).error_class is ErrorClass.RATE_LIMITED
    chunk = {"error": {"code": "server_error", "message": "boom", "metadata": {"error_type": "server"}}}
    error = classify_error_in_ok_response(chunk, streamed=True)
    assert error.error_class is ErrorClass.STREAM_ERROR and error.disposition is Disposition.RETRY
    assert (
        classify_error_in_ok_response({"error": {"code": 401, "message": "x"}}, streamed=True).disposition
        is Disposition.FATAL
    )


def test_weight_exceeds_budget_gives_up_the_prompt_without_stopping_the_job() -> None:
    body = {
        "error": {
            "code": 402,
            "message": "Request weight exceeds the in-flight budget",
            "metadata": {"reason": "weight_exceeds_budget", "limit_source": "openrouter_credits"},
        }
    }
    error = classify_status(402, body, {})
    assert (error.error_class, error.disposition) == (ErrorClass.TOO_COSTLY, Disposition.GIVE_UP)


def test_platform_429s_are_told_apart_from_upstream_ones() -> None:
    reset = str(int((time.time() + 30) * 1000))
    in_headers = classify_status(
        429, {"error": {"code": 429, "message": "Rate limit exceeded"}}, {"X-RateLimit-Reset": reset}
    )
    free_day = {
        "error": {
            "code": 429,
            "message": "Rate limit exceeded: free-models-per-day",
            "metadata": {"headers": {"X-RateLimit-Reset": reset}, "provider_name": None},
        }
    }
    in_body = classify_status(429, free_day, {})
    by_message = classify_status(
        429, {"error": {"code": 429, "message": "Rate limit exceeded: free-models-per-min"}}, {}
    )
    upstream = classify_status(
        429,
        {
            "error": {
                "code": 429,
                "message": "Provider returned error",
                "metadata": {"raw": "error code: 1015", "provider_name": "Kluster"},
            }
        },
        {"Retry-After": "3"},
    )
    assert in_headers.platform_limit and in_body.platform_limit and by_message.platform_limit
    assert 25 < (in_body.retry_after_s or 0) <= 30
    assert not upstream.platform_limit and upstream.provider == "Kluster" and upstream.retry_after_s == 3
