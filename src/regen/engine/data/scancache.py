"""The scan of each prompts file kept in the run folder, so an unchanged dataset is not validated again.

Every start validates every prompt line (docs/data-contract.md §1), 4.7 s a million lines; a week's
job starts many times on the same files. `cached_scan` keeps what `scan(keep_digests=True)` found in
`<run_dir>/scans/<dataset>.scan` under the file's identity: its size, mtime_ns and sha256, and a
fingerprint of the rules that checked it (the source of the modules that validate). A start whose
file has the same size and mtime hashes it (about 0.2 s a 77 MB file) and uses the kept scan only
when the sha256 is the same too: an edit that keeps size and mtime is still seen. A cache file that
cannot be read whole (torn, another version) is scanned again and rewritten: it is only ever a copy.

The file: one JSON line (identity, the report's counts and invalid lines, the byte lengths of what
follows and their sha256), then the content lengths (int64, line order) and the digests
(DIGEST_BYTES a line). Written to a temporary name, fsynced and renamed: never seen half written.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from array import array
from collections.abc import Callable
from io import BufferedReader
from pathlib import Path
from typing import Any

import orjson

from regen.engine.data import lines as lines_module
from regen.engine.data import scan as scan_module
from regen.engine.data import validate as validate_module
from regen.engine.data.datasets import Dataset
from regen.engine.data.scan import InvalidLine, ScanReport, scan

SCANS_DIR = "scans"
_FORMAT = 1


def _rules() -> str:
    """What decides a scan's result: a change to the validation makes every kept scan stale."""
    digest = hashlib.sha256()
    for module in (lines_module, scan_module, validate_module):
        digest.update(Path(str(module.__file__)).read_bytes())
    return digest.hexdigest()


def _file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def cached_scan(dataset: Dataset, run_dir: Path) -> tuple[ScanReport, Callable[[], None] | None]:
    """The dataset's scan with digests, and what keeps it in the run folder: None when it came from
    there (or the file changed while it was scanned). Keeping it is left to the caller, once the
    run folder is the job's (a refused start leaves no run folder behind)."""
    path = dataset.prompts_path
    cache = run_dir / SCANS_DIR / f"{dataset.name}.scan"
    try:
        st = path.stat()
    except OSError:
        return scan(dataset, keep_digests=True), None  # scan names the problem
    rules = _rules()
    kept = _load(cache, dataset, st.st_size, st.st_mtime_ns, rules)
    if kept is not None:
        return kept, None
    report = scan(dataset, keep_digests=True)
    after = path.stat()
    # A file written while it was scanned has no single identity: not kept.
    if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns) or report.size != st.st_size:
        return report, None

    def keep() -> None:
        with contextlib.suppress(OSError):  # only ever a copy: the next start scans again
            _store(cache, report, st.st_mtime_ns, rules)

    return report, keep


def _load(cache: Path, dataset: Dataset, size: int, mtime_ns: int, rules: str) -> ScanReport | None:
    try:
        with open(cache, "rb") as f:
            return _read(f, dataset, size, mtime_ns, rules)
    except (OSError, KeyError, TypeError, ValueError, AttributeError):
        return None  # unreadable, or not a cache this regen wrote: scanned again


def _read(f: BufferedReader, dataset: Dataset, size: int, mtime_ns: int, rules: str) -> ScanReport | None:
    head: dict[str, Any] = orjson.loads(f.readline())  # JSONDecodeError is a ValueError
    if (
        not isinstance(head, dict)
        or head.get("format") != _FORMAT
        or head.get("rules") != rules
        or head.get("size") != size
        or head.get("mtime_ns") != mtime_ns
    ):
        return None
    # Read straight into the report's own buffers: a million lines' 24 MB held once, not thrice.
    chars = array("q", bytes(head["chars_bytes"]))
    digests = bytearray(head["digests_bytes"])
    body = hashlib.sha256()
    for buffer in (memoryview(chars).cast("B"), memoryview(digests)):
        if f.readinto(buffer) != len(buffer):
            return None  # torn: scanned again
        body.update(buffer)
    if f.read(1) or body.hexdigest() != head["body_sha256"]:
        return None  # damaged
    # Same size and mtime: the content decides (an edit can keep both).
    if _file_sha256(dataset.prompts_path) != head["sha256"]:
        return None
    return ScanReport(
        dataset=dataset.name,
        path=dataset.prompts_path,
        lines=head["lines"],
        valid=head["valid"],
        invalid=[InvalidLine(dataset.name, line, reason) for line, reason in head["invalid"]],
        duplicates=head["duplicates"],
        size=size,
        sha256=head["sha256"],
        ends_with_newline=head["ends_with_newline"],
        turns={int(n): count for n, count in head["turns"].items()},
        extra_keys=head["extra_keys"],
        content_chars=chars,
        digests=digests,
    )


def _store(cache: Path, report: ScanReport, mtime_ns: int, rules: str) -> None:
    parts = (memoryview(report.content_chars).cast("B"), memoryview(report.digests or b""))
    body = hashlib.sha256()
    for part in parts:
        body.update(part)
    head = {
        "format": _FORMAT,
        "rules": rules,
        "size": report.size,
        "mtime_ns": mtime_ns,
        "sha256": report.sha256,
        "lines": report.lines,
        "valid": report.valid,
        "invalid": [[bad.line, bad.reason] for bad in report.invalid],
        "duplicates": report.duplicates,
        "ends_with_newline": report.ends_with_newline,
        "turns": {str(n): count for n, count in report.turns.items()},
        "extra_keys": report.extra_keys,
        "chars_bytes": len(parts[0]),
        "digests_bytes": len(parts[1]),
        "body_sha256": body.hexdigest(),
    }
    cache.parent.mkdir(parents=True, exist_ok=True)
    temporary = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as f:
            f.write(orjson.dumps(head) + b"\n")
            for part in parts:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, cache)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
