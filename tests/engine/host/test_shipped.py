"""The modules regen ships to a GPU host with a host script (engine/host/remote.py, engine/host/sglang.py):
the host has no regen installed, so every regen module a shipped one imports must be shipped too."""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Sequence
from pathlib import Path

import pytest

from regen.engine.cluster import slurm
from regen.engine.host import remote, sglang


def _regen_imports(module: str) -> set[str]:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("regen"):
            package = importlib.util.find_spec(node.module)
            if package is not None and package.submodule_search_locations is not None:
                # `from regen.x import y`: y is a module (the loader makes the packages themselves).
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            else:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("regen"))
    return found


@pytest.mark.parametrize(
    ("entry", "modules"),
    [(remote.ENTRY, remote.MODULES), (sglang.ENTRY, sglang.MODULES), (slurm.NODE_ENTRY, slurm.NODE_MODULES)],
    ids=["hostcmd", "sglangctl", "nodeserver"],
)
def test_every_regen_module_a_shipped_one_imports_is_shipped_too(entry: str, modules: Sequence[str]) -> None:
    shipped = {entry, *modules}
    missing = {f"{module} imports {name}" for module in shipped for name in _regen_imports(module) - shipped}
    assert missing == set()
