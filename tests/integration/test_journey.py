"""The operator's night as one test (`make journey`): every command in the order an operator runs it,
on real parts only.

regen comes from its built wheel in a fresh venv (tests/support/wheel.py), run as `<venv>/bin/regen`
with nothing of this checkout on its path. Two "GPU hosts" are real sshds on loopback whose logins find
the stand-in SGLang (tests/support/gpuhost.py), their model folders holding the same files at different
paths; OpenRouter is `regen sim openrouter` in a process of its own; the console runs in real tmux.

Settings: both hosts, `job.backends = ["sglang", "openrouter"]`, a deadline, no tokenizer. Then:
inspect (both hosts, one digest), pull, sglang start, run in tmux (the host pane and the fleets pane
read on screen), `p`, `P`, `d`, `q` (the job goes on), attach, SIGKILL of the job, run again (it
resumes, the deadline where `d` put it) to the end, push, verify, export, sglang stop (nothing of the
servers' process groups left). Every step is asserted on the screen or on disk: one row per prompt,
spend equal to the simulator's bill, no traceback in any log or any command's stderr.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.support.datasets import one_row_per_prompt, write_dataset
from tests.support.gpuhost import GpuHost, group_members, make_gpu_host
from tests.support.openrouter_sim import openrouter_process
from tests.support.processes import wait_gone
from tests.support.sglang_sim import model_folder
from tests.support.sshd import need_sshd
from tests.support.tmux import Tmux, needs_tmux
from tests.support.wheel import clean_env, installed_regen

pytestmark = needs_tmux

KEY = "sk-sim-journey"
DATASETS = {"chat": 40, "code": 40}
# The GPUs slow enough that the deadline needs OpenRouter for part of the work, and the job lasts
# long enough to be steered from the console: 2 requests at a time per host at 4 tokens/s each, 16
# tokens/s in all, where the work is about 2.5k tokens and the deadline a minute.
GPU_SIM: dict[str, Any] = {
    "time_scale": 1.0,
    "startup_weights_s": 0.3,
    "startup_kv_pool_s": 0.1,
    "startup_cuda_graph_s": 0.1,
    "startup_http_s": 0.1,
    "startup_warmup_s": 0.1,
    "decode_tokens_per_s": 4.0,
    "max_running_requests": 2,
    "output_len_min": 16,
    "output_len_max": 48,
}
OPENROUTER_SIM = {
    "api_keys": [KEY],
    "time_scale": 0.3,
    "min_completion_tokens": 16,
    "max_completion_tokens": 48,
    "chunk_interval_s": 0.05,
    "keepalive_interval_s": 0.05,
    "generation_lookup_delay_s": 0.1,
    "retry_after_s": 0,
    "seed": 11,
}


@pytest.fixture(scope="module")
def regen_bin() -> Path:
    return installed_regen()


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[tuple[GpuHost, GpuHost]]:
    need_sshd()
    one = make_gpu_host(tmp_path / "gpu1")
    two = make_gpu_host(tmp_path / "gpu2")
    # The same files, mounted at another path on the second host.
    two.model = model_folder(tmp_path / "gpu2" / "mnt" / "nvme" / "Kimi-K2.5")
    two.work = one.work  # one [sglang] work_dir for both; the pid files differ by port
    for host in (one, two):
        host.set_sim(**GPU_SIM)
        for name, count in DATASETS.items():
            write_dataset(host.root / "data", name, count)
    try:
        yield one, two
    finally:
        one.cleanup()
        two.cleanup()


@pytest.fixture
def openrouter(tmp_path: Path, regen_bin: Path) -> Iterator[str]:
    """`regen sim openrouter` from the installed wheel, in a process of its own; yields its API URL."""
    with openrouter_process(
        tmp_path, OPENROUTER_SIM, regen=[str(regen_bin / "regen")], env=clean_env()
    ) as url:
        yield url


class Operator:
    """The operator's shell: the installed `regen`, run from the folder holding settings.toml, with
    the OpenRouter key in the environment and nothing of this checkout on any path."""

    def __init__(self, regen_bin: Path, home: Path, transcript: Path) -> None:
        self.regen = regen_bin / "regen"
        self.home = home
        self.transcript = transcript
        self.env = {**clean_env(), "OPENROUTER_API_KEY": KEY, "TZ": "UTC"}
        self.stderrs: dict[str, str] = {}

    def __call__(self, *args: str, timeout: float = 180, code: int = 0) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(self.regen), *args],
            cwd=self.home,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        self.stderrs[" ".join(args)] = done.stderr
        self.keep(f"$ regen {' '.join(args)}  (exit {done.returncode})", done.stdout + done.stderr)
        assert done.returncode == code, (
            f"regen {' '.join(args)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
        return done

    def keep(self, title: str, text: str) -> None:
        """The night's transcript (commands' output, screens), kept in the test's folder for a reader."""
        with self.transcript.open("a") as out:
            out.write(f"\n===== {title}\n{text}\n")

    def shell_line(self, *args: str) -> str:
        """The command line tmux runs: this environment, then `regen ARGS`."""
        env = " ".join(f"{k}={v!r}" for k, v in {**self.env, "TERM": "tmux-256color"}.items() if k in KEPT)
        return f"cd {self.home} && env -i {env} {self.regen} {' '.join(args)}; sleep 600"


