"""Hostile inputs: prompts, settings, results files and journals an operator (or a broken tool)
might hand regen. Each gives a one-line message naming the file and line (or key), or is handled
as docs/inputs.md says; never a traceback, never a partial write.

The validator and the line reader are also run on generated input (Hypothesis): valid prompts
must be accepted with the sha256 of the reference definition, and arbitrary bytes never raise.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import shutil
import subprocess
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import regen.engine.data.lines as lines_mod
from regen.engine.data.datasets import Dataset, Prompt, canonical_sha256
from regen.engine.data.jsonl import MAX_LINE_BYTES as JSONL_MAX_LINE
from regen.engine.data.jsonl import CorruptLine, iter_jsonl
from regen.engine.data.scan import iter_prompts, scan
from regen.engine.data.validate import MAX_NESTING, validate_line
from regen.engine.run.recovery import RecoveryError, read_journals, read_rows
from tests.support.datasets import read_rows as rows_of
from tests.support.datasets import write_dataset
from tests.support.openrouter_sim import SIM_KEY, openrouter_process
from tests.support.processes import ENV, regen_captured, run_regen, settings_file

U = b'{"messages":[{"role":"user","content":"hi"}]}'


def reference_sha256(messages: Any) -> str:
    # data-contract §2, written out again here on purpose: the test must not share the code.
    canonical = json.dumps(messages, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


# -- the validator on generated lines --------------------------------------------------------------

# Any code point but surrogates (which have no UTF-8 form); control characters, U+2028, BOMs and
# NULs inside strings included: they are escaped in the JSON.
SURROGATES: tuple[Literal["Cs"]] = ("Cs",)  # the category, as hypothesis's signature spells it
text = st.text(st.characters(exclude_categories=SURROGATES), max_size=40)
extra_value = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False, allow_infinity=False),
    text,
)


@st.composite
def messages(draw: st.DrawFn) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if draw(st.booleans()):
        out.append({"role": "system", "content": draw(text)})
    middle = draw(st.lists(st.sampled_from(["user", "assistant", "tool"]), max_size=4))
    for role in [*middle, "user"]:
        message: dict[str, Any] = {"role": role, "content": draw(text)}
        if draw(st.integers(0, 4)) == 0:
            message[draw(st.sampled_from(["name", "weight", "x"]))] = draw(extra_value)
        items = list(message.items())
        draw(st.randoms()).shuffle(items)  # key order must not matter to the hash
        out.append(dict(items))
    return out


def encodings(doc: dict[str, Any]) -> Iterator[bytes]:
    with contextlib.suppress(TypeError):  # integers past 64 bits: orjson cannot write them
        yield orjson.dumps(doc)
    yield json.dumps(doc).encode()  # ASCII with \\u escapes
    yield json.dumps(doc, ensure_ascii=False).encode()
    yield b"  " + json.dumps(doc, separators=(" , ", " : "), ensure_ascii=False).encode() + b" \t\r"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msgs=messages(), meta=st.one_of(st.none(), st.dictionaries(text, extra_value, max_size=3)))
def test_valid_prompts_are_accepted_with_the_reference_hash(msgs: list[dict[str, Any]], meta: Any) -> None:
    doc: dict[str, Any] = {"messages": msgs}
    if meta is not None:
        doc["meta"] = meta
    expected = reference_sha256(json.loads(json.dumps(msgs)))
    for line in encodings(doc):
        for raw in (line, line + b"\n"):
            prompt = validate_line(raw, "B1", 7)
            assert isinstance(prompt, Prompt), (prompt, raw)
            assert prompt.sha256 == expected
            assert prompt.sha256 == canonical_sha256(prompt.messages)
            assert prompt.messages == json.loads(line)["messages"]


def _never_raises(raw: bytes) -> None:
    result = validate_line(raw)
    assert isinstance(result, Prompt | str)
    if isinstance(result, str):
        assert result and "\n" not in result and len(result) < 100


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise(raw: bytes) -> None:
    _never_raises(raw)


@settings(max_examples=500, deadline=None)
@given(msgs=messages(), cut=st.integers(0, 10_000), junk=st.binary(min_size=1, max_size=8))
def test_damaged_valid_lines_never_raise(msgs: list[dict[str, Any]], cut: int, junk: bytes) -> None:
    line = json.dumps({"messages": msgs}, ensure_ascii=False).encode()
    at = cut % (len(line) + 1)
    _never_raises(line[:at] + junk + line[at:])
    _never_raises(line[:at])


@settings(max_examples=40, deadline=None)
@given(depth=st.integers(1, 120_000) | st.integers(500, 520), opener=st.sampled_from([b"[", b'{"a":']))
def test_any_nesting_depth_is_judged_not_crashed(depth: int, opener: bytes) -> None:
    closer = b"]" if opener == b"[" else b"}"
    raw = U[:-1] + b',"meta":{"x":' + opener * depth + b"0" * (opener == b'{"a":') + closer * depth + b"}}"
    result = validate_line(raw)
    # The document is depth + 2 levels deep (the line, meta): a fixed limit, whatever the stack.
    if depth + 2 <= MAX_NESTING:
        assert isinstance(result, Prompt)
    else:
        assert result == "JSON nested too deep"


def test_nesting_limit_does_not_depend_on_the_callers_stack() -> None:
    at_limit = U[:-1] + b',"meta":{"x":' + b"[" * 510 + b"1.5" + b"]" * 510 + b"}}"
    past = U[:-1] + b',"meta":{"x":' + b"[" * 511 + b"]" * 511 + b"}}"

    def deep(n: int) -> tuple[Prompt | str, Prompt | str]:
        return deep(n - 1) if n else (validate_line(at_limit), validate_line(past))

    for stack in (0, 300, 400):
        ok, refused = deep(stack)
        assert isinstance(ok, Prompt) and refused == "JSON nested too deep"


# -- the line reader: long lines are reported, never held ------------------------------------------


def _reference_lines(data: bytes, limit: int) -> list[bytes | None]:
    parts = data.split(b"\n")
    if parts[-1] == b"":
        parts.pop()
    return [None if len(p) > limit else p for p in parts]


@settings(max_examples=400, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), max_size=30),
    final_newline=st.booleans(),
    chunk=st.integers(1, 17),
    limit=st.integers(0, 25),
)
def test_line_reader_matches_a_plain_split(
    tmp_path_factory: pytest.TempPathFactory, lengths: list[int], final_newline: bool, chunk: int, limit: int
) -> None:
    body = b"\n".join(bytes([97 + i % 26]) * n for i, n in enumerate(lengths))
    data = body + (b"\n" if final_newline and lengths else b"")
    path = tmp_path_factory.mktemp("lines") / "prompts.jsonl"
    path.write_bytes(data)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lines_mod, "_CHUNK", chunk)
        mp.setattr(lines_mod, "MAX_LINE_BYTES", limit)
        got = [
            None if raw is lines_mod.OVERLONG else raw
            for raw in lines_mod.read_lines(lines_mod.open_file(path), path)
        ]
    assert got == _reference_lines(data, limit)


def test_a_100_mb_line_is_reported_and_never_held(tmp_path: Path) -> None:
    folder = tmp_path / "A"
    folder.mkdir()
    path = folder / "prompts.jsonl"
    huge = 100 << 20
    with open(path, "wb") as fh:
        fh.write(U + b"\n")
        fh.write(b'{"messages":[{"role":"user","content":"')
        block = b"y" * (1 << 20)
        for _ in range(huge >> 20):
            fh.write(block)
        fh.write(b'"}]}\n')
        fh.write(U + b"\n")
    tracemalloc.start()
    try:
        report = scan(Dataset("A", folder))
        prompts = list(iter_prompts(Dataset("A", folder)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.lines == 3 and report.valid == 2
    [bad] = report.invalid
    assert (bad.line, bad.reason) == (1, f"line longer than {lines_mod.MAX_LINE_BYTES} bytes")
    assert [p.line for p in prompts] == [0, 2]
    # Held: at most the cap (the line is gathered until it passes 16 MiB, then skipped) and a
    # buffer's slack, never the 100 MiB line.
    assert peak < lines_mod.MAX_LINE_BYTES * 3 // 2, f"peak {peak} bytes"
    assert (
        report.size == path.stat().st_size and report.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    )


HOSTILE_INVALID: list[tuple[str, bytes, str]] = [
    ("invalid UTF-8", b'{"messages":[{"role":"user","content":"caf\xe9"}]}', "not valid UTF-8"),
    ("NUL byte", b'{"messages":[{"role":"user","content":"a\x00b"}]}', "holds a NUL byte"),
    ("NUL block", b"\x00" * 64, "holds a NUL byte"),
    ("nested 100,000 deep", b"[" * 100_000 + b"]" * 100_000, "JSON nested too deep"),
    ("1e999", U[:-1] + b',"meta":{"x":1e999}}', "a number is out of range"),
    (
        "-1e999 in a message",
        b'{"messages":[{"role":"user","content":"x","w":-1e999}]}',
        "a number is out of range",
    ),
    ("5000 digits", U[:-1] + b',"meta":{"x":' + b"7" * 5000 + b"}}", "a number has too many digits"),
    ("BOM", b"\xef\xbb\xbf" + U, "starts with a UTF-8 byte order mark"),
    ("two objects", U + U, "not valid JSON"),
    ("a lone CR", b"\r", "blank line"),
]

HOSTILE_VALID: list[tuple[str, bytes]] = [
    ("CRLF ending", U + b"\r"),
    (
        "duplicate keys: the last wins",
        b'{"messages":[{"role":"user","content":"first"}],"messages":[{"role":"user","content":"last"}]}',
    ),
    ("escaped NUL in content", b'{"messages":[{"role":"user","content":"a\\u0000b"}]}'),
    ("1e308 in meta", U[:-1] + b',"meta":{"x":1e308}}'),
    ("a 256 KiB prompt", b'{"messages":[{"role":"user","content":"' + b"z x " * (64 << 10) + b'"}]}'),
]


@pytest.mark.parametrize(("what", "raw", "reason"), HOSTILE_INVALID, ids=[c[0] for c in HOSTILE_INVALID])
def test_hostile_line_reason(what: str, raw: bytes, reason: str) -> None:
    assert validate_line(raw) == reason
    assert validate_line(raw + b"\n") == reason


def test_hostile_valid_lines_as_documented() -> None:
    crlf = validate_line(HOSTILE_VALID[0][1])
    assert isinstance(crlf, Prompt) and crlf.messages == [{"role": "user", "content": "hi"}]
    dup = validate_line(HOSTILE_VALID[1][1])
    assert isinstance(dup, Prompt) and dup.messages[0]["content"] == "last"
    nul = validate_line(HOSTILE_VALID[2][1])
    assert isinstance(nul, Prompt) and nul.messages[0]["content"] == "a\x00b"
    assert nul.sha256 == reference_sha256(nul.messages)


# -- CLI: prompts ---------------------------------------------------------------------------------


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_regen(*args, env={**ENV, "OPENROUTER_API_KEY": SIM_KEY}, timeout=timeout)


def run_here(*args: str) -> subprocess.CompletedProcess[str]:
    """`run_cli` without a Python start: the refusals below are checked in this process, and
    `test_a_refusal_is_the_processs_exit_code_and_one_line` checks that a real process says the same."""
    return regen_captured(*args, env={**ENV, "OPENROUTER_API_KEY": SIM_KEY})


def assert_clean_failure(proc: subprocess.CompletedProcess[str], code: int, *expected: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    for text in expected:
        assert text in proc.stderr, proc.stderr


@pytest.mark.parametrize(("what", "raw", "reason"), HOSTILE_INVALID, ids=[c[0] for c in HOSTILE_INVALID])
def test_cli_refuses_a_hostile_prompt_line_naming_file_and_line(
    tmp_path: Path, what: str, raw: bytes, reason: str
) -> None:
    data = write_dataset(tmp_path, "A", 0, raw=[U, raw, U])
    # No simulator: the lines are checked before anything is sent (an unreachable address proves it).
    settings = settings_file(tmp_path, "http://127.0.0.1:9/api/v1", [data])
    proc = run_here("run", "--headless", "--settings", str(settings))
    assert_clean_failure(proc, 1, f"{data / 'prompts.jsonl'}:2: {reason}")
    assert not (data / "raw_responses.jsonl").exists(), "nothing is written for a refused dataset"
    assert not (tmp_path / "run").exists()


def test_cli_refuses_a_100_mb_line(tmp_path: Path) -> None:
    folder = tmp_path / "A"
    folder.mkdir()
    with open(folder / "prompts.jsonl", "wb") as fh:
        fh.write(U + b"\n" + b"{" * (100 << 20) + b"\n")
    settings = settings_file(tmp_path, "http://127.0.0.1:9/api/v1", [folder])
    proc = run_here("run", "--headless", "--settings", str(settings))
    assert_clean_failure(proc, 1, f"prompts.jsonl:2: line longer than {lines_mod.MAX_LINE_BYTES} bytes")


def test_cli_runs_the_hostile_valid_lines_and_skips_the_invalid_ones(
    sim_process: str,
    tmp_path: Path,
) -> None:
    lines = [raw for _, raw in HOSTILE_VALID] + [raw for _, raw, _ in HOSTILE_INVALID]
    data = write_dataset(tmp_path, "A", 0, raw=lines)
    # And no final newline: the last line still counts.
    prompts = data / "prompts.jsonl"
    prompts.write_bytes(prompts.read_bytes() + U)
    settings = settings_file(tmp_path, sim_process, [data], concurrency=8, max_attempts=20)
    refused = run_cli("run", "--headless", "--settings", str(settings))
    assert_clean_failure(
        refused, 1, "invalid prompt lines", f"{prompts}:{len(HOSTILE_VALID) + 1}: not valid UTF-8"
    )
    done = run_cli("run", "--headless", "--skip-invalid", "--settings", str(settings))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stdout + done.stderr
    rows = rows_of(data)
    valid_lines = [*range(len(HOSTILE_VALID)), len(lines)]
    assert sorted(r["line"] for r in rows) == valid_lines
    raw_lines = prompts.read_bytes().split(b"\n")
    for row in rows:
        doc = json.loads(raw_lines[row["line"]])
        assert row["prompt_sha256"] == reference_sha256(doc["messages"])
    events = [orjson.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_bytes().splitlines()]
    skipped = sorted(e["line"] for e in events if e["event"] == "invalid_line")
    assert skipped == list(range(len(HOSTILE_VALID), len(lines)))
    assert prompts.read_bytes().endswith(U), "inputs are never rewritten"
    verified = run_cli("verify", "--settings", str(settings), str(data))
    assert verified.returncode == 0, verified.stdout + verified.stderr


# -- settings ---------------------------------------------------------------------------------------

HOSTILE_SETTINGS: list[tuple[str, bytes, list[str]]] = [
    (
        "wrong types",
        b'[job]\nconcurrency = "lots"\n[openrouter]\nstream = "maybe"\n',
        ["job.concurrency", "openrouter.stream"],
    ),
    (
        "unknown keys",
        b"[job]\nconcurency = 5\n[bogus]\nx = 1\n",
        ["job.concurency: Extra inputs", "bogus: Extra inputs"],
    ),
    ("huge integer", b"[openrouter]\nmax_tokens = 99999999999999999999999\n", ["openrouter.max_tokens"]),
    ("infinite budget", b"[job]\nbudget_usd = inf\n", ["job.budget_usd: Input should be a finite number"]),
    ("nan", b"[job]\nbackoff_base_s = nan\n", ["job.backoff_base_s"]),
    ("a commit that never comes", b"[job]\ncommit_interval_s = 1e300\n", ["job.commit_interval_s"]),
    (
        "a NUL in a path",
        b'[job]\nrun_dir = "a\\u0000b"\n',
        ["job.run_dir: contains a NUL character"],
    ),
    ("invalid UTF-8", b'[job]\nrun_dir = "caf\xe9"\n', ["not valid UTF-8"]),
    ("nested 100,000 deep", b"x = " + b"[" * 100_000 + b"]" * 100_000 + b"\n", ["nested too deep"]),
    ("not TOML at all", b"\x00\x01\x02garbage", ["not valid TOML"]),
]


@pytest.mark.parametrize(("what", "content", "keys"), HOSTILE_SETTINGS, ids=[c[0] for c in HOSTILE_SETTINGS])
def test_cli_hostile_settings_exit_2_naming_file_and_key(
    tmp_path: Path, what: str, content: bytes, keys: list[str]
) -> None:
    path = tmp_path / "settings.toml"
    path.write_bytes(content)
    proc = run_here("run", "--headless", "--settings", str(path))
    assert_clean_failure(proc, 2, *keys)
    assert all(line.startswith(f"regen: {path}: ") for line in proc.stderr.strip().splitlines()), proc.stderr


def test_a_refusal_is_the_processs_exit_code_and_one_line(tmp_path: Path) -> None:
    """What the in-process refusals above check, once from a real `regen` process."""
    path = tmp_path / "settings.toml"
    path.write_bytes(HOSTILE_SETTINGS[0][1])
    proc = run_cli("run", "--headless", "--settings", str(path), timeout=60)
    assert_clean_failure(proc, 2, *HOSTILE_SETTINGS[0][2])
    assert proc.stdout == "" and all(
        line.startswith(f"regen: {path}: ") for line in proc.stderr.strip().splitlines()
    )
    data = write_dataset(tmp_path, "A", 0, raw=[U, HOSTILE_INVALID[0][1], U])
    settings = settings_file(tmp_path, "http://127.0.0.1:9/api/v1", [data])
    proc = run_cli("run", "--headless", "--settings", str(settings))
    assert_clean_failure(proc, 1, f"{data / 'prompts.jsonl'}:2: {HOSTILE_INVALID[0][2]}")
    assert not (tmp_path / "run").exists()


# -- results files and journals with garbage added by hand -----------------------------------------


@pytest.fixture(scope="module")
def module_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One simulator process for the tests that need a finished run (each gets its own copy)."""
    config = {
        "time_scale": 0.02,
        "min_completion_tokens": 10,
        "max_completion_tokens": 40,
        "chunk_interval_s": 0.01,
        "keepalive_interval_s": 0.05,
        "generation_lookup_delay_s": 0.1,
        "retry_after_s": 0,
        "seed": 3,
    }
    with openrouter_process(tmp_path_factory.mktemp("sim"), config) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def finished_template(module_sim: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("finished")
    data = write_dataset(root, "A", 40)
    settings = settings_file(root, module_sim, [data], concurrency=8, max_attempts=20)
    proc = run_cli("run", "--headless", "--settings", str(settings))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    verified = run_cli("verify", "--settings", str(settings), str(data))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    return root


@pytest.fixture
def finished_run(finished_template: Path, module_sim: str, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of a finished run: settings and the dataset folder."""
    shutil.copytree(finished_template / "A", tmp_path / "A")
    shutil.copytree(finished_template / "run", tmp_path / "run", ignore=shutil.ignore_patterns("*.sock"))
    return settings_file(
        tmp_path, module_sim, [tmp_path / "A"], concurrency=8, max_attempts=20
    ), tmp_path / "A"


GARBAGE: list[tuple[str, bytes, str]] = [
    ("text", b"hello, I edited this\n", "corrupt JSON"),
    ("NULs", b"\x00" * 100 + b"\n", "holds NUL bytes, not JSON"),
    ("invalid UTF-8", b'{"line": "\xff"}\n', "corrupt JSON"),
    ("an array", b"[1, 2, 3]\n", "not a JSON object"),
    ("another tool's object", b'{"hello": "world"}\n', "not a"),
]


@pytest.mark.parametrize("target", ["raw_responses.jsonl", "attempts.jsonl", "events.jsonl"])
@pytest.mark.parametrize(("what", "junk", "problem"), GARBAGE, ids=[g[0] for g in GARBAGE])
def test_garbage_in_results_or_journals_stops_with_file_and_line_and_writes_nothing(
    finished_run: tuple[Path, Path], target: str, what: str, junk: bytes, problem: str
) -> None:
    settings, data = finished_run
    path = data / target if target == "raw_responses.jsonl" else settings.parent / "run" / target
    lines = path.read_bytes().count(b"\n")
    # In the middle, as an editor would leave it: the good lines after it must not be guessed at.
    content = path.read_bytes().split(b"\n")
    middle = b"\n".join(content[: lines // 2]) + b"\n" + junk + b"\n".join(content[lines // 2 :])
    path.write_bytes(middle)
    before = {
        p: p.read_bytes()
        for p in [path, data / "raw_responses.jsonl", settings.parent / "run" / "attempts.jsonl"]
    }
    proc = run_here("run", "--headless", "--settings", str(settings))
    assert_clean_failure(proc, 1, f"{path}:{lines // 2 + 1}: ", problem, "fix or delete it, then run again")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert {p: p.read_bytes() for p in before} == before, "nothing rewritten, nothing appended"
    if target == "raw_responses.jsonl":
        verified = run_here("verify", "--settings", str(settings), str(data))
        assert verified.returncode == 1 and "Traceback" not in verified.stderr + verified.stdout
        assert f"line {lines // 2}" in verified.stdout
    # Removing the line by hand is the documented remedy.
    path.write_bytes(b"\n".join(content))
    again = run_cli("run", "--headless", "--settings", str(settings))
    assert again.returncode == 0, again.stderr[-2000:]


def test_garbage_without_a_newline_is_a_torn_tail_and_cut(finished_run: tuple[Path, Path]) -> None:
    settings, data = finished_run
    results = data / "raw_responses.jsonl"
    good = results.read_bytes()
    results.write_bytes(good + b"{garbage typed by hand, no newline")
    proc = run_cli("run", "--headless", "--settings", str(settings))
    assert proc.returncode == 0, proc.stderr
    assert results.read_bytes() == good
    events = [orjson.loads(x) for x in (settings.parent / "run" / "events.jsonl").read_bytes().splitlines()]
    assert any(e["event"] == "repaired" and e["file"] == "raw_responses.jsonl" for e in events)


def test_cli_verify_on_a_corrupt_attempt_journal_is_a_message(finished_run: tuple[Path, Path]) -> None:
    settings, data = finished_run
    journal = settings.parent / "run" / "attempts.jsonl"
    journal.write_bytes(journal.read_bytes() + b"garbage\n")
    proc = run_here("verify", "--settings", str(settings), str(data))
    assert_clean_failure(proc, 1, f"{journal} line ", "corrupt JSON")


# -- the readers directly -------------------------------------------------------------------------


def test_iter_jsonl_refuses_an_over_long_complete_line_without_holding_it(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    path.write_bytes(b'{"a":1}\n' + b"x" * 5000 + b"\n" + b'{"a":2}\n')
    it = iter_jsonl(path, max_line=1000)
    assert next(it) == (0, {"a": 1})
    with pytest.raises(CorruptLine, match="line 1: line longer than 1000 bytes"):
        next(it)
    # A long last line without its newline is a torn tail, however long: ignored.
    path.write_bytes(b'{"a":1}\n' + b"x" * 5000)
    assert list(iter_jsonl(path, max_line=1000)) == [(0, {"a": 1})]
    assert JSONL_MAX_LINE >= 16 * lines_mod.MAX_LINE_BYTES // 4


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        ({"rid": "A-00000000#0"}, "not an attempt record"),
        ({"k": "start", "rid": "A-00000000#0", "ds": "A", "line": 0, "reserved": "lots"}, "start record"),
        ({"k": "start", "rid": "A-00000000#0", "ds": "A", "reserved": "0.1"}, "start record"),
        ({"k": "end", "rid": "A-00000000#0", "cost": [1]}, "cost is not a number"),
        ({"k": "end", "rid": "A-00000000#0", "cost": "NaN"}, "cost is not a number"),
        ({"k": "end", "rid": "A-00000000#0", "provider": {"x": 1}}, "malformed provider"),
        ({"k": "gen", "rid": "A-00000000#0"}, "gen record"),
        ({"k": "reconciled", "rid": "A-00000000#0", "delta": True}, "delta is not a number"),
        ({"k": "end"}, "without a request id"),
    ],
)
def test_read_journals_names_the_bad_record(tmp_path: Path, record: dict[str, Any], problem: str) -> None:
    attempts = tmp_path / "attempts.jsonl"
    good = {"k": "start", "rid": "A-00000001#0", "ds": "A", "line": 1, "reserved": "0.01"}
    attempts.write_bytes(orjson.dumps(good) + b"\n" + orjson.dumps(record) + b"\n")
    with pytest.raises(RecoveryError, match=rf"attempts\.jsonl:2: .*{problem}"):
        read_journals(attempts, tmp_path / "events.jsonl")
    # A kind it does not know is passed over: journals may grow.
    attempts.write_bytes(orjson.dumps(good) + b"\n" + b'{"k": "hold", "s": 3}\n')
    assert read_journals(attempts, tmp_path / "events.jsonl").attempts == {"A": {1: 1}}


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ({"line": "3", "prompt_sha256": "x"}, "no line number"),
        ({"line": -1, "prompt_sha256": "x"}, "no line number"),
        ({"line": 3}, "no prompt_sha256"),
        ({"line": 3, "prompt_sha256": "x", "usage": "lots"}, "malformed usage"),
        ({"line": 3, "prompt_sha256": "x", "usage": {"completion_tokens": "9"}}, "malformed usage"),
        ({"line": 3, "prompt_sha256": "x", "cost": "free"}, "cost is not a number"),
        ({"line": 3, "prompt_sha256": "x", "status": 1}, "malformed status"),
    ],
)
def test_read_rows_names_the_bad_row(tmp_path: Path, row: dict[str, Any], problem: str) -> None:
    results = tmp_path / "raw_responses.jsonl"
    results.write_bytes(
        orjson.dumps({"line": 0, "prompt_sha256": "y", "status": "ok"}) + b"\n" + orjson.dumps(row) + b"\n"
    )
    with pytest.raises(RecoveryError, match=rf"raw_responses\.jsonl:2: .*{problem}"):
        read_rows(results, {3})


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(
                [
                    "k",
                    "rid",
                    "ds",
                    "line",
                    "reserved",
                    "gen",
                    "cost",
                    "est",
                    "delta",
                    "provider",
                    "outcome",
                    "ctok",
                    "event",
                ]
            ),
            st.one_of(
                st.none(),
                st.booleans(),
                st.integers(-3, 3),
                st.floats(),
                st.text(max_size=5),
                st.sampled_from(["start", "end", "gen", "reconciled", "exclude", "1e3"]),
            ),
        ),
        max_size=12,
    )
)
def test_read_journals_on_any_json_objects_reads_or_names_the_line(
    tmp_path_factory: pytest.TempPathFactory, records: list[dict[str, Any]]
) -> None:
    folder = tmp_path_factory.mktemp("journal")
    body = b"".join(json.dumps(r).encode() + b"\n" for r in records)  # json writes NaN as NaN
    (folder / "attempts.jsonl").write_bytes(body)
    (folder / "events.jsonl").write_bytes(body)
    try:
        read_journals(folder / "attempts.jsonl", folder / "events.jsonl")
    except RecoveryError as exc:
        assert "\n" not in str(exc) and ".jsonl:" in str(exc)


def test_the_seeded_garbage_generator_finds_no_crash(tmp_path: Path) -> None:
    """Random bytes appended to a real-looking results file: a message or a clean read, always."""
    rng = random.Random(20261101)
    good = b"".join(orjson.dumps({"line": i, "prompt_sha256": "s", "status": "ok"}) + b"\n" for i in range(5))
    results = tmp_path / "raw_responses.jsonl"
    for _ in range(300):
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
        results.write_bytes(good + junk + (b"\n" if rng.random() < 0.7 else b""))
        try:
            progress = read_rows(results)
        except RecoveryError as exc:
            assert "raw_responses.jsonl:6: " in str(exc)
        else:
            assert set(progress.done) >= set(range(5))
