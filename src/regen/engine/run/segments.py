"""The attempt journal's history, rotated into compressed segments that a resume never reads.

A checkpoint (engine/run/checkpoint.py) holds everything a start needs from the records before it,
so once attempts.jsonl has grown to `job.journal_segment_mb` (COMPACT_FROM by default) the whole
file, all of it read into a checkpoint, becomes segment N: renamed into `segments/` at once, then
compressed in the background. At a start (`rotate`: nothing writes it) and while the job runs, at a
periodic checkpoint (`rotate_live`: its writer holds it between two batches, and goes on in a fresh
file made, flocked, before the rename; engine/data/jsonl.py `switch`), so the file of a job never
restarted stays bounded too. A start reads the checkpoint and the new attempts.jsonl only; whoever
needs the whole history (a start without a usable checkpoint, `regen verify`'s spend, a spend audit:
engine/run/recovery.py read_journals and journal_spend) reads the segments in order, then the file.

Crash-safe at every step: the rename moves the file whole (history = segments + attempts.jsonl holds
throughout, the file absent for a moment while the job runs); the compressed copy is written to a
temporary name, fsynced and renamed, and only then is the plain segment removed; a segment found
both plain and compressed is read plain; a temporary left by a crash is removed and the plain
segment compressed again; a fresh file a crash left before it took the journal's place is removed
(docs/faults.md, "Checkpoints").
"""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from regen.engine.data.jsonl import WriteFailed, create_locked

SEGMENTS_DIR = "segments"
# A journal smaller than this stays whole: about 200,000 attempts, seconds to read. The default of
# `job.journal_segment_mb`, which a job passes as `limit`.
COMPACT_FROM = 64 << 20
_compressing = threading.Lock()
_PART = re.compile(r"^(?P<stem>.+)\.(?P<n>\d{6})\.jsonl(?P<gz>\.gz)?$")


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def segments(path: Path) -> list[Path]:
    """The rotated segments of journal `path`, oldest first (each plain if it is there, else compressed)."""
    folder = path.parent / SEGMENTS_DIR
    if not folder.is_dir():
        return []
    found: dict[int, Path] = {}
    for entry in folder.iterdir():
        match = _PART.match(entry.name)
        if match is None or match["stem"] != path.stem:
            continue
        n = int(match["n"])
        if match["gz"] is None or n not in found:
            found[n] = entry
    return [found[n] for n in sorted(found)]


def history(path: Path) -> list[Path]:
    """Every part of journal `path`, in order: its segments, then the file."""
    return [*segments(path), path]


def read_live(path: Path, read: Callable[[Path, Path, int, int], tuple[int, int]]) -> None:
    """Every part of journal `path`'s history read once, in order, by `read(part, shown, start,
    first)` (`shown`: the name to give the part in a message; it returns the byte and line it stopped
    at), while a job may be rotating it (`rotate_live`): for readers that do not hold the run
    (`regen report`, `regen verify`). The live file is read through a descriptor, so if it becomes a
    segment under the reader the rest of it is read on from where the reader was, then what came
    after it; a rotation between the listing and the open is read in its order, before the new file.
    """
    done = 0
    while True:
        parts = segments(path)
        for part in parts[done:]:
            read(part, part, 0, 0)
        done = len(parts)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # no journal, or between a rotation's two renames
            if len(segments(path)) > done:
                continue
            return
        try:
            if len(segments(path)) > done:
                continue  # rotated before the open: that segment is read first
            held = Path(f"/proc/self/fd/{fd}")  # this file, whatever its name becomes
            at = read(held, path, 0, 0)
            if len(segments(path)) == done:
                return
            read(held, path, *at)  # it became segment done + 1 under the reader: the rest of it
            done += 1
        finally:
            os.close(fd)


def last_segment(path: Path) -> int:
    """The number of the newest segment of `path` (0: none)."""
    parts = segments(path)
    match = _PART.match(parts[-1].name) if parts else None
    return int(match["n"]) if match else 0


def due(path: Path, limit: int | None = None) -> bool:
    """Whether journal `path` has grown to `limit` bytes (None: COMPACT_FROM): it is rotated next."""
    try:
        return path.stat().st_size >= (COMPACT_FROM if limit is None else limit)
    except FileNotFoundError:
        return False


def rotate(path: Path, limit: int | None = None) -> Path | None:
    """Journal `path` renamed to its next segment (nothing writes it now), if it is `due`."""
    if not due(path, limit):
        return None
    folder = path.parent / SEGMENTS_DIR
    folder.mkdir(exist_ok=True)
    target = folder / f"{path.stem}.{last_segment(path) + 1:06d}.jsonl"
    os.rename(path, target)
    _fsync_dir(folder)
    _fsync_dir(path.parent)
    return target


def _fresh(path: Path) -> Path:
    """Where the file that takes journal `path`'s place while the job runs is made, before it moves there."""
    return path.with_name(f".{path.name}.next")


def clear_fresh(path: Path) -> None:
    """A fresh journal a crash left before it took `path`'s place (always empty: nothing writes it
    before it is there). Only while nothing writes the journal (a start)."""
    with contextlib.suppress(FileNotFoundError):
        _fresh(path).unlink()


def rotate_live(path: Path) -> int:
    """Journal `path`, which its writer holds between two batches, renamed to its next segment and a
    fresh one, flocked, put in its place; the fresh one's descriptor (engine/data/jsonl.py `switch`).

    The fresh file is made and flocked first, beside it; then the journal is renamed to the segment
    (its writer's flock goes with it) and the fresh file renamed to `path`. Between the two renames
    `path` is absent: the run lock (engine/run/runlock.py) keeps any other job out meanwhile, and
    a SIGKILL there leaves segments + no file, the whole history, with only the empty fresh file to
    clear. An OSError before the journal moved leaves it as it was (nothing moved); a WriteFailed
    says it moved with no fresh file in its place, so nothing may be written to it any more.
    """
    folder = path.parent / SEGMENTS_DIR
    folder.mkdir(exist_ok=True)
    target = folder / f"{path.stem}.{last_segment(path) + 1:06d}.jsonl"
    fresh = _fresh(path)
    clear_fresh(path)
    fd = create_locked(fresh)
    try:
        os.rename(path, target)
    except BaseException:
        os.close(fd)
        fresh.unlink()
        raise
    try:
        os.rename(fresh, path)
        _fsync_dir(folder)
        _fsync_dir(path.parent)
    except OSError as exc:
        os.close(fd)
        raise WriteFailed.from_exception(path, exc) from exc
    return fd


def compress(path: Path) -> int:
    """Every plain segment of journal `path` compressed (safe to run again after a crash); how many.

    One at a time in a process: a job's compression is cancelled at its stop while its thread goes
    on, and a second one started meanwhile (the next start, a later rotation) must not clear the
    first one's temporary as a crash's.
    """
    with _compressing:
        return _compress(path)


def _compress(path: Path) -> int:
    folder = path.parent / SEGMENTS_DIR
    if not folder.is_dir():
        return 0
    for stale in folder.glob(f".{path.stem}.*.tmp"):
        stale.unlink()
    done = 0
    for part in segments(path):
        if part.suffix == ".gz":
            continue
        final = part.with_name(part.name + ".gz")
        temporary = folder / f".{part.name}.gz.tmp"
        try:
            with open(part, "rb") as src, gzip.open(temporary, "wb", compresslevel=1) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            with open(temporary, "rb") as f:
                os.fsync(f.fileno())
            os.replace(temporary, final)
            _fsync_dir(folder)
        finally:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
        part.unlink()
        done += 1
    return done
