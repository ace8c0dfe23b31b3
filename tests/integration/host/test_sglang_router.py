"""Two GPU hosts behind the real router (smg from PyPI): the run spreads over both, one worker is
killed mid-run, the router and regen take it out, and the job finishes on the other with every row once.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.datasets import read_rows, write_dataset
from tests.support.gpuhost import GpuHost, group_members, make_gpu_host, sim_state
from tests.support.processes import run_regen, start_headless_run, wait_rows
from tests.support.sshd import need_sshd

PROMPTS = [[{"role": "user", "content": f"question {i}: tell me about topic {i % 9}"}] for i in range(80)]
SLOW = {
    "record_ids": True,
    "decode_tokens_per_s": 40.0,
    "time_scale": 1.0,
    "startup_weights_s": 0.2,
    "startup_kv_pool_s": 0.1,
    "startup_cuda_graph_s": 0.1,
    "startup_http_s": 0.05,
    "startup_warmup_s": 0.05,
}


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[GpuHost, GpuHost]]:
    need_sshd()
    one = make_gpu_host(tmp_path / "gpu1")
    two = make_gpu_host(tmp_path / "gpu2")
    two.work = one.work  # one [sglang] work_dir for both hosts; the pid files differ by port
    two.model = one.model  # the same model on both, as the backend insists
    try:
        yield one, two
    finally:
        one.cleanup()
        two.cleanup()


def settings(one: GpuHost, two: GpuHost, tmp_path: Path, data: Path) -> Path:
    top = "\n".join(
        [
            "[openrouter]",
            "max_tokens = 64",
            "[tokenizer]",
            f'path = "{one.model}"',
            "[headless]",
            "status_interval_s = 0.5",
            "[job]",
            'backend = "sglang"',
            f"datasets = [{json.dumps(str(data))}]",
            f"run_dir = {json.dumps(str(tmp_path / 'run'))}",
            "concurrency = 24",
            "backoff_base_s = 0.05",
            "backoff_max_s = 0.5",
            "max_attempts = 10",
            "commit_interval_s = 0.002",
        ]
    )
    path = tmp_path / "settings.toml"
    path.write_text(
        one.settings_text(top=top, others=(("gpu2", two),), extra_sglang={"metrics_interval_s": 0.3})
    )
    return path


def test_two_workers_behind_the_router_one_killed_mid_run(
    pair: tuple[GpuHost, GpuHost], tmp_path: Path
) -> None:
    one, two = pair
    one.set_sim(**SLOW)
    data = write_dataset(tmp_path, "A", PROMPTS)
    conf = settings(one, two, tmp_path, data)
    started = run_regen("sglang", "start", "--settings", str(conf), timeout=180)
    assert started.returncode == 0, started.stderr + started.stdout
    assert "every host ready (2)" in started.stdout

    log = tmp_path / "job.log"
    job = start_headless_run(conf, log)
    try:
        wait_rows(data, 10, job, log)
        before = read_rows(data)
        served_two = {r["rid"]: r for r in sim_state(two)["requests"]}
        assert {r["provider"] for r in before} == {"gpu1", "gpu2"}  # round robin over both hosts
        # gpu2's server dies (its whole process group, as a crash takes it).
        record = json.loads((one.work / f"sglang-{two.port}.pid").read_text())
        os.killpg(record["pgid"], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while group_members(record["pgid"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert job.wait(240) == 0, log.read_text()[-3000:]
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    rows = read_rows(data)
    assert sorted(Counter(r["line"] for r in rows).items()) == [(i, 1) for i in range(len(PROMPTS))]
    served_one = {r["rid"]: r for r in sim_state(one)["requests"]}
    for row in rows:
        record_of = served_one if row["provider"] == "gpu1" else served_two
        assert row["provider"] in ("gpu1", "gpu2")
        served = record_of[row["generation_id"]]
        assert row["prompt_ids"] == served["prompt_ids"] and row["output_ids"] == served["output_ids"]
    late = [r for r in rows if r["line"] not in {b["line"] for b in before}]
    assert late and {r["provider"] for r in late[-20:]} == {"gpu1"}  # the rest went to the live worker
    summary = log.read_text()
    assert "gpu1:" in summary and "gpu2:" in summary  # the per-worker breakdown
    events = (tmp_path / "run" / "events.jsonl").read_text()
    # regen took the dead worker out of the router itself (and said so in the journal).
    out = [json.loads(e) for e in events.splitlines() if '"worker_out"' in e]
    assert [e["host"] for e in out] == ["gpu2"]
    # The router was the job's child, on loopback only: gone with it.
    (line,) = [
        x
        for x in (tmp_path / "run" / "router.log").read_text().splitlines()
        if x.startswith("regen: router pid")
    ]
    pid = int(line.split()[3].rstrip(":"))
    assert "--host 127.0.0.1" in line and "--prometheus-host 127.0.0.1" in line and "round_robin" in line
    assert not Path(f"/proc/{pid}").exists()
