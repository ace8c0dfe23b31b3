"""Durable append-only JSONL files.

The project rule (docs/architecture.md, "Files a run writes"): every write that matters is an append of whole lines,
flushed and fsynced in groups; a torn last line is repaired on start; nothing is rewritten in
place. ``JsonlAppender`` is the one writer of a file and does group commit: lines queue while the
previous batch is being written and synced, then go out together as one ``write`` and one sync.
The future returned by ``append`` resolves only after its line is on disk, so a SIGKILL at any
moment loses nothing acknowledged; it can leave a torn last line, which the next ``open`` (or
``repair_torn_tail``) cuts off. Line numbers are 0-based, like prompt lines. ``switch`` moves a
long-running writer on to a fresh file between two batches (the attempt journal's rotation while a
job runs: engine/run/segments.py).

When a write or sync fails (disk full, an I/O error, a filesystem remounted read-only), the
appender cuts the file back to its last acknowledged line, fails that batch and every later
append with ``WriteFailed``, and accepts nothing more: docs/faults.md, "Disk full".
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import gzip
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal, InvalidOperation
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson

from regen.engine.errors import RegenError

__all__ = [
    "MAX_LINE_BYTES",
    "CorruptLine",
    "JsonlAppender",
    "JsonlError",
    "WriteFailed",
    "create_locked",
    "iter_jsonl",
    "iter_lines",
    "parse_line",
    "repair_torn_tail",
]

# The longest line ``iter_jsonl`` reads (docs/inputs.md). A row is far smaller (its text is capped by
# what one attempt may receive); a longer complete line is garbage, and reading it whole would
# cost its length in memory.
MAX_LINE_BYTES = 64 << 20


# -- values as regen's lines hold them (the rows, engine/data/row.py; the journals, engine/run/records.py)


def is_money(value: object) -> bool:
    """An amount as regen writes it: a decimal string (or, in older journals, a plain number), finite."""
    kind = type(value)
    if kind is float or kind is int:  # a row's amount: the cheap test first
        return math.isfinite(value)  # type: ignore[arg-type]
    if kind is not str:
        return False
    try:
        return Decimal(str(value)).is_finite()
    except InvalidOperation:
        return False


def is_optional(value: object, *types: type) -> bool:
    """None, or exactly one of `types` (a bool is not an int here)."""
    return value is None or type(value) in types


class JsonlError(RegenError, ValueError):
    """A JSONL file is corrupt, locked by another writer, or could not be written."""


class CorruptLine(JsonlError):
    """A complete line that is not a JSON object; ``line`` is 0-based, ``problem`` says why."""

    def __init__(self, path: str | os.PathLike[str], line: int, problem: str) -> None:
        self.path = Path(path)
        self.line = line
        self.problem = problem
        super().__init__(f"{path} line {line}: {problem}")


class WriteFailed(JsonlError):
    """Appending to a file failed; nothing more is written to it by this appender.

    ``path`` is the file, ``errno`` the OS error number (None when the writer was stopped rather
    than refused by the OS), ``reason`` the OS's words. ``clean`` is False when the file could
    not be cut back after a partial write, so it may end in lines of the failed batch (the next
    open still repairs a torn last line). The message is one line naming the file and why.
    """

    def __init__(self, path: Path, reason: str, errno_: int | None = None, *, clean: bool = True) -> None:
        self.path = path
        self.reason = reason
        self.errno = errno_
        self.clean = clean
        name = errno.errorcode.get(errno_) if errno_ is not None else None
        code = f" [{name}]" if name else ""
        tail = "" if clean else "; it could not be cut back, so it may end in unacknowledged lines"
        super().__init__(f"{path}: write failed: {reason}{code}{tail}")

    @classmethod
    def from_exception(cls, path: Path, exc: BaseException, *, clean: bool = True) -> WriteFailed:
        if isinstance(exc, WriteFailed):
            return cls(exc.path, exc.reason, exc.errno, clean=exc.clean and clean)
        if isinstance(exc, OSError):
            return cls(path, exc.strerror or str(exc), exc.errno, clean=clean)
        return cls(path, str(exc) or type(exc).__name__, None, clean=clean)

    def again(self) -> WriteFailed:
        """A fresh instance for another raise (an exception object keeps its traceback)."""
        return WriteFailed(self.path, self.reason, self.errno, clean=self.clean)


class _PartialWrite(OSError):
    """A write failed and the file could not be truncated back to where the batch began."""


# fdatasync also flushes the file size, which is all an append needs; fsync adds mtime etc.
_sync = getattr(os, "fdatasync", os.fsync)
# Indirection so tests can make writes fail (disk full) without touching the os module.
_write = os.write
_truncate = os.ftruncate

_TAIL_STEP = 1 << 16


def _repair_fd(fd: int) -> int:
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return 0
    # Walk back in blocks to the last newline; a torn line is at most one batch's last line,
    # but it can be long, and reading the whole file would be wasteful.
    end = size
    keep = 0
    while end > 0:
        start = max(0, end - _TAIL_STEP)
        block = os.pread(fd, end - start, start)
        nl = block.rfind(b"\n")
        if nl >= 0:
            keep = start + nl + 1
            break
        end = start
    os.ftruncate(fd, keep)
    _sync(fd)
    return size - keep


def repair_torn_tail(path: str | os.PathLike[str]) -> int:
    """Cut a last line that has no ``\\n`` (a write torn by a crash); return the bytes dropped.

    A missing file is fine and returns 0. Only call it while no appender has the file open.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    try:
        return _repair_fd(fd)
    finally:
        os.close(fd)


