"""Fault draws and the error bodies each fault class produces (docs/openrouter.md §3.5, §4.4, §6).

The bodies deliberately span the three generations of error metadata OpenRouter has used (old
"Provider returned error" + metadata.raw, typed error_type, availability objects), because a client
must survive all of them.
"""

from __future__ import annotations

import random
import time
from typing import Any

import orjson

from regen.sim.openrouter import refusals
from regen.sim.openrouter.config import ALL_FAULTS


def draw(rates: dict[str, float], rng: random.Random) -> str | None:
    """One draw over the classes' probabilities (checked in their canonical order)."""
    if not rates:
        return None
    u = rng.random()
    acc = 0.0
    for name in ALL_FAULTS:
        p = rates.get(name)
        if p:
            acc += p
            if u < acc:
                return name
    return None


def http_fault(
    fault: str, *, provider_name: str, model_id: str, retry_after_s: int, user_id: str
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, body, extra headers) of a pre-first-byte HTTP fault."""
    headers: dict[str, str] = {}
    ra = str(retry_after_s)
    if fault == "http_429":
        body: dict[str, Any] = {
            "error": {
                "code": 429,
                "message": "Rate limit exceeded",
                "metadata": {
                    "error_type": "rate_limit_exceeded",
                    "provider_code": "rate_limited",
                    "provider_name": provider_name,
                },
            }
        }
        return 429, body, headers
    if fault == "http_429_retry_after":
        headers["Retry-After"] = ra
        body = {
            "error": {
                "message": (f"All providers for {model_id} are at capacity. Retry after {ra} seconds."),
                "code": 429,
                "error_type": "rate_limit_exceeded",
                "http_status": 429,
                "availability": {
                    "code": "capacity_exhausted",
                    "retryable": True,
                    "retry_after": retry_after_s,
                    "requested_models": [model_id],
                    "affected_providers": [provider_name],
                    "docs_url": "https://openrouter.ai/docs/errors#capacity_exhausted",
                },
                "metadata": {
                    "previous_errors": [
                        {"provider": provider_name, "code": "capacity_exhausted", "status": 429}
                    ]
                },
            }
        }
        return 429, body, headers
    if fault == "http_429_ratelimit_reset":
        reset_ms = str(int((time.time() + retry_after_s) * 1000))
        limits = {"X-RateLimit-Limit": "20", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": reset_ms}
        headers.update(limits)
        body = {
            "error": {
                "message": "Rate limit exceeded: limit_rpm/20",
                "code": 429,
                "metadata": {"headers": limits, "provider_name": None},
            },
            "user_id": user_id,
        }
        return 429, body, headers
    if fault == "http_500":
        # 5xx messages are masked and provider_code dropped (§4.4).
        return (
            500,
            {
                "error": {
                    "code": 500,
                    "message": "Internal Server Error",
                    "metadata": {"error_type": "server"},
                }
            },
            headers,
        )
    if fault == "http_502":
        raw = orjson.dumps(
            {
                "error": {
                    "message": "upstream connect error or disconnect/reset before headers",
                    "type": "server_error",
                    "code": 502,
                }
            }
        ).decode()
        body = {
            "error": {
                "message": "Provider returned error",
                "code": 502,
                "metadata": {"raw": raw, "provider_name": provider_name, "is_byok": False},
            },
            "user_id": user_id,
        }
        return 502, body, headers
    if fault == "http_503":
        headers["Retry-After"] = ra
        return (
            503,
            {
                "error": {
                    "code": 503,
                    "message": "Service temporarily unavailable",
                    "metadata": {"error_type": "provider_overloaded", "provider_name": provider_name},
                }
            },
            headers,
        )
    if fault == "http_408":
        return (
            408,
            {"error": {"code": 408, "message": "Operation timed out. Please try again later."}},
            headers,
        )
    if fault == "http_524":
        return 524, {"error": {"code": 524, "message": "Request timed out. Please try again later."}}, headers
    if fault == "http_529":
        raw = orjson.dumps(
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        ).decode()
        return (
            529,
            {
                "error": {
                    "code": 529,
                    "message": "Provider returned error",
                    "metadata": {"raw": raw, "provider_name": provider_name},
                }
            },
            headers,
        )
    if fault == "http_402_in_flight":
        headers["Retry-After"] = ra
        return 402, refusals.in_flight_exhausted(), headers
    raise ValueError(f"not an HTTP fault: {fault}")


def error_body_200(provider_name: str, user_id: str) -> dict[str, Any]:
    """HTTP 200 whose body is only an error: no `choices` at all (§3.5, litellm#8448)."""
    return {
        "error": {
            "message": "Provider returned error",
            "code": 429,
            "metadata": {"raw": "error code: 1015", "provider_name": provider_name},
        },
        "user_id": user_id,
    }


def provider_disconnected() -> dict[str, Any]:
    """The error carried by finish_reason "error" (embedded and mid-stream forms)."""
    return {
        "code": 502,
        "message": "Provider disconnected mid-stream",
        "metadata": {"error_type": "provider_unavailable"},
    }
