"""regen verify and regen export on datasets built with real (small) tokenizers."""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from regen.cli import data as data_commands
from regen.cli.main import build_parser
from regen.engine.data.datasets import Dataset
from regen.engine.data.export import ExportError, export
from regen.engine.data.tokenizer import THINK_END, TargetTokenizer, TokenizerSpec
from regen.engine.data.verify import verify_dataset
from tests.support.processes import regen_in_process
from tests.support.tokenizers import (
    build_tokenizer,
    make_row,
    prompts_of,
    sample_conversations,
    write_prompts,
    write_rows,
)

N = 30


@pytest.fixture(scope="module")
def kimi_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "kimi", "kimi")


@pytest.fixture(scope="module")
def kimi(kimi_dir: Path) -> TargetTokenizer:
    return TargetTokenizer(TokenizerSpec(kimi_dir, template_kwargs={"thinking": True}))


def _variety(line: int) -> dict[str, Any]:
    """ok rows mostly, some truncated with and without content, some degenerate or empty."""
    if line % 7 == 3:
        return {"finish_reason": "length", "content": ""}
    if line % 7 == 5:
        return {"finish_reason": "length", "content": "partial answ"}
    if line % 11 == 4:
        return {"content": "!!!!!!!!!!!!"}
    return {"content": f"Answer {line}: 東京 😀\n\n- item"}


@pytest.fixture
def clean(tmp_path: Path, kimi: TargetTokenizer) -> Dataset:
    ds = write_prompts(tmp_path / "B1", sample_conversations(N))
    write_rows(ds, [make_row(p, tokenizer=kimi, **_variety(p.line)) for p in prompts_of(ds)])
    return ds


def _read_rows(ds: Dataset) -> list[dict[str, Any]]:
    return [json.loads(line) for line in ds.results_path.read_text().splitlines()]


def _rewrite(ds: Dataset, change: Callable[[list[dict[str, Any]]], None]) -> None:
    rows = _read_rows(ds)
    change(rows)
    write_rows(ds, rows)


@pytest.fixture(autouse=True)
def _no_settings_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Commands read ./settings.toml when present; tests run from an empty folder.
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)


# ---------------------------------------------------------------------------------------------
# verify