def iter_jsonl(
    path: str | os.PathLike[str], *, max_line: int | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line, object)`` for every complete line, streamed; a missing file yields nothing.

    A torn last line (no trailing ``\\n``) is ignored: it was never acknowledged. A complete line
    that is not a JSON object, or is longer than ``max_line`` bytes (default ``MAX_LINE_BYTES``),
    raises ``CorruptLine`` naming the file and line.
    """
    for n, raw in iter_lines(path, max_line=max_line):
        yield n, parse_line(path, n, raw)


def iter_lines(
    path: str | os.PathLike[str],
    *,
    max_line: int | None = None,
    start: int = 0,
    first: int = 0,
    end: int | None = None,
) -> Iterator[tuple[int, bytes]]:
    """``(line, bytes)`` for every complete line, as ``iter_jsonl`` reads them, not parsed; from
    byte `start`, which is line `first` of the file (a checkpoint's offset, engine/run/checkpoint.py),
    to byte `end` (the lines that began before it)."""
    limit = MAX_LINE_BYTES if max_line is None else max_line
    try:
        # A rotated journal segment is compressed (engine/run/segments.py).
        f = gzip.open(path, "rb") if os.fspath(path).endswith(".gz") else open(path, "rb")  # noqa: SIM115
    except FileNotFoundError:
        return
    with f:
        if start:
            f.seek(start)
        n = first - 1
        at = start
        while end is None or at < end:
            raw = f.readline(limit + 1)
            if not raw:
                return
            n += 1
            if raw[-1:] != b"\n":
                if len(raw) <= limit or not _skip_rest_of_line(f):
                    return  # a torn last line, however long
                raise CorruptLine(path, n, f"line longer than {limit} bytes")
            at += len(raw)
            yield n, raw


def parse_line(path: str | os.PathLike[str], n: int, raw: bytes) -> dict[str, Any]:
    """One complete line (0-based `n`) as a JSON object, or CorruptLine naming it."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        if b"\x00" in raw:
            # Zeros are what a power loss can leave where a write never reached the disk.
            raise CorruptLine(path, n, "holds NUL bytes, not JSON") from None
        raise CorruptLine(path, n, f"corrupt JSON ({e})") from None
    if not isinstance(obj, dict):
        raise CorruptLine(path, n, "not a JSON object")
    return obj


def _skip_rest_of_line(f: Any) -> bool:
    """Read past the end of an over-long line a block at a time; False when the file ends first."""
    while True:
        block = f.readline(_TAIL_STEP)
        if not block:
            return False
        if block[-1:] == b"\n":
            return True


class JsonlAppender:
    """Group-commit appender for one file; create it with ``await JsonlAppender.open(path)``.

    ``await appender.append(obj)`` returns once the line is written and synced. Lines keep the
    order of the ``append`` calls. One appender per file: ``open`` takes an exclusive ``flock``
    so a second writer (another job, or a second appender in this process) fails at once
    instead of interleaving.
    """

    def __init__(
        self,
        path: Path,
        fd: int,
        executor: ThreadPoolExecutor,
        *,
        commit_interval_s: float,
        max_batch: int,
        repaired_bytes: int,
        on_failure: Callable[[WriteFailed], None] | None = None,
    ) -> None:
        self.path = path
        self.repaired_bytes = repaired_bytes
        self.bytes_written = 0
        self.lines_written = 0
        self._fd = fd
        self._executor = executor
        self._interval = commit_interval_s
        self._max_batch = max_batch
        self._loop = asyncio.get_running_loop()
        # Parallel queues: encoded chunk, its line count, and the future to resolve for it (None
        # for a line nobody waits for: `append_nowait`).
        self._chunks: list[bytes] = []
        self._counts: list[int] = []
        self._waiters: list[asyncio.Future[None] | None] = []
        self._taken = 0  # chunks ever taken into a batch: a queued chunk's ticket less this is its index
        self._queued_lines = 0
        self._first_queued_at = 0.0
        self._wake = asyncio.Event()
        self._closing = False
        self._closed = False
        self._failure: WriteFailed | None = None
        self._on_failure = on_failure
        # Waiters of the batch being written now: failed too if the writer is cancelled mid-write.
        self._writing: list[asyncio.Future[None] | None] = []
        # A `switch` asked for and not yet done: the move to run between two batches, and its caller's future.
        self._switch: tuple[Callable[[], int | None], asyncio.Future[bool]] | None = None
        self._task = self._loop.create_task(self._run(), name=f"jsonl-writer {path.name}")

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        commit_interval_s: float = 0.005,
        max_batch: int = 4096,
        on_failure: Callable[[WriteFailed], None] | None = None,
    ) -> JsonlAppender:
        """Open (creating it if needed) ``path`` for appending, repairing a torn tail first.

        ``commit_interval_s`` is how long the first line of a batch may wait for company before
        the batch is written; ``max_batch`` caps the lines per write. ``on_failure`` is called
        once, on the loop, when writing fails (in the same step that fails the waiters), so an
        owner can stop producing lines at once.
        """
        if commit_interval_s < 0 or max_batch < 1:
            raise ValueError("commit_interval_s must be >= 0 and max_batch >= 1")
        path = Path(path)
        # A private thread per file: a slow sync never queues behind other work in the
        # default executor (DNS lookups, other files), and the single thread serialises the
        # file's writes and its final close.
        executor = ThreadPoolExecutor(1, thread_name_prefix=f"jsonl-{path.name}")
        try:
            fd, repaired = await asyncio.get_running_loop().run_in_executor(executor, _open_for_append, path)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        return cls(
            path,
            fd,
            executor,
            commit_interval_s=commit_interval_s,
            max_batch=max_batch,
            repaired_bytes=repaired,
            on_failure=on_failure,
        )

    # -- appending ------------------------------------------------------------------------

    def append(self, obj: Mapping[str, Any]) -> asyncio.Future[None]:
        """Queue one object as one line; the future resolves once it is durable.

        Serialisation happens now, so later changes to ``obj`` do not leak into the file and an
        unserialisable object raises here, at the caller.
        """
        self._check_usable()
        if not isinstance(obj, dict):
            raise TypeError(f"JSONL lines are objects, got {type(obj).__name__}")
        return self._enqueue(orjson.dumps(obj) + b"\n", 1)

    def append_nowait(self, obj: Mapping[str, Any]) -> int:
        """Queue one line nobody waits for; a failure to write it reaches ``on_failure`` (and every
        later append). Returns its ticket for ``supersede``."""
        self._check_usable()
        if not isinstance(obj, dict):
            raise TypeError(f"JSONL lines are objects, got {type(obj).__name__}")
        self._enqueue_line(orjson.dumps(obj) + b"\n", None)
        return self._taken + len(self._chunks) - 1

    def supersede(self, ticket: int, obj: Mapping[str, Any]) -> asyncio.Future[None]:
        """Append `obj`, in place of the line of `ticket` when that line is still queued (not yet in
        a batch being written): a line that says everything the queued one says and more makes it
        redundant, and the file then holds the new line where the old one would have been, so it
        is durable no later than the old one would have been. Otherwise a plain ``append``."""
        self._check_usable()
        index = ticket - self._taken
        if 0 <= index < len(self._chunks) and self._waiters[index] is None and self._counts[index] == 1:
            if not isinstance(obj, dict):
                raise TypeError(f"JSONL lines are objects, got {type(obj).__name__}")
            fut: asyncio.Future[None] = self._loop.create_future()
            self._chunks[index] = orjson.dumps(obj) + b"\n"
            self._waiters[index] = fut
            return fut
        return self.append(obj)

    def append_many(self, objs: Iterable[Mapping[str, Any]]) -> asyncio.Future[None]:
        """Queue several lines that become durable together; one future for all of them."""
        self._check_usable()
        lines = []
        for obj in objs:
            if not isinstance(obj, dict):
                raise TypeError(f"JSONL lines are objects, got {type(obj).__name__}")
            lines.append(orjson.dumps(obj))
        if not lines:
            return self._enqueue(b"", 0)
        lines.append(b"")
        return self._enqueue(b"\n".join(lines), len(lines) - 1)

    async def switch(self, move: Callable[[], int | None]) -> bool:
        """Run `move` on the file's own thread between two batches and go on writing where it says.

        Every line of a batch already taken is durable before `move` runs; lines appended meanwhile
        queue (in order, ``supersede`` still applying) and are written after it. `move` returns the
        descriptor of the file now at ``path`` (opened by ``create_locked``: appending, flocked),
        whose writes follow from then on, the old one being closed; or None to go on with the old.
        It runs in the writer's own task, so a caller cancelled while waiting does not cut it
        short, and ``close`` waits for it. True when the file was switched. A WriteFailed from
        `move` (the file moved away with none in its place) fails the appender as a failed write
        does; any other exception is the caller's, and the old file stays in use.
        """
        self._check_usable()
        if self._switch is not None:
            raise JsonlError(f"{self.path}: a switch is already under way")
        fut: asyncio.Future[bool] = self._loop.create_future()
        self._switch = (move, fut)
        self._wake.set()
        return await fut

    async def flush(self) -> None:
        """Wait until every line queued so far is durable (raises if writing failed)."""
        if self._closed:
            return
        self._check_usable()
        await self._enqueue(b"", 0)

    async def close(self) -> None:
        """Flush what is queued, stop the writer and close the file. Safe to call twice."""
        if self._closed:
            return
        self._closing = True
        self._wake.set()
        try:
            await asyncio.shield(self._task)
        except asyncio.CancelledError:
            if not self._task.cancelled():
                raise  # our caller was cancelled, not the writer
        finally:
            if not self._closed:
                self._closed = True
                # On the file's own thread, so it runs after any write still in flight.
                await self._loop.run_in_executor(self._executor, _close_fd, self._fd)
                self._executor.shutdown(wait=False)
        if self._failure is not None:
            raise self._failure.again()

    async def __aenter__(self) -> JsonlAppender:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.close()
        except JsonlError:
            if exc is None:
                raise

    @property
    def closed(self) -> bool:
        return self._closed or self._closing

    @property
    def failed(self) -> bool:
        """True once a write failed; every later append raises ``WriteFailed``."""
        return self._failure is not None

    @property
    def failure(self) -> WriteFailed | None:
        """Why writing stopped (file and OS reason), or None while the file is healthy."""
        return self._failure

    @property
    def queued_lines(self) -> int:
        """Lines accepted but not yet in a batch being written."""
        return self._queued_lines

    # -- internals ------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise self._failure.again()
        if self._closing or self._closed:
            raise JsonlError(f"{self.path}: appender is closed")

    def _enqueue(self, data: bytes, lines: int) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = self._loop.create_future()
        if not self._chunks:
            self._first_queued_at = self._loop.time()
            self._wake.set()
        self._chunks.append(data)
        self._counts.append(lines)
        self._waiters.append(fut)
        self._queued_lines += lines
        return fut

    def _enqueue_line(self, data: bytes, fut: asyncio.Future[None] | None) -> None:
        if not self._chunks:
            self._first_queued_at = self._loop.time()
            self._wake.set()
        self._chunks.append(data)
        self._counts.append(1)
        self._waiters.append(fut)
        self._queued_lines += 1

    def _take_batch(self) -> tuple[bytes, int, list[asyncio.Future[None] | None]]:
        # At least one chunk, then whole chunks while the line cap allows.
        n = 0
        lines = 0
        counts = self._counts
        while n < len(counts) and (n == 0 or lines + counts[n] <= self._max_batch):
            lines += counts[n]
            n += 1
        data = b"".join(self._chunks[:n])
        waiters = self._waiters[:n]
        del self._chunks[:n], self._counts[:n], self._waiters[:n]
        self._taken += n
        self._queued_lines -= lines
        if self._chunks:
            # The rest has waited at least as long as this batch; send it without lingering.
            self._first_queued_at = 0.0
        return data, lines, waiters

    async def _run(self) -> None:
        loop = self._loop
        try:
            while True:
                if self._switch is not None:  # once per batch, never per append
                    if not await self._switch_now():
                        return
                    continue
                if not self._chunks:
                    if self._closing:
                        return
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                if self._interval > 0 and not self._closing:
                    delay = self._first_queued_at + self._interval - loop.time()
                    if delay > 0 and self._queued_lines < self._max_batch:
                        # Linger so one sync carries many lines; lines arriving meanwhile join.
                        await asyncio.sleep(delay)
                data, lines, waiters = self._take_batch()
                self._writing = waiters
                try:
                    await loop.run_in_executor(self._executor, _write_all, self._fd, data)
                except Exception as e:
                    self._fail(
                        WriteFailed.from_exception(self.path, e, clean=not isinstance(e, _PartialWrite))
                    )
                    return
                self._writing = []
                self.bytes_written += len(data)
                self.lines_written += lines
                for fut in waiters:
                    if fut is not None and not fut.done():  # a caller may have cancelled its wait
                        fut.set_result(None)
        except asyncio.CancelledError:
            # A batch may be mid-write on the file's thread: its outcome is unknown, so its
            # waiters are told it failed rather than left waiting forever.
            self._fail(WriteFailed(self.path, "the writer was stopped before these lines were synced"))
            raise

    async def _switch_now(self) -> bool:
        """The switch asked for, between two batches; False when it failed the appender."""
        assert self._switch is not None
        move, fut = self._switch
        old = self._fd

        def moved() -> int | None:
            fd = move()
            if fd is not None:
                os.close(old)  # and with it the old file's flock: the new one holds its own
            return fd

        try:
            fd = await self._loop.run_in_executor(self._executor, moved)
        except WriteFailed as exc:
            self._switch = None
            self._fail(exc)
            if not fut.done():
                fut.set_exception(exc.again())
            return False
        except Exception as exc:
            self._switch = None
            if not fut.done():  # a caller may have cancelled its wait
                fut.set_exception(exc)
            return True
        self._switch = None
        if fd is not None:
            self._fd = fd
        if not fut.done():
            fut.set_result(fd is not None)
        return True

    def _fail(self, failure: WriteFailed) -> None:
        self._failure = failure
        waiters = [*self._writing, *self._waiters]
        self._writing = []
        if self._switch is not None:
            switching = self._switch[1]
            self._switch = None
            if not switching.done():
                switching.set_exception(failure.again())
        for fut in waiters:
            if fut is not None and not fut.done():
                fut.set_exception(failure.again())
        self._taken += len(self._chunks)
        self._chunks.clear()
        self._counts.clear()
        self._waiters.clear()
        self._queued_lines = 0
        if self._on_failure is not None:
            try:
                self._on_failure(failure)
            except Exception as exc:  # the owner's bug must not stop the waiters being failed
                self._loop.call_exception_handler(
                    {"message": f"{self.path}: on_failure callback raised", "exception": exc}
                )


