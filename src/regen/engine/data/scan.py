"""One pass over a dataset: every line checked, what ``regen inspect`` prints and a run checks first.

``scan`` validates every line of a dataset in one streaming pass (data/lines.py, data/validate.py)
and reports counts, invalid lines by kind, duplicates, the file's size and sha256;
``iter_prompts`` yields the valid prompts lazily, with the same line numbers.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from array import array
from collections.abc import Container, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from regen.engine.data.datasets import PROMPTS_FILE, Dataset, DatasetError, Prompt, discover
from regen.engine.data.lines import Tap, open_file, read_lines
from regen.engine.data.validate import check_line, reason_kind

__all__ = ["DIGEST_BYTES", "InvalidLine", "ScanReport", "iter_prompts", "scan"]


@dataclass(frozen=True, slots=True)
class InvalidLine:
    dataset: str
    line: int
    reason: str

    @property
    def kind(self) -> str:
        return reason_kind(self.reason)

    def __str__(self) -> str:
        return f"{self.dataset} line {self.line}: {self.reason}"


@dataclass(slots=True)
class ScanReport:
    """One pass over a dataset file: what ``regen inspect`` prints and what a run checks first."""

    dataset: str
    path: Path
    lines: int = 0
    valid: int = 0
    invalid: list[InvalidLine] = field(default_factory=list)
    # Lines whose canonical messages hash was already seen earlier in the file.
    duplicates: int = 0
    size: int = 0
    sha256: str = ""
    ends_with_newline: bool = True
    # Number of messages per valid prompt -> how many prompts have that many.
    turns: dict[int, int] = field(default_factory=dict)
    # Top-level keys other than messages/id/meta -> how many lines carry them (ignored keys).
    extra_keys: dict[str, int] = field(default_factory=dict)
    # Total content characters of each valid prompt, in line order; array keeps it 8 bytes each.
    content_chars: array[int] = field(default_factory=lambda: array("q"))
    # With scan(keep_digests=True): the first DIGEST_BYTES of each line's canonical-messages sha256,
    # line after line (zeros for an invalid line), so rows can be checked against their prompts
    # without reading the file again.
    digests: bytearray | None = None

    def digest_of(self, line: int) -> bytes | None:
        """The kept digest prefix of a valid line, or None."""
        if self.digests is None or not 0 <= line < self.lines:
            return None
        digest = bytes(self.digests[line * DIGEST_BYTES : (line + 1) * DIGEST_BYTES])
        return None if digest == _NO_DIGEST else digest

    @property
    def total(self) -> int:
        """Same as ``lines``: every line of the file, valid or not."""
        return self.lines

    @property
    def invalid_lines(self) -> frozenset[int]:
        """The invalid line numbers, ready for ``iter_prompts(skip_lines=...)``."""
        return frozenset(i.line for i in self.invalid)

    def invalid_by_kind(self, first: int = 5) -> dict[str, tuple[int, list[int]]]:
        """``kind -> (count, first few line numbers)``, kinds in order of first appearance."""
        out: dict[str, tuple[int, list[int]]] = {}
        for inv in self.invalid:
            count, sample = out.get(inv.kind, (0, []))
            if len(sample) < first:
                sample.append(inv.line)
            out[inv.kind] = (count + 1, sample)
        return out

    def content_chars_percentiles(self, ps: Sequence[int] = (50, 90, 99)) -> dict[str, int]:
        values = sorted(self.content_chars)
        if not values:
            return {f"p{p}": 0 for p in ps}
        # Nearest-rank: always a value that occurs, which reads better for lengths.
        return {
            f"p{p}": values[min(len(values) - 1, max(0, math.ceil(p / 100 * len(values)) - 1))] for p in ps
        }

    def to_dict(self, first: int = 5) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "path": str(self.path),
            "lines": self.lines,
            "valid": self.valid,
            "invalid": len(self.invalid),
            "invalid_by_kind": {
                k: {"count": c, "first_lines": s} for k, (c, s) in self.invalid_by_kind(first).items()
            },
            "duplicates": self.duplicates,
            "size": self.size,
            "sha256": self.sha256,
            "ends_with_newline": self.ends_with_newline,
            "turns": {str(k): v for k, v in sorted(self.turns.items())},
            "content_chars": self.content_chars_percentiles(),
            "extra_keys": dict(sorted(self.extra_keys.items())),
        }


_KNOWN_KEYS = frozenset({"messages", "id", "meta"})
# 16 bytes of a sha256 tell prompts apart with a collision chance far below anything observable.
DIGEST_BYTES = 16
_NO_DIGEST = bytes(DIGEST_BYTES)


def scan(dataset: Dataset, *, keep_digests: bool = False) -> ScanReport:
    """Validate every line of ``dataset`` in one streaming pass."""
    path = dataset.prompts_path
    report = ScanReport(dataset=dataset.name, path=path)
    tap = Tap()
    lines = read_lines(open_file(path), path, tap)
    seen: set[bytes] = set()
    turns = report.turns
    extra = report.extra_keys
    invalid = report.invalid
    content_chars = report.content_chars
    sha256 = hashlib.sha256
    name = dataset.name
    digests = report.digests = bytearray() if keep_digests else None
    line = -1
    for line, raw in enumerate(lines):
        checked = check_line(raw)
        if isinstance(checked, str):
            invalid.append(InvalidLine(name, line, checked))
            if digests is not None:
                digests += _NO_DIGEST
            continue
        # A digest prefix keeps the duplicate set small for multi-million-line files.
        digest = sha256(checked.canonical).digest()[:DIGEST_BYTES]
        if digests is not None:
            digests += digest
        if digest in seen:
            report.duplicates += 1
        else:
            seen.add(digest)
        n = len(checked.messages)
        turns[n] = turns.get(n, 0) + 1
        content_chars.append(checked.content_chars)
        if len(checked.obj) > 1:
            for key in checked.obj.keys() - _KNOWN_KEYS:
                extra[key] = extra.get(key, 0) + 1
    report.lines = line + 1
    report.valid = report.lines - len(invalid)
    report.sha256 = tap.hash.hexdigest()
    report.size = tap.size
    report.ends_with_newline = tap.size == 0 or tap.last == b"\n"
    return report


def iter_prompts(dataset: Dataset, skip_lines: Container[int] = ()) -> Iterator[Prompt]:
    """Valid prompts of ``dataset`` in line order, read lazily from disk.

    Invalid lines and ``skip_lines`` are passed over; line numbers match ``scan``.
    """
    path = dataset.prompts_path
    return _iter_prompts(dataset.name, read_lines(open_file(path), path), skip_lines)


def _iter_prompts(name: str, lines: Iterator[bytes], skip_lines: Container[int]) -> Iterator[Prompt]:
    for line, raw in enumerate(lines):
        if line in skip_lines:
            continue
        checked = check_line(raw)
        if isinstance(checked, str):
            continue
        yield checked.prompt(name, line)


# ---------------------------------------------------------------------------------------------
# Standalone: python -m regen.engine.data.scan DIR... (a dataset folder or a root of them)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: scan.py DIR...  (dataset folders or folders of them; prints JSON lines)")
        return 2
    folders = [Path(a) for a in args if (Path(a) / PROMPTS_FILE).is_file()]
    roots = [Path(a) for a in args if not (Path(a) / PROMPTS_FILE).is_file()]
    try:
        datasets = discover(folders, roots)
        for ds in datasets:
            print(json.dumps(scan(ds).to_dict(), ensure_ascii=False), flush=True)
    except DatasetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
