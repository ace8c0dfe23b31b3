"""Themes: bundled ones load and stay readable at 256 colours; broken files are reported, never fatal."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.color import Color as RichColor
from rich.color import ColorSystem
from textual.color import Color

from regen.console.options import ConsoleOptions
from regen.console.theming import (
    DEFAULT_THEME,
    REGEN_VARIABLES,
    ThemeFileError,
    bundled_theme_dir,
    load_theme_file,
    load_themes,
    variable_defaults,
)
from tests.support.console_app import make_app, settle

BUNDLED = ("regen-dark", "regen-light", "regen-contrast")


def contrast(a: Color, b: Color) -> float:
    """WCAG contrast ratio."""

    def luminance(c: Color) -> float:
        def channel(v: int) -> float:
            s = v / 255
            return s / 12.92 if s <= 0.03928 else ((s + 0.055) / 1.055) ** 2.4

        return 0.2126 * channel(c.r) + 0.7152 * channel(c.g) + 0.0722 * channel(c.b)

    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def at_256(colour: str) -> Color:
    """The colour a 256-colour terminal shows."""
    rich = RichColor.parse(colour).downgrade(ColorSystem.EIGHT_BIT)
    r, g, b = rich.get_truecolor()
    return Color(r, g, b)


def test_bundled_themes_load_without_problems() -> None:
    loaded = load_themes()
    assert loaded.problems == []
    assert set(BUNDLED) <= set(loaded.names)
    assert DEFAULT_THEME == "regen-dark"
    assert (bundled_theme_dir() / "regen-dark.toml").is_file()


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_themes_are_readable_at_256_colours(name: str) -> None:
    theme = load_theme_file(bundled_theme_dir() / f"{name}.toml")
    assert set(REGEN_VARIABLES) <= set(theme.variables)
    floor = 7.0 if name == "regen-contrast" else 4.5
    # Panes sit on $surface, the screen on $background: text must read on both, as a 256-colour
    # terminal (Rich's downgrade) shows them.
    for ground in (theme.background, theme.surface):
        background = at_256(ground or "")
        assert contrast(at_256(theme.foreground or ""), background) >= 7.0
        for colour in (theme.primary, theme.success, theme.warning, theme.error, *theme.variables.values()):
            assert contrast(at_256(colour or ""), background) >= floor, (name, ground, colour)


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def test_broken_theme_files_are_listed_one_line_each(tmp_path: Path) -> None:
    write(tmp_path, "bad-toml.toml", "name = [")
    write(tmp_path, "bad-colour.toml", 'name = "x"\n[colors]\nprimary = "not-a-colour"\n')
    write(tmp_path, "typo.toml", 'name = "y"\n[colors]\nprimary = "#123456"\nbackgrond = "#000000"\n')
    write(tmp_path, "no-primary.toml", 'name = "z"\n[colors]\nbackground = "#000000"\n')
    write(
        tmp_path,
        "mine.toml",
        'name = "mine"\ndark = false\n[colors]\nprimary = "#AF0000"\n[variables]\nbudget-warn = "#FF8700"\n',
    )
    loaded = load_themes([tmp_path, tmp_path / "missing"])
    assert "mine" in loaded.names
    problems = "\n".join(loaded.problems)
    assert "bad-toml.toml: not valid TOML" in problems
    assert "bad-colour.toml: primary = 'not-a-colour' is not a colour" in problems
    assert "typo.toml: unknown colour backgrond" in problems
    assert "no-primary.toml: needs a [colors] table with at least primary" in problems
    assert "missing: no such theme folder" in problems
    with pytest.raises(ThemeFileError):
        load_theme_file(tmp_path / "bad-toml.toml")


def test_a_minimal_theme_gets_regen_variables_from_its_colours(tmp_path: Path) -> None:
    theme = load_theme_file(
        write(tmp_path, "min.toml", '[colors]\nprimary = "#5FAFFF"\nwarning = "#FFD700"\n')
    )
    assert theme.name == "min"
    defaults = variable_defaults(theme)
    assert set(defaults) == set(REGEN_VARIABLES)
    assert defaults["budget-warn"] == "#FFD700"
    for value in defaults.values():
        Color.parse(value)


async def test_the_app_reports_broken_themes_in_one_toast_and_runs(tmp_path: Path) -> None:
    write(tmp_path, "bad-toml.toml", "name = [")
    write(tmp_path, "bad-colour.toml", 'name = "x"\n[colors]\nprimary = "nope"\n')
    write(tmp_path, "mine.toml", 'name = "mine"\n[colors]\nprimary = "#AF0000"\n')
    app = make_app(options=ConsoleOptions(theme="mine", theme_dirs=[tmp_path]))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert app.theme == "mine"
        toasts = [n for n in app._notifications if n.title == "Themes"]
        assert len(toasts) == 1
        assert "bad-toml.toml" in toasts[0].message and "bad-colour.toml" in toasts[0].message
        assert app.theme_variables["budget-warn"]  # a theme without regen's variables still styles


async def test_an_unknown_theme_falls_back_to_the_default() -> None:
    app = make_app(options=ConsoleOptions(theme="no-such-theme"))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert app.theme == DEFAULT_THEME
        assert any("unknown theme 'no-such-theme'" in n.message for n in app._notifications)
