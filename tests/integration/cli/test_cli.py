"""The `regen` command as operators run it: real processes, real signals, a simulator in its own process."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
import urllib.request
from collections import Counter
from decimal import Decimal
from pathlib import Path

import orjson
import pytest

from regen.engine.data.datasets import Dataset
from regen.engine.data.jsonl import iter_jsonl
from regen.engine.data.scan import scan
from regen.engine.run.checkpoint import CHECKPOINTS_DIR, Checkpointer, Lane
from regen.engine.run.recovery import read_journals
from regen.engine.run.runlock import holder
from regen.engine.run.segments import history
from tests.support.datasets import read_rows, write_dataset
from tests.support.openrouter_sim import SECRET
from tests.support.processes import (
    ENV,
    kill_at_random_moments,
    regen_argv,
    regen_captured,
    settings_file,
    wait_for_attempts,
)


def test_sigkill_at_random_moments_then_resume_loses_and_duplicates_nothing(
    sim_process: str, tmp_path: Path
) -> None:
    data = [write_dataset(tmp_path, "A", 1500), write_dataset(tmp_path, "B", 500)]
    # A checkpoint every second: kills land between checkpoints, and each start reads on from the
    # last one; the journal rotated at 40 KB, by checkpoints while running and by starts, so kills
    # land around rotations too (docs/faults.md, "Checkpoints").
    settings = settings_file(
        tmp_path, sim_process, data, concurrency=32, max_attempts=20, checkpoint_interval_s=1,
        journal_segment_mb=0.04,
    )  # fmt: skip
    env = {**ENV, "OPENROUTER_API_KEY": "sk-sim-test"}
    kills = kill_at_random_moments(settings, env, random.Random(11), 4, 0.8, 2.5)
    assert kills >= 2, "the job finished too fast to be killed"
    checkpoints = tmp_path / "run" / CHECKPOINTS_DIR
    written = max(int(p.stem) for p in checkpoints.glob("*.ckpt"))
    assert written > 4, "besides one at each start, the killed runs checkpointed while running"
    final = subprocess.run(
        regen_argv("run", "--headless", "--settings", str(settings)),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert final.returncode == 0, final.stdout[-2000:] + final.stderr[-2000:]
    for folder, count in zip(data, (1500, 500), strict=True):
        raw = (folder / "raw_responses.jsonl").read_bytes()
        assert raw.endswith(b"\n")
        rows = [orjson.loads(line) for line in raw.splitlines()]
        lines = Counter(row["line"] for row in rows)
        assert set(lines) == set(range(count)), "no prompt lost"
        assert max(lines.values()) == 1, "no row duplicated"
    run = tmp_path / "run"
    parts = history(run / "attempts.jsonl")
    begun = [e for _, e in iter_jsonl(run / "events.jsonl") if e["event"] == "start"]
    assert len(parts) - 1 > len(begun), "more segments than starts: checkpoints rotated while running"
    journal = [record for part in parts for _, record in iter_jsonl(part)]
    started = [r["rid"] for r in journal if r["k"] == "start"]
    assert len(started) == len(set(started)), "no record read twice"
    starts, ends = set(started), {r["rid"] for r in journal if r["k"] == "end"}
    assert starts == ends, "every attempt in flight at a kill was settled at the next start"
    assert any(r.get("outcome") == "lost_at_crash" for r in journal)
    # The clean stop's checkpoint holds everything: a start from it rebuilds what a full read does.
    full = read_journals(
        run / "attempts.jsonl", run / "events.jsonl", backend="openrouter", default="openrouter"
    )
    # Every bill regen has the id of is counted at what was billed; those killed before their
    # response headers stay at their worst case, flagged, until the key's usage bounds them at the
    # end (tests/integration/job/test_providers.py test_sigkill_then_resume_the_ledger_equals_the_bill).
    with urllib.request.urlopen(sim_process.replace("/api/v1", "/_sim/ledger")) as response:
        bill = orjson.loads(response.read())
    known = {r["gen"] for r in journal if r.get("gen")}
    billed_known = sum((Decimal(repr(r["cost"])) for r in bill["records"] if r["id"] in known), Decimal(0))
    assert full.spent - full.estimated == billed_known
    assert Decimal(bill["billed_total"]) - billed_known <= full.estimated
    if full.estimates.unknowable_count:
        assert full.spent == Decimal(bill["billed_total"])
    verified = subprocess.run(
        regen_argv("verify", "--settings", str(settings), *map(str, data)),
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert verified.returncode == 0 and "no violations" in verified.stdout, verified.stdout + verified.stderr
    datasets = [Dataset(folder.name, folder) for folder in data]
    resumed = Checkpointer(
        run, run / "attempts.jsonl", run / "events.jsonl", [Lane("openrouter", "openrouter", "openrouter", True)],
        {d.name: d.results_path for d in datasets},
    ).resume({d.name: scan(d, keep_digests=True) for d in datasets})  # fmt: skip
    assert resumed.from_checkpoint
    got = resumed.journals["openrouter"]
    assert (got.spent, got.estimates, got.crashed) == (full.spent, full.estimates, full.crashed)
    assert all(len(resumed.progress[d.name].done) == n for d, n in zip(datasets, (1500, 500), strict=True))


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signals_drain_and_exit_with_their_code(
    sim_process: str, tmp_path: Path, signum: int, code: int
) -> None:
    data = [write_dataset(tmp_path, "A", 3000)]
    settings = settings_file(tmp_path, sim_process, data, concurrency=32)
    proc = headless_run(settings)
    # Signal once it is generating: what is checked here is the drain of requests in flight (a
    # signal during the start: the test below).
    wait_for_attempts(tmp_path / "run" / "attempts.jsonl", 20)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, out[-1500:] + err[-1500:]
    assert "draining" in out and "Traceback" not in err
    assert out.strip().splitlines()[-1].startswith("stopped: interrupted by")
    rows = read_rows(data[0])
    assert 0 < len(rows) < 3000 and len({r["line"] for r in rows}) == len(rows)
    journal = [orjson.loads(x) for x in (tmp_path / "run" / "attempts.jsonl").read_bytes().splitlines()]
    starts = {r["rid"] for r in journal if r["k"] == "start"}
    assert starts == {r["rid"] for r in journal if r["k"] == "end"}, "drained: nothing left in flight"


def test_a_signal_while_the_job_starts_stops_it_before_anything_is_sent(
    sim_process: str, tmp_path: Path
) -> None:
    # The simulator is frozen so the job's start waits on it (the catalog) with the run folder taken:
    # a SIGINT then used to reach asyncio's own handler, whose cancel was lost, and the job ran on.
    [sim_pid] = [pid for pid, argv in processes() if str(tmp_path / "sim.json") in argv]
    data = [write_dataset(tmp_path, "A", 300)]
    settings = settings_file(tmp_path, sim_process, data, concurrency=8)
    os.kill(sim_pid, signal.SIGSTOP)
    try:
        proc = headless_run(settings)
        deadline = time.monotonic() + 60
        while holder(tmp_path / "run") != proc.pid and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # past the lock: asking the frozen simulator
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
    finally:
        os.kill(sim_pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out[-1500:] + err[-1500:]
    assert "SIGINT: stopping as soon as the job has started" in out and "Traceback" not in err
    journal = tmp_path / "run" / "attempts.jsonl"
    assert not journal.exists() or b'"k":"start"' not in journal.read_bytes(), "nothing sent"
    assert read_rows(data[0]) == []


def headless_run(settings: Path) -> subprocess.Popen[str]:
    """`regen run --headless` on the simulator's key, its output captured."""
    return subprocess.Popen(
        regen_argv("run", "--headless", "--settings", str(settings)),
        env={**ENV, "OPENROUTER_API_KEY": "sk-sim-test"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def processes() -> list[tuple[int, str]]:
    """(pid, command line) of every process this user can see."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found.append(
                    (int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
                )
            except OSError:
                continue
    return found


def test_status_lines_and_summary(sim_process: str, tmp_path: Path) -> None:
    data = [write_dataset(tmp_path, "A", 60), write_dataset(tmp_path, "B", 20)]
    settings = settings_file(tmp_path, sim_process, data, concurrency=8)
    done = subprocess.run(
        regen_argv("run", "--headless", "--settings", str(settings)),
        env={**ENV, "OPENROUTER_API_KEY": "sk-sim-test"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    status = [line for line in lines if line.startswith("[")]
    assert status, done.stdout
    last = status[-1]
    for part in (
        "DONE",
        "A 60/60",
        "B 20/20",
        "tok/s",
        "req/s",
        "in flight",
        "spent",
        "reserved",
        "/ $100.00",
        "errors",
        "ETA",
    ):
        assert part in last, (part, last)
    assert lines[-1] == "done: every dataset is done"


def test_bad_prompt_lines_are_listed_and_nothing_is_written(sim_process: str, tmp_path: Path) -> None:
    good = b'{"messages": [{"role": "user", "content": "hi"}]}'
    data = write_dataset(
        tmp_path,
        "A",
        0,
        raw=[good, b"{not json", b"", b'{"messages": [{"role": "assistant", "content": "x"}]}', good],
    )
    settings = settings_file(tmp_path, sim_process, [data])
    env = {**ENV, "OPENROUTER_API_KEY": "sk-sim-test"}
    bad = subprocess.run(
        regen_argv("run", "--headless", "--settings", str(settings)), env=env, capture_output=True, text=True
    )
    assert bad.returncode == 1
    prompts = data / "prompts.jsonl"
    assert f"{prompts}:2: not valid JSON" in bad.stderr
    assert f"{prompts}:3: blank line" in bad.stderr
    assert f"{prompts}:4: last message is not from the user" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert not (data / "raw_responses.jsonl").exists() and not (tmp_path / "run").exists()
    skipped = subprocess.run(
        regen_argv("run", "--headless", "--skip-invalid", "--settings", str(settings)),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert skipped.returncode == 0, skipped.stderr
    assert sorted(r["line"] for r in read_rows(data)) == [0, 4]
    events = [orjson.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_bytes().splitlines()]
    assert sorted(e["line"] for e in events if e["event"] == "invalid_line") == [1, 2, 3]


def test_the_key_appears_in_no_output_and_no_file(sim_process: str, tmp_path: Path) -> None:
    data = [write_dataset(tmp_path, "A", 30)]
    settings = settings_file(tmp_path, sim_process, data, concurrency=8)
    good = subprocess.run(
        regen_argv("run", "--headless", "--settings", str(settings)),
        env={**ENV, "OPENROUTER_API_KEY": SECRET},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert good.returncode == 0, good.stderr
    wrong = SECRET[:-6] + "000000"
    refused = subprocess.run(
        regen_argv("run", "--headless", "--settings", str(settings)),
        env={**ENV, "OPENROUTER_API_KEY": wrong},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1 and "API key was refused" in refused.stderr
    texts = [good.stdout, good.stderr, refused.stdout, refused.stderr]
    texts += [
        p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file() and p.name != "sim.json"
    ]
    for text in texts:
        assert SECRET not in text and wrong not in text and SECRET[9:30] not in text


def test_no_key_and_no_datasets_are_clear_errors(tmp_path: Path) -> None:
    settings = tmp_path / "settings.toml"
    settings.write_text("[job]\nbudget_usd = 5\n")
    no_key = regen_captured("run", "--headless", "--settings", str(settings))
    assert no_key.returncode == 1 and "no API key" in no_key.stderr and "Traceback" not in no_key.stderr
    no_data = regen_captured(
        "run", "--headless", "--settings", str(settings), env={**ENV, "OPENROUTER_API_KEY": "x"}
    )
    assert no_data.returncode == 1 and "no datasets" in no_data.stderr


def test_demo_runs_to_the_end_and_exits_0(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    done = subprocess.run(
        regen_argv("demo", "--headless", "--dir", str(folder), "--speed", "25"),
        env=ENV,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.splitlines()[-1].startswith("done: every dataset is done")
    for name in ("chat", "code", "reasoning"):
        prompts = (folder / "datasets" / name / "prompts.jsonl").read_bytes().count(b"\n")
        assert len(read_rows(folder / "datasets" / name)) == prompts
    again = regen_captured("demo", "--headless", "--dir", str(tmp_path))
    assert again.returncode != 0 and "is not a regen demo folder" in again.stderr


def test_demo_rehearses_the_sglang_path(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    done = subprocess.run(
        regen_argv("demo", "--backend", "sglang", "--headless", "--dir", str(folder), "--speed", "10"),
        env=ENV,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "SGLang simulator at" in done.stdout and "GPU-h" in done.stdout
    assert done.stdout.splitlines()[-1].startswith("done: every dataset is done")
    for name in ("chat", "code", "reasoning"):
        prompts = (folder / "datasets" / name / "prompts.jsonl").read_bytes().count(b"\n")
        rows = read_rows(folder / "datasets" / name)
        assert len(rows) == prompts
        assert {r["backend"] for r in rows} == {"sglang"} and {r["output_ids_source"] for r in rows} == {
            "server"
        }
        assert all(r["output_ids"] and r["prompt_ids"] for r in rows)
    # The tokenizer the job rendered with is the built-in one, written into the demo folder.
    assert (folder / "tokenizer" / "tokenizer.json").is_file()
