"""The job with a tokenizer: rows carry token ids, `regen verify` passes, `regen export` loads back."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from regen.engine.config.settings import Settings, TokenizerSettings
from regen.engine.data.tokenizer import TargetTokenizer
from regen.engine.job.job import Job, JobError, StopReason
from regen.sim.openrouter.server import OpenRouterSim
from tests.support.datasets import read_rows, write_dataset
from tests.support.processes import ENV, regen_argv
from tests.support.tiktoken_model import build_tiktoken_tokenizer
from tests.support.tokenizers import build_tokenizer


@pytest.fixture(scope="module")
def kimi_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "kimi", "kimi")


# Kimi's shape as a tokenizer.json, and as Kimi ships it: tiktoken.model and remote code
# (tests/support/tiktoken_model.py), loaded with trust_remote_code.
@pytest.fixture(scope="module", params=["json", "tiktoken"])
def any_kimi(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if request.param == "tiktoken":
        return build_tiktoken_tokenizer(tmp_path_factory.mktemp("tok") / "kimi-tiktoken")
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "kimi", "kimi")


async def test_rows_carry_ids_that_verify_and_export(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings], any_kimi: Path
) -> None:
    kimi_folder = any_kimi
    remote = (kimi_folder / "tiktoken.model").is_file()
    sim.config.max_completion_tokens = 90  # max_tokens 64: some rows end truncated
    a = write_dataset(tmp_path, "A", 40)
    settings = make_settings(sim.base_url, [a])
    settings.tokenizer = TokenizerSettings(
        path=kimi_folder, name="test/kimi-shaped", workers=1, trust_remote_code=remote
    )
    job = Job(settings)
    await job.prepare()
    outcome = await job.run()
    assert outcome.reason is StopReason.DONE
    rows = read_rows(a)
    assert len(rows) == 40
    tokenizer = TargetTokenizer.from_settings(settings.tokenizer)
    for row in rows:
        assert row["output_ids_source"] == "retokenized" and row["prompt_ids"] and row["output_ids"]
        assert row["num_output_tokens"] == len(row["output_ids"])
        assert row["tokenizer"]["name"] == "test/kimi-shaped"
        if row["status"] == "ok":
            assert row["output_ids"][-1] == tokenizer.end_of_turn_id and row["terminator_appended"]
            assert row["output_ids"].count(tokenizer.think_end_id) == 1
            # The retokenized ids decode back to the row's text (docs/data-contract.md §4.8).
            text = row["reasoning"] + "</think>" + row["content"] + "<|im_end|>"
            assert tokenizer.decode(row["output_ids"]) == text
        line = row["line"]
        messages = [{"role": "user", "content": f"A question {line}: explain topic {line % 17}."}]
        rendered = tokenizer._tok.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True, thinking=True
        )
        assert row["prompt_ids"] == list(rendered), "apply_chat_template's own ids"
    settings_path = tmp_path / "settings.toml"
    trust = "true" if remote else "false"
    settings_path.write_text(
        f'[tokenizer]\npath = "{kimi_folder}"\ntrust_remote_code = {trust}\n[job]\nrun_dir = "{tmp_path / "run"}"\n'
    )
    verified = subprocess.run(
        regen_argv("verify", "--settings", str(settings_path), "--require-ids", "--json", str(a)),
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verified.returncode == 0, verified.stdout[-2000:] + verified.stderr[-2000:]
    exported = subprocess.run(
        regen_argv("export", "--format", "specforge", "--settings", str(settings_path), str(a)),
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert exported.returncode == 0, exported.stderr
    lines = [orjson.loads(x) for x in (a / "export.specforge.jsonl").read_bytes().splitlines()]
    ok_rows = {r["id"]: r for r in rows if r["status"] == "ok"}
    assert len(lines) == len(ok_rows) > 0
    for line in lines:
        row = ok_rows[line["id"]]
        assert line["input_ids"] == row["prompt_ids"] + row["output_ids"]
        assert line["loss_mask"] == [0] * len(row["prompt_ids"]) + [1] * len(row["output_ids"])
    # A planted fault is caught by the same command.
    broken = [json.dumps(r) for r in rows] + [json.dumps(rows[0])]
    (a / "raw_responses.jsonl").write_text("\n".join(broken) + "\n")
    caught = subprocess.run(
        regen_argv("verify", "--settings", str(settings_path), str(a)),
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert caught.returncode == 1 and "duplicate" in caught.stdout + caught.stderr


async def test_a_thinking_mismatch_is_refused_at_start(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings], kimi_folder: Path
) -> None:
    a = write_dataset(tmp_path, "A", 2)
    settings = make_settings(sim.base_url, [a])
    settings.tokenizer = TokenizerSettings(path=kimi_folder, thinking=False)
    with pytest.raises(JobError, match=r"tokenizer\.thinking is false but requests ask for reasoning"):
        await Job(settings).prepare()


async def test_a_missing_tokenizer_folder_is_a_clear_error(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    a = write_dataset(tmp_path, "A", 2)
    settings = make_settings(sim.base_url, [a])
    settings.tokenizer = TokenizerSettings(path=tmp_path / "nowhere")
    with pytest.raises(JobError, match="nowhere"):
        await Job(settings).prepare()
    assert not (a / "raw_responses.jsonl").exists()


async def test_kimis_shape_without_trust_is_refused_at_start_naming_the_setting_and_the_file(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    a = write_dataset(tmp_path, "A", 2)
    settings = make_settings(sim.base_url, [a])
    folder = build_tiktoken_tokenizer(tmp_path / "Kimi-K2.5")
    settings.tokenizer = TokenizerSettings(path=folder)
    with pytest.raises(JobError) as err:
        await Job(settings).prepare()
    message = str(err.value)
    assert "tokenization_kimi.py" in message and "tokenizer.trust_remote_code = true" in message
    assert "\n" not in message and not (a / "raw_responses.jsonl").exists()
