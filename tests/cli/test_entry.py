"""The `regen` command's entry point (src/regen/cli/entry.py)."""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

import pytest

from regen.cli import entry
from regen.engine.errors import EXIT_SIGINT


class _CtrlCWhileImporting(importlib.abc.MetaPathFinder):
    """The operator's Ctrl-C landing while the command's modules are being imported."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname == "regen.cli.main":
            raise KeyboardInterrupt
        return None


def test_a_ctrl_c_while_regen_imports_exits_130_without_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "regen.cli.main", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_CtrlCWhileImporting(), *sys.meta_path])
    assert entry.main() == EXIT_SIGINT == 130
