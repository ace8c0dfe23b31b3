"""Import hygiene at run time (the static layers are `lint-imports` in `make test`): the job never
loads the console or Textual, and choosing a backend loads only it."""

from __future__ import annotations

import subprocess
import sys

from tests.support.processes import ROOT


def loaded_after(code: str) -> set[str]:
    probe = f"import sys\n{code}\nprint(' '.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True)
    return set(done.stdout.split())


def test_a_headless_openrouter_job_loads_no_console_textual_or_ssh() -> None:
    modules = loaded_after(
        "from regen.engine.config.settings import Settings\n"
        "from regen.engine.job.job import Job\n"
        "import regen.engine.control.headless\n"
        "Job(Settings())"
    )
    assert "regen.engine.backends.openrouter.backend" in modules
    for forbidden in ("textual", "regen.console", "regen.sim", "asyncssh", "sglang"):
        assert not any(m == forbidden or m.startswith(forbidden + ".") for m in modules), forbidden
