"""Training rows for tests, made by regen's own writer (engine/data/row.py `new_row`), so they have the
keys in the order regen writes them; `changes` replace any value (the id follows the dataset and line
unless given)."""

from __future__ import annotations

from typing import Any, cast

from regen.engine.data.row import Row, new_row
from regen.engine.units import DOLLARS, GPU_SECONDS


def a_row(line: int = 0, dataset: str = "A", **changes: Any) -> Row:
    """An OpenRouter row with token ids (long enough to be sliced: engine/run/rowfacts.py), or with
    `backend="sglang"` a GPU-time row (`gpu_s`, cost null)."""
    sglang = changes.get("backend") == "sglang"
    row = new_row(
        id=f"{dataset}-{line:08d}",
        dataset=dataset,
        line=line,
        prompt_sha256=f"{line:064x}",
        source_id=None,
        meta=None,
        status="ok",
        backend="openrouter",
        model="m/x",
        served_model="m/x-1",
        provider="P",
        generation_id=f"gen-{line}",
        finish_reason="stop",
        native_finish_reason="stop",
        reasoning="think",
        content="answer",
        prompt_ids=list(range(100000, 100100)),
        output_ids=list(range(200000, 200300)),
        output_ids_source="server",
        terminator_appended=False,
        usage={"prompt_tokens": 100, "completion_tokens": 300},
        unit=GPU_SECONDS if sglang else DOLLARS,
        amount=1.25 if sglang else 0.0004,
        cost_estimated=False,
        is_byok=False,
        request={"max_tokens": 100},
        server={"kind": "sglang" if sglang else "openrouter"},
        flags=[],
        timing={"started_at": "2026-12-01T10:00:00.000Z", "ttft_s": 0.1, "e2e_s": 1.0, "attempts": 1},
        created_at="2026-12-01T10:00:01.000Z",
    )
    counts = {"num_prompt_tokens": len(changes.get("prompt_ids", row["prompt_ids"]))}
    counts["num_output_tokens"] = len(changes.get("output_ids", row["output_ids"]))
    return cast(Row, {**row, **counts, **changes})


def unfilled_row(line: int = 0, dataset: str = "A", **changes: Any) -> Row:
    """A row as the job writes it before the tokenizer stage: no ids yet (engine/data/tokenize_pool.py
    fills them), so an OpenRouter row is retokenized from its text; a server row brings its
    `output_ids` in `changes`."""
    empty: dict[str, Any] = {"prompt_ids": [], "output_ids": [], "output_ids_source": None}
    return a_row(line, dataset, **{**empty, **changes})
