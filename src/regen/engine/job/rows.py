"""The raw_responses.jsonl row of docs/data-contract.md §3, built from a finished attempt."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from regen.engine.data.contract import SCHEMA_VERSION, quality_flags, utc_iso

if TYPE_CHECKING:
    from regen.engine.backends.base import AttemptOutcome, Backend
    from regen.engine.data.datasets import Prompt


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
