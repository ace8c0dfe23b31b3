"""A disk that fills up mid-run, for real: the run folder on a small tmpfs (tests/support/filesystems.py)."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import pytest

from tests.support.datasets import read_rows, write_dataset
from tests.support.filesystems import Unmountable, small_tmpfs
from tests.support.openrouter_sim import SIM_KEY
from tests.support.processes import ENV, regen_argv, settings_file


def test_a_full_disk_stops_the_run_cleanly_and_it_resumes_once_space_is_freed(
    sim_process: str,
    tmp_path: Path,
) -> None:
    """Exit 1 naming the file and why, no torn line, everything acknowledged kept; with room again
    the same command finishes the work, one row per prompt."""
    try:
        with small_tmpfs(tmp_path / "small", 96 * 1024) as small:
            a = write_dataset(tmp_path, "A", 600)
            settings = settings_file(small, sim_process, [a], concurrency=16, max_attempts=20)
            env = {**ENV, "OPENROUTER_API_KEY": SIM_KEY}
            full = subprocess.run(
                regen_argv("run", "--headless", "--settings", str(settings)),
                env=env,
                capture_output=True,
                text=True,
                timeout=180,
            )
            said = full.stdout + full.stderr
            assert full.returncode == 1, said[-2000:]
            assert "attempts.jsonl: write failed: No space left on device [ENOSPC]" in said
            assert "run the same command again" in said and "Traceback" not in said
            for name in ("attempts.jsonl", "events.jsonl"):
                data = (small / "run" / name).read_bytes()
                assert not data or data.endswith(b"\n"), f"{name} ends in a whole line"
            assert len(read_rows(a)) < 600
            subprocess.run(["mount", "-o", "remount,size=16m", str(small)], check=True)
            again = subprocess.run(
                regen_argv("run", "--headless", "--settings", str(settings)),
                env=env,
                capture_output=True,
                text=True,
                timeout=240,
            )
            assert again.returncode == 0, (again.stdout + again.stderr)[-2000:]
            rows = read_rows(a)
            assert len(rows) == 600 and max(Counter(r["line"] for r in rows).values()) == 1
    except Unmountable as exc:
        pytest.skip(f"no small filesystem here: {exc}")
