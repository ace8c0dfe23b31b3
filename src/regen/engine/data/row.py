"""The training row: one line of raw_responses.jsonl per finished prompt (docs/data-contract.md §3).

The row is regen's product and the file a resume trusts, so, as the journals' records
(engine/run/records.py), it is described here by code:

- `Row`, a TypedDict naming every key as it is on disk, **in the order regen writes them**, each with
  its meaning and its § in the data contract; `QuarantinedRow` is a row kept apart in the run
  folder's quarantine.jsonl, with why.
- `FIELDS`, that order as a tuple, read off `Row` itself: engine/run/rowfacts.py builds its slicer
  from it, so a field moved here moves there too.
- `new_row`, the one writer: every row regen writes is made by it (engine/job/rows.py `build_row`
  maps an attempt onto it), its keys in `FIELDS` order; the tokenizer stage
  (engine/data/tokenize_pool.py) fills values in, never adds or moves a key.
- `read_row`, the one reader of a parsed row: it checks the fields a reader relies on and hands the
  row on typed, or raises `BadRow` saying what is wrong (the caller adds file:line). Lenient as the
  records' readers are: a row of an older regen may lack a key added since (`gpu_s`, `meta`), and
  `training=True` adds the fields a training file is made of (`regen verify`, `regen export`).

A key on disk is never renamed and never changes its meaning; a row may grow new keys (at the end, so
the slicer's order holds for older and newer rows alike).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict, cast

from regen.engine.data.contract import SCHEMA_VERSION
from regen.engine.data.jsonl import is_money, is_optional
from regen.engine.units import DOLLARS, Unit

__all__ = [
    "FIELDS",
    "BadRow",
    "OutputIdsSource",
    "QuarantinedRow",
    "Row",
    "RowStatus",
    "RowTiming",
    "TokenizerBlock",
    "Usage",
    "new_row",
    "read_row",
    "row_amount",
    "row_attempts",
]

RowStatus = Literal["ok", "truncated"]
# SERVER: the backend sent the server's own ids (SGLang); RETOKENIZED: its text was encoded here
# (docs/data-contract.md §5.2, §5.3); None until the tokenizer stage has run.
OutputIdsSource = Literal["server", "retokenized"]


class Usage(TypedDict, total=False):
    """Token counts as the backend reported them (None where it did not), flattened
    (docs/data-contract.md §3.2 `usage`): OpenRouter's native `usage`, or SGLang's `meta_info`. A
    backend reports all four (engine/backends/base.py `no_usage`); a row of an older regen may hold
    fewer, or none (read as {})."""

    prompt_tokens: int | None
    completion_tokens: int | None
    reasoning_tokens: int | None
    cached_tokens: int | None


class RowTiming(TypedDict):
    """When and how long (docs/data-contract.md §3.2 `timing`)."""

    started_at: str  # the prompt's first attempt, ISO 8601 UTC with milliseconds
    ttft_s: float | None  # the winning attempt's time to first token; None without a stream
    e2e_s: float  # the winning attempt, request to last byte
    attempts: int  # every attempt this prompt took, the winning one included


class TokenizerBlock(TypedDict):
    """The tokenizer and template the ids were made with (engine/data/tokenizer.py `info`)."""

    name: str
    files_sha256: dict[str, str]  # file name -> sha256: what `regen verify` compares rows by (§4.9)
    template_kwargs: dict[str, Any]  # the chat template's switches, `thinking` among them
    add_generation_prompt: bool


class Row(TypedDict):
    """One row, its keys in the order regen writes them (docs/data-contract.md §3.1-3.2)."""

    schema_version: int  # SCHEMA_VERSION (engine/data/contract.py)
    # Identity (§2): `id` is f"{dataset}-{line:08d}"; `line` the prompt's line in prompts.jsonl,
    # 0-based; `prompt_sha256` the hash of its canonical messages; `source_id` the line's own `id`.
    id: str
    dataset: str
    line: int
    prompt_sha256: str
    source_id: str | None
    meta: Any  # the input line's `meta` (§1), as it came; None without one
    status: str  # a RowStatus: ok (finish_reason stop) or truncated (length); read as it stands
    backend: str  # the backend that made it: openrouter or sglang
    model: str  # the model requested (OpenRouter slug, or SGLang's served model name)
    served_model: str | None  # the model that answered, as the answer names it
    provider: str | None  # OpenRouter's serving provider; SGLang's worker, host:port
    generation_id: str | None  # OpenRouter's generation id; SGLang's rid
    finish_reason: str  # normalised: stop or length
    native_finish_reason: Any  # the backend's own, as it came
    reasoning: str  # thinking text, "" when none; never holds a special-token string (§4.8)
    content: str  # answer text, "" when none
    prompt_ids: list[int]  # the rendered generation prompt (§5.1); [] before a tokenizer is set
    output_ids: list[int]  # the target's continuation (§5); [] before a tokenizer is set
    output_ids_source: OutputIdsSource | None
    terminator_appended: bool  # regen added the end-of-turn id itself (§5.2, §5.3)
    num_prompt_tokens: int  # len(prompt_ids)
    num_output_tokens: int  # len(output_ids)
    usage: Usage
    cost: float | None  # US dollars from the bill (docs/money.md); None for a GPU-time row
    cost_estimated: bool  # `cost` is a worst case awaiting the bill (docs/openrouter.md §8)
    is_byok: bool | None  # OpenRouter: the provider was paid with the operator's own key; None elsewhere
    request: dict[str, Any]  # the sampling and length settings sent, and the thinking switch
    server: dict[str, Any]  # the backend's server: kind, endpoint, version, model_digest (§3.2)
    tokenizer: TokenizerBlock | None  # None until the tokenizer stage has run
    flags: list[str]  # quality flags (§4.11): empty_content, degenerate_content, empty_reasoning
    timing: RowTiming
    created_at: str  # when the row was written, ISO 8601 UTC with milliseconds
    # A GPU-time row's amount (SGLang): the attempt's share of its server's GPU time, GPU-seconds
    # (docs/money.md). Absent from dollar rows, and the last key when present.
    gpu_s: NotRequired[float]


class QuarantinedRow(Row):
    """A row kept apart in the run folder's quarantine.jsonl, never a training row (docs/fidelity.md):
    an answer outside the precision allowlist, or one of a route whose rows were taken back."""

    quarantine_reason: str
    requeued: NotRequired[bool]  # taken back after it was written (engine/run/requeue.py)


# The keys in the order they are written; the quarantine's two come after them.
FIELDS: tuple[str, ...] = tuple(Row.__annotations__)


class BadRow(ValueError):
    """A row its reader refuses; `problem` says what is wrong with it (the caller adds file:line)."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


