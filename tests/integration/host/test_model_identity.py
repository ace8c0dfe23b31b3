"""One model by content, not by path (engine/host/identity.py): two hosts whose model folders hold the same
files at different paths are one model, launched under one served name, with the digest in every row and
in `regen inspect`; two hosts whose files differ are refused before anything is launched, naming both
hosts and the first file that differs.

Two real sshds on loopback, each a "GPU host" with the stand-in SGLang launcher and its model folder at
a path of its own (tests/support/gpuhost.py); the run goes through the real router (smg).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from regen.engine.host.scripts.identity import digest, first_difference, survey
from tests.support.datasets import read_rows, write_dataset
from tests.support.gpuhost import GpuHost, make_gpu_host
from tests.support.processes import run_regen
from tests.support.sglang_sim import model_folder
from tests.support.sshd import need_sshd

PROMPTS = [[{"role": "user", "content": f"question {i}: tell me about topic {i % 5}"}] for i in range(24)]


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[GpuHost, GpuHost]]:
    need_sshd()
    one = make_gpu_host(tmp_path / "gpu1")
    two = make_gpu_host(tmp_path / "gpu2")
    # The same files, mounted at another path on the second host.
    two.model = model_folder(tmp_path / "gpu2" / "mnt" / "nvme" / "Kimi-K2.5")
    two.work = one.work  # one [sglang] work_dir for both; the pid files differ by port
    try:
        yield one, two
    finally:
        one.cleanup()
        two.cleanup()


def settings(one: GpuHost, two: GpuHost, tmp_path: Path, data: Path) -> Path:
    top = "\n".join(
        [
            "[openrouter]",
            "max_tokens = 32",
            "[tokenizer]",
            f"path = {json.dumps(str(one.model))}",
            "[job]",
            'backend = "sglang"',
            f"datasets = [{json.dumps(str(data))}]",
            f"run_dir = {json.dumps(str(tmp_path / 'run'))}",
            "concurrency = 8",
            "backoff_base_s = 0.05",
            "commit_interval_s = 0.002",
        ]
    )
    path = tmp_path / "settings.toml"
    path.write_text(one.settings_text(top=top, others=(("gpu2", two),)))
    return path


def test_the_same_files_at_different_paths_are_one_model_under_one_served_name(
    pair: tuple[GpuHost, GpuHost], tmp_path: Path
) -> None:
    one, two = pair
    assert one.model != two.model
    data = write_dataset(tmp_path, "A", PROMPTS)
    conf = settings(one, two, tmp_path, data)
    inspect = run_regen("inspect", "--json", "--settings", str(conf), timeout=120)
    assert inspect.returncode == 0, inspect.stderr
    digests = {h["name"]: h["model_digest"] for h in json.loads(inspect.stdout)["hosts"]}
    assert digests["gpu1"] == digests["gpu2"] and digests["gpu1"].startswith("sha256:")
    text = run_regen("inspect", "--settings", str(conf), timeout=120)
    assert text.stdout.count(f"model digest {digests['gpu1']}") == 2 and "different models" not in text.stdout

    started = run_regen("sglang", "start", "--settings", str(conf), timeout=180)
    assert started.returncode == 0, started.stderr + started.stdout
    assert f"model {digests['gpu1']} on gpu1, gpu2" in started.stdout
    status = run_regen("sglang", "status", "--json", "--settings", str(conf), timeout=120)
    served = {h["host"]: h["served_model_name"] for h in json.loads(status.stdout)["hosts"]}
    assert served == {"gpu1": "Kimi-K2.5", "gpu2": "Kimi-K2.5"}  # the model folder's name, on both

    run = run_regen("run", "--headless", "--settings", str(conf), timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = read_rows(data)
    assert len(rows) == len(PROMPTS)
    assert {r["provider"] for r in rows} == {"gpu1", "gpu2"}
    assert {r["model"] for r in rows} == {"Kimi-K2.5"} and {r["served_model"] for r in rows} == {"Kimi-K2.5"}
    assert {r["server"]["model_digest"] for r in rows} == {digests["gpu1"]}


def test_different_files_are_refused_before_any_launch_naming_both_hosts_and_the_file(
    pair: tuple[GpuHost, GpuHost], tmp_path: Path
) -> None:
    one, two = pair
    config = json.loads((two.model / "config.json").read_text())
    (two.model / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    data = write_dataset(tmp_path, "A", PROMPTS)
    conf = settings(one, two, tmp_path, data)
    started = run_regen("sglang", "start", "--settings", str(conf), timeout=180)
    assert started.returncode == 1
    [line] = [x for x in started.stderr.splitlines() if "different models" in x]
    assert "gpu1 and gpu2 hold different models: config.json differs" in line
    assert str(one.model) in line and str(two.model) in line and "nothing was launched" in line
    assert one.record() is None and not list(one.work.glob("sglang-*.pid")), "nothing launched on any host"
    inspect = run_regen("inspect", "--settings", str(conf), timeout=120)
    assert "note: gpu1 and gpu2 hold different models: config.json differs" in inspect.stdout


def test_the_identity_names_the_first_file_that_differs_and_ignores_the_path(tmp_path: Path) -> None:
    a = survey(str(model_folder(tmp_path / "a" / "Kimi")))
    b = survey(str(model_folder(tmp_path / "b" / "elsewhere" / "Kimi")))
    assert a["path"] != b["path"] and digest(a["items"]) == digest(b["items"])
    assert first_difference(a["items"], b["items"]) is None
    (tmp_path / "b" / "elsewhere" / "Kimi" / "model-00001-of-00002.safetensors").write_bytes(b"x" * 10)
    (tmp_path / "b" / "elsewhere" / "Kimi" / "tokenizer_config.json").write_text("{}")
    c = survey(str(tmp_path / "b" / "elsewhere" / "Kimi"))
    assert digest(c["items"]) != digest(a["items"])
    name, mine, theirs = first_difference(a["items"], c["items"]) or ("", None, None)
    assert name == "tokenizer_config.json" and mine != theirs
    (tmp_path / "b" / "elsewhere" / "Kimi" / "tokenizer_config.json").write_bytes(
        (tmp_path / "a" / "Kimi" / "tokenizer_config.json").read_bytes()
    )
    weights = first_difference(a["items"], survey(str(tmp_path / "b" / "elsewhere" / "Kimi"))["items"])
    assert weights == ("model-00001-of-00002.safetensors", None, "bytes:10")


async def test_the_consoles_start_refuses_different_models_before_launching_on_any_host(
    pair: tuple[GpuHost, GpuHost], tmp_path: Path
) -> None:
    from regen.engine.config.loading import load_settings
    from regen.engine.host.monitor import HostMonitor

    one, two = pair
    (two.model / "tokenizer_config.json").write_text("{}")
    conf = settings(one, two, tmp_path, write_dataset(tmp_path, "A", PROMPTS))
    loaded = load_settings(conf)
    monitor = HostMonitor(loaded.hosts, inspect_at_start=False, sglang=loaded.sglang)
    monitor.start()
    try:
        assert monitor.sglang_action("start", None) == "starting SGLang on gpu1, gpu2"
        deadline = asyncio.get_running_loop().time() + 120
        while any(v["sglang_action"]["state"] == "running" for v in monitor.view()):  # type: ignore[index]
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.1)
        for view in monitor.view():
            action = view["sglang_action"]
            assert action is not None and action["state"] == "failed"
            assert "gpu1 and gpu2 hold different models: tokenizer_config.json differs" in str(
                action["message"]
            )
            assert "nothing was launched" in str(action["message"])
    finally:
        await monitor.close()
    assert not list(one.work.glob("sglang-*.pid")), "nothing launched on any host"
