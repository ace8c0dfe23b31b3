"""Console settings and the process environment Textual reads at import; nothing here imports Textual."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

COLOR_SYSTEMS = ("auto", "standard", "256", "truecolor", "windows", "none")


@dataclass(slots=True)
class ConsoleOptions:
    """How the console looks and behaves; the CLI fills it from settings and flags."""

    theme: str = "regen-dark"
    """Name of the theme to start with; an unknown name falls back to the default with a toast."""
    theme_dirs: list[Path] = field(default_factory=list)
    """Extra folders scanned for `*.toml` theme files (after the bundled ones)."""
    keymap: dict[str, str] = field(default_factory=dict)
    """Binding id to comma-separated keys, e.g. {"pause": "P", "freeze": "F,ctrl+f"}."""
    mouse: bool = True
    """Mouse reporting; off is kinder to slow SSH links."""
    export_dir: Path | None = None
    """Where `e` writes snapshot files; None means the job's run folder, else the current folder."""
    stale_after_s: float = 5.0
    """Data older than this shows its age in the warning colour."""
    repaint_interval_s: float = 0.5
    """Panes repaint at most this often (the newest snapshot wins), spread over a few frames after the
    header so that no frame carries them all; 0 repaints everything at once on every snapshot."""
    log_max_lines: int = 2000
    """The log pane keeps at most this many lines."""
    history_points: int = 300
    """Points behind each sparkline (one per second of job time)."""
    concurrency_step: float = 0.10
    """`+`/`-` change the configured concurrency by this fraction (at least 1)."""
    min_size: tuple[int, int] = (60, 16)
    """Below this many columns x rows the console shows a message instead of a broken layout."""
    budget_warn_fraction: float = 0.8
    """Spent plus reserved above this fraction of the budget shows in the budget-warning colour."""


def configure_environment(
    fps: int | None = None, color_system: str | None = None, *, escape_delay_ms: int | None = None
) -> None:
    """Set what Textual reads from the environment at import; call before importing `regen.console.app`.

    Mouse reporting has no environment switch: it is `ConsoleOptions.mouse`, passed to `App.run`.
    """
    if fps is not None:
        if fps < 1:
            raise ValueError(f"--fps must be at least 1, not {fps}")
        os.environ["TEXTUAL_FPS"] = str(fps)
    if color_system is not None:
        if color_system not in COLOR_SYSTEMS:
            raise ValueError(
                f"--color-system must be one of {', '.join(COLOR_SYSTEMS)}, not {color_system!r}"
            )
        if color_system == "none":
            os.environ["NO_COLOR"] = "1"
        else:
            os.environ["TEXTUAL_COLOR_SYSTEM"] = color_system
    if escape_delay_ms is not None:
        os.environ["ESCDELAY"] = str(escape_delay_ms)