def _open_for_append(path: Path, *, create: bool = False) -> tuple[int, int]:
    flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
        created = True
    except FileExistsError:
        if create:
            raise
        fd = os.open(path, flags)
        created = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JsonlError(f"{path}: another writer has this file open") from None
        repaired = 0 if created else _repair_fd(fd)
        if created:
            # The new directory entry must be durable too, or a crash can lose the whole file.
            dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return fd, repaired
    except BaseException:
        os.close(fd)
        raise


def create_locked(path: Path) -> int:
    """A new, empty file at `path` (none may be there), opened for appending and flocked as an
    appender opens its file, its directory entry durable: what ``JsonlAppender.switch`` moves to."""
    fd, _ = _open_for_append(path, create=True)
    return fd


def _write_all(fd: int, data: bytes) -> None:
    if not data:
        return
    # The last acknowledged line ends here: this appender is the file's only writer (flock).
    start = os.fstat(fd).st_size
    try:
        view = memoryview(data)
        while view:
            # A short write is not an error: the rest is written next, and a full disk says so
            # with ENOSPC on that next call.
            n = _write(fd, view)
            if n <= 0:
                raise OSError(errno.EIO, "write made no progress")
            view = view[n:]
        _sync(fd)
    except OSError as exc:
        # Leave no part of a failed batch behind: its callers are told it failed. After a failed
        # fsync the batch's pages may or may not be on disk, so it is cut either way.
        try:
            _truncate(fd, start)
            _sync(fd)
        except OSError:
            try:
                size = os.fstat(fd).st_size
            except OSError:
                size = -1
            if size != start:
                raise _PartialWrite(exc.errno, exc.strerror or str(exc)) from exc
        raise


def _close_fd(fd: int) -> None:
    os.close(fd)