def new_row(
    *,
    id: str,
    dataset: str,
    line: int,
    prompt_sha256: str,
    source_id: str | None,
    meta: Any,
    status: RowStatus,
    backend: str,
    model: str,
    served_model: str | None,
    provider: str | None,
    generation_id: str | None,
    finish_reason: str,
    native_finish_reason: Any,
    reasoning: str,
    content: str,
    prompt_ids: list[int],
    output_ids: list[int],
    output_ids_source: OutputIdsSource | None,
    terminator_appended: bool,
    usage: Usage,
    unit: Unit,
    amount: float,
    cost_estimated: bool,
    is_byok: bool | None,
    request: dict[str, Any],
    server: dict[str, Any],
    flags: list[str],
    timing: RowTiming,
    created_at: str,
) -> Row:
    """The row, keys in `FIELDS` order. `amount` is in the ledger's `unit`: dollars go to `cost`, any
    other unit to its own key at the end with `cost` null (§3.2)."""
    row: Row = {
        "schema_version": SCHEMA_VERSION,
        "id": id,
        "dataset": dataset,
        "line": line,
        "prompt_sha256": prompt_sha256,
        "source_id": source_id,
        "meta": meta,
        "status": status,
        "backend": backend,
        "model": model,
        "served_model": served_model,
        "provider": provider,
        "generation_id": generation_id,
        "finish_reason": finish_reason,
        "native_finish_reason": native_finish_reason,
        "reasoning": reasoning,
        "content": content,
        "prompt_ids": prompt_ids,
        "output_ids": output_ids,
        "output_ids_source": output_ids_source,
        "terminator_appended": terminator_appended,
        "num_prompt_tokens": len(prompt_ids),
        "num_output_tokens": len(output_ids),
        "usage": usage,
        "cost": amount if unit == DOLLARS else None,
        "cost_estimated": cost_estimated,
        "is_byok": is_byok,
        "request": request,
        "server": server,
        "tokenizer": None,
        "flags": flags,
        "timing": timing,
        "created_at": created_at,
    }
    if unit != DOLLARS:
        row["gpu_s"] = amount
    return row


