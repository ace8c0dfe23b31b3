"""What a resume reads from rows (engine/run/rowfacts.py, engine/run/recovery.py read_rows) and the
done lines' bitmap (engine/run/lineset.py): the same facts as a whole parse, whatever the row holds."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from random import Random
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regen.engine.data.datasets import Dataset
from regen.engine.data.row import FIELDS, Row, read_row
from regen.engine.data.scan import scan
from regen.engine.run.inputs import check_rows_match
from regen.engine.run.lineset import LineSet
from regen.engine.run.recovery import read_rows
from regen.engine.run.rowfacts import SLICE_FROM, WANTED, row_facts
from regen.engine.run.state import JobError
from tests.support.rows import a_row


def raw(row: Mapping[str, Any]) -> bytes:
    return orjson.dumps(row) + b"\n"


def facts_of(line: bytes) -> dict[str, Any]:
    """What the whole parse and the row's reader give for the facts."""
    row = read_row(orjson.loads(line))
    return {key: row.get(key) for key in WANTED}


@pytest.mark.parametrize(
    "changes",
    [
        {},
        # Keys named like the ones read, nested where a search by key would find them first.
        {"meta": {"status": "x", "line": 9, "backend": "y", "usage": {"cost": 1}, "reasoning": "r"}},
        {"source_id": 'a","status":"bad', "meta": [{"meta": None}]},
        {"content": '","usage":{"completion_tokens":999},"cost":5,"cost_estimated":', "reasoning": 'x\\"y'},
        {"usage": {"prompt_tokens": 1, "completion_tokens": 7, "cost": 0.5, "details": {"cost": 2}}},
        {"usage": None, "cost": None, "status": "truncated", "backend": "sglang"},
        {"cost": 1.5e-05},
        {"backend": "sglang", "native_finish_reason": {"type": "length", "nested": {"usage": {"cost": 2}}}},
    ],
    ids=[
        "plain",
        "meta-with-the-keys",
        "escaped-source",
        "text-with-the-keys",
        "nested-usage",
        "nulls",
        "exp",
        "sglang-nested-finish",
    ],
)
def test_a_sliced_row_gives_what_the_whole_parse_gives(changes: dict[str, Any]) -> None:
    line = raw(a_row(7, **changes))
    assert len(line) >= SLICE_FROM
    facts = row_facts(line)
    assert facts is not None and facts == facts_of(line)


@pytest.mark.parametrize(
    "line",
    [
        b'{"line": 3, "prompt_sha256": "x"}\n',  # hand-written: another key order
        raw(a_row(1))[:-2] + b"\n",  # not closed
        raw(a_row(1)).replace(b'"reasoning":"think"', b'"reasoning":"th\x00\x00"'),  # a power loss's zeros
        raw(a_row(1)).replace(b'"line":1', b'"line":1.5'),
    ],
    ids=["other-order", "unclosed", "nul-bytes", "float-line"],
)
def test_a_row_not_in_regens_shape_is_left_to_the_whole_parse(line: bytes) -> None:
    assert row_facts(line) is None


def test_a_results_file_reads_the_same_sliced_or_whole(tmp_path: Path) -> None:
    rows = [a_row(line, status="truncated" if line % 3 == 0 else "ok") for line in range(50)]
    rows.append(a_row(4))  # a duplicate
    rows.append(
        a_row(60, backend="sglang", meta={"k": [1, {"status": "no"}]}, usage={"completion_tokens": 5})
    )
    long_path, short_path = tmp_path / "long.jsonl", tmp_path / "short.jsonl"
    long_path.write_bytes(b"".join(raw(row) for row in rows))
    # The same facts in rows short enough to be parsed whole.
    short_path.write_bytes(b"".join(raw({**row, "prompt_ids": [], "output_ids": []}) for row in rows))
    sliced, whole = read_rows(long_path, {60}), read_rows(short_path, {60})
    assert sliced.done == whole.done == LineSet([*range(50), 60])
    for got in (sliced, whole):
        assert (got.ok, got.truncated, got.duplicates, got.output_tokens) == (34, 17, 1, 50 * 300 + 5)
        assert got.backend_rows == {"openrouter": 50, "sglang": 1}
        assert got.settling[60]["usage"]["completion_tokens"] == 5
        assert got.settling[60]["generation_id"] == "gen-60"
    assert sliced.lines == whole.lines == 52 and sliced.offset == long_path.stat().st_size


