"""A run on SGLang reached only through [[hosts]]: the job opens a tunnel over the host's SSH
connection, the rows carry the server's own ids, and a dropped tunnel or a killed job costs no row.

The server is the stand-in launcher started by `regen sglang start` over a real sshd on loopback; its
own record of what it received and generated (`record_ids`) is what rows are compared with.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from regen.engine.backends.sglang.audit import fleet_answers
from regen.engine.config.loading import load_settings
from regen.engine.data.datasets import Dataset
from regen.engine.data.scan import iter_prompts
from regen.engine.data.tokenizer import TargetTokenizer
from tests.support.datasets import read_rows, write_dataset
from tests.support.gpuhost import GpuHost, sim_state
from tests.support.processes import run_regen, start_headless_run, wait_rows

PROMPTS = [[{"role": "user", "content": f"question {i}: tell me about topic {i % 9}"}] for i in range(60)]


def run_settings(host: GpuHost, tmp_path: Path, datasets: list[Path], **job: Any) -> Path:
    job_lines = {
        "backend": "sglang",
        "datasets": [str(d) for d in datasets],
        "run_dir": str(tmp_path / "run"),
        "concurrency": 16,
        "backoff_base_s": 0.05,
        "backoff_max_s": 0.5,
        "commit_interval_s": 0.002,
        **job,
    }
    top = "\n".join(
        [
            "[openrouter]",
            "max_tokens = 64",
            "[tokenizer]",
            f'path = "{host.model}"',
            "[headless]",
            "status_interval_s = 0.5",
            "[job]",
            *(f"{k} = {json.dumps(v)}" for k, v in job_lines.items()),
        ]
    )
    path = tmp_path / "settings.toml"
    path.write_text(host.settings_text(top=top, extra_sglang={"metrics_interval_s": 0.3}))
    return path


def started(host: GpuHost, conf: Path) -> None:
    done = run_regen("sglang", "start", "--settings", str(conf), timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout


def check_rows(host: GpuHost, data: Path) -> list[dict[str, Any]]:
    """One row per prompt, each carrying exactly the ids the server received and generated for its rid."""
    rows = read_rows(data)
    assert sorted(Counter(r["line"] for r in rows).items()) == [(i, 1) for i in range(len(PROMPTS))]
    served = {r["rid"]: r for r in sim_state(host)["requests"]}
    for row in rows:
        record = served[row["generation_id"]]
        assert row["prompt_ids"] == record["prompt_ids"]
        assert row["output_ids"] == record["output_ids"]
        assert row["native_finish_reason"] == record["finish_reason"]
        assert row["output_ids_source"] == "server" and row["backend"] == "sglang"
        assert row["provider"] == "gpu1"  # the worker is named by its host, not the tunnel's local port
        assert row["server"]["version"] == "0.5.23"
    return rows


def test_a_run_through_the_tunnel_carries_the_servers_ids(host: GpuHost, tmp_path: Path) -> None:
    host.set_sim(record_ids=True)
    data = write_dataset(tmp_path, "A", PROMPTS)
    conf = run_settings(host, tmp_path, [data])
    started(host, conf)
    run = run_regen("run", "--headless", "--settings", str(conf), timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    check_rows(host, data)
    # Nothing of the run is left on this machine's ports: the tunnel closed with the job.
    assert host.sshd.sessions() == []
    # The canary audit asks the same server alone, through tunnels of its own (docs/fidelity.md).
    settings = load_settings(conf, "run")
    assert settings.tokenizer.path is not None
    encode = TargetTokenizer.from_settings(settings.tokenizer, path=settings.tokenizer.path).encode
    prompts = list(iter_prompts(Dataset("A", data)))[:3]
    answers = asyncio.run(fleet_answers(settings, prompts, 16, encode))
    assert list(answers) == ["sglang gpu1"], "named by its host, not the tunnel's local port"
    assert all(ids for ids in answers["sglang gpu1"]), answers
    assert host.sshd.sessions() == []


def test_sigkill_of_the_job_then_resume(host: GpuHost, tmp_path: Path) -> None:
    # Slow enough that requests are in flight when the job dies.
    host.set_sim(
        record_ids=True,
        decode_tokens_per_s=40.0,
        time_scale=1.0,
        startup_weights_s=0.2,
        startup_kv_pool_s=0.1,
        startup_cuda_graph_s=0.1,
        startup_http_s=0.05,
        startup_warmup_s=0.05,
    )
    data = write_dataset(tmp_path, "A", PROMPTS)
    conf = run_settings(host, tmp_path, [data])
    started(host, conf)
    log = tmp_path / "job1.log"
    job = start_headless_run(conf, log)
    wait_rows(data, 5, job, log)
    job.send_signal(signal.SIGKILL)
    job.wait(10)
    # The job died with requests in flight: the server still runs them, or has aborted them when
    # the tunnel's connection closed (either is what a GPU host would see).
    state = sim_state(host)
    assert set(state["live_rids"]) | set(state["aborted_rids"])
    again = run_regen("run", "--headless", "--settings", str(conf), timeout=240)
    assert again.returncode == 0, again.stderr[-3000:]
    check_rows(host, data)


def test_the_tunnel_dropped_mid_run(host: GpuHost, tmp_path: Path) -> None:
    host.set_sim(
        record_ids=True,
        decode_tokens_per_s=40.0,
        time_scale=1.0,
        startup_weights_s=0.2,
        startup_kv_pool_s=0.1,
        startup_cuda_graph_s=0.1,
        startup_http_s=0.05,
        startup_warmup_s=0.05,
    )
    data = write_dataset(tmp_path, "A", PROMPTS)
    conf = run_settings(host, tmp_path, [data], max_attempts=8)
    started(host, conf)
    log = tmp_path / "job.log"
    job = start_headless_run(conf, log)
    try:
        wait_rows(data, 5, job, log)
        live_before = set(sim_state(host)["live_rids"])
        assert live_before
        # The host goes away under the run: every SSH connection (the job's one) is cut.
        assert host.sshd.kill_sessions() >= 1
        assert job.wait(180) == 0, log.read_text()[-3000:]
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    rows = check_rows(host, data)
    assert any(r["timing"]["attempts"] > 1 for r in rows)  # the cut ones were sent again
    assert "outage" in (tmp_path / "run" / "events.jsonl").read_text()
    state = sim_state(host)
    # The cut requests' rids were aborted on the server once the tunnel was back (a cut stream may
    # still be generating there), and every prompt still got exactly one row. A request cut on its way
    # may never have reached the server, so what counts is that only attempts the job sent and that
    # made no row are aborted, and that the ones the server was running when the drop came are among them.
    aborted = {rid for rid in state["abort_requests"] if rid}
    journal = [orjson.loads(line) for line in (tmp_path / "run" / "attempts.jsonl").read_bytes().splitlines()]
    sent = {rec["rid"] for rec in journal if rec["k"] == "start"}
    made_rows = {r["generation_id"] for r in rows}
    assert aborted and aborted <= sent - made_rows
    assert live_before - made_rows <= aborted | set(state["aborted_rids"])
    assert os.path.exists(data / "raw_responses.jsonl")
