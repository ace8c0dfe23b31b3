"""regen as an operator installs it: the built wheel in a fresh virtual environment, not the
editable checkout. A module or a data file left out of the wheel (package discovery, package data)
fails here and nowhere else, since the checkout's own venv sees every file of the tree."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.support.datasets import read_rows
from tests.support.wheel import built_wheel, clean_env, installed_regen


@pytest.fixture(scope="module")
def installed() -> Path:
    """The `bin/` folder of a fresh venv holding regen from its wheel, and nothing of this checkout
    (built once per source tree, shared with tests/integration/test_journey.py)."""
    return installed_regen()


def test_the_wheel_holds_every_module_and_imports_outside_the_checkout(
    installed: Path, tmp_path: Path
) -> None:
    names = zipfile.ZipFile(built_wheel()).namelist()
    assert "regen/console/app.tcss" in names and "regen/console/themes/regen-dark.toml" in names
    assert "regen/demo/datasets/chat/prompts.jsonl" in names
    probe = (
        "import pkgutil, importlib, regen, sys\n"
        "assert 'site-packages' in regen.__file__, regen.__file__\n"
        "for m in pkgutil.walk_packages(regen.__path__, 'regen.'):\n"
        "    if m.name.endswith('__main__') or m.name.startswith('regen.engine.host.scripts'):\n"
        "        continue\n"
        "    importlib.import_module(m.name)\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [installed / "python", "-c", probe], cwd=tmp_path, env=clean_env(), capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_the_installed_command_answers_help_and_runs_the_demo(installed: Path, tmp_path: Path) -> None:
    helped = subprocess.run(
        [installed / "regen", "--help"], cwd=tmp_path, env=clean_env(), capture_output=True, text=True
    )
    assert helped.returncode == 0 and "demo" in helped.stdout and "sglang" in helped.stdout
    folder = tmp_path / "demo"
    done = subprocess.run(
        [installed / "regen", "demo", "--headless", "--dir", str(folder), "--speed", "25"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.splitlines()[-1].startswith("done: every dataset is done")
    for name in ("chat", "code", "reasoning"):
        prompts = (folder / "datasets" / name / "prompts.jsonl").read_bytes().count(b"\n")
        assert len(read_rows(folder / "datasets" / name)) == prompts