def test_rows_are_checked_against_the_prompts_as_they_are_read(tmp_path: Path) -> None:
    folder = tmp_path / "A"
    folder.mkdir()
    prompts = [orjson.dumps({"messages": [{"role": "user", "content": f"q{n}"}]}) for n in range(5)]
    (folder / "prompts.jsonl").write_bytes(b"\n".join([*prompts, b"not json"]) + b"\n")
    dataset = Dataset("A", folder)
    report = scan(dataset, keep_digests=True)
    from regen.engine.data.validate import validate_line

    shas = [validate_line(p, "A", n).sha256 for n, p in enumerate(prompts)]  # type: ignore[union-attr]
    dataset.results_path.write_bytes(b"".join(raw(a_row(n, prompt_sha256=shas[n])) for n in range(5)))
    check_rows_match(dataset, read_rows(dataset.results_path, prompts=report))  # all match

    with dataset.results_path.open("ab") as f:
        f.write(raw(a_row(5, prompt_sha256=shas[0])) + raw(a_row(9, prompt_sha256=shas[0])))
    with pytest.raises(JobError, match=r"2 rows name lines that are not valid prompts .* \(first: line 6\)"):
        check_rows_match(dataset, read_rows(dataset.results_path, prompts=report))

    dataset.results_path.write_bytes(raw(a_row(2, prompt_sha256=shas[3])))
    with pytest.raises(JobError, match=r"prompts.jsonl:3: prompt changed since its row was written"):
        check_rows_match(dataset, read_rows(dataset.results_path, prompts=report))


def test_a_line_set_holds_lines_as_bits() -> None:
    lines = LineSet([0, 7, 8, 1_000_000])
    assert not lines.add(7) and lines.add(9)
    assert len(lines) == 5 and list(lines) == [0, 7, 8, 9, 1_000_000]
    assert 1_000_000 in lines and 999_999 not in lines and -1 not in lines and "7" not in lines
    assert len(lines.to_bytes()) == 1_000_000 // 8 + 1
    copy = lines.copy()
    copy.add(3)
    assert 3 not in lines and LineSet.from_bytes(lines.to_bytes()) == lines != copy
    assert not LineSet() and LineSet.from_bytes(b"") == LineSet()


# -- hypothesis: whatever a row holds, the slice is the whole parse ---------------------------------

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from([*FIELDS, "x"]), inner, max_size=4)
    ),
    max_leaves=12,
)
# Text that looks like the row's own keys and their JSON, so a slicer that searched naively would cut there.
_tricky = st.lists(
    st.sampled_from(
        [*(f'"{key}":' for key in FIELDS), '","', "{", "}", "[", "]", "\\", '"', "null", "é", "😀"]
    )
    | st.text(max_size=8),
    max_size=12,
).map("".join)
_usage = st.fixed_dictionaries(
    {},
    optional={
        "prompt_tokens": st.none() | st.integers(0, 10**6),
        "completion_tokens": st.none() | st.integers(0, 10**6),
        "reasoning_tokens": st.none() | st.integers(0, 10**6),
        "cached_tokens": st.none() | st.integers(0, 10**6),
        "cost": _json,
    },
)


@st.composite
def _rows(draw: st.DrawFn) -> Row:
    sglang = draw(st.booleans())
    changes: dict[str, Any] = {
        "backend": "sglang" if sglang else "openrouter",
        "status": draw(st.sampled_from(["ok", "truncated"])),
        "source_id": draw(st.none() | _tricky),
        "meta": draw(_json),
        "native_finish_reason": draw(_json),
        "reasoning": draw(_tricky),
        "content": draw(_tricky),
        "usage": draw(_usage),
        "generation_id": draw(st.none() | _tricky),
        "prompt_sha256": draw(_tricky),
    }
    if sglang:
        changes["cost"] = None
    else:
        changes["cost"] = draw(st.none() | st.floats(0, 10, allow_nan=False) | st.integers(0, 3))
    return a_row(draw(st.integers(0, 10**9)), **changes)


@settings(max_examples=150, deadline=None)
@given(_rows())
def test_any_row_regen_writes_is_sliced_to_what_the_whole_parse_gives(row: Row) -> None:
    line = raw(row)
    assert len(line) >= SLICE_FROM
    facts = row_facts(line)
    assert facts is not None, "a row in regen's shape is never left to the whole parse"
    assert facts == facts_of(line)


@settings(max_examples=100, deadline=None)
@given(_rows(), st.randoms(use_true_random=False))
def test_a_row_in_another_key_order_is_never_read_wrong(row: Row, rng: Random) -> None:
    keys = list(row)
    rng.shuffle(keys)
    line = raw({key: row[key] for key in keys})  # type: ignore[literal-required]
    facts = row_facts(line)
    assert facts is None or facts == facts_of(line)


def test_the_slicer_follows_the_rows_key_order() -> None:
    """Two wanted keys swapped in a row: the slicer, made from FIELDS, no longer recognises it."""
    row = a_row(3)
    keys = list(FIELDS[: FIELDS.index("cost") + 1])
    for first, second in [("line", "prompt_sha256"), ("status", "backend"), ("usage", "cost")]:
        swapped = keys.copy()
        i, j = swapped.index(first), swapped.index(second)
        swapped[i], swapped[j] = swapped[j], swapped[i]
        order = [*swapped, *(key for key in row if key not in swapped)]
        line = raw({key: row[key] for key in order})  # type: ignore[literal-required]
        assert row_facts(line) is None, f"{first} and {second} swapped"
        assert facts_of(line) == facts_of(raw(row))
