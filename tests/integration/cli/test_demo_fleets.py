"""`regen demo --fleets`: both simulators in one job, paced to a deadline the GPUs alone would miss.

Headless, to its end: the plan said before the start has OpenRouter carry part of the work within the
budget, both backends make rows, one row per prompt. In real tmux: the console's fleets pane, `P`
pausing one backend and `d` moving the deadline, on the demo's own job.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

from tests.support.datasets import read_rows
from tests.support.processes import ENV, regen_argv, wait_gone
from tests.support.tmux import Tmux, needs_tmux

DATASETS = ("chat", "code", "reasoning")


def test_the_fleets_demo_runs_both_backends_to_the_end_headless(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    done = subprocess.run(
        regen_argv("demo", "--fleets", "--headless", "--dir", str(folder), "--speed", "4"),
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    out = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "SGLang simulator at" in out[0] and "OpenRouter simulator at" in out[0], out[0]
    # The plan before the start: the GPUs' share, what OpenRouter must carry, for how much, the verdict.
    plan = out[1]
    assert plan.startswith("deadline ") and "the GPUs make " in plan, plan
    assert re.search(
        r"OpenRouter must carry [\d.]+k tokens for \$0\.\d\d, budget left \$0\.50: fits; ", plan
    ), plan
    status = [line for line in out if line.startswith("[")]
    assert status and all("| plan GPUs " in line and "| deadline " in line for line in status), status[:2]
    # The job's in-flight total has no limit of its own with two backends: each one's is in the split.
    assert all(re.search(r"\| in flight \d+ \|", line) for line in status), status[0]
    made: Counter[str] = Counter()
    for name in DATASETS:
        prompts = (folder / "datasets" / name / "prompts.jsonl").read_bytes().count(b"\n")
        rows = read_rows(folder / "datasets" / name)
        assert len(rows) == prompts and len({row["line"] for row in rows}) == prompts, name
        made.update(row["backend"] for row in rows)
    assert made["sglang"] > 0 and made["openrouter"] > 0, made
    for name in ("sglang", "openrouter"):
        assert any(line.startswith(f"  {name}: {made[name]} rows (") for line in out), name
    assert out[-1].startswith("done: every dataset is done")


@needs_tmux
def test_the_fleets_demo_in_the_console_shows_both_and_takes_p_and_d(tmp_path: Path, tmux: Tmux) -> None:
    folder = tmp_path / "demo"
    env = " ".join(
        f"{k}={v!r}"
        for k, v in {**ENV, "TERM": "tmux-256color", "TZ": "UTC"}.items()
        if k in ("PATH", "PYTHONPATH", "HOME", "TERM", "PYTHONUNBUFFERED", "TZ")
    )
    command = " ".join(regen_argv("demo", "--fleets", "--dir", str(folder)))
    tmux(
        "new-session",
        "-d",
        "-s",
        "regen",
        "-x",
        "140",
        "-y",
        "42",
        f"cd {tmp_path} && env -u COLUMNS -u LINES {env} {command}; sleep 600",
    )
    lock = folder / "run" / "job.lock"
    try:
        screen = tmux.wait_for(
            lambda s: "Plan deadline 140s" in s and "sglang RUNNING" in s and "openrouter RUNNING" in s,
            "the fleets pane",
            timeout=90,
        )
        assert (
            screen.index("sglang RUNNING")
            < screen.index("openrouter RUNNING")
            < screen.index("Plan deadline")
        )
        assert "P Backend" in screen and "d Deadline" in screen
        # P: the chooser lists both backends; enter pauses the first (sglang), OpenRouter runs on.
        tmux.keys("P")
        tmux.wait_for(lambda s: "Pause or resume one backend" in s, "the backend chooser")
        tmux.keys("Enter")
        screen = tmux.wait_for(lambda s: "sglang PAUSED" in s, "sglang paused")
        assert "openrouter RUNNING" in screen
        # d: a new deadline reaches the job and the pane.
        tmux.keys("d")
        tmux.wait_for(lambda s: "Deadline now: 140s," in s and "Set [enter]" in s, "the deadline box")
        time.sleep(0.5)  # the box takes the keys once it has the focus (after it is drawn)
        tmux.keys("C-u")
        tmux.wait_for(lambda s: "12h, 90m, 06:30 or none" in s, "the box emptied")
        tmux.keys("-l", "90m")
        tmux.wait_for(lambda s: "  90m" in s, "the text typed")
        tmux.keys("Enter")
        tmux.wait_for(lambda s: "Plan deadline 90m" in s and "Set the deadline" not in s, "the new deadline")
        tmux.keys("q")
        tmux.wait_for(lambda s: "Fleets" not in s, "the console to close")
        assert lock.read_text().strip(), "the demo's job runs on detached, as `regen run`'s does"
    finally:
        if lock.exists() and lock.read_text().strip():
            pid = int(lock.read_text())
            for _ in range(2):  # the first drains, the second cancels what is in flight
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
            wait_gone(pid, 30)
