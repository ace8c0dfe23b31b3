"""Concrete colours from the current theme, for Rich text in tables and logs (CSS uses variables)."""

from __future__ import annotations

from rich.style import Style
from textual.app import App
from textual.color import Color, ColorParseError


def theme_color(app: App[object], variable: str) -> str | None:
    """A theme variable as a hex colour; "text-muted" and other computed ones are resolved too."""
    variables = app.theme_variables
    value = variables.get(variable)
    if value is not None:
        try:
            return Color.parse(value).hex
        except ColorParseError:
            pass
    try:
        foreground = Color.parse(variables.get("foreground", "#E0E0E0"))
        background = Color.parse(variables.get("background", "#121212"))
    except ColorParseError:
        return None
    if variable.startswith("text-muted") or variable == "foreground-muted":
        return foreground.blend(background, 0.4).hex
    return foreground.hex


def theme_style(app: App[object], variable: str, *, bold: bool = False) -> Style:
    """A Rich style in a theme colour."""
    colour = theme_color(app, variable)
    return Style(color=colour, bold=bold) if colour else Style(bold=bold)
