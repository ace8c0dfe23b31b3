"""Themes are data: TOML files turned into Textual `Theme`s, colours checked, failures reported not raised.

The bundled files live in `console/themes/`, package data in a checkout and in an installed wheel
alike. (This module is `theming`, so `console/themes/` stays a data folder.)
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from textual.color import Color, ColorParseError
from textual.theme import Theme

from regen.engine.errors import UsageError

DEFAULT_THEME = "regen-dark"
COLOR_KEYS = (
    "primary",
    "secondary",
    "accent",
    "foreground",
    "background",
    "surface",
    "panel",
    "boost",
    "success",
    "warning",
    "error",
)
REGEN_VARIABLES = ("budget-warn", "budget-over", "provider-excluded", "data-stale")
_TOP_KEYS = {"name", "dark", "colors", "variables", "luminosity_spread", "text_alpha"}


class ThemeFileError(UsageError, ValueError):
    """A theme file that cannot be used; the message names the file and the problem."""


@dataclass(slots=True)
class LoadedThemes:
    """The themes found, in load order, and one line per file that could not be used."""

    themes: list[Theme] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [theme.name for theme in self.themes]


def bundled_theme_dir() -> Path:
    """The folder holding the themes regen ships."""
    return Path(__file__).resolve().parent / "themes"


def _color(path: Path, key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ThemeFileError(f"{path.name}: {key} must be a colour string, not {value!r}")
    try:
        Color.parse(value)
    except ColorParseError:
        raise ThemeFileError(f"{path.name}: {key} = {value!r} is not a colour") from None
    return value


def load_theme_file(path: Path) -> Theme:
    """One theme from a TOML file; raises ThemeFileError saying what is wrong."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ThemeFileError(f"{path.name}: cannot read ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ThemeFileError(f"{path.name}: not valid TOML ({exc})") from None
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise ThemeFileError(f"{path.name}: unknown key {', '.join(unknown)}")
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not name.strip():
        raise ThemeFileError(f"{path.name}: name must be a non-empty string")
    colors = data.get("colors")
    if not isinstance(colors, dict) or "primary" not in colors:
        raise ThemeFileError(f"{path.name}: needs a [colors] table with at least primary")
    unknown = sorted(set(colors) - set(COLOR_KEYS))
    if unknown:
        raise ThemeFileError(
            f"{path.name}: unknown colour {', '.join(unknown)} (known: {', '.join(COLOR_KEYS)})"
        )
    checked = {key: _color(path, key, value) for key, value in colors.items()}
    variables = data.get("variables", {})
    if not isinstance(variables, dict):
        raise ThemeFileError(f"{path.name}: [variables] must be a table")
    checked_variables = {
        str(key): _color(path, f"variables.{key}", value) for key, value in variables.items()
    }
    dark = data.get("dark", True)
    if not isinstance(dark, bool):
        raise ThemeFileError(f"{path.name}: dark must be true or false")
    extra: dict[str, float] = {}
    for key in ("luminosity_spread", "text_alpha"):
        if key in data:
            value = data[key]
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
                raise ThemeFileError(f"{path.name}: {key} must be a number from 0 to 1")
            extra[key] = float(value)
    return Theme(name=name.strip(), dark=dark, variables=checked_variables, **checked, **extra)  # type: ignore[arg-type]


def load_themes(folders: Iterable[Path] = ()) -> LoadedThemes:
    """The bundled themes, then every `*.toml` in `folders` (a later theme replaces one of the same name)."""
    loaded = LoadedThemes()
    by_name: dict[str, Theme] = {}
    for folder in [bundled_theme_dir(), *folders]:
        folder = folder.expanduser()
        if not folder.is_dir():
            if folder != bundled_theme_dir():
                loaded.problems.append(f"{folder}: no such theme folder")
            continue
        for path in sorted(folder.glob("*.toml")):
            try:
                theme = load_theme_file(path)
            except ThemeFileError as exc:
                loaded.problems.append(str(exc))
                continue
            by_name[theme.name] = theme
    loaded.themes = list(by_name.values())
    return loaded


def variable_defaults(theme: Theme) -> dict[str, str]:
    """Values for regen's own CSS variables that a theme left out, derived from its colours."""
    foreground = Color.parse(theme.foreground or ("#E0E0E0" if theme.dark else "#1C1C1C"))
    background = Color.parse(theme.background or ("#121212" if theme.dark else "#EEEEEE"))
    warning = theme.warning or "#FFD75F"
    return {
        "budget-warn": warning,
        "budget-over": theme.error or "#FF5F5F",
        "provider-excluded": foreground.blend(background, 0.45).hex,
        "data-stale": warning,
    }
