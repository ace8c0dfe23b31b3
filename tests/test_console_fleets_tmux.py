"""In real tmux: the console on a job with both fleets shows them in one view; P pauses one backend
while the other runs on, and d changes the deadline.

The job is the console's scripted one (console/scripted.py: the engine's snapshot types, deadline
parser and pacer), run as its own process by `python -m regen.console.launch --fleets`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tests.support.processes import ENV
from tests.support.tmux import Tmux, needs_tmux

pytestmark = needs_tmux


def clear_the_box(tmux: Tmux) -> None:
    """ctrl+u empties the box; wait until it is empty (its placeholder shows) before typing, since
    Textual runs the binding after the key and letters typed at once could land before it."""
    tmux.keys("C-u")
    tmux.wait_for(lambda s: "12h, 90m, 06:30 or none" in s, "the box emptied")


def test_both_fleets_in_one_view_and_the_deadline_changed_from_the_keyboard(
    tmp_path: Path,
    tmux: Tmux,
) -> None:
    env = " ".join(
        f"{k}={v!r}"
        for k, v in {**ENV, "TERM": "tmux-256color", "TZ": "UTC"}.items()
        if k in ("PATH", "PYTHONPATH", "HOME", "TERM", "PYTHONUNBUFFERED", "TZ")
    )
    command = f"{sys.executable} -m regen.console.launch --fleets --deadline 1h --no-mouse"
    # The pane's shell may carry an 80x24 COLUMNS/LINES from whoever started the tmux server; the
    # console must size itself from the window.
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

    # One view: each backend with its state, its workers or providers, then the plan to the deadline.
    screen = tmux.wait_for(
        lambda s: "Plan deadline 1h" in s and "gpu-a:30000" in s and "ceiling" in s and "GPU-h" in s,
        "the fleets pane",
    )
    assert (
        screen.index("sglang RUNNING") < screen.index("openrouter RUNNING") < screen.index("Plan deadline 1h")
    )
    assert "Fleets" in screen and "ETA " in screen and "projected $" in screen
    assert "P Backend" in screen and "d Deadline" in screen

    # P: the chooser lists both backends; enter pauses the first (sglang), OpenRouter runs on.
    tmux.keys("P")
    tmux.wait_for(lambda s: "Pause or resume one backend" in s, "the backend chooser")
    tmux.keys("Enter")
    screen = tmux.wait_for(lambda s: "sglang PAUSED" in s, "sglang paused")
    assert "openrouter RUNNING" in screen and "paused sglang" in screen  # the pane and the log

    # d: a bad deadline is refused in the box with the job's rule; a good one reaches the job.
    tmux.keys("d")
    tmux.wait_for(lambda s: "Deadline now: 1h," in s and "Set [enter]" in s, "the deadline box")
    time.sleep(0.5)  # the box takes the keys once it has the focus (after it is drawn)
    clear_the_box(tmux)
    tmux.keys("-l", "1.5h")
    tmux.wait_for(lambda s: "1.5h" in s, "the text typed")
    tmux.keys("Enter")
    tmux.wait_for(lambda s: "not a time of day or a duration" in s, "the refusal")
    clear_the_box(tmux)
    tmux.keys("-l", "90m")
    tmux.wait_for(lambda s: "  90m" in s, "the text typed")
    tmux.keys("Enter")
    screen = tmux.wait_for(
        lambda s: "Plan deadline 90m" in s and "Set the deadline" not in s, "the new deadline"
    )
    assert "deadline 90m:" in screen  # the job's answer, in the log

    tmux.keys("q")
    tmux.wait_for(lambda s: "Fleets" not in s, "the console to close")
