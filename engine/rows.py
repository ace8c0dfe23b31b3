"""The raw_responses.jsonl row of reference/data-contract.md §3, built from a finished attempt."""

from __future__ import annotations

import functools
import re
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.backends.openrouter.client import AttemptResult
    from engine.datasets import Prompt
    from engine.settings import OpenRouterSettings

SCHEMA_VERSION = 1
# Kimi's known failure: a long run of one character with finish_reason stop (reference §10.3).
_DEGENERATE = re.compile(r"(.)\1{63,}", re.DOTALL)


def requested_thinking(settings: OpenRouterSettings) -> bool:
    """Whether requests ask the model to reason (and return the reasoning)."""
    reasoning = settings.reasoning or {}
    return (
        bool(settings.reasoning) and not reasoning.get("exclude", False) and reasoning.get("effort") != "none"
    )


@functools.lru_cache(maxsize=8)
def _utc_second(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


def utc_iso(ts: float) -> str:
    """2026-09-20T10:11:12.345Z. Rows come thousands a second, so the formatted second is cached."""
    ms = int(ts * 1000)
    return f"{_utc_second(ms // 1000)}.{ms % 1000:03d}Z"


def quality_flags(content: str, reasoning: str) -> list[str]:
    """Flags that data-contract §4.11 asks for: kept, but not trusted blindly."""
    flags = []
    if not content:
        flags.append("empty_content")
    # Cheap first: a degenerate answer is a run of one character from its start, so its head
    # already shows at most two distinct characters; only then scan the whole text.
    if (
        content
        and len(set(content[:128])) <= 2
        and len(set(content.strip())) <= 2
        and _DEGENERATE.search(content)
    ):
        flags.append("degenerate_content")
    if not reasoning:
        flags.append("empty_reasoning")
    return flags


def build_row(
    prompt: Prompt,
    result: AttemptResult,
    status: str,
    settings: OpenRouterSettings,
    *,
    cost: float | None,
    cost_estimated: bool,
    started_at: float,
    attempts: int,
    now: float,
) -> dict[str, Any]:
    usage = result.usage or {}
    details = usage.get("completion_tokens_details") or {}
    prompt_details = usage.get("prompt_tokens_details") or {}
    return {
        "schema_version": SCHEMA_VERSION,
        "id": prompt.id,
        "dataset": prompt.dataset,
        "line": prompt.line,
        "prompt_sha256": prompt.sha256,
        "source_id": prompt.source_id,
        "meta": prompt.meta,
        "status": status,
        "backend": "openrouter",
        "model": settings.model,
        "served_model": result.served_model,
        "provider": result.provider,
        "generation_id": result.generation_id,
        "finish_reason": result.finish_reason,
        "native_finish_reason": result.native_finish_reason,
        "reasoning": result.reasoning,
        "content": result.content,
        # Token ids come from the target model's tokenizer, filled in by the tokenizer stage.
        "prompt_ids": [],
        "output_ids": [],
        "output_ids_source": None,
        "terminator_appended": False,
        "num_prompt_tokens": 0,
        "num_output_tokens": 0,
        "usage": {
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
            "reasoning_tokens": details.get("reasoning_tokens"),
            "cached_tokens": prompt_details.get("cached_tokens"),
        },
        "cost": cost,
        "cost_estimated": cost_estimated,
        "is_byok": result.is_byok,
        "request": {
            "thinking": requested_thinking(settings),
            "max_tokens": settings.max_tokens,
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            "min_p": None,
            "seed": None,
            "stream": settings.stream,
        },
        "server": {"kind": "openrouter", "endpoint": "/api/v1/chat/completions"},
        "tokenizer": None,
        "flags": quality_flags(result.content, result.reasoning),
        "timing": {
            "started_at": utc_iso(started_at),
            "ttft_s": None if result.ttft_s is None else round(result.ttft_s, 4),
            "e2e_s": round(result.e2e_s, 4),
            "attempts": attempts,
        },
        "created_at": utc_iso(now),
    }
