"""Durable JSONL appends: repair, reading, group commit, failure, and real SIGKILLs."""

from __future__ import annotations

import asyncio
import errno
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import orjson
import pytest

import regen.engine.data.jsonl as jsonl
from regen.engine.data.jsonl import JsonlAppender, JsonlError, create_locked, iter_jsonl, repair_torn_tail
from tests.support.processes import ROOT

# -- repair_torn_tail -----------------------------------------------------------------------


def test_repair_missing_file_is_zero(tmp_path: Path) -> None:
    assert repair_torn_tail(tmp_path / "nope.jsonl") == 0


@pytest.mark.parametrize(
    ("content", "kept", "dropped"),
    [
        (b"", b"", 0),
        (b'{"a":1}\n', b'{"a":1}\n', 0),
        (b'{"a":1}\n{"b":', b'{"a":1}\n', 5),
        (b'{"b":2', b"", 6),
        (b'{"a":1}\n\n{"x', b'{"a":1}\n\n', 3),
    ],
)
def test_repair_torn_tail(tmp_path: Path, content: bytes, kept: bytes, dropped: int) -> None:
    p = tmp_path / "f.jsonl"
    p.write_bytes(content)
    assert repair_torn_tail(p) == dropped
    assert p.read_bytes() == kept
    assert repair_torn_tail(p) == 0


def test_repair_long_torn_line_spanning_blocks(tmp_path: Path) -> None:
    p = tmp_path / "f.jsonl"
    head = b'{"a":1}\n' * 3
    torn = b'{"big":"' + b"x" * 300_000  # longer than the backward-read block
    p.write_bytes(head + torn)
    assert repair_torn_tail(p) == len(torn)
    assert p.read_bytes() == head
    p.write_bytes(torn)
    assert repair_torn_tail(p) == len(torn)
    assert p.read_bytes() == b""


# -- iter_jsonl -------------------------------------------------------------------------------


def test_iter_jsonl_reads_lines_and_ignores_torn_tail(tmp_path: Path) -> None:
    p = tmp_path / "f.jsonl"
    p.write_bytes(b'{"i":0}\n{"i":1,"s":"\xc3\xa9"}\n{"i":2')
    assert list(iter_jsonl(p)) == [(0, {"i": 0}), (1, {"i": 1, "s": "é"})]


def test_iter_jsonl_missing_file_yields_nothing(tmp_path: Path) -> None:
    assert list(iter_jsonl(tmp_path / "absent.jsonl")) == []


@pytest.mark.parametrize(
    ("bad", "what"),
    [(b"{oops\n", "corrupt JSON"), (b"\n", "corrupt JSON"), (b"[1,2]\n", "not a JSON object")],
)
def test_iter_jsonl_corrupt_complete_line_names_file_and_line(tmp_path: Path, bad: bytes, what: str) -> None:
    p = tmp_path / "f.jsonl"
    p.write_bytes(b'{"i":0}\n{"i":1}\n' + bad + b'{"i":3}\n')
    it = iter_jsonl(p)
    assert next(it) == (0, {"i": 0})
    assert next(it) == (1, {"i": 1})
    with pytest.raises(JsonlError, match=rf"f\.jsonl line 2: {what}"):
        next(it)


# -- JsonlAppender ----------------------------------------------------------------------------


