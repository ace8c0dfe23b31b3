"""Each command checks only what it uses of the settings (engine/config/needs.py): on an SGLang job with
[[hosts]] and no tokenizer, inspect, pull and `sglang start|status|stop` go ahead, and `regen run`
fetches the tokenizer from the host's model folder itself, says so in one line, and runs.

The host is a real sshd on loopback with the stand-in SGLang launcher (tests/support/gpuhost.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.datasets import read_rows, write_dataset
from tests.support.gpuhost import GpuHost
from tests.support.processes import run_regen

PROMPTS = [[{"role": "user", "content": f"question {i}"}] for i in range(12)]


def no_tokenizer_settings(host: GpuHost, tmp_path: Path, job: list[str]) -> Path:
    """An SGLang job on `host` with no [tokenizer] section at all."""
    top = "\n".join(
        [
            "[openrouter]",
            "max_tokens = 32",
            "[headless]",
            "status_interval_s = 0.5",
            "[job]",
            f"run_dir = {json.dumps(str(tmp_path / 'run'))}",
            "concurrency = 8",
            "backoff_base_s = 0.05",
            "commit_interval_s = 0.002",
            *job,
        ]
    )
    path = tmp_path / "settings.toml"
    path.write_text(host.settings_text(top=top))
    return path


def test_inspect_pull_and_sglang_need_no_tokenizer_on_an_sglang_job(host: GpuHost, tmp_path: Path) -> None:
    conf = no_tokenizer_settings(host, tmp_path, ['backends = ["sglang", "openrouter"]'])
    inspect = run_regen("inspect", "--settings", str(conf), timeout=120)
    assert inspect.returncode == 0, inspect.stderr
    assert "tokenizer.path" not in inspect.stderr
    started = run_regen("sglang", "start", "--settings", str(conf), timeout=180)
    assert started.returncode == 0, started.stderr + started.stdout
    status = run_regen("sglang", "status", "--settings", str(conf), timeout=120)
    assert status.returncode == 0 and "ready" in status.stdout, status.stderr + status.stdout
    pulled = run_regen("pull", "--settings", str(conf), timeout=120)
    assert pulled.returncode == 0, pulled.stderr
    assert (tmp_path / "regen-data" / "tokenizer" / "tokenizer_config.json").is_file()
    stopped = run_regen("sglang", "stop", "--settings", str(conf), timeout=120)
    assert stopped.returncode == 0 and "nothing of its process group is left" in stopped.stdout, (
        stopped.stderr
    )


def test_a_run_with_hosts_and_no_tokenizer_fetches_it_from_the_host_and_says_so(
    host: GpuHost, tmp_path: Path
) -> None:
    data = write_dataset(tmp_path, "A", PROMPTS)
    conf = no_tokenizer_settings(
        host, tmp_path, ['backend = "sglang"', f"datasets = [{json.dumps(str(data))}]"]
    )
    started = run_regen("sglang", "start", "--settings", str(conf), timeout=180)
    assert started.returncode == 0, started.stderr + started.stdout
    run = run_regen("run", "--headless", "--settings", str(conf), timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    [said] = [line for line in run.stderr.splitlines() if "tokenizer" in line and "fetched" in line]
    folder = tmp_path / "regen-data" / "tokenizer"
    assert "gpu1's model folder" in said and str(folder) in said and "sha256-verified" in said
    # The files are the host's, byte for byte.
    for name in ("tokenizer_config.json", "config.json"):
        assert (folder / name).read_bytes() == (host.model / name).read_bytes()
    rows = read_rows(data)
    assert len(rows) == len(PROMPTS) and all(r["prompt_ids"] and r["output_ids"] for r in rows)
    # A second run finds them there: nothing fetched, nothing said.
    again = run_regen("run", "--headless", "--settings", str(conf), timeout=180)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "fetched" not in again.stderr
