"""The raw_responses.jsonl row of docs/data-contract.md §3, built from a finished attempt: what the
attempt and its backend say, mapped onto the row's one writer (engine/data/row.py `new_row`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from regen.engine.data.contract import quality_flags, utc_iso
from regen.engine.data.row import Row, RowStatus, new_row

if TYPE_CHECKING:
    from regen.engine.backends.base import AttemptOutcome, Backend
    from regen.engine.data.datasets import Prompt


def build_row(
    prompt: Prompt,
    outcome: AttemptOutcome,
    status: RowStatus,
    backend: Backend,
    *,
    cost: float,
    cost_estimated: bool,
    started_at: float,
    attempts: int,
    now: float,
) -> Row:
    """`cost` is in the backend's unit (`Backend.unit`): dollars, or the attempt's GPU-seconds."""
    server_ids = outcome.output_ids is not None
    prompt_ids = outcome.prompt_ids if server_ids and outcome.prompt_ids is not None else []
    return new_row(
        id=prompt.id,
        dataset=prompt.dataset,
        line=prompt.line,
        prompt_sha256=prompt.sha256,
        source_id=prompt.source_id,
        meta=prompt.meta,
        status=status,
        backend=backend.name,
        model=backend.model,
        served_model=outcome.served_model,
        provider=outcome.route,
        generation_id=outcome.handle,
        finish_reason=str(outcome.finish_reason),
        native_finish_reason=outcome.native_finish_reason,
        reasoning=outcome.reasoning,
        content=outcome.content,
        # Without the server's own ids, the tokenizer stage fills these from the target's tokenizer.
        prompt_ids=prompt_ids,
        output_ids=outcome.output_ids if outcome.output_ids is not None else [],
        output_ids_source="server" if server_ids else None,
        terminator_appended=outcome.terminator_appended,
        usage=outcome.usage.copy(),
        unit=backend.unit,
        amount=cost,
        cost_estimated=cost_estimated,
        is_byok=outcome.is_byok,
        request=backend.row_request(),
        server=backend.row_server(),
        flags=quality_flags(outcome.content, outcome.reasoning),
        timing={
            "started_at": utc_iso(started_at),
            "ttft_s": None if outcome.ttft_s is None else round(outcome.ttft_s, 4),
            "e2e_s": round(outcome.e2e_s, 4),
            "attempts": attempts,
        },
        created_at=utc_iso(now),
    )