async def test_append_is_durable_when_awaited(tmp_path: Path) -> None:
    p = tmp_path / "out.jsonl"
    app = await JsonlAppender.open(p)
    await app.append({"i": 0, "text": "héllo\nworld"})
    # Acknowledged means on disk: another reader sees it before close.
    assert list(iter_jsonl(p)) == [(0, {"i": 0, "text": "héllo\nworld"})]
    assert app.lines_written == 1
    assert app.bytes_written == p.stat().st_size
    await app.close()
    assert oct(p.stat().st_mode & 0o777) == oct(0o644 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


async def test_order_kept_and_lines_grouped_into_few_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    syncs = []
    real_sync = jsonl._sync

    def counting_sync(fd: int) -> None:
        syncs.append(fd)
        real_sync(fd)

    monkeypatch.setattr(jsonl, "_sync", counting_sync)
    p = tmp_path / "out.jsonl"
    app = await JsonlAppender.open(p, max_batch=1000)
    futs = [app.append({"i": i}) for i in range(5000)]
    futs.append(app.append_many({"i": i} for i in range(5000, 5010)))
    await asyncio.gather(*futs)
    await app.close()
    assert [obj["i"] for _, obj in iter_jsonl(p)] == list(range(5010))
    assert app.lines_written == 5010
    # Group commit: one sync per batch of up to max_batch lines, not one per line.
    assert 5 <= len(syncs) <= 10


async def test_concurrent_producers_all_acknowledged_exactly_once(tmp_path: Path) -> None:
    p = tmp_path / "out.jsonl"
    app = await JsonlAppender.open(p, commit_interval_s=0.001)

    async def producer(k: int) -> None:
        for j in range(20):
            await app.append({"k": k, "j": j})

    await asyncio.gather(*(producer(k) for k in range(200)))
    await app.close()
    rows = [(o["k"], o["j"]) for _, o in iter_jsonl(p)]
    assert sorted(rows) == [(k, j) for k in range(200) for j in range(20)]
    # Each producer's own lines stay in its order.
    for k in range(200):
        assert [j for kk, j in rows if kk == k] == list(range(20))


async def test_a_superseding_line_takes_the_place_of_a_queued_one_and_follows_a_written_one(
    tmp_path: Path,
) -> None:
    p = tmp_path / "out.jsonl"
    app = await JsonlAppender.open(p, commit_interval_s=0.05)
    first = app.append_nowait({"k": "gen", "n": 1})
    app.append({"k": "other"})
    # Still queued: the end line is written where the gen line would have been, and it alone.
    ended = app.supersede(first, {"k": "end", "n": 1})
    await ended
    assert [o for _, o in iter_jsonl(p)] == [{"k": "end", "n": 1}, {"k": "other"}]
    # Already written: the gen line stays, and the end line is appended after it.
    second = app.append_nowait({"k": "gen", "n": 2})
    await app.flush()
    await app.supersede(second, {"k": "end", "n": 2})
    third = app.append_nowait({"k": "gen", "n": 3})
    await app.close()
    assert [o["k"] + str(o.get("n", "")) for _, o in iter_jsonl(p)] == [
        "end1",
        "other",
        "gen2",
        "end2",
        "gen3",
    ]
    assert app.lines_written == 5
    with pytest.raises(JsonlError, match="closed"):
        app.supersede(third, {"k": "end", "n": 3})


async def test_flush_waits_for_queued_lines(tmp_path: Path) -> None:
    p = tmp_path / "out.jsonl"
    app = await JsonlAppender.open(p, commit_interval_s=0.05)
    futs = [app.append({"i": i}) for i in range(10)]
    await app.flush()
    assert all(f.done() for f in futs)
    assert len(list(iter_jsonl(p))) == 10
    await app.flush()  # nothing queued: returns at once
    await app.close()
    await app.close()
    with pytest.raises(JsonlError, match="closed"):
        app.append({"i": 99})


async def test_open_repairs_torn_tail_and_appends_after_it(tmp_path: Path) -> None:
    p = tmp_path / "out.jsonl"
    p.write_bytes(b'{"i":0}\n{"i":1}\n{"i":')
    async with await JsonlAppender.open(p) as app:
        assert app.repaired_bytes == 5
        await app.append({"i": 2})
    assert [o["i"] for _, o in iter_jsonl(p)] == [0, 1, 2]


async def test_second_writer_on_same_file_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "out.jsonl"
    app = await JsonlAppender.open(p)
    with pytest.raises(JsonlError, match="another writer"):
        await JsonlAppender.open(p)
    await app.close()
    app2 = await JsonlAppender.open(p)  # the lock goes with the file descriptor
    await app2.close()


async def test_non_object_and_unserialisable_rejected_at_call(tmp_path: Path) -> None:
    async with await JsonlAppender.open(tmp_path / "out.jsonl") as app:
        with pytest.raises(TypeError):
            app.append([1, 2])  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            app.append({"x": object()})


async def test_write_failure_fails_waiters_and_later_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "out.jsonl"
    app = await JsonlAppender.open(p)
    await app.append({"i": 0})
    written: list[int] = []

    def half_then_full(fd: int, data: memoryview) -> int:
        # A short write followed by ENOSPC: the file must not keep half a batch.
        if not written:
            written.append(1)
            return os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(jsonl, "_write", half_then_full)
    futs = [app.append({"i": i}) for i in range(1, 50)]
    results = await asyncio.gather(*futs, return_exceptions=True)
    assert all(isinstance(r, JsonlError) for r in results)
    assert "No space left" in str(results[0]) and str(p) in str(results[0])
    with pytest.raises(JsonlError, match="write failed: No space left"):
        app.append({"i": 99})
    with pytest.raises(JsonlError):
        await app.close()
    # Only the acknowledged line remains, and the file ends cleanly.
    assert p.read_bytes() == b'{"i":0}\n'


async def test_cancelled_wait_does_not_break_the_writer(tmp_path: Path) -> None:
    p = tmp_path / "out.jsonl"
    async with await JsonlAppender.open(p, commit_interval_s=0.02) as app:
        fut = app.append({"i": 0})
        fut.cancel()
        await app.append({"i": 1})
    assert [o["i"] for _, o in iter_jsonl(p)] == [0, 1]


async def test_a_switch_moves_the_writer_between_batches_keeping_order_lock_and_failures_apart(
    tmp_path: Path,
) -> None:
    p, old = tmp_path / "out.jsonl", tmp_path / "old.jsonl"
    app = await JsonlAppender.open(p, commit_interval_s=0.01)
    await asyncio.gather(*[app.append({"i": i}) for i in range(5)])
    queued = threading.Event()
    seen: list[int] = []

    def move() -> int:
        queued.wait(5)
        # The writer is between batches: lines appended meanwhile wait for it.
        seen.append(len(list(iter_jsonl(p))))
        os.rename(p, old)
        fresh = tmp_path / ".fresh"
        fd = create_locked(fresh)
        os.rename(fresh, p)
        return fd

    switching = asyncio.ensure_future(app.switch(move))
    await asyncio.sleep(0.05)
    during = [app.append({"i": i}) for i in range(5, 10)]
    queued.set()
    assert await switching is True
    await asyncio.gather(*during)
    assert seen == [5]
    assert [o["i"] for _, o in iter_jsonl(old)] == [0, 1, 2, 3, 4]
    assert [o["i"] for _, o in iter_jsonl(p)] == [5, 6, 7, 8, 9]
    with pytest.raises(JsonlError, match="another writer"):
        await JsonlAppender.open(p)  # the fresh file is locked as the old one was
    second = await JsonlAppender.open(old)  # and the old one no longer is
    await second.close()

    def refused() -> int:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    with pytest.raises(OSError, match="cross-device"):
        await app.switch(refused)
    await app.append({"i": 10})  # a move that failed leaves the writer on its file
    assert [o["i"] for _, o in iter_jsonl(p)][-1] == 10

    def lost() -> int:
        raise jsonl.WriteFailed(p, "moved away, none in its place")

    with pytest.raises(jsonl.WriteFailed, match="none in its place"):
        await app.switch(lost)
    with pytest.raises(jsonl.WriteFailed):
        app.append({"i": 11})
    with pytest.raises(jsonl.WriteFailed):
        await app.close()
    assert [o["i"] for _, o in iter_jsonl(p)] == [5, 6, 7, 8, 9, 10]


# -- SIGKILL at random moments -----------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import asyncio, os, sys
    from regen.engine.data.jsonl import JsonlAppender, iter_jsonl

    def pad(i):
        # Lines of very different sizes, some larger than a page, so kills land mid-write.
        return "x" * ((i * 7919) % 9000)

    async def main(path):
        app = await JsonlAppender.open(path, commit_interval_s=0.001)
        start = sum(1 for _ in iter_jsonl(path))
        inflight = asyncio.Semaphore(300)

        def acked(fut, i):
            inflight.release()
            if not fut.cancelled() and fut.exception() is None:
                sys.stdout.write(f"{i}\\n")
                sys.stdout.flush()

        i = start
        while True:
            await inflight.acquire()
            fut = app.append({"i": i, "pad": pad(i)})
            fut.add_done_callback(lambda f, i=i: acked(f, i))
            i += 1

    asyncio.run(main(sys.argv[1]))
    """
)


def _acked(path: Path) -> list[int]:
    data = path.read_bytes()
    # The child may die while printing; a line without its newline proves nothing.
    complete = data[: data.rfind(b"\n") + 1]
    return [int(x) for x in complete.split()]


def test_sigkill_at_random_moments_loses_no_acknowledged_line(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    out = tmp_path / "out.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    rng = random.Random(20260920)
    total_acked = 0
    for round_no in range(5):
        ack_file = tmp_path / f"acks{round_no}.txt"
        before = sum(1 for _ in iter_jsonl(out))
        with open(ack_file, "wb") as ack_out:
            child = subprocess.Popen(
                [sys.executable, str(script), str(out)], stdout=ack_out, env=env, cwd=ROOT
            )
        try:
            deadline = time.monotonic() + 15
            while ack_file.stat().st_size == 0:
                assert child.poll() is None, "child exited before acknowledging anything"
                assert time.monotonic() < deadline, "child acknowledged nothing"
                time.sleep(0.002)
            time.sleep(rng.uniform(0.0, 0.3))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        acked = _acked(ack_file)
        assert acked, "no acknowledgement survived"
        assert acked == sorted(acked) and acked[0] == before

        repair_torn_tail(out)
        rows = [obj for _, obj in iter_jsonl(out)]
        # Every line exactly once and in order, whatever the moment of the kill...
        assert [r["i"] for r in rows] == list(range(len(rows)))
        assert all(r["pad"] == "x" * ((r["i"] * 7919) % 9000) for r in rows)
        # ...and everything acknowledged is there.
        assert acked[-1] < len(rows)
        assert out.read_bytes().endswith(b"\n")
        total_acked += len(acked)
    assert total_acked > 0


def test_child_script_lines_are_one_line_each() -> None:
    # The SIGKILL test relies on orjson never emitting a raw newline inside a line.
    assert b"\n" not in orjson.dumps({"s": "a\nb\r\u2028"})
