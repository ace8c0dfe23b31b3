"""Text progress bars in content markup, coloured with theme variables only."""

from __future__ import annotations

PARTIAL = " ▏▎▍▌▋▊▉"


def bar(fraction: float | None, width: int, colour: str = "$primary") -> str:
    """A bar `width` cells wide filled to `fraction`, with eighth-cell precision."""
    width = max(1, width)
    if fraction is None:
        return f"[$text-muted]{'·' * width}[/]"
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, part = divmod(eighths, 8)
    filled = "█" * full + (PARTIAL[part] if part and full < width else "")
    rest = width - len(filled)
    return f"[{colour}]{filled}[/][$text-muted]{'░' * rest}[/]"


def segments(parts: list[tuple[float, str, str]], width: int) -> str:
    """A bar of consecutive segments (fraction, colour, character); the rest is left empty."""
    width = max(1, width)
    out: list[str] = []
    used = 0
    for fraction, colour, char in parts:
        cells = min(width - used, round(max(0.0, fraction) * width))
        if cells > 0:
            out.append(f"[{colour}]{char * cells}[/]")
            used += cells
    if used < width:
        out.append(f"[$text-muted]{'░' * (width - used)}[/]")
    return "".join(out)
