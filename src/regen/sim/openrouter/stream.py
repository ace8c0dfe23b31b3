"""Wire shapes of chat completions: SSE chunks (docs/openrouter.md §4), usage (§3.3, §4.2), bodies (§3).

Chunks are built from a pre-serialised header so each one costs one small orjson call: every
chunk repeats id, provider, model, object and created in the order seen on the wire.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import orjson

from regen.sim.openrouter.catalog import SimEndpoint

KEEPALIVE = b": OPENROUTER PROCESSING\n\n"
DONE = b"data: [DONE]\n\n"


def costs(ep: SimEndpoint, prompt_tokens: int, completion_tokens: int) -> tuple[float, float, float]:
    """(cost, prompt part, completion part) in USD at the serving endpoint's prices; computed in
    decimal from the price strings so the float reported is the nearest to the exact amount."""
    prompt = Decimal(ep.pricing.prompt) * prompt_tokens
    completion = Decimal(ep.pricing.completion) * completion_tokens
    total = prompt + completion + Decimal(ep.pricing.request)
    return float(total), float(prompt), float(completion)


def usage_object(
    prompt_tokens: int,
    completion_tokens: int,
    reasoning_tokens: int,
    cost: float,
    prompt_cost: float,
    completion_cost: float,
    *,
    shape: str,
    byok: bool,
) -> dict[str, Any] | None:
    """Shape A: the current docs (cost, cost_details); B: older, no cost; C: no usage at all."""
    if shape == "C":
        return None
    if shape == "B":
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": reasoning_tokens,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }
    upstream = cost
    if byok:
        # BYOK: `cost` is OpenRouter's fee (0 here); the provider's charge sits upstream.
        upstream = prompt_cost + completion_cost
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "cost": cost,
        "is_byok": byok,
        "prompt_tokens_details": {
            "cached_tokens": 0,
            "cache_write_tokens": 0,
            "audio_tokens": 0,
            "video_tokens": 0,
        },
        "cost_details": {
            "upstream_inference_cost": upstream,
            "upstream_inference_prompt_cost": prompt_cost,
            "upstream_inference_completions_cost": completion_cost,
        },
        "completion_tokens_details": {
            "reasoning_tokens": reasoning_tokens,
            "image_tokens": 0,
            "audio_tokens": 0,
        },
    }


def reasoning_details(text: str) -> list[dict[str, Any]]:
    return [{"type": "reasoning.text", "text": text, "format": "unknown", "index": 0}]


class ChunkBuilder:
    """SSE `data:` events for one generation."""

    __slots__ = ("_prefix",)

    def __init__(self, gen_id: str, provider: str, model: str, created: int) -> None:
        head = orjson.dumps(
            {
                "id": gen_id,
                "provider": provider,
                "model": model,
                "object": "chat.completion.chunk",
                "created": created,
            }
        )
        self._prefix = b"data: " + head[:-1] + b',"choices":'

    def _event(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        tail = b"".join(b',"' + k.encode() + b'":' + orjson.dumps(v) for k, v in extra.items())
        return self._prefix + orjson.dumps(choices) + tail + b"}\n\n"

    @staticmethod
    def _choice(
        delta: dict[str, Any], finish: str | None = None, native: str | None = None
    ) -> dict[str, Any]:
        return {
            "index": 0,
            "delta": delta,
            "finish_reason": finish,
            "native_finish_reason": native,
            "logprobs": None,
        }

    def role(self) -> bytes:
        return self._event([self._choice({"role": "assistant", "content": ""})])

    def content(self, text: str) -> bytes:
        return self._event([self._choice({"role": "assistant", "content": text})])

    def reasoning(self, text: str) -> bytes:
        delta = {
            "role": "assistant",
            "content": "",
            "reasoning": text,
            "reasoning_details": reasoning_details(text),
        }
        return self._event([self._choice(delta)])

    def tool_calls(self, entries: list[dict[str, Any]]) -> bytes:
        """Tool-call deltas carry `content: null`, unlike text deltas (Kimi capture, §4.1)."""
        return self._event([self._choice({"role": "assistant", "content": None, "tool_calls": entries})])

    def finish(self, finish_reason: str | None, native: str | None, **extra: Any) -> bytes:
        return self._event(
            [self._choice({"role": "assistant", "content": ""}, finish_reason, native)], **extra
        )

    def usage_a(self, usage: dict[str, Any], **extra: Any) -> bytes:
        return self._event([], usage=usage, **extra)

    def usage_b(self, usage: dict[str, Any], **extra: Any) -> bytes:
        return self._event([self._choice({"role": "assistant", "content": ""})], usage=usage, **extra)

    def error(self, error: dict[str, Any]) -> bytes:
        """The unified mid-stream error (§4.4): top-level error plus finish_reason "error"."""
        return self._event(
            [
                {
                    "index": 0,
                    "delta": {"content": ""},
                    "finish_reason": "error",
                    "native_finish_reason": "error",
                }
            ],
            error=error,
        )

    def error_in_choice(self, error: dict[str, Any]) -> bytes:
        choice = self._choice({"role": "assistant", "content": ""}, "error", "error")
        choice["error"] = error
        return self._event([choice])

    def error_no_choices(self, error: dict[str, Any]) -> bytes:
        """The 200 SSE with `choices: []` and a top-level error, zero tokens (§4.4 variants)."""
        return self._event([], error=error)
