"""Command-line arguments that several `regen` commands share."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from regen.engine.errors import UsageError

if TYPE_CHECKING:
    from regen.engine.config.settings import HostSettings, Settings


def add_settings_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--settings",
        type=Path,
        default=None,
        metavar="FILE",
        help="settings file (default ./settings.toml when present, else built-in defaults)",
    )


def chosen_hosts(
    settings: Settings, name: str | None, *, one: bool = False, need_model: bool = False
) -> list[HostSettings]:
    """The [[hosts]] a command acts on: `--host NAME`, else all of them (`one`: there must be just
    one, or a name). `need_model`: each must name its model folder. A `UsageError` says what is
    missing."""
    hosts = list(settings.hosts)
    if not hosts:
        raise UsageError("no GPU hosts in the settings: add a [[hosts]] table (see settings.example.toml)")
    names = ", ".join(h.name for h in hosts)
    if name is not None:
        hosts = [h for h in hosts if h.name == name]
        if not hosts:
            raise UsageError(f"--host {name}: no such host (hosts: {names})")
    elif one and len(hosts) > 1:
        raise UsageError(f"several hosts in the settings: choose one with --host ({names})")
    missing = [h.name for h in hosts if need_model and not h.model_path]
    if missing:
        raise UsageError(
            f"{', '.join(missing)}: model_path is not set in the [[hosts]] table: SGLang needs the model folder"
        )
    return hosts
