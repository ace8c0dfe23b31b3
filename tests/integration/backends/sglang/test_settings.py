"""[sglang] and job.backend: what the SGLang backend needs from the settings, refused in one line."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest

from regen.engine.backends import make_backend
from regen.engine.backends.sglang.backend import SGLangBackend
from regen.engine.config.example import example_toml
from regen.engine.config.loading import SettingsError, load_settings
from regen.engine.config.settings import HostSettings, Settings, SGLangSettings, served_model_name
from tests.support.processes import ENV, regen_argv


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "settings.toml"
    path.write_text(text)
    return path


def test_the_defaults_and_the_example_file() -> None:
    settings = Settings()
    assert settings.job.backend == "openrouter"
    sglang = settings.sglang
    assert (sglang.port, sglang.tp, sglang.ready_timeout_s, sglang.urls) == (30000, 8, 2700.0, [])
    assert (sglang.healthy_queue_min, sglang.healthy_queue_max, sglang.healthy_kv_usage_max) == (
        100,
        2000,
        0.95,
    )
    example = tomllib.loads(example_toml())
    assert "served_model_name" not in example["sglang"] and example["job"]["backend"] == "openrouter"
    # Empty: the first host's model folder's name, whatever the other hosts' paths (one name for the job).
    hosts = [
        HostSettings(name=n, address="h", data_root="/d", model_path=p)
        for n, p in (("a", "/data/models/Kimi-K2.5/"), ("b", "/mnt/nvme/Kimi-K2.5-copy"))
    ]
    assert served_model_name(sglang, hosts) == "Kimi-K2.5" and served_model_name(sglang, []) is None
    named = SGLangSettings(served_model_name="kimi", launch_args=["--weight-version=v7"])
    assert served_model_name(named, hosts) == "kimi" and named.weight_version == "v7"
    assert sglang.weight_version == "default"


def test_sglang_needs_urls_and_a_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(write(tmp_path, '[job]\nbackend = "sglang"\n'))
    problems = info.value.problems
    assert len(problems) == 2
    assert problems[0].startswith(f"{tmp_path / 'settings.toml'}: sglang.urls: ")
    assert 'urls = ["http://127.0.0.1:30000"]' in problems[0]
    assert "tokenizer.path" in problems[1]
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    settings = load_settings(
        write(
            tmp_path,
            f'[job]\nbackend = "sglang"\n[sglang]\nurls = ["http://127.0.0.1:30000/"]\n'
            f'[tokenizer]\npath = "{tokenizer}"\n',
        )
    )
    assert settings.sglang.urls == ["http://127.0.0.1:30000"]
    assert isinstance(make_backend(settings), SGLangBackend)


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ('[sglang]\nurls = ["127.0.0.1:30000"]\n', "sglang.urls"),
        ('[sglang]\nurls = ["http://host:1/generate"]\n', "sglang.urls"),
        ("[sglang]\nhealthy_queue_min = 50\nhealthy_queue_max = 50\n", "sglang"),
        ('[job]\nbackend = "vllm"\n', "job.backend"),
        ("[sglang]\nhealthy_kv_usage_max = 1.5\n", "sglang.healthy_kv_usage_max"),
    ],
)
def test_bad_values_name_their_key(tmp_path: Path, body: str, key: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(write(tmp_path, body))
    [problem] = info.value.problems
    assert problem.startswith(f"{tmp_path / 'settings.toml'}: {key}: ")


def test_regen_run_refuses_the_settings_with_exit_code_2(tmp_path: Path) -> None:
    path = write(tmp_path, '[job]\nbackend = "sglang"\n[tokenizer]\npath = "tok"\n')
    done = subprocess.run(
        regen_argv("run", "--headless", "--settings", str(path)),
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "sglang.urls" in done.stderr and "Traceback" not in done.stderr


def test_regen_run_with_neither_a_host_nor_a_tokenizer_says_which_setting_and_command_in_one_line(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, '[job]\nbackend = "sglang"\n[sglang]\nurls = ["http://127.0.0.1:1"]\n')
    done = subprocess.run(
        regen_argv("run", "--headless", "--settings", str(path)),
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.startswith(f"regen: {path}: tokenizer.path: empty") and "regen pull" in line
    # The commands that fetch it or look at the hosts never ask for it (here they want [[hosts]]).
    for command in (["inspect"], ["pull"], ["push"], ["sglang", "status"]):
        other = subprocess.run(
            regen_argv(*command, "--settings", str(path)), env=ENV, capture_output=True, text=True, timeout=60
        )
        assert other.returncode == 2 and "tokenizer.path" not in other.stderr, (command, other.stderr)
        assert "no GPU hosts in the settings" in other.stderr
