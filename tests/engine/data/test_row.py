"""The training row (engine/data/row.py): its one writer makes the bytes regen has always written, in
the order `Row` declares; its one reader refuses what no reader can use and reads older rows."""

from __future__ import annotations

from typing import Any, get_type_hints

import orjson
import pytest

from regen.engine.backends.base import AttemptOutcome
from regen.engine.data.datasets import Prompt
from regen.engine.data.row import FIELDS, BadRow, QuarantinedRow, Row, read_row, row_amount
from regen.engine.job.rows import build_row
from regen.engine.units import DOLLARS, GPU_SECONDS, Unit
from tests.support.rows import a_row

# What build_row wrote before the row was typed (the same attempt, both backends): the format on disk
# does not move.
BEFORE = {
    "openrouter": b'{"schema_version":1,"id":"B3-00001234","dataset":"B3","line":1234,"prompt_sha256":"'
    + b"9f" * 32
    + b'","source_id":"src-7","meta":{"k":[1,2]},"status":"ok","backend":"openrouter","model":"m/x",'
    b'"served_model":"m/x-0127","provider":"Moonshot AI","generation_id":"gen-1","finish_reason":"stop",'
    b'"native_finish_reason":"stop","reasoning":"why","content":"answer","prompt_ids":[],"output_ids":[],'
    b'"output_ids_source":null,"terminator_appended":false,"num_prompt_tokens":0,"num_output_tokens":0,'
    b'"usage":{"prompt_tokens":10,"completion_tokens":20,"reasoning_tokens":5,"cached_tokens":0},'
    b'"cost":0.00419025,"cost_estimated":false,"is_byok":false,"request":{"max_tokens":64,"thinking":true},'
    b'"server":{"kind":"openrouter"},"tokenizer":null,"flags":[],"timing":{"started_at":'
    b'"2026-09-21T14:13:20.500Z","ttft_s":0.1235,"e2e_s":1.2346,"attempts":2},'
    b'"created_at":"2026-09-21T14:14:01.250Z"}',
    "sglang": b'{"schema_version":1,"id":"B3-00001234","dataset":"B3","line":1234,"prompt_sha256":"'
    + b"9f" * 32
    + b'","source_id":"src-7","meta":{"k":[1,2]},"status":"ok","backend":"sglang","model":"m/x",'
    b'"served_model":"m/x-0127","provider":"10.0.0.1:30000","generation_id":"gen-1","finish_reason":"stop",'
    b'"native_finish_reason":{"type":"stop"},"reasoning":"why","content":"answer","prompt_ids":[1,2,3],'
    b'"output_ids":[4,5],"output_ids_source":"server","terminator_appended":true,"num_prompt_tokens":3,'
    b'"num_output_tokens":2,"usage":{"prompt_tokens":10,"completion_tokens":20,"reasoning_tokens":5,'
    b'"cached_tokens":0},"cost":null,"cost_estimated":false,"is_byok":null,"request":{"max_tokens":64,'
    b'"thinking":true},"server":{"kind":"sglang"},"tokenizer":null,"flags":[],"timing":{"started_at":'
    b'"2026-09-21T14:13:20.500Z","ttft_s":0.1235,"e2e_s":1.2346,"attempts":2},'
    b'"created_at":"2026-09-21T14:14:01.250Z","gpu_s":0.00419025}',
}


class _Backend:
    """What build_row reads of a backend."""

    model = "m/x"

    def __init__(self, name: str, unit: Unit) -> None:
        self.name, self.unit = name, unit

    def row_request(self) -> dict[str, Any]:
        return {"max_tokens": 64, "thinking": True}

    def row_server(self) -> dict[str, Any]:
        return {"kind": self.name}


def _built(backend: str) -> Row:
    sglang = backend == "sglang"
    prompt = Prompt(
        "B3", 1234, "9f" * 32, [{"role": "user", "content": "hi"}], source_id="src-7", meta={"k": [1, 2]}
    )
    outcome = AttemptOutcome(
        route="10.0.0.1:30000" if sglang else "Moonshot AI",
        handle="gen-1",
        served_model="m/x-0127",
        finish_reason="stop",
        native_finish_reason={"type": "stop"} if sglang else "stop",
        content="answer",
        reasoning="why",
        prompt_ids=[1, 2, 3] if sglang else None,
        output_ids=[4, 5] if sglang else None,
        terminator_appended=sglang,
        usage={"prompt_tokens": 10, "completion_tokens": 20, "reasoning_tokens": 5, "cached_tokens": 0},
        is_byok=None if sglang else False,
        e2e_s=1.23456,
        ttft_s=0.123456,
    )
    return build_row(
        prompt,
        outcome,
        "ok",
        _Backend(backend, GPU_SECONDS if sglang else DOLLARS),  # type: ignore[arg-type]
        cost=0.00419025,
        cost_estimated=False,
        started_at=1790000000.5,
        attempts=2,
        now=1790000041.25,
    )


@pytest.mark.parametrize("backend", ["openrouter", "sglang"])
def test_a_row_is_the_bytes_it_was_before_it_was_typed(backend: str) -> None:
    row = _built(backend)
    assert orjson.dumps(row) == BEFORE[backend]
    assert tuple(row) == (FIELDS if backend == "sglang" else FIELDS[:-1])  # `gpu_s` last, for GPU time
    assert row_amount(row) == 0.00419025


def test_the_order_is_the_types_and_a_quarantined_row_adds_its_keys_after_it() -> None:
    assert tuple(get_type_hints(Row)) == FIELDS and FIELDS[-1] == "gpu_s"
    assert tuple(get_type_hints(QuarantinedRow))[len(FIELDS) :] == ("quarantine_reason", "requeued")


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"line": -1}, "no line number"),
        ({"line": True}, "no line number"),
        ({"prompt_sha256": None}, "no prompt_sha256"),
        ({"status": 3}, "malformed status or generation_id"),
        ({"generation_id": ["x"]}, "malformed status or generation_id"),
        ({"cost": "a lot"}, "cost is not a number"),
        ({"backend": "sglang", "gpu_s": float("inf")}, "gpu_s is not a number"),
        ({"usage": [1]}, "malformed usage"),
        ({"usage": {"completion_tokens": "7"}}, "malformed usage"),
        ({"backend": 7}, "backend is not a name"),
    ],
)
def test_the_reader_refuses_what_no_reader_can_use(changes: dict[str, Any], problem: str) -> None:
    with pytest.raises(BadRow, match=problem):
        read_row({**a_row(3), **changes})


def test_the_reader_reads_an_older_row_and_the_training_fields_on_demand() -> None:
    older: dict[str, Any] = {"line": 4, "prompt_sha256": "ab", "status": "ok", "usage": None, "cost": 0.5}
    row = read_row(older)
    assert row["usage"] == {} and row.get("backend") is None and row_amount(row) == 0.5
    with pytest.raises(BadRow, match="id missing or not str"):
        read_row(older, training=True)
    with pytest.raises(BadRow, match="not a JSON object"):
        read_row([older])
    whole = a_row(4)
    assert read_row(orjson.loads(orjson.dumps(whole)), training=True) == whole
    with pytest.raises(BadRow, match="num_output_tokens missing or not int"):
        read_row({**whole, "num_output_tokens": False}, training=True)
