"""Settings: file, environment, the API key, and errors that name the key and the file."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from regen.engine.config.example import example_toml
from regen.engine.config.loading import SettingsError, load_settings
from regen.engine.config.settings import Settings
from tests.support.processes import ROOT


def test_example_file_is_generated_from_the_docstrings() -> None:
    assert (ROOT / "settings.example.toml").read_text() == example_toml(), (
        "settings.example.toml is stale: regenerate it with "
        "python -c 'from regen.engine.config.example import example_toml; print(example_toml(), end=\"\")'"
    )


def test_example_file_loads_to_the_defaults() -> None:
    data = tomllib.loads((ROOT / "settings.example.toml").read_text())
    assert Settings(**data).model_dump() == Settings().model_dump()


def test_file_then_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.toml"
    path.write_text('[job]\nconcurrency = 300\nbudget_usd = 12.5\ndatasets = ["data/B1"]\n')
    monkeypatch.setenv("REGEN_JOB__CONCURRENCY", "400")
    settings = load_settings(path)
    assert settings.job.concurrency == 400
    assert settings.job.budget_usd == 12.5
    assert settings.job.datasets == [tmp_path / "data" / "B1"], "relative to the settings file"


def test_openrouter_api_key_env_is_honoured_and_kept_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-test-secret-value-123")
    settings = load_settings(None)
    assert settings.openrouter.api_key is not None
    assert settings.openrouter.api_key.get_secret_value() == "sk-test-secret-value-123"
    assert "sk-test-secret-value-123" not in repr(settings)
    assert "sk-test-secret-value-123" not in settings.model_dump_json()


def test_bad_values_name_key_and_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[job]\nconcurrency = -5\nbudget = 3\n[openrouter]\nstream = "maybe"\n')
    with pytest.raises(SettingsError) as info:
        load_settings(path)
    problems = info.value.problems
    assert len(problems) == 3
    assert all(p.startswith(f"{path}: ") for p in problems)
    joined = "\n".join(problems)
    assert "job.concurrency" in joined and "job.budget" in joined and "openrouter.stream" in joined


def test_bad_environment_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGEN_JOB__CONCURRENCY", "lots")
    with pytest.raises(SettingsError) as info:
        load_settings(None)
    assert info.value.problems[0].startswith("environment REGEN_JOB__CONCURRENCY: job.concurrency:")


def test_key_never_echoed_in_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        '[openrouter]\napi_key = "sk-or-v1-' + "thisisnotarealkeybutlookslikeone" + '"\nmodell = "x"\n'
    )
    with pytest.raises(SettingsError) as info:
        load_settings(path)
    assert "thisisnotarealkey" not in str(info.value)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("[job\nconcurrency = 1\n", "not valid TOML"),
        (None, "settings file not found"),
    ],
)
def test_unreadable_file(tmp_path: Path, content: str | None, expected: str) -> None:
    path = tmp_path / "s.toml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SettingsError, match=expected):
        load_settings(path)


def test_cli_bad_settings_exit_2_one_line_per_problem_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[job]\nconcurrency = 0\nmax_attempts = 0\n")
    proc = subprocess.run(
        [sys.executable, "-m", "regen.cli.main", "run", "--headless", "--settings", str(path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "src")},
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2
    assert all(str(path) in line for line in lines)
    assert "Traceback" not in proc.stderr
