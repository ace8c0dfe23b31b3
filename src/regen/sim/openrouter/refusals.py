"""Bodies and headers of the requests OpenRouter refuses for money or rate (docs/openrouter.md §6.5, §6.6, §7.3).

Kept apart from faults.py: these are not random draws but the modelled outcome of the account's
state (balance, holds, request counts), and the random `http_402_in_flight` fault reuses the same
in-flight body so the two can never drift apart.
"""

from __future__ import annotations

import math
import time
from typing import Any

import orjson

_CREDITS_URL = "https://openrouter.ai/settings/credits"


def in_flight_exhausted() -> dict[str, Any]:
    """402 while the holds of other requests fill the budget; sent with Retry-After (§6.5 item 2)."""
    return {
        "error": {
            "code": 402,
            "message": (
                "This request would exceed your available credits given your current "
                "in-flight requests. Retry after in-flight requests settle, or add credits."
            ),
            "metadata": {
                "reason": "in_flight_budget_exhausted",
                "limit_source": "openrouter_in_flight_budget",
                "remedy_hint": (
                    "Retry after your in-flight requests settle (see the Retry-After header). "
                    f"Adding credits at {_CREDITS_URL} raises your "
                    "in-flight budget, up to a capped ceiling."
                ),
            },
        }
    }


def weight_exceeds_budget(estimate: float, budget: float) -> dict[str, Any]:
    """402 for one request larger than the whole budget: no Retry-After, waiting cannot help.

    The reason and limit_source are documented; the wording of message and hint is inferred.
    """
    return {
        "error": {
            "code": 402,
            "message": (
                f"This request's estimated cost (${estimate:.6f}) exceeds your in-flight spending "
                f"budget (${budget:.6f}). Lower max_tokens or shorten the prompt, or add credits."
            ),
            "metadata": {
                "reason": "weight_exceeds_budget",
                "limit_source": "openrouter_credits",
                "remedy_hint": (
                    "Lower max_tokens or the prompt size. Adding credits at "
                    f"{_CREDITS_URL} raises your in-flight budget, up to a capped ceiling."
                ),
            },
        }
    }


def negative_balance(user_id: str) -> dict[str, Any]:
    """402 once usage has overshot the credits, free models included (§6.5 item 3).

    The message is the spec's generic 402 example; the metadata follows the typed variants.
    """
    return {
        "error": {
            "code": 402,
            "message": "Insufficient credits. Add more using https://openrouter.ai/credits",
            "metadata": {
                "limit_source": "openrouter_credits",
                "remedy_hint": f"Your balance is negative. Add credits at {_CREDITS_URL}.",
            },
        },
        "user_id": user_id,
    }


def free_model_limited(
    which: str, limit: int, reset_ms: int, user_id: str, *, retry_after: bool
) -> tuple[dict[str, Any], dict[str, str]]:
    """429 for a `:free` variant over its per-minute or per-day count (§4.4 aider#3550, §7.3).

    `which` is "min" or "day". The limit headers also ride inside metadata, where some clients
    only look.
    """
    limits = {
        "X-RateLimit-Limit": str(limit),
        "X-RateLimit-Remaining": "0",  # refused: nothing is left in the window
        "X-RateLimit-Reset": str(reset_ms),
    }
    headers = dict(limits)
    if retry_after:
        headers["Retry-After"] = str(seconds_until_ms(reset_ms))
    body = {
        "error": {
            "message": f"Rate limit exceeded: free-models-per-{which}",
            "code": 429,
            "metadata": {"headers": limits, "provider_name": None},
        },
        "user_id": user_id,
    }
    return body, headers


def upstream_rate_limited(provider_name: str, model_id: str, user_id: str) -> dict[str, Any]:
    """429 when every provider tried was out of capacity: the old "Provider returned error" shape
    with the upstream's own message in metadata.raw (§6.2, open-webui/computer#293)."""
    raw = orjson.dumps(
        {"error": {"message": f"Rate limit reached for {model_id}", "type": "rate_limit_error"}}
    ).decode()
    return {
        "error": {
            "message": "Provider returned error",
            "code": 429,
            "metadata": {
                "raw": raw,
                "provider_name": provider_name,
                "error_type": "rate_limit_exceeded",
                "limit_source": "upstream_provider",
            },
        },
        "user_id": user_id,
    }


def seconds_until_ms(epoch_ms: int) -> int:
    """Whole seconds (at least 1) until an epoch-millisecond instant: Retry-After takes integers."""
    return max(1, math.ceil(epoch_ms / 1000 - time.time()))
