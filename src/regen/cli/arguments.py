"""Command-line arguments that several `regen` commands share."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_settings_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--settings",
        type=Path,
        default=None,
        metavar="FILE",
        help="settings file (default ./settings.toml when present, else built-in defaults)",
    )
