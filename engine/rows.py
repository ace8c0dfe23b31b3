"""The raw_responses.jsonl row of docs/data-contract.md §3, built from a finished attempt."""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.backends.base import AttemptOutcome, Backend
    from engine.datasets import Prompt

SCHEMA_VERSION = 1


@functools.lru_cache(maxsize=8)
def _utc_second(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


def utc_iso(ts: float) -> str:
    """2026-09-20T10:11:12.345Z. Rows come thousands a second, so the formatted second is cached."""
    ms = int(ts * 1000)
    return f"{_utc_second(ms // 1000)}.{ms % 1000:03d}Z"


def is_degenerate(content: str) -> bool:
    """Content made of one repeated character: Kimi's `!!!!` failure (docs/data-contract.md §4)."""
    stripped = content.strip()
    # str.count runs in C; a set of every character of a long answer does not.
    return len(stripped) > 1 and stripped.count(stripped[0]) == len(stripped)


def quality_flags(content: str, reasoning: str) -> list[str]:
    """Flags that docs/data-contract.md §4 asks for: kept, but not trusted blindly."""
    flags = []
    if not content:
        flags.append("empty_content")
    elif is_degenerate(content):
        flags.append("degenerate_content")
    if not reasoning:
        flags.append("empty_reasoning")
    return flags


def build_row(
    prompt: Prompt,
    outcome: AttemptOutcome,
    status: str,
    backend: Backend,
    *,
    cost: float | None,
    cost_estimated: bool,
    started_at: float,
    attempts: int,
    now: float,
) -> dict[str, Any]:
    server_ids = outcome.output_ids is not None
    prompt_ids = outcome.prompt_ids if server_ids and outcome.prompt_ids is not None else []
    output_ids = outcome.output_ids if outcome.output_ids is not None else []
    # `cost` is US dollars (docs/data-contract.md §3.2); a GPU-time ledger's amount has its own key.
    dollars = backend.unit == "usd"
    row = {
        "schema_version": SCHEMA_VERSION,
        "id": prompt.id,
        "dataset": prompt.dataset,
        "line": prompt.line,
        "prompt_sha256": prompt.sha256,
        "source_id": prompt.source_id,
        "meta": prompt.meta,
        "status": status,
        "backend": backend.name,
        "model": backend.model,
        "served_model": outcome.served_model,
        "provider": outcome.route,
        "generation_id": outcome.handle,
        "finish_reason": outcome.finish_reason,
        "native_finish_reason": outcome.native_finish_reason,
        "reasoning": outcome.reasoning,
        "content": outcome.content,
        # Without the server's own ids, the tokenizer stage fills these from the target's tokenizer.
        "prompt_ids": prompt_ids,
        "output_ids": output_ids,
        "output_ids_source": "server" if server_ids else None,
        "terminator_appended": outcome.terminator_appended,
        "num_prompt_tokens": len(prompt_ids),
        "num_output_tokens": len(output_ids),
        "usage": dict(outcome.usage),
        "cost": cost if dollars else None,
        "cost_estimated": cost_estimated,
        "is_byok": outcome.is_byok,
        "request": backend.row_request(),
        "server": backend.row_server(),
        "tokenizer": None,
        "flags": quality_flags(outcome.content, outcome.reasoning),
        "timing": {
            "started_at": utc_iso(started_at),
            "ttft_s": None if outcome.ttft_s is None else round(outcome.ttft_s, 4),
            "e2e_s": round(outcome.e2e_s, 4),
            "attempts": attempts,
        },
        "created_at": utc_iso(now),
    }
    if not dollars:
        row[backend.unit] = cost  # "gpu_s": the attempt's share of its server's GPU time
    return row
