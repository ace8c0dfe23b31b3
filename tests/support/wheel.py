"""regen as an operator installs it: the wheel built from this checkout, installed into a fresh venv
(with the router extra, as a fleet of several GPU hosts needs), not the editable checkout.

Built and installed with uv (seconds; pip took a minute and a half of CPU), once per source tree
and kept: its folder is named after a digest of what goes into the wheel (src/, pyproject.toml,
README.md), under the system's temporary folder, and every test (tests/integration/test_wheel.py,
tests/integration/test_journey.py) and every pytest process (xdist workers) uses the same one. A change to any
of those files names another folder, so a test never runs an older regen. A file lock makes
concurrent sessions build it once; the venv counts only once its `ready` file is written, after the
install succeeded.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.processes import ROOT

# What the wheel is made of; a change to any of them is a new build.
SOURCES = ("src", "pyproject.toml", "README.md")


def source_digest() -> str:
    """sha256 over every file that goes into the wheel, by relative path and content."""
    h = hashlib.sha256()
    for name in SOURCES:
        top = ROOT / name
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in files:
            if "__pycache__" in path.parts or path.suffix == ".pyc" or ".egg-info" in str(path):
                continue
            h.update(str(path.relative_to(ROOT)).encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def clean_env() -> dict[str, str]:
    """The environment without this checkout on any path: what an operator's shell has."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


@functools.cache
def installed_regen() -> Path:
    """The `bin/` folder of a venv holding regen from its wheel (and smg, the router), nothing of
    this checkout; built once per source tree (see the module's docstring)."""
    home = Path(tempfile.gettempdir()) / f"regen-wheel-{source_digest()}"
    lock_path = home.with_suffix(".lock")
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / "ready").exists():
            _build(home)
    return home / "venv" / "bin"


def built_wheel() -> Path:
    """The wheel file that venv was installed from."""
    home = installed_regen().parent.parent
    return home / (home / "ready").read_text().strip()


def _uv(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """uv (the test extra's), outside this checkout's venv: what it builds and installs is regen's wheel.
    The system's certificates, as pip uses them (a machine whose registry is behind its own CA)."""
    uv = Path(sys.executable).parent / "uv"
    return subprocess.run(
        [str(uv), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**clean_env(), "UV_NO_PROGRESS": "1", "UV_NATIVE_TLS": "1"},
    )


def _build(home: Path) -> None:
    partial = home.with_name(home.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    built = _uv("build", "--quiet", "--wheel", "--out-dir", str(partial), str(ROOT))
    if built.returncode != 0:
        raise AssertionError(f"building the wheel failed:\n{built.stdout[-2000:]}{built.stderr[-3000:]}")
    (wheel,) = partial.glob("regen-*.whl")
    # The venv is made at its final path (a venv's scripts name their interpreter by absolute path),
    # from the wheel kept in the partial folder; the folder counts once `ready` is written. Its
    # interpreter is this one's base Python: nothing of this venv is on its path.
    venv = home / "venv"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    made = _uv("venv", "--quiet", "--python", sys.executable, str(venv))
    if made.returncode != 0:
        raise AssertionError(f"making the venv failed:\n{made.stderr[-3000:]}")
    final_wheel = home / wheel.name
    shutil.move(str(wheel), final_wheel)
    shutil.rmtree(partial, ignore_errors=True)
    # The wheel's own metadata decides what comes with it, as pip's install would.
    done = _uv(
        "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), f"{final_wheel}[router]"
    )
    if done.returncode != 0 or not (venv / "bin" / "regen").exists():
        shutil.rmtree(home, ignore_errors=True)
        raise AssertionError(f"installing the wheel failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    (home / "ready").write_text(final_wheel.name + "\n")