def test_clean_dataset_passes(clean: Dataset, kimi_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert regen_in_process("verify", str(clean.folder), "--tokenizer", str(kimi_dir)) == 0
    out = capsys.readouterr().out
    assert "B1: 30 rows" in out
    assert "violations: none" in out
    assert "degenerate_content" in out  # a flag, not a failure
    assert "verify: 1 dataset(s), no violations" in out


def test_clean_dataset_report(clean: Dataset, kimi: TargetTokenizer) -> None:
    report = verify_dataset(clean, kimi, check_prompts=True)
    assert not report.violations, report.examples
    assert report.rows == N and report.missing == 0
    assert report.ok + report.truncated == N
    assert report.decoded == N
    assert report.tokenizer_checked
    rows = _read_rows(clean)
    assert report.output_tokens == sum(len(r["output_ids"]) for r in rows)
    assert report.cost == pytest.approx(sum(r["cost"] for r in rows))
    assert report.flags["degenerate_content"] >= 1


def _dup(rows: list[dict[str, Any]]) -> None:
    rows.append(dict(rows[4]))


def _orphan(rows: list[dict[str, Any]]) -> None:
    extra = dict(rows[0])
    extra["line"] = N + 5
    extra["id"] = f"B1-{N + 5:08d}"
    rows.append(extra)


def _short_ids(rows: list[dict[str, Any]]) -> None:
    rows[2]["output_ids"] = rows[2]["output_ids"][:-3]


def _special_in_content(rows: list[dict[str, Any]]) -> None:
    rows[6]["content"] = "leaked <|im_end|> token"


def _status_pair(rows: list[dict[str, Any]]) -> None:
    rows[1]["status"] = "truncated"


def _no_terminator(rows: list[dict[str, Any]]) -> None:
    rows[8]["output_ids"] = rows[8]["output_ids"][:-1]
    rows[8]["num_output_tokens"] -= 1


def _text_changed(rows: list[dict[str, Any]]) -> None:
    rows[9]["content"] += " edited"


FAULTS: list[tuple[str, Callable[[list[dict[str, Any]]], None], str, int]] = [
    ("duplicate", _dup, "duplicate_row", N),
    ("orphan", _orphan, "orphan_row", N),
    ("short ids", _short_ids, "count_mismatch", 2),
    ("special string", _special_in_content, "special_in_text", 6),
    ("status/finish", _status_pair, "status_finish", 1),
    ("no terminator", _no_terminator, "no_terminator", 8),
    ("text changed", _text_changed, "decode_mismatch", 9),
]


@pytest.mark.parametrize(("name", "change", "rule", "row"), FAULTS, ids=[f[0] for f in FAULTS])
def test_planted_fault(
    name: str,
    change: Callable[[list[dict[str, Any]]], None],
    rule: str,
    row: int,
    clean: Dataset,
    kimi_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _rewrite(clean, change)
    assert regen_in_process("verify", str(clean.folder), "--tokenizer", str(kimi_dir)) == 1
    out = capsys.readouterr().out
    assert f"B1: raw_responses.jsonl line {row} " in out
    assert f": {rule}: " in out
    assert "verify: " in out and "B1" in out.splitlines()[-1]


def test_changed_prompt(clean: Dataset, kimi_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = clean.prompts_path.read_text().splitlines()
    lines[3] = json.dumps({"messages": [{"role": "user", "content": "a different question"}]})
    clean.prompts_path.write_text("\n".join(lines) + "\n")
    assert regen_in_process("verify", str(clean.folder), "--tokenizer", str(kimi_dir)) == 1
    out = capsys.readouterr().out
    assert "raw_responses.jsonl line 3 (prompt line 3): prompt_changed" in out


def test_think_end_twice_and_think_in_output(clean: Dataset, kimi: TargetTokenizer) -> None:
    rows = _read_rows(clean)
    ok = next(i for i, r in enumerate(rows) if r["status"] == "ok")
    ids = rows[ok]["output_ids"]
    rows[ok]["output_ids"] = [kimi.think_id, kimi.think_end_id, *ids]
    rows[ok]["num_output_tokens"] = len(rows[ok]["output_ids"])
    write_rows(clean, rows)
    report = verify_dataset(clean, kimi)
    assert set(report.violations) >= {"think_end_count", "think_in_output", "decode_mismatch"}


def test_prompt_ids_checks(clean: Dataset, kimi: TargetTokenizer) -> None:
    def tamper(rows: list[dict[str, Any]]) -> None:
        rows[0]["prompt_ids"] = rows[0]["prompt_ids"][:-1]
        rows[0]["num_prompt_tokens"] -= 1
        rows[1]["prompt_ids"] = [rows[1]["prompt_ids"][1], *rows[1]["prompt_ids"]]
        rows[1]["num_prompt_tokens"] += 1

    _rewrite(clean, tamper)
    assert set(verify_dataset(clean, kimi).violations) == {"prompt_suffix"}
    report = verify_dataset(clean, kimi, check_prompts=True)
    assert report.violations["prompt_render"] == 2


def test_mixed_tokenizers(clean: Dataset, kimi: TargetTokenizer) -> None:
    def mix(rows: list[dict[str, Any]]) -> None:
        rows[5]["tokenizer"]["files_sha256"]["tokenizer.json"] = "0" * 64

    _rewrite(clean, mix)
    report = verify_dataset(clean, kimi)
    assert set(report.violations) == {"mixed_tokenizers", "tokenizer_mismatch"}
    assert report.examples["mixed_tokenizers"][0].row == 5


def test_without_tokenizer_structure_still_checked(clean: Dataset) -> None:
    _rewrite(clean, _dup)
    report = verify_dataset(clean, None)
    assert set(report.violations) == {"duplicate_row"}
    assert report.decoded == 0
    assert any("no tokenizer" in n for n in report.notes)


def test_not_tokenized_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ds = write_prompts(tmp_path / "B2", sample_conversations(5))
    write_rows(ds, [make_row(p) for p in prompts_of(ds)])
    assert regen_in_process("verify", str(ds.folder)) == 0
    assert "not tokenized: 5" in capsys.readouterr().out
    assert regen_in_process("verify", str(ds.folder), "--require-ids") == 1
    assert ": not_tokenized: " in capsys.readouterr().out


def test_missing_rows_are_not_violations(clean: Dataset, kimi: TargetTokenizer) -> None:
    _rewrite(clean, lambda rows: rows.__delitem__(slice(10, None)))
    report = verify_dataset(clean, kimi)
    assert not report.violations
    assert report.missing == N - 10


def test_sglang_rows(tmp_path: Path, kimi: TargetTokenizer) -> None:
    ds = write_prompts(tmp_path / "S1", sample_conversations(6))
    rows = []
    for p in prompts_of(ds):
        finish = "length" if p.line == 2 else "stop"
        server = kimi.encode(f"reason {p.line}{THINK_END}answer {p.line}")
        if p.line == 2:
            server = kimi.encode("cut while thinking")
        if p.line == 4:
            server.append(kimi.end_of_turn_id)  # the server kept its stop token
        ids, appended, reasoning, content = kimi.keep_server_ids(server, finish)
        row = make_row(p, reasoning=reasoning, content=content, finish_reason=finish, tokenizer=kimi)
        row["backend"] = "sglang"
        row["cost"] = None  # GPU time, not dollars (docs/data-contract.md §3.2)
        row["gpu_s"] = 0.5
        row["output_ids"] = ids
        row["num_output_tokens"] = len(ids)
        row["terminator_appended"] = appended
        row["output_ids_source"] = "server"
        row["usage"] = {"prompt_tokens": len(row["prompt_ids"]), "completion_tokens": len(server)}
        rows.append(row)
    rows[5]["usage"]["completion_tokens"] = (rows[5]["usage"].get("completion_tokens") or 0) + 1
    write_rows(ds, rows)
    report = verify_dataset(ds, kimi)
    assert dict(report.violations) == {"server_count": 1}
    assert report.examples["server_count"][0].row == 5
    assert report.rows_without_cost == 6


def test_cost_against_journal(clean: Dataset, kimi_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = Path.cwd() / "regen-run"
    run_dir.mkdir()
    records = [{"k": "end", "rid": f"B1-{i:08d}#0", "cost": 0.0005} for i in range(N)]
    (run_dir / "attempts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert regen_in_process("verify", str(clean.folder)) == 1
    assert ": cost_exceeds_journal: " in capsys.readouterr().out
    records += [{"k": "end", "ds": "B1", "rid": "B1-00000000#1", "cost": 0.02}]
    (run_dir / "attempts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert regen_in_process("verify", str(clean.folder)) == 0


def test_verify_json(clean: Dataset, kimi_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _rewrite(clean, _dup)
    assert regen_in_process("verify", str(clean.folder), "--tokenizer", str(kimi_dir), "--json") == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False
    [ds] = out["datasets"]
    assert ds["violations"] == {"duplicate_row": 1}
    assert ds["examples"]["duplicate_row"][0]["row"] == N


def test_verify_datasets_from_settings(
    clean: Dataset, kimi_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Path.cwd() / "s.toml"
    settings.write_text(f'[job]\ndatasets = ["{clean.folder}"]\n[tokenizer]\npath = "{kimi_dir}"\n')
    assert regen_in_process("verify", "--settings", str(settings)) == 0
    assert "B1: 30 rows" in capsys.readouterr().out


def test_verify_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert regen_in_process("verify") == 2
    assert capsys.readouterr().err.startswith("regen: no datasets")
    assert regen_in_process("verify", str(tmp_path / "nope")) == 2
    err = capsys.readouterr().err
    assert err.startswith("regen: ") and "Traceback" not in err


def test_verify_bad_tokenizer_is_one_line(
    clean: Dataset, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert regen_in_process("verify", str(clean.folder), "--tokenizer", str(tmp_path / "none")) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tokenizer folder does not exist" in err


def test_run_ignores_other_commands() -> None:
    assert data_commands.run(argparse.Namespace(command="run")) is None


# ---------------------------------------------------------------------------------------------
# export


def _load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_specforge_export(clean: Dataset, capsys: pytest.CaptureFixture[str]) -> None:
    assert regen_in_process("export", str(clean.folder)) == 0
    out_path = clean.folder / "export.specforge.jsonl"
    records = _load(out_path)
    rows = {r["id"]: r for r in _read_rows(clean)}
    ok = [r for r in rows.values() if r["status"] == "ok"]
    assert len(records) == len(ok)
    for rec in records:
        row = rows[rec["id"]]
        assert rec["input_ids"] == row["prompt_ids"] + row["output_ids"]
        assert len(rec["loss_mask"]) == len(rec["input_ids"])
        assert rec["loss_mask"] == [0] * row["num_prompt_tokens"] + [1] * row["num_output_tokens"]
    out = capsys.readouterr().out
    assert f"B1: {len(ok)} of {N} rows written" in out
    assert "skipped by status: truncated" in out
    assert not [p for p in clean.folder.iterdir() if p.name.endswith(".tmp")]


def test_specforge_max_length_and_mask(clean: Dataset, tmp_path: Path) -> None:
    rows = _read_rows(clean)
    lengths = sorted(r["num_prompt_tokens"] + r["num_output_tokens"] for r in rows)
    limit = lengths[len(lengths) // 2]
    out = tmp_path / "sf.jsonl"
    [report] = export(
        [clean],
        "specforge",
        output=out,
        statuses=("ok", "truncated"),
        max_length=limit,
        mask_last_prompt_token=True,
    )
    records = _load(out)
    too_long = sum(1 for n in lengths if n > limit)
    assert report.dropped_too_long == too_long > 0
    assert report.written == len(records) == N - too_long
    by_id = {r["id"]: r for r in rows}
    for rec in records:
        row = by_id[rec["id"]]
        assert len(rec["input_ids"]) <= limit
        p = row["num_prompt_tokens"]
        assert rec["loss_mask"][: p - 1] == [0] * (p - 1)
        assert rec["loss_mask"][p - 1 :] == [1] * (row["num_output_tokens"] + 1)


def test_conversations_export(clean: Dataset, capsys: pytest.CaptureFixture[str]) -> None:
    assert regen_in_process("export", "--format", "conversations", str(clean.folder)) == 0
    assert "reasoning" in capsys.readouterr().err  # the §6 warning
    records = _load(clean.folder / "export.conversations.jsonl")
    rows = {r["id"]: r for r in _read_rows(clean)}
    prompts = {p.id: p for p in prompts_of(clean)}
    for rec in records:
        *messages, reply = rec["conversations"]
        assert messages == prompts[rec["id"]].messages
        row = rows[rec["id"]]
        assert reply == {
            "role": "assistant",
            "content": row["content"],
            "reasoning_content": row["reasoning"],
        }


def test_export_refuses_mixed_tokenizers_and_leaves_nothing(
    clean: Dataset, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def mix(rows: list[dict[str, Any]]) -> None:
        rows[-1]["tokenizer"]["files_sha256"]["tokenizer.json"] = "f" * 64

    _rewrite(clean, mix)
    target = tmp_path / "out" / "train.jsonl"
    assert (
        regen_in_process("export", str(clean.folder), "--status", "ok,truncated", "--output", str(target))
        == 1
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tokenizer files differ" in err
    assert not target.exists()
    assert list(target.parent.iterdir()) == []


def test_export_keeps_previous_file_on_failure(clean: Dataset) -> None:
    assert regen_in_process("export", str(clean.folder)) == 0
    path = clean.folder / "export.specforge.jsonl"
    before = path.read_bytes()
    _rewrite(clean, _dup)
    with pytest.raises(ExportError, match="second row for prompt line 4"):
        export([clean], "specforge", statuses=("ok", "truncated"))
    assert path.read_bytes() == before
    assert not [p for p in clean.folder.iterdir() if p.name.endswith(".tmp")]


def test_specforge_refuses_rows_without_ids(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ds = write_prompts(tmp_path / "B3", sample_conversations(3))
    write_rows(ds, [make_row(p) for p in prompts_of(ds)])
    assert regen_in_process("export", str(ds.folder)) == 1
    assert "no token ids" in capsys.readouterr().err
    assert not (ds.folder / "export.specforge.jsonl").exists()
    # Conversations need only text.
    assert regen_in_process("export", "--format", "conversations", str(ds.folder)) == 0


def test_export_usage(clean: Dataset, capsys: pytest.CaptureFixture[str]) -> None:
    assert regen_in_process("export", "--status", "ok,done", str(clean.folder)) == 2
    assert "unknown status done" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["export", "--max-length", "0", str(clean.folder)])
    assert exit_info.value.code == 2


def test_export_json_and_several_datasets(
    tmp_path: Path, kimi: TargetTokenizer, capsys: pytest.CaptureFixture[str]
) -> None:
    folders = []
    for name in ("A1", "A2"):
        ds = write_prompts(tmp_path / name, sample_conversations(4))
        write_rows(ds, [make_row(p, tokenizer=kimi) for p in prompts_of(ds)])
        folders.append(str(ds.folder))
    out = tmp_path / "all.jsonl"
    assert regen_in_process("export", *folders, "--output", str(out), "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    assert [d["written"] for d in summary["datasets"]] == [4, 4]
    assert {r["id"][:2] for r in _load(out)} == {"A1", "A2"}


def test_thinking_rows_against_a_tokenizer_without_think(clean: Dataset, tmp_path: Path) -> None:
    folder = build_tokenizer(tmp_path / "chatml", "chatml")
    tok = TargetTokenizer(TokenizerSpec(folder, template_kwargs={"thinking": False}))
    report = verify_dataset(clean, tok)
    # Different tokenizer files: reported once per dataset, ids not checked against it.
    assert dict(report.violations) == {"tokenizer_mismatch": 1}
    assert report.decoded == 0


def test_chatml_dataset_round_trip(tmp_path: Path) -> None:
    folder = build_tokenizer(tmp_path / "chatml", "chatml")
    tok = TargetTokenizer(TokenizerSpec(folder, template_kwargs={"thinking": False}))
    ds = write_prompts(tmp_path / "C1", sample_conversations(8))
    write_rows(ds, [make_row(p, tokenizer=tok, reasoning="") for p in prompts_of(ds)])
    report = verify_dataset(ds, tok, check_prompts=True)
    assert not report.violations, report.examples
    [exported] = export([ds], "specforge")
    assert exported.written == 8
    shutil.rmtree(folder)


def test_verify_refuses_kimis_shape_in_one_line_without_trust_or_with_a_bad_tiktoken_model(
    clean: Dataset, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/data-contract.md §9: the setting and the file named; a tiktoken.model's file and line."""
    from tests.support.tiktoken_model import build_tiktoken_tokenizer

    folder = build_tiktoken_tokenizer(tmp_path / "Kimi-K2.5")
    assert regen_in_process("verify", str(clean.folder), "--tokenizer", str(folder)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "runs tokenization_kimi.py" in err
    assert "set tokenizer.trust_remote_code = true" in err
    lines = (folder / "tiktoken.model").read_text().splitlines()
    lines[56] = "not-a-rank-line"
    (folder / "tiktoken.model").write_text("\n".join(lines) + "\n")
    (tmp_path / "settings.toml").write_text("[tokenizer]\ntrust_remote_code = true\n")
    argv = [
        "verify",
        "--settings",
        str(tmp_path / "settings.toml"),
        str(clean.folder),
        "--tokenizer",
        str(folder),
    ]
    assert regen_in_process(*argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{folder / 'tiktoken.model'}:57: expected 'base64-token rank'" in err