KEPT = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "OPENROUTER_API_KEY", "TERM", "TZ")


def write_settings(home: Path, one: GpuHost, two: GpuHost, openrouter: str) -> Path:
    top = "\n".join(
        [
            "[openrouter]",
            f"base_url = {json.dumps(openrouter)}",
            "max_tokens = 64",
            "[job]",
            'backends = ["sglang", "openrouter"]',
            'deadline = "60s"',
            'run_dir = "run"',
            "concurrency = 16",
            "budget_usd = 1.0",
            "backoff_base_s = 0.05",
            "backoff_max_s = 0.5",
            "[steering]",
            "interval_s = 0.5",
            "smoothing_s = 2.0",
            "gpu_tokens_per_s = 16.0",
            "[headless]",
            "status_interval_s = 1.0",
        ]
    )
    path = home / "settings.toml"
    path.write_text(
        one.settings_text(top=top, extra_sglang={"metrics_interval_s": 0.5}, others=(("gpu2", two),))
    )
    return path


def events(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def header(screen: str) -> str:
    return screen.splitlines()[0] if screen else ""


def assert_no_traceback(where: str, text: str) -> None:
    assert "Traceback" not in text, f"a traceback in {where}:\n{text[-4000:]}"


# Ten minutes, not the suite's five: the wheel's build and install (setup) count, and on a fresh clone
# they share two cores with the rest of the suite.
@pytest.mark.timeout(600)
def test_the_operators_night_from_settings_to_export_on_two_hosts_and_openrouter(
    regen_bin: Path, hosts: tuple[GpuHost, GpuHost], openrouter: str, tmp_path: Path, tmux: Tmux
) -> None:
    one, two = hosts
    home = tmp_path / "operator"
    home.mkdir()
    write_settings(home, one, two, openrouter)
    regen = Operator(regen_bin, home, tmp_path / "journey.txt")
    run = home / "run"
    workspace = home / "regen-data"

    def see(predicate: Callable[[str], bool], what: str, timeout: float = 20.0) -> str:
        screen = tmux.wait_for(predicate, what, timeout)
        regen.keep(f"screen: {what}", screen)
        return screen

    # inspect: both hosts answer, every line valid, one model by content at two paths.
    inspected = json.loads(regen("inspect", "--json").stdout)["hosts"]
    assert [h["name"] for h in inspected] == ["gpu1", "gpu2"] and all(h["ok"] for h in inspected)
    digests = {h["model_digest"] for h in inspected}
    assert len(digests) == 1 and next(iter(digests)).startswith("sha256:")
    digest = digests.pop()
    for h in inspected:
        assert {d["name"]: (d["valid"], d["invalid_count"]) for d in h["datasets"]} == {
            name: (count, 0) for name, count in DATASETS.items()
        }
    text = regen("inspect").stdout
    assert text.count(f"model digest {digest}") == 2 and "different models" not in text

    # pull: the datasets and the tokenizer into the workspace, byte for byte the host's.
    regen("pull", "--host", "gpu1")
    for name in DATASETS:
        pulled = workspace / "datasets" / name / "prompts.jsonl"
        assert pulled.read_bytes() == (one.root / "data" / name / "prompts.jsonl").read_bytes()
    assert (workspace / "tokenizer" / "tokenizer_config.json").read_bytes() == (
        one.model / "tokenizer_config.json"
    ).read_bytes()

    # sglang start: one model on both hosts, launched under one served name.
    started = regen("sglang", "start", timeout=240)
    assert f"model {digest} on gpu1, gpu2" in started.stdout, started.stdout
    status = json.loads(regen("sglang", "status", "--json").stdout)["hosts"]
    assert {h["host"]: h["served_model_name"] for h in status} == {"gpu1": "Kimi-K2.5", "gpu2": "Kimi-K2.5"}
    groups = [record["pgid"] for record in (one.record(), two.record()) if record]
    assert len(groups) == 2 and all(group_members(g) for g in groups)

    # run in tmux: the job starts detached, the console attaches; the host pane and the fleets pane.
    tmux("new-session", "-d", "-s", "regen", "-x", "160", "-y", "48", regen.shell_line("run"))
    screen = see(
        lambda s: "sglang RUNNING" in s and "openrouter RUNNING" in s and "Plan deadline 60s" in s,
        "the fleets pane",
        timeout=90,
    )
    assert screen.index("sglang RUNNING") < screen.index("openrouter RUNNING") < screen.index("Plan deadline")
    # The header counts both backends' requests in flight against no one limit (each has its own).
    assert re.search(r"· in flight \d+ ·", screen.splitlines()[1]), screen.splitlines()[1]
    screen = see(
        lambda s: "gpu1 connected" in s and "gpu2 connected" in s and "tunnel open" in s, "the host pane"
    )
    job_pid = int((run / "job.lock").read_text())

    # p: the whole job pauses, and resumes.
    tmux.keys("p")
    see(lambda s: "PAUSED" in header(s), "the job paused")
    tmux.keys("p")
    see(lambda s: "RUNNING" in header(s), "the job resumed")
    said = [e for e in events(run) if e["event"] in ("pause", "resume") and "backend" not in e]
    assert [e["event"] for e in said] == ["pause", "resume"]

    # P: one backend pauses (sglang, the first); OpenRouter runs on. P again resumes it.
    tmux.keys("P")
    see(lambda s: "Pause or resume one backend" in s, "the backend chooser")
    tmux.keys("Enter")
    screen = see(lambda s: "sglang PAUSED" in s, "sglang paused")
    assert "openrouter RUNNING" in screen
    tmux.keys("P")
    see(lambda s: "Pause or resume one backend" in s, "the backend chooser")
    tmux.keys("Enter")
    see(lambda s: "sglang RUNNING" in s, "sglang resumed")

    # d: a new deadline, counted from now.
    tmux.keys("d")
    see(lambda s: "Deadline now: 60s," in s and "Set [enter]" in s, "the deadline box")
    time.sleep(0.5)  # the box takes the keys once it has the focus (after it is drawn)
    tmux.keys("C-u")
    see(lambda s: "12h, 90m, 06:30 or none" in s, "the box emptied")
    tmux.keys("-l", "50s")
    see(lambda s: "  50s" in s, "the text typed")
    tmux.keys("Enter")
    see(lambda s: "Plan deadline 50s" in s and "Set the deadline" not in s, "the new deadline")
    [moved] = [e for e in events(run) if e["event"] == "deadline" and e.get("source") != "settings"]
    deadline_at = moved["at"]

    # q: the console closes, the job goes on.
    tmux.keys("q")
    see(lambda s: "Fleets" not in s, "the console to close")
    os.kill(job_pid, 0)

    # attach: the console back on the same job.
    # In the same terminal, as the operator types it (the pane's first command has ended).
    tmux("respawn-pane", "-k", "-t", "regen", regen.shell_line("attach"))
    see(lambda s: "sglang RUNNING" in s and "Plan deadline 50s" in s, "the console attached", timeout=60)

    # SIGKILL of the job: the console says why it lost the job.
    rows_before = sum(
        (workspace / "datasets" / n / "raw_responses.jsonl").read_bytes().count(b"\n")
        for n in DATASETS
        if (workspace / "datasets" / n / "raw_responses.jsonl").exists()
    )
    os.kill(job_pid, signal.SIGKILL)
    wait_gone(job_pid, 10)
    see(lambda s: "DISCONNECTED" in s, "the console to say the job is gone", timeout=30)
    tmux.keys("q")
    assert 0 < rows_before < sum(DATASETS.values()), "the kill came in the middle of the job"

    # run again, to the end (headless this time): it resumes, the deadline where `d` put it.
    final = regen("run", "--headless", timeout=300)
    out = final.stdout.splitlines()
    assert out[-1].startswith("done: every dataset is done"), final.stdout[-3000:]
    kept = [e for e in events(run) if e["event"] == "deadline"]
    assert kept[-1]["at"] == deadline_at, kept
    starts = [e for e in events(run) if e["event"] == "start"]
    assert [s["pid"] for s in starts][:1] == [job_pid] and len(starts) == 2, starts
    [end] = [e for e in events(run) if e["event"] == "end"]

    # One row per prompt, from both backends, the digest on every SGLang row.
    made: Counter[str] = Counter()
    for name, count in DATASETS.items():
        rows = one_row_per_prompt(workspace / "datasets" / name, count)
        made.update(r["backend"] for r in rows)
        # Which dataset's prompts the GPUs get is the dispatcher's: a dataset may have none of theirs.
        assert {r["server"]["model_digest"] for r in rows if r["backend"] == "sglang"} <= {digest}
        assert {r["model"] for r in rows if r["backend"] == "sglang"} <= {"Kimi-K2.5"}
    assert made["sglang"] > 0 and made["openrouter"] > 0, made
    assert {k: v["rows"] for k, v in end["split"].items()} == dict(made), end["split"]

    # Spend is the simulator's bill, exactly.
    with urllib.request.urlopen(openrouter.replace("/api/v1", "/_sim/ledger"), timeout=10) as answer:
        bill = json.loads(answer.read())
    assert Decimal(end["spent"]) == Decimal(bill["billed_total"]) > 0, (end["spent"], bill["billed_total"])

    # push: the rows back beside their prompts on the host, whole.
    regen("push", "--host", "gpu1")
    for name in DATASETS:
        assert (one.root / "data" / name / "raw_responses.jsonl").read_bytes() == (
            workspace / "datasets" / name / "raw_responses.jsonl"
        ).read_bytes()

    # verify and export.
    verified = regen("verify")
    assert verified.stdout.splitlines()[-1] == f"verify: {len(DATASETS)} dataset(s), no violations", (
        verified.stdout
    )
    regen("export")
    for name, count in DATASETS.items():
        exported = workspace / "datasets" / name / "export.specforge.jsonl"
        assert exported.read_bytes().count(b"\n") == count

    # sglang stop: nothing of either server's process group left on the hosts.
    stopped = regen("sglang", "stop", timeout=120)
    assert stopped.stdout.count("nothing of its process group is left") == 2, stopped.stdout
    assert not any(group_members(g) for g in groups)

    # No traceback anywhere: the job's log, the hosts' logs, every command's stderr.
    assert_no_traceback("job.log", (run / "job.log").read_text(errors="replace"))
    for host in (one, two):
        assert_no_traceback(f"{host.root.name}'s SGLang log", host.log())
    for command, stderr in regen.stderrs.items():
        assert_no_traceback(f"regen {command}", stderr)
    assert_no_traceback("the final run's output", final.stdout)
