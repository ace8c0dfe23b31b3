"""Write errors at the appender, staged on real filesystems: a full tmpfs, ext4 turned read-only by
the kernel's error path, ext4 shut down (EIO); and, beside them, injected errors for the cases a
filesystem cannot be made to produce on demand (a failed fsync, a truncate that fails too).

What must hold every time: the file ends at a line boundary, every acknowledged line is in it
exactly once, nothing unacknowledged is kept when the file could be cut back, every waiter of the
failed batch and every later append get `WriteFailed` naming the file and the OS reason.
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import orjson
import pytest

import regen.engine.data.jsonl as jsonl
from regen.engine.data.jsonl import JsonlAppender, JsonlError, WriteFailed, iter_jsonl
from tests.support.filesystems import (
    Unmountable,
    emergency_read_only,
    ext4_loop,
    mount_ext4,
    plain_remount_read_only,
    shut_down,
    small_tmpfs,
    umount,
)


def _pad(i: int) -> str:
    # Lines from a few bytes to two pages, so batches straddle what the disk has left.
    return "x" * ((i * 7919) % 9000)


async def _fill(
    app: JsonlAppender, *, burst: int = 40, limit: int = 200_000
) -> tuple[list[int], list[BaseException]]:
    """Append bursts of lines until writing fails; returns (acknowledged ids, errors seen)."""
    acked: list[int] = []
    errors: list[BaseException] = []
    i = 0
    while app.failure is None and i < limit:
        futs = [(k, app.append({"i": k, "pad": _pad(k)})) for k in range(i, i + burst)]
        i += burst
        for k, fut in futs:
            try:
                await fut
                acked.append(k)
            except BaseException as exc:
                errors.append(exc)
    return acked, errors


def _ids(path: Path) -> list[int]:
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), "the file must end at a line boundary"
    ids = [orjson.loads(line)["i"] for line in data.splitlines()]
    for line in data.splitlines():
        obj = orjson.loads(line)
        assert obj["pad"] == _pad(obj["i"]), "a line was torn or mixed"
    return ids


def _assert_exactly(path: Path, acked: list[int]) -> None:
    ids = _ids(path)
    assert len(ids) == len(set(ids)), "a line is in the file twice"
    assert ids == sorted(acked), "the file holds exactly the acknowledged lines, in order"


async def _assert_failed_everywhere(
    app: JsonlAppender, errors: Sequence[BaseException | None], path: Path, reason: str
) -> WriteFailed:
    assert errors, "the failed batch's waiters were told"
    assert all(isinstance(e, WriteFailed) for e in errors), errors
    failure = app.failure
    assert failure is not None and app.failed
    message = str(errors[0])
    assert str(path) in message and reason in message and "\n" not in message
    assert message == str(failure)
    with pytest.raises(WriteFailed, match=reason):
        app.append({"i": -1})
    with pytest.raises(WriteFailed, match=reason):
        app.append_many([{"i": -2}])
    with pytest.raises(WriteFailed):
        await app.flush()
    return failure


class _ShortWriteSpy:
    """Calls the real os.write and records when it wrote less than asked (a full disk's way)."""

    def __init__(self) -> None:
        self.short = 0
        self.calls = 0

    def __call__(self, fd: int, data: memoryview) -> int:
        self.calls += 1
        n = os.write(fd, data)
        if n < len(data):
            self.short += 1
        return n


# -- a full disk ---------------------------------------------------------------------------------


async def test_full_tmpfs_keeps_every_acknowledged_line_once_and_resumes_after_space_is_freed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _ShortWriteSpy()
    monkeypatch.setattr(jsonl, "_write", spy)
    try:
        mount = small_tmpfs(tmp_path / "disk", 512 << 10)
        disk = mount.__enter__()
    except Unmountable as exc:
        pytest.skip(f"no real small filesystem here ({exc}); test_injected_disk_full covers the logic")
    try:
        ballast = disk / "ballast"
        ballast.write_bytes(b"\0" * (96 << 10))  # freed later, as an operator would free space
        path = disk / "attempts.jsonl"
        told: list[WriteFailed] = []
        app = await JsonlAppender.open(path, commit_interval_s=0.001, on_failure=told.append)
        acked, errors = await _fill(app)
        failure = await _assert_failed_everywhere(app, errors, path, "No space left on device")
        assert failure.errno == errno.ENOSPC and failure.clean
        assert "[ENOSPC]" in str(failure)
        assert told == [failure], "the owner is told once"
        assert spy.short > 0, "the disk filled mid-batch: a short write was cut back"
        with pytest.raises(WriteFailed):
            await app.close()
        assert len(acked) > 20
        _assert_exactly(path, acked)

        ballast.unlink()
        app = await JsonlAppender.open(path, commit_interval_s=0.001)
        assert app.repaired_bytes == 0, "nothing torn was left to repair"
        more = list(range(10**6, 10**6 + 5))
        for k in more:
            await app.append({"i": k, "pad": _pad(k)})
        await app.close()
        _assert_exactly(path, acked + more)
    finally:
        mount.__exit__(None, None, None)


async def test_injected_disk_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same rules with the disk's behaviour played at the write call: whole writes while
    space lasts, then one short write, then ENOSPC."""
    room = [300_000]

    def full_disk(fd: int, data: memoryview) -> int:
        if room[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = os.write(fd, data[: room[0]])
        room[0] -= n
        return n

    monkeypatch.setattr(jsonl, "_write", full_disk)
    path = tmp_path / "out.jsonl"
    app = await JsonlAppender.open(path, commit_interval_s=0.001)
    acked, errors = await _fill(app)
    failure = await _assert_failed_everywhere(app, errors, path, "No space left on device")
    assert failure.errno == errno.ENOSPC and failure.clean
    with pytest.raises(WriteFailed):
        await app.close()
    _assert_exactly(path, acked)


# -- a read-only remount and a dying disk --------------------------------------------------------


@pytest.fixture
def ext4(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    try:
        mount = ext4_loop(tmp_path / "ext4.img", tmp_path / "ext4")
        where = mount.__enter__()
    except Unmountable as exc:
        pytest.skip(f"no loop-mounted ext4 here ({exc}); the injected tests cover the logic")
    try:
        yield tmp_path / "ext4.img", where
    finally:
        mount.__exit__(None, None, None)


async def test_filesystem_turned_read_only_under_the_appender(ext4: tuple[Path, Path]) -> None:
    image, where = ext4
    path = where / "raw_responses.jsonl"
    app = await JsonlAppender.open(path, commit_interval_s=0.001)
    acked = []
    for k in range(200):
        await app.append({"i": k, "pad": _pad(k)})
        acked.append(k)
    # The kernel refuses a plain read-only remount while a file is open for writing, so what an
    # operator meets is ext4's own emergency remount after a disk error; stage that.
    assert plain_remount_read_only(where).returncode != 0
    emergency_read_only(where)
    more, errors = await _fill(app)
    assert more == [], "nothing is acknowledged on a read-only filesystem"
    failure = await _assert_failed_everywhere(app, errors, path, "Read-only file system")
    assert failure.errno == errno.EROFS and failure.clean
    with pytest.raises(WriteFailed):
        await app.close()
    umount(where)
    mount_ext4(image, where)
    _assert_exactly(path, acked)


async def test_disk_io_error_under_the_appender(ext4: tuple[Path, Path]) -> None:
    image, where = ext4
    path = where / "attempts.jsonl"
    app = await JsonlAppender.open(path, commit_interval_s=0.001)
    acked = []
    for k in range(100):
        await app.append({"i": k, "pad": _pad(k)})
        acked.append(k)
    shut_down(where)
    more, errors = await _fill(app)
    assert more == []
    failure = await _assert_failed_everywhere(app, errors, path, "Input/output error")
    assert failure.errno == errno.EIO
    with pytest.raises(WriteFailed):
        await app.close()
    umount(where)
    mount_ext4(image, where)
    _assert_exactly(path, acked)


# -- what a filesystem will not do on demand -----------------------------------------------------


async def test_failed_fsync_cuts_the_whole_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "out.jsonl"
    app = await JsonlAppender.open(path, commit_interval_s=0.001)
    for k in range(3):
        await app.append({"i": k, "pad": _pad(k)})
    real_sync = jsonl._sync
    calls = [0]

    def sync_fails_once(fd: int) -> None:
        calls[0] += 1
        if calls[0] == 1:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_sync(fd)

    monkeypatch.setattr(jsonl, "_sync", sync_fails_once)
    futs = [app.append({"i": k, "pad": _pad(k)}) for k in range(3, 30)]
    results = await asyncio.gather(*futs, return_exceptions=True)
    await _assert_failed_everywhere(app, list(results), path, "Input/output error")
    with pytest.raises(WriteFailed):
        await app.close()
    # The batch was written, its sync failed: it is cut, its lines were never acknowledged.
    _assert_exactly(path, [0, 1, 2])


async def test_partial_write_that_cannot_be_cut_back_says_so_and_the_next_open_repairs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "out.jsonl"
    app = await JsonlAppender.open(path, commit_interval_s=0.001)
    for k in range(3):
        await app.append({"i": k, "pad": _pad(k)})
    wrote = [False]

    def half_then_eio(fd: int, data: memoryview) -> int:
        if not wrote[0]:
            wrote[0] = True
            return os.write(fd, data[: len(data) // 2 + 7])
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    def truncate_refused(fd: int, size: int) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(jsonl, "_write", half_then_eio)
    monkeypatch.setattr(jsonl, "_truncate", truncate_refused)
    futs = [app.append({"i": k, "pad": _pad(k)}) for k in range(3, 20)]
    results = await asyncio.gather(*futs, return_exceptions=True)
    failure = await _assert_failed_everywhere(app, list(results), path, "Input/output error")
    assert not failure.clean and "may end in unacknowledged lines" in str(failure)
    with pytest.raises(WriteFailed):
        await app.close()
    monkeypatch.undo()
    # The next start repairs the torn tail; what stays is the acknowledged lines, then perhaps
    # whole lines of the failed batch (never acknowledged, never torn, never twice).
    reopened = await JsonlAppender.open(path)
    assert reopened.repaired_bytes > 0
    await reopened.close()
    ids = _ids(path)
    assert ids[:3] == [0, 1, 2] and ids == list(range(len(ids)))


async def test_writer_cancelled_mid_write_fails_that_batch_instead_of_hanging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "out.jsonl"
    app = await JsonlAppender.open(path, commit_interval_s=0.001)
    entered = asyncio.Event()
    loop = asyncio.get_running_loop()
    release = asyncio.Event()

    def slow_write(fd: int, data: memoryview) -> int:
        loop.call_soon_threadsafe(entered.set)
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result(timeout=10)
        return os.write(fd, data)

    monkeypatch.setattr(jsonl, "_write", slow_write)
    fut = app.append({"i": 0, "pad": ""})
    later = None
    await asyncio.wait_for(entered.wait(), 10)
    later = app.append({"i": 1, "pad": ""})
    app._task.cancel()
    with pytest.raises(WriteFailed, match="writer was stopped"):
        await asyncio.wait_for(fut, 10)
    with pytest.raises(WriteFailed, match="writer was stopped"):
        await asyncio.wait_for(later, 10)
    release.set()
    with pytest.raises(JsonlError):
        await app.close()


def test_write_failed_message_is_one_line_with_the_reason() -> None:
    exc = WriteFailed.from_exception(
        Path("/data/run/attempts.jsonl"), OSError(errno.ENOSPC, "No space left on device")
    )
    assert str(exc) == "/data/run/attempts.jsonl: write failed: No space left on device [ENOSPC]"
    assert isinstance(exc, JsonlError) and exc.errno == errno.ENOSPC and exc.path.name == "attempts.jsonl"
    assert list(iter_jsonl(Path("/nonexistent/x.jsonl"))) == []
