"""Checkpoints: what a restart rebuilds from the journals and rows, kept up to a point in each file.

A start used to read every journal record and every row the run ever wrote (BENCHMARKS.md
"Restart"). A checkpoint holds the readers' own state after reading up to a byte offset of each
file (engine/run/recovery.py JournalReplay per lane, DatasetProgress per dataset): money by state,
open estimates, the attempts still open, the attempt counts of unfinished prompts (those of done
prompts are dropped), and each dataset's done lines as a bitmap. A start loads the last good one and
reads only what was written after its offsets, so it rebuilds exactly what a full read would.

Written at every start (after the read), every `job.checkpoint_interval_s` while the job runs and at
every clean stop, each time by reading on from the previous checkpoint's offsets: the checkpoint is
what the files say, never the live job's counters. A periodic one whose attempt journal has grown to
its rotation size is followed by `rotate_attempts`: the journal read to its end while its writer
waits, a checkpoint at offset 0 of the next file written first, then the rename
(engine/run/segments.py). While the job writes, the rows are read only up to the size they had
before the journals were read, so every row read has its attempt's records read too (a row is
written after its attempt's start record).

A file: one JSON line (format, the reading code's fingerprint, the run's lanes and datasets, the
attempt journal's segment count, each file's offset and the sha256 of the 4 KB before it, the
body's length and sha256), then the body (the readers' state, pickled). Written to a temporary
name, fsynced, renamed; the last KEEP are kept. One that does not read whole (torn, damaged,
another regen, files that no longer hold what it read, another segment count) is passed over for
the one before it; with none, the files are read from the start (docs/faults.md, "Checkpoints").
Offset 0 has no bytes to check, so one naming more segments than there are (a rotation a crash
stopped before its rename) is removed by the start that finds it, before a later rotation could
make it match a file it never read. The body is unpickled only into the classes listed in _ALLOWED.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pickle
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from regen.engine.data.jsonl import JsonlError, WriteFailed
from regen.engine.data.scan import ScanReport
from regen.engine.run import lineset, recovery
from regen.engine.run.recovery import DatasetProgress, JournalReplay, JournalState, read_rows
from regen.engine.run.segments import clear_fresh, due, last_segment, rotate, rotate_live

CHECKPOINTS_DIR = "checkpoints"
KEEP = 2
_FORMAT = 1
_TAIL = 4096  # bytes before an offset whose sha256 says the file still holds what was read


@dataclass(frozen=True, slots=True)
class Lane:
    """One reading of the journals: a lane's backend (None: every backend's), the backend of records
    that name none, and whether it counts attempts per prompt (engine/run/recovery.py read_journals)."""

    name: str
    backend: str | None
    default: str | None
    count_attempts: bool


@dataclass(slots=True)
class Resumed:
    """What a start gets: each lane's journals and each dataset's rows, as a full read would give."""

    journals: dict[str, JournalState]
    progress: dict[str, DatasetProgress]
    from_checkpoint: bool


def _code() -> str:
    """The readers whose state a body holds: a checkpoint another regen wrote is not read."""
    digest = hashlib.sha256()
    for module in (recovery, lineset):
        digest.update(Path(str(module.__file__)).read_bytes())
    return digest.hexdigest()


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint")
        return super().find_class(module, name)


_ALLOWED = frozenset(
    {
        ("regen.engine.run.recovery", "JournalReplay"),
        ("regen.engine.run.recovery", "JournalState"),
        ("regen.engine.run.recovery", "DatasetProgress"),
        ("regen.engine.run.recovery", "Unsettled"),
        ("regen.engine.run.recovery", "_AttemptReplay"),
        ("regen.engine.run.recovery", "_EventReplay"),
        ("regen.engine.run.lineset", "LineSet"),
        ("regen.engine.money.ledger", "Estimates"),
        ("regen.engine.money.ledger", "SpendBreakdown"),
        ("decimal", "Decimal"),
        ("copyreg", "_reconstructor"),
        ("builtins", "object"),
        ("builtins", "set"),
        ("builtins", "bytearray"),
    }
)


def _copy(value: Any) -> Any:
    """A deep copy through the checkpoint's own encoding (what the job mutates is never the reader's)."""
    return _Restricted(io.BytesIO(pickle.dumps(value, pickle.HIGHEST_PROTOCOL))).load()


def _tail_sha(path: Path, offset: int) -> str:
    if offset == 0:
        return ""
    with open(path, "rb") as f:
        f.seek(max(0, offset - _TAIL))
        return hashlib.sha256(f.read(min(offset, _TAIL))).hexdigest()


class Checkpointer:
    """The run's readers, kept between checkpoints: `resume` at a start, `advance` after."""

    def __init__(
        self,
        run_dir: Path,
        attempts: Path,
        events: Path,
        lanes: Sequence[Lane],
        results: Mapping[str, Path],
        rotate_from: int | None = None,
    ) -> None:
        self.dir = run_dir / CHECKPOINTS_DIR
        self.rotate_from = rotate_from  # bytes of attempt journal rotated (None: segments.COMPACT_FROM)
        self.attempts_path, self.events_path = attempts, events
        self.lanes = list(lanes)
        self.results = dict(results)
        self.key = {
            "lanes": [[lane.name, lane.backend, lane.default, lane.count_attempts] for lane in self.lanes],
            "datasets": sorted(self.results),
        }
        self.replays: dict[str, JournalReplay] = {}
        self.progress: dict[str, DatasetProgress] = {}
        self.prompts_sha: dict[str, str] = {}  # dataset -> the prompts file its rows were checked against
        self.tails: dict[str, str] = {}  # dataset -> sha256 of the 4 KB before the rows read so far
        self.written = 0  # checkpoints written by this process
        # A periodic advance still running in its thread when the clean stop's starts: one at a time.
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------ a start

    def resume(
        self,
        prompts: Mapping[str, ScanReport],
        before_rows: Callable[[Mapping[str, JournalState]], None] | None = None,
    ) -> Resumed:
        """The journals and rows as a full read gives them, read from the last good checkpoint on.

        Nothing writes the files now: torn tails are repaired as a full read repairs them.
        `before_rows` is handed each lane's journals (not yet finished) before the rows are read:
        the rows taken back that a crash left in their files are dropped there (engine/run/requeue.py).
        """
        if self.dir.is_dir():
            for stale in self.dir.glob(".*.tmp"):  # a write a crash cut short: never a checkpoint
                stale.unlink()
        clear_fresh(self.attempts_path)  # a rotation a crash cut short (engine/run/segments.py)
        loaded = self._load()
        if loaded is None:
            self.replays = {
                lane.name: JournalReplay.begin(lane.backend, lane.default, lane.count_attempts)
                for lane in self.lanes
            }
            self.progress = {}
            self.prompts_sha = {}
        for replay in self.replays.values():
            replay.state.torn_bytes = 0
            replay.repair(self.attempts_path, self.events_path)
            if loaded is None:
                replay.read_segments(self.attempts_path)  # the whole history
            replay.advance(self.attempts_path, self.events_path)
        if before_rows is not None:
            before_rows({name: replay.state for name, replay in self.replays.items()})
        open_lines = self._open_lines()
        for name, path in self.results.items():
            report = prompts[name]
            progress = self.progress.get(name)
            if (
                progress is None
                or self.prompts_sha.get(name) != report.sha256
                or not self._holds(name, progress)
            ):
                # Another prompts file (every row is checked again), or rows rewritten since: read whole.
                progress = DatasetProgress()
            progress.torn_bytes = 0
            progress.changed, progress.orphans = None, []
            self.progress[name] = read_rows(path, open_lines.get(name, set()), report, progress=progress)
            self.prompts_sha[name] = report.sha256
            self.tails[name] = _tail_sha(path, self.progress[name].offset)
        self._forget_settled(open_lines)
        # Everything read is in the checkpoint the job writes next: a grown journal becomes history.
        if rotate(self.attempts_path, self.rotate_from) is not None:
            for replay in self.replays.values():
                replay.attempts_at = (0, 0)
        copies: tuple[dict[str, JournalReplay], dict[str, DatasetProgress]] = _copy(
            (self.replays, self.progress)
        )
        journals = {name: replay.finish() for name, replay in copies[0].items()}
        return Resumed(journals, copies[1], loaded is not None)

    # ---------------------------------------------------------------------- while running

    def advance(self) -> None:
        """Read on to what the files hold now (complete lines only) and write a checkpoint.

        Safe while the job writes: rows only up to their size before the journals are read.
        """
        with self._lock:
            self._advance()

    def read_on(self) -> None:
        """Read on as `advance` does, without writing a checkpoint. The job calls it between
        checkpoints (engine/job/job.py, `READ_ON_S`): a read counts an attempt for every prompt
        started since the last read, and drops the counts of those that have their row only at its
        end, so one read of five minutes held 375,000 counts at 1,250 rows/s, a table the dict
        and then the process's RSS kept (BENCHMARKS.md, "Soak")."""
        with self._lock:
            self._read()

    def attempts_counted(self) -> int:
        """How many prompts' attempt counts the lanes hold now (those without their row)."""
        return sum(replay.attempts_counted() for replay in self.replays.values())

    def rotate_attempts(self) -> int | None:
        """The attempt journal, grown to its rotation size while the job runs, rotated into its next
        segment, with a checkpoint that has read all of it; the fresh journal's descriptor, or None
        when it has not grown that far. Call it while nothing writes the journal and everything
        written is on disk: from its appender's `switch` (engine/data/jsonl.py), as the job does.

        The checkpoint is written first, naming the segment count the rotation makes and offset 0
        of the fresh file: a SIGKILL before the rename leaves it not matching the files (passed over
        for the one before it, which reads on through the old file; the next start clears it), one
        after leaves it matching. A failure before the journal moved (the checkpoint not written,
        the rename refused) raises after putting everything back, so the journal goes on unrotated.
        """
        with self._lock:
            if not self.rotation_due():
                return None
            self._read()
            size = self.attempts_path.stat().st_size
            if any(replay.attempts_at[0] != size for replay in self.replays.values()):
                # A line the readers left (none should be: every batch is whole and synced).
                raise JsonlError(f"{self.attempts_path}: not read to its end, so not rotated")
            read = {name: replay.attempts_at for name, replay in self.replays.items()}
            for replay in self.replays.values():
                replay.attempts_at = (0, 0)
            number = self._number()
            try:
                self._write(segments=last_segment(self.attempts_path) + 1)
                return rotate_live(self.attempts_path)
            except WriteFailed:
                raise  # it moved with no fresh journal in its place: the checkpoint is right
            except (OSError, JsonlError):  # nothing moved
                for name, at in read.items():
                    self.replays[name].attempts_at = at
                with contextlib.suppress(FileNotFoundError):
                    (self.dir / f"{number:08d}.ckpt").unlink()
                raise

    def rotation_due(self) -> bool:
        """Whether the attempt journal has grown to its rotation size (`rotate_attempts`)."""
        return due(self.attempts_path, self.rotate_from)

    def _advance(self) -> None:
        self._read()
        self._write()

    def _read(self) -> None:
        sizes = {name: path.stat().st_size if path.exists() else 0 for name, path in self.results.items()}
        for replay in self.replays.values():
            replay.advance(self.attempts_path, self.events_path)
        open_lines = self._open_lines()
        for name, path in self.results.items():
            progress = self.progress.get(name)
            if progress is not None and (progress.offset > sizes[name] or not self._holds(name, progress)):
                # Rewritten under the reader (rows taken back and the file compacted): read it again.
                progress = DatasetProgress()
            self.progress[name] = read_rows(
                path, open_lines.get(name, set()), progress=progress, end=sizes[name]
            )
            self.tails[name] = _tail_sha(path, self.progress[name].offset)
        self._forget_settled(open_lines)

    def _holds(self, name: str, progress: DatasetProgress) -> bool:
        """Whether the dataset's results file still holds, before the offset read, what was read."""
        path = self.results[name]
        size = path.stat().st_size if path.exists() else 0
        return progress.offset <= size and _tail_sha(path, progress.offset) == self.tails.get(name)

    def _open_lines(self) -> dict[str, set[int]]:
        lines: dict[str, set[int]] = {}
        for replay in self.replays.values():
            for name, open_ in replay.open_lines().items():
                lines.setdefault(name, set()).update(open_)
        return lines

    def _forget_settled(self, open_lines: Mapping[str, set[int]]) -> None:
        """Only unfinished prompts keep their attempt counts, only open attempts their rows' facts."""
        done = {name: progress.done for name, progress in self.progress.items()}
        for replay in self.replays.values():
            replay.forget_done(done)
        for name, progress in self.progress.items():
            keep = open_lines.get(name, set())
            for line in [line for line in progress.settling if line not in keep]:
                del progress.settling[line]

    # ------------------------------------------------------------------------------ the file

    def _files(self) -> dict[str, Path]:
        return {"attempts": self.attempts_path, "events": self.events_path} | {
            f"rows:{name}": path for name, path in self.results.items()
        }

    def _offsets(self) -> dict[str, int]:
        first = next(iter(self.replays.values()))
        offsets = {"attempts": first.attempts_at[0], "events": first.events_at[0]}
        for name in self.results:
            progress = self.progress.get(name)
            offsets[f"rows:{name}"] = 0 if progress is None else progress.offset
        return offsets

    def write(self) -> Path:
        """The readers' state now, as the next checkpoint file (crash-safe: written whole or not seen)."""
        with self._lock:
            return self._write()

    def _write(self, segments: int | None = None) -> Path:
        body = pickle.dumps((self.replays, self.progress, self.prompts_sha), pickle.HIGHEST_PROTOCOL)
        files = self._files()
        head = {
            "format": _FORMAT,
            "code": _code(),
            "key": self.key,
            "segments": last_segment(self.attempts_path) if segments is None else segments,
            "files": {
                label: {"offset": offset, "tail": _tail_sha(files[label], offset)}
                for label, offset in self._offsets().items()
            },
            "body_bytes": len(body),
            "body_sha256": hashlib.sha256(body).hexdigest(),
        }
        self.dir.mkdir(parents=True, exist_ok=True)
        number = self._number()
        path = self.dir / f"{number:08d}.ckpt"
        temporary = self.dir / f".{number:08d}.{os.getpid()}.tmp"
        try:
            with open(temporary, "wb") as f:
                f.write(orjson.dumps(head) + b"\n" + body)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self.written += 1
        for old in self._existing()[KEEP:]:
            with contextlib.suppress(FileNotFoundError):
                old.unlink()
        return path

    def _number(self) -> int:
        """The number the next checkpoint file gets."""
        existing = self._existing()
        return int(existing[0].stem) + 1 if existing else 1

    def _existing(self) -> list[Path]:
        """Checkpoint files, newest first."""
        if not self.dir.is_dir():
            return []
        return sorted(
            (p for p in self.dir.glob("*.ckpt") if p.stem.isdigit()), key=lambda p: int(p.stem), reverse=True
        )

    def _load(self) -> Path | None:
        """The newest checkpoint that reads whole and matches the files, into the readers; its path."""
        code = _code()
        for path in self._existing():
            with contextlib.suppress(
                OSError, ValueError, KeyError, TypeError, pickle.UnpicklingError, EOFError, AttributeError
            ):
                if self._take(path, code):
                    return path
        return None

    def _take(self, path: Path, code: str) -> bool:
        data = path.read_bytes()
        cut = data.find(b"\n")
        head = orjson.loads(data[:cut])
        body = data[cut + 1 :]
        if head["format"] != _FORMAT or head["code"] != code or head["key"] != self.key:
            return False
        segments = last_segment(self.attempts_path)
        if head["segments"] > segments:
            # Written for a rotation a crash stopped before its rename (rotate_attempts): once another
            # rotation makes that many segments its offset 0 would match a file it never read.
            path.unlink()
            return False
        if head["segments"] != segments:
            return False  # the journal was rotated since: its offsets are of another file
        if len(body) != head["body_bytes"] or hashlib.sha256(body).hexdigest() != head["body_sha256"]:
            return False  # torn or damaged
        files = self._files()
        for label, kept in head["files"].items():
            file = files[label]
            size = file.stat().st_size if file.exists() else 0
            if kept["offset"] > size or _tail_sha(file, kept["offset"]) != kept["tail"]:
                return False  # the file no longer holds what was read (replaced, cut, edited)
        replays, progress, prompts_sha = _Restricted(io.BytesIO(body)).load()
        if set(replays) != {lane.name for lane in self.lanes}:
            return False
        self.replays, self.progress, self.prompts_sha = replays, progress, prompts_sha
        self.tails = {name: head["files"][f"rows:{name}"]["tail"] for name in self.results}
        return True
