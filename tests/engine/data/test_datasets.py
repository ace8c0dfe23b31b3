"""Datasets: discovery, every validation rule, canonical hashing, streaming scans, demo data."""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

import regen.engine.data.lines as lines_mod
import regen.engine.data.scan as scan_mod
import regen.engine.data.validate as validate_mod
from regen.demo import make_datasets
from regen.engine.data.datasets import Dataset, DatasetError, Prompt, canonical_sha256, discover
from regen.engine.data.scan import InvalidLine, iter_prompts, scan
from regen.engine.data.validate import reason_kind, validate_line

DEMO = Path(make_datasets.__file__).resolve().parent / "datasets"


def _reference_sha256(messages: Any) -> str:
    # docs/data-contract.md §2, spelled out independently of the module under test.
    return hashlib.sha256(
        json.dumps(messages, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")
    ).hexdigest()


def _make(root: Path, name: str, content: bytes | str = b"") -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    data = content.encode() if isinstance(content, str) else content
    (folder / "prompts.jsonl").write_bytes(data)
    return folder


def _line(*messages: tuple[str, Any], **extra: Any) -> bytes:
    return json.dumps({"messages": [{"role": r, "content": c} for r, c in messages], **extra}).encode()


@pytest.fixture(params=["orjson", "stdlib"])
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with orjson and again as on a host without it (stdlib json only)."""
    if request.param == "stdlib":
        monkeypatch.setattr(validate_mod, "orjson", None)
    return str(request.param)


# -- discovery --------------------------------------------------------------------------------


def test_discover_folders_roots_and_only(tmp_path: Path) -> None:
    direct = _make(tmp_path / "elsewhere", "B9")
    root = tmp_path / "prepared"
    for name in ["B3", "B1", "B2"]:
        _make(root, name)
    (root / "notes").mkdir()  # no prompts.jsonl: not a dataset, not an error
    (root / "README.md").write_text("x")
    _make(root, ".hidden")

    found = discover([direct], [root])
    assert [d.name for d in found] == ["B9", "B1", "B2", "B3"]
    assert found[0] == Dataset("B9", direct)
    assert found[1].prompts_path == root / "B1" / "prompts.jsonl"
    assert found[1].results_path == root / "B1" / "raw_responses.jsonl"

    assert [d.name for d in discover([direct], [root], only={"B2", "B9"})] == ["B9", "B2"]
    assert discover([], [root], only=[]) == []


def test_discover_same_folder_twice_is_one_dataset(tmp_path: Path) -> None:
    root = tmp_path / "prepared"
    b1 = _make(root, "B1")
    assert [d.name for d in discover([b1, b1], [root])] == ["B1"]


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda t: ([t / "missing"], []), "missing: dataset folder does not exist"),
        (lambda t: ([_file(t / "f")], []), "f: not a folder"),
        (lambda t: ([_dir(t / "empty")], []), "empty: no prompts.jsonl in this folder"),
        (lambda t: ([], [t / "nothere"]), "nothere: datasets root does not exist"),
        (lambda t: ([], [_dir(t / "bare")]), "bare: no dataset folders"),
        (lambda t: ([_make(t / "a", "B1")], [_root_with(t / "r", "B1")]), "B1'? is also used by"),
        (lambda t: ([_make(t, "has space")], []), "dataset name 'has space' is not usable"),
        (lambda t: ([_make(t, "a#b")], []), "is not usable"),
    ],
)
def test_discover_errors_name_the_path(tmp_path: Path, setup: Any, message: str) -> None:
    folders, roots = setup(tmp_path)
    with pytest.raises(DatasetError, match=message) as err:
        discover(folders, roots)
    assert "\n" not in str(err.value)
    assert str(tmp_path) in str(err.value)


def test_discover_unknown_only_name(tmp_path: Path) -> None:
    root = _root_with(tmp_path / "r", "B1")
    with pytest.raises(DatasetError, match=r"unknown dataset B7 \(found: B1\)"):
        discover([], [root], only=["B1", "B7"])
    assert issubclass(DatasetError, ValueError)


def _file(p: Path) -> Path:
    p.write_text("x")
    return p


def _dir(p: Path) -> Path:
    p.mkdir()
    return p


def _root_with(root: Path, name: str) -> Path:
    _make(root, name)
    return root


# -- validation rules -------------------------------------------------------------------------

U = ("user", "hi")
A = ("assistant", "hello")
S = ("system", "be brief")

INVALID = [
    (b"", "blank line"),
    (b"   \t", "blank line"),
    (b"\r", "blank line"),
    (b"{not json}", "not valid JSON"),
    (b'{"messages": [', "not valid JSON"),
    (b'{"messages": [{"role": "user", "content": NaN}]}', "not valid JSON"),
    (b'{"messages": [{"role": "user", "content": 1e400}]}', "a number is out of range"),
    (b"\xff\xfe{}", "not valid UTF-8"),
    (b'{"messages": [{"role": "user", "content": "caf\xe9"}]}', "not valid UTF-8"),
    (b"\xef\xbb\xbf" + _line(U), "starts with a UTF-8 byte order mark"),
    (b"[]", "not a JSON object"),
    (b'"text"', "not a JSON object"),
    (b"{}", "messages missing or empty"),
    (b'{"messages": null}', "messages missing or empty"),
    (b'{"messages": []}', "messages missing or empty"),
    (b'{"messages": {"role": "user"}}', "messages is not a list"),
    (b'{"messages": "hi"}', "messages is not a list"),
    (b'{"messages": ["hi"]}', "message 1: not an object"),
    (b'{"messages": [{"content": "hi"}]}', "message 1: role missing"),
    (b'{"messages": [{"role": 3, "content": "hi"}]}', "message 1: role is not a string"),
    (_line(U, ("bot", "x"), U), "message 2: role 'bot' not allowed"),
    (_line(("User", "x")), "message 1: role 'User' not allowed"),
    (_line(("x" * 100, "x")), "message 1: role 'xxxxxxxxxxxxxxxxxxxxxxx…' not allowed"),
    (_line(U, S, U), "system message not first"),
    (_line(S, S, U), "system message not first"),
    (_line(("user", 5)), "message 1: content is not a string"),
    (_line(("user", {"text": "x"})), "message 1: content is not a string"),
    (_line(("user", None)), "message 1: content missing"),
    (b'{"messages": [{"role": "user"}]}', "message 1: content missing"),
    (_line(("user", [{"type": "text", "text": "x"}])), "message 1: content is a list of parts (multimodal)"),
    (_line(U, A), "last message is not from the user"),
    (_line(S), "last message is not from the user"),
    (_line(U, A, U, ("tool", "42")), "last message is not from the user"),
    (_line(U, id=7), "id is not a string"),
    (_line(U, meta=[1]), "meta is not an object"),
    (_line(U, meta="x"), "meta is not an object"),
    (
        b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
        "a string holds an unpaired surrogate escape",
    ),
]


@pytest.mark.parametrize(("raw", "reason"), INVALID)
def test_invalid_line_reason(parser: str, raw: bytes, reason: str) -> None:
    assert validate_line(raw) == reason
    assert validate_line(raw + b"\n") == reason


VALID = [
    _line(U),
    _line(S, U),
    _line(U, A, U),
    _line(S, U, A, ("tool", "result"), U),
    _line(("user", "")),  # empty content is still a string
    _line(U, id="src-1", meta={"k": [1, 2.5, None]}, extra="ignored"),
    _line(U, id=None, meta=None),
    b'{"messages":[{"role":"user","content":"x"}]}\r',  # CRLF line ending
    b'  {"messages":[{"role":"user","content":"x","name":"bob"}]}  ',
]


@pytest.mark.parametrize("raw", VALID)
def test_valid_lines(parser: str, raw: bytes) -> None:
    p = validate_line(raw, "B3", 1234)
    assert isinstance(p, Prompt), p
    doc = json.loads(raw)
    assert p.messages == doc["messages"]
    assert p.request_messages == doc["messages"]
    assert p.sha256 == _reference_sha256(doc["messages"])
    assert p.source_id == doc.get("id")
    assert p.meta == doc.get("meta")
    assert (p.dataset, p.line, p.id) == ("B3", 1234, "B3-00001234")


def test_reason_kind_groups_by_message_number_and_value() -> None:
    assert reason_kind("message 2: role 'bot' not allowed") == "message N: role not allowed"
    assert reason_kind("message 17: content is not a string") == "message N: content is not a string"
    assert reason_kind("blank line") == "blank line"
    inv = InvalidLine("B1", 4, "message 3: role 'x' not allowed")
    assert inv.kind == "message N: role not allowed"
    assert str(inv) == "B1 line 4: message 3: role 'x' not allowed"


# -- canonical hashing ------------------------------------------------------------------------

TRICKY_MESSAGES: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Grüße aus Köln – „Anführungszeichen“ und ß"}],
    [{"role": "user", "content": "日本語のテキスト、絵文字 😀👍🏽 and ZWJ 👨‍👩‍👧"}],
    [{"role": "user", "content": 'quotes " backslash \\ slash / tab \t nl \n cr \r bs \b ff \f'}],
    [{"role": "user", "content": "controls \x00\x01\x1f del \x7f nbsp \xa0 ls \u2028 ps \u2029 bom \ufeff"}],
    [{"role": "user", "content": "astral \U0001f600 max \U0010ffff bmp-max \uffff"}],
    [{"role": "system", "content": "s"}, {"role": "user", "content": "u", "name": "é"}],
    [{"role": "user", "content": "x", "z": "1", "a": "2", "é": "3", "\U0001f600": "4", "\uffff": "5"}],
    [{"role": "user", "content": "x", "f": 1e-7, "g": 1e16, "h": 0.1, "i": -0.0, "j": 1.0, "k": 2.5e-300}],
    [{"role": "user", "content": "x", "n": 2**63, "m": -(2**63) - 1, "big": 10**30}],
    [{"role": "user", "content": "x", "nested": {"b": [1, {"d": None, "c": True}], "a": {"z": [], "y": {}}}}],
    [{"content": "order", "role": "user"}],
]


@pytest.mark.parametrize("messages", TRICKY_MESSAGES)
def test_line_hash_equals_reference_definition(parser: str, messages: list[dict[str, Any]]) -> None:
    for dumps in (
        lambda m: json.dumps({"messages": m}, ensure_ascii=False).encode(),
        lambda m: json.dumps({"messages": m}).encode(),  # \u escapes in the file
    ):
        raw = dumps(messages)
        p = validate_line(raw)
        assert isinstance(p, Prompt), p
        # The reference parses with json.loads, so that is what the line means.
        assert p.sha256 == _reference_sha256(json.loads(raw)["messages"])
    assert canonical_sha256(messages) == _reference_sha256(messages)


def test_orjson_string_escaping_is_identical_for_every_code_point() -> None:
    # The proof behind the fast path: one string holding every non-surrogate code point, and
    # keys whose UTF-16 order differs from code point order.
    every = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    messages = [{"role": "user", "content": every, every[::-1]: every, "\uffff": "a", "\U00010000": "b"}]
    ref = json.dumps(messages, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")
    assert orjson.dumps(messages, option=orjson.OPT_SORT_KEYS) == ref
    p = validate_line(json.dumps({"messages": messages}).encode())
    assert isinstance(p, Prompt)
    assert p.sha256 == hashlib.sha256(ref).hexdigest()


def test_random_strings_hash_like_the_reference(parser: str) -> None:
    rng = random.Random(7)
    pools = [(0, 0x80), (0x80, 0x800), (0x800, 0xD800), (0xE000, 0x10000), (0x10000, 0x110000)]

    def text() -> str:
        out = []
        for _ in range(rng.randrange(0, 40)):
            lo, hi = rng.choice(pools)
            out.append(chr(rng.randrange(lo, hi)))
        return "".join(out)

    for _ in range(300):
        messages: list[dict[str, Any]] = [{"role": "user", "content": text()}]
        if rng.random() < 0.5:
            messages[0][text() or "k"] = text()
        raw = json.dumps({"messages": messages}, ensure_ascii=rng.random() < 0.5).encode()
        p = validate_line(raw)
        assert isinstance(p, Prompt)
        assert p.sha256 == _reference_sha256(messages)


# -- scan and iter_prompts --------------------------------------------------------------------


def _mixed_dataset(tmp_path: Path) -> Dataset:
    lines = [
        _line(U),  # 0
        b"",  # 1 blank
        _line(U, A),  # 2 last not user
        _line(S, U, id="a", extra=1),  # 3
        _line(U),  # 4 duplicate of 0
        b"\xc3\x28",  # 5 not UTF-8
        _line(("user", "second")),  # 6
        _line(U),  # 7 duplicate of 0 again
        _line(U, A, U, other=True),  # 8, no trailing newline
    ]
    return Dataset("mix", _make(tmp_path, "mix", b"\n".join(lines)))


def test_scan_counts_lines_invalid_duplicates(parser: str, tmp_path: Path) -> None:
    ds = _mixed_dataset(tmp_path)
    r = scan(ds)
    assert (r.dataset, r.path) == ("mix", ds.prompts_path)
    assert r.lines == r.total == 9
    assert r.valid == 6
    assert r.invalid == [
        InvalidLine("mix", 1, "blank line"),
        InvalidLine("mix", 2, "last message is not from the user"),
        InvalidLine("mix", 5, "not valid UTF-8"),
    ]
    assert r.invalid_lines == {1, 2, 5}
    assert r.duplicates == 2
    data = ds.prompts_path.read_bytes()
    assert r.size == len(data)
    assert r.sha256 == hashlib.sha256(data).hexdigest()
    assert r.ends_with_newline is False
    assert r.turns == {1: 4, 2: 1, 3: 1}
    assert r.extra_keys == {"extra": 1, "other": 1}
    assert r.invalid_by_kind() == {
        "blank line": (1, [1]),
        "last message is not from the user": (1, [2]),
        "not valid UTF-8": (1, [5]),
    }
    d = r.to_dict()
    assert d["invalid"] == 3 and d["duplicates"] == 2
    json.dumps(d)  # serialisable as is, for --json


def test_iter_prompts_matches_scan_and_skips(parser: str, tmp_path: Path) -> None:
    ds = _mixed_dataset(tmp_path)
    prompts = list(iter_prompts(ds))
    assert [p.line for p in prompts] == [0, 3, 4, 6, 7, 8]
    assert [p.id for p in prompts][:2] == ["mix-00000000", "mix-00000003"]
    assert prompts[1].source_id == "a"
    # Duplicates stay distinct prompts with the same hash.
    assert prompts[0].sha256 == prompts[2].sha256 == prompts[4].sha256
    assert prompts[0].line != prompts[2].line
    assert [p.line for p in iter_prompts(ds, skip_lines={0, 4, 8, 1})] == [3, 6, 7]


def test_newline_handling(tmp_path: Path) -> None:
    u = _line(U)
    cases = {
        b"": (0, 0, True),
        u: (1, 1, False),
        u + b"\n": (1, 1, True),
        u + b"\n\n": (2, 1, True),  # a trailing empty line is a blank line, never ignored
        b"\n" + u + b"\n": (2, 1, True),
        u + b"\r\n" + u + b"\r\n": (2, 2, True),
    }
    for i, (content, (lines, valid, ends)) in enumerate(cases.items()):
        r = scan(Dataset(f"n{i}", _make(tmp_path, f"n{i}", content)))
        assert (r.lines, r.valid, r.ends_with_newline) == (lines, valid, ends), content


def test_lines_spanning_read_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lines_mod, "_CHUNK", 7)  # lines split across many reads
    lines = [_line(("user", "x" * n)) for n in (0, 1, 5, 30, 2)]
    ds = Dataset("c", _make(tmp_path, "c", b"\n".join(lines)))
    r = scan(ds)
    assert (r.lines, r.valid) == (5, 5)
    assert [len(p.messages[0]["content"]) for p in iter_prompts(ds)] == [0, 1, 5, 30, 2]


def test_missing_prompts_file_is_a_dataset_error(tmp_path: Path) -> None:
    ds = Dataset("gone", tmp_path / "gone")
    with pytest.raises(DatasetError, match=r"gone/prompts\.jsonl: file not found"):
        scan(ds)
    with pytest.raises(DatasetError, match="file not found"):
        iter_prompts(ds)  # raised at the call, not at first iteration


def test_iter_prompts_is_lazy(tmp_path: Path) -> None:
    ds = Dataset("lazy", _make(tmp_path, "lazy", b"\n".join([_line(U)] * 10)))
    it: Iterator[Prompt] = iter_prompts(ds)
    assert next(it).line == 0
    # Lines appended after iteration started are still seen: nothing was read ahead into a list.
    with open(ds.prompts_path, "ab") as f:
        f.write(b"\n" + _line(("user", "late")) + b"\n")
    assert [p.line for p in it][-1] == 10


def test_scan_100k_lines(tmp_path: Path) -> None:
    n = 100_000
    folder = tmp_path / "big"
    folder.mkdir()
    with open(folder / "prompts.jsonl", "wb") as f:
        for i in range(n):
            k = i % 90_000  # lines 90000.. repeat earlier prompts
            msgs = [{"role": "user", "content": f"Question {k}: explain topic {k % 97} — ü 日本"}]
            if k % 3 == 0:
                msgs.insert(0, {"role": "system", "content": "Be concise."})
            f.write(orjson.dumps({"id": f"s{i}", "messages": msgs}) + b"\n")
        f.write(b"{broken\n")
    ds = Dataset("big", folder)
    t0 = time.perf_counter()
    r = scan(ds)
    elapsed = time.perf_counter() - t0
    assert (r.lines, r.valid) == (n + 1, n)
    assert r.invalid == [InvalidLine("big", n, "not valid JSON")]
    assert r.duplicates == n - 90_000
    assert elapsed < 10, f"scan of {n} lines took {elapsed:.2f}s"


def test_module_runs_standalone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "prepared"
    _make(root, "B1", _line(U) + b"\n\n")
    assert scan_mod.main([str(root)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["dataset"], out["lines"], out["valid"]) == ("B1", 2, 1)
    assert scan_mod.main([str(tmp_path / "nope")]) == 1


# -- demo datasets ----------------------------------------------------------------------------


def test_demo_datasets_validate_and_vary() -> None:
    found = discover([], [DEMO])
    assert [d.name for d in found] == ["chat", "code", "reasoning"]
    reports = {d.name: scan(d) for d in found}
    assert {k: r.lines for k, r in reports.items()} == {"chat": 200, "code": 120, "reasoning": 80}
    for r in reports.values():
        assert r.invalid == [] and r.ends_with_newline
    # Exactly one deliberate duplicate, in chat, as two identical lines.
    assert {k: r.duplicates for k, r in reports.items()} == {"chat": 1, "code": 0, "reasoning": 0}
    chat_lines = (DEMO / "chat" / "prompts.jsonl").read_bytes().split(b"\n")
    at = make_datasets.CHAT_DUPLICATE_AT
    assert chat_lines[at] == chat_lines[at + 1]

    prompts = [p for d in found for p in iter_prompts(d)]
    assert any(p.messages[0]["role"] == "system" for p in prompts)
    assert any(len(p.messages) >= 3 and p.messages[-2]["role"] == "assistant" for p in prompts)
    assert any(p.source_id for p in prompts) and any(p.source_id is None for p in prompts)
    assert any(p.meta for p in prompts)
    texts = [m["content"] for p in prompts for m in p.messages]
    assert any(any("\u3040" <= ch <= "\u30ff" for ch in t) for t in texts)  # Japanese kana
    assert any("ä" in t or "ü" in t or "ß" in t for t in texts)  # German


def test_demo_generator_reproduces_committed_files(tmp_path: Path) -> None:
    written = make_datasets.write(tmp_path)
    for name, path in written.items():
        assert path.read_bytes() == (DEMO / name / "prompts.jsonl").read_bytes(), name
