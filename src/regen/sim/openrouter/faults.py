"""Fault draws and the error bodies each fault class produces (docs/openrouter.md §3.5, §4.4, §6).

The bodies deliberately span the three generations of error metadata OpenRouter has used (old
"Provider returned error" + metadata.raw, typed error_type, availability objects), because a client
must survive all of them.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
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


# (status, body, extra headers) of one HTTP fault, from who served and what the config says.
_Answer = tuple[int, dict[str, Any], dict[str, str]]


@dataclass(frozen=True, slots=True)
class _Context:
    provider_name: str
    model_id: str
    retry_after_s: int
    user_id: str


def http_fault(
    fault: str, *, provider_name: str, model_id: str, retry_after_s: int, user_id: str
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, body, extra headers) of a pre-first-byte HTTP fault."""
    answer = _HTTP_ANSWERS.get(fault)
    if answer is None:
        raise ValueError(f"not an HTTP fault: {fault}")
    return answer(_Context(provider_name, model_id, retry_after_s, user_id))


def _rate_limited(c: _Context) -> _Answer:
    body: dict[str, Any] = {
        "error": {
            "code": 429,
            "message": "Rate limit exceeded",
            "metadata": {
                "error_type": "rate_limit_exceeded",
                "provider_code": "rate_limited",
                "provider_name": c.provider_name,
            },
        }
    }
    return 429, body, {}


def _capacity_exhausted(c: _Context) -> _Answer:
    ra = str(c.retry_after_s)
    body = {
        "error": {
            "message": (f"All providers for {c.model_id} are at capacity. Retry after {ra} seconds."),
            "code": 429,
            "error_type": "rate_limit_exceeded",
            "http_status": 429,
            "availability": {
                "code": "capacity_exhausted",
                "retryable": True,
                "retry_after": c.retry_after_s,
                "requested_models": [c.model_id],
                "affected_providers": [c.provider_name],
                "docs_url": "https://openrouter.ai/docs/errors#capacity_exhausted",
            },
            "metadata": {
                "previous_errors": [
                    {"provider": c.provider_name, "code": "capacity_exhausted", "status": 429}
                ]
            },
        }
    }
    return 429, body, {"Retry-After": ra}


def _rate_limit_reset(c: _Context) -> _Answer:
    reset_ms = str(int((time.time() + c.retry_after_s) * 1000))
    limits = {"X-RateLimit-Limit": "20", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": reset_ms}
    body = {
        "error": {
            "message": "Rate limit exceeded: limit_rpm/20",
            "code": 429,
            "metadata": {"headers": limits, "provider_name": None},
        },
        "user_id": c.user_id,
    }
    return 429, body, dict(limits)


def _internal_error(c: _Context) -> _Answer:
    # 5xx messages are masked and provider_code dropped (§4.4).
    body = {"error": {"code": 500, "message": "Internal Server Error", "metadata": {"error_type": "server"}}}
    return 500, body, {}


def _bad_gateway(c: _Context) -> _Answer:
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
            "metadata": {"raw": raw, "provider_name": c.provider_name, "is_byok": False},
        },
        "user_id": c.user_id,
    }
    return 502, body, {}


def _unavailable(c: _Context) -> _Answer:
    body = {
        "error": {
            "code": 503,
            "message": "Service temporarily unavailable",
            "metadata": {"error_type": "provider_overloaded", "provider_name": c.provider_name},
        }
    }
    return 503, body, {"Retry-After": str(c.retry_after_s)}


def _timed_out(c: _Context) -> _Answer:
    return 408, {"error": {"code": 408, "message": "Operation timed out. Please try again later."}}, {}


def _cloudflare_timeout(c: _Context) -> _Answer:
    return 524, {"error": {"code": 524, "message": "Request timed out. Please try again later."}}, {}


def _overloaded(c: _Context) -> _Answer:
    raw = orjson.dumps(
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    ).decode()
    body = {
        "error": {
            "code": 529,
            "message": "Provider returned error",
            "metadata": {"raw": raw, "provider_name": c.provider_name},
        }
    }
    return 529, body, {}


def _in_flight_exhausted(c: _Context) -> _Answer:
    return 402, refusals.in_flight_exhausted(), {"Retry-After": str(c.retry_after_s)}


_HTTP_ANSWERS: dict[str, Callable[[_Context], _Answer]] = {
    "http_429": _rate_limited,
    "http_429_retry_after": _capacity_exhausted,
    "http_429_ratelimit_reset": _rate_limit_reset,
    "http_500": _internal_error,
    "http_502": _bad_gateway,
    "http_503": _unavailable,
    "http_408": _timed_out,
    "http_524": _cloudflare_timeout,
    "http_529": _overloaded,
    "http_402_in_flight": _in_flight_exhausted,
}


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