def row_amount(row: Row) -> float | None:
    """The row's amount in its ledger's unit: `cost` for dollars, else `gpu_s` (§3.2)."""
    cost = row["cost"]
    return cost if cost is not None else row.get("gpu_s")


def row_attempts(row: Row) -> int:
    """The attempts the row's prompt took (`timing.attempts`); 1 where a row does not say."""
    timing: object = row.get("timing")
    attempts = timing.get("attempts") if isinstance(timing, dict) else None
    return attempts if type(attempts) is int and attempts > 0 else 1


# -- reading -------------------------------------------------------------------------------------
# Only the fields a reader relies on are checked, so a row may grow new fields without breaking older
# readers; the training fields are the ones a training file is made of.

_TRAINING: dict[str, type | tuple[type, ...]] = {
    "id": str,
    "dataset": str,
    "line": int,
    "prompt_sha256": str,
    "status": str,
    "finish_reason": str,
    "reasoning": str,
    "content": str,
    "prompt_ids": list,
    "output_ids": list,
    "num_prompt_tokens": int,
    "num_output_tokens": int,
}


def _type_names(kind: type | tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in (kind if isinstance(kind, tuple) else (kind,)))


def row_problem(raw: Mapping[str, object]) -> str | None:
    """What is wrong with a row for any reader (a resume, a take-back, a crash's settling), or None:
    its line and prompt digest, and the types of its status, handle, amount, usage and backend."""
    line = raw.get("line")
    if type(line) is not int or line < 0:
        return "not a result row (no line number)"
    if type(raw.get("prompt_sha256")) is not str:
        return "not a result row (no prompt_sha256)"
    if not is_optional(raw.get("status"), str) or not is_optional(raw.get("generation_id"), str):
        return "result row with a malformed status or generation_id"
    for key in ("cost", "gpu_s"):
        if raw.get(key) is not None and not is_money(raw[key]):
            return f"result row whose {key} is not a number"
    usage = raw.get("usage")
    if not is_optional(usage, dict) or (
        isinstance(usage, dict) and usage and not is_optional(usage.get("completion_tokens"), int)
    ):
        return "result row with malformed usage"
    if not is_optional(raw.get("backend"), str):
        return "result row whose backend is not a name"
    return None


def training_problem(raw: Mapping[str, object]) -> str | None:
    """The first field a training row must hold that is missing or of the wrong type (§4), or None."""
    for key, kind in _TRAINING.items():
        value = raw.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"{key} missing or not {_type_names(kind)}"
    return None


def read_row(raw: object, *, training: bool = False) -> Row:
    """A parsed line of raw_responses.jsonl as a `Row`, or `BadRow` saying what is wrong with it.
    `training`: the fields a training file needs are checked too (`regen verify`, `regen export`).
    Keys an older regen did not write stay absent: read them with `.get` (`gpu_s`, `meta`)."""
    if not isinstance(raw, Mapping):
        raise BadRow("not a result row (not a JSON object)")
    problem = (training_problem(raw) if training else None) or row_problem(raw)
    if problem is not None:
        raise BadRow(problem)
    row = cast(Row, raw)
    if row.get("usage") is None:
        row["usage"] = {}  # an older row's: no counts
    return row
