"""Stand-in for the `sglang` package: the version a GPU host would report (docs/sglang.md)."""

from .version import __version__

__all__ = ["__version__"]
