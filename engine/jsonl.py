"""Durable append-only JSONL files.

The project rule (docs/architecture.md, "Files a run writes"): every write that matters is an append of whole lines,
flushed and fsynced in groups; a torn last line is repaired on start; nothing is rewritten in
place. ``JsonlAppender`` is the one writer of a file and does group commit: lines queue while the
previous batch is being written and synced, then go out together as one ``write`` and one sync.
The future returned by ``append`` resolves only after its line is on disk, so a SIGKILL at any
moment loses nothing acknowledged; it can leave a torn last line, which the next ``open`` (or
``repair_torn_tail``) cuts off. Line numbers are 0-based, like prompt lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson

__all__ = ["JsonlAppender", "JsonlError", "iter_jsonl", "repair_torn_tail"]


class JsonlError(ValueError):
    """A JSONL file is corrupt, locked by another writer, or could not be written."""


# fdatasync also flushes the file size, which is all an append needs; fsync adds mtime etc.
_sync = getattr(os, "fdatasync", os.fsync)
# Indirection so tests can make writes fail (disk full) without touching the os module.
_write = os.write

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


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line, object)`` for every complete line, streamed; a missing file yields nothing.

    A torn last line (no trailing ``\\n``) is ignored: it was never acknowledged. A complete line
    that is not a JSON object raises ``JsonlError`` naming the file and line.
    """
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the with below, after the check
    except FileNotFoundError:
        return
    with f:
        for n, raw in enumerate(f):
            if raw[-1:] != b"\n":
                return
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as e:
                raise JsonlError(f"{path} line {n}: corrupt JSON ({e})") from None
            if not isinstance(obj, dict):
                raise JsonlError(f"{path} line {n}: not a JSON object")
            yield n, obj


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
        # Parallel queues: encoded chunk, its line count, and the future to resolve for it.
        self._chunks: list[bytes] = []
        self._counts: list[int] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._queued_lines = 0
        self._first_queued_at = 0.0
        self._wake = asyncio.Event()
        self._closing = False
        self._closed = False
        self._error: BaseException | None = None
        self._task = self._loop.create_task(self._run(), name=f"jsonl-writer {path.name}")

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        commit_interval_s: float = 0.005,
        max_batch: int = 4096,
    ) -> JsonlAppender:
        """Open (creating it if needed) ``path`` for appending, repairing a torn tail first.

        ``commit_interval_s`` is how long the first line of a batch may wait for company before
        the batch is written; ``max_batch`` caps the lines per write.
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
        finally:
            if not self._closed:
                self._closed = True
                # On the file's own thread, so it runs after any write still in flight.
                await self._loop.run_in_executor(self._executor, _close_fd, self._fd)
                self._executor.shutdown(wait=False)
        if self._error is not None:
            raise self._failed()

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
    def queued_lines(self) -> int:
        """Lines accepted but not yet in a batch being written."""
        return self._queued_lines

    # -- internals ------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._error is not None:
            raise self._failed()
        if self._closing or self._closed:
            raise JsonlError(f"{self.path}: appender is closed")

    def _failed(self) -> JsonlError:
        err = JsonlError(f"{self.path}: writing failed earlier, nothing more is accepted ({self._error})")
        err.__cause__ = self._error
        return err

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

    def _take_batch(self) -> tuple[bytes, int, list[asyncio.Future[None]]]:
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
        self._queued_lines -= lines
        if self._chunks:
            # The rest has waited at least as long as this batch; send it without lingering.
            self._first_queued_at = 0.0
        return data, lines, waiters

    async def _run(self) -> None:
        loop = self._loop
        try:
            while True:
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
                try:
                    await loop.run_in_executor(self._executor, _write_all, self._fd, data)
                except Exception as e:
                    self._fail(e, waiters)
                    return
                self.bytes_written += len(data)
                self.lines_written += lines
                for fut in waiters:
                    if not fut.done():  # a caller may have cancelled its wait
                        fut.set_result(None)
        except asyncio.CancelledError:
            self._fail(JsonlError(f"{self.path}: writer stopped before these lines were written"), [])
            raise

    def _fail(self, exc: BaseException, waiters: list[asyncio.Future[None]]) -> None:
        self._error = exc
        err = self._failed()
        for fut in [*waiters, *self._waiters]:
            if not fut.done():
                fut.set_exception(err)
        self._chunks.clear()
        self._counts.clear()
        self._waiters.clear()
        self._queued_lines = 0


def _open_for_append(path: Path) -> tuple[int, int]:
    flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
        created = True
    except FileExistsError:
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


def _write_all(fd: int, data: bytes) -> None:
    if not data:
        return
    start = os.fstat(fd).st_size
    try:
        view = memoryview(data)
        while view:
            n = _write(fd, view)
            if n <= 0:
                raise OSError(errno.EIO, "write made no progress")
            view = view[n:]
        _sync(fd)
    except OSError:
        # Leave no part of a failed batch behind: its callers were told it failed. Best effort;
        # if this fails too, the next open still repairs a torn tail.
        with contextlib.suppress(OSError):
            os.ftruncate(fd, start)
        raise


def _close_fd(fd: int) -> None:
    os.close(fd)
