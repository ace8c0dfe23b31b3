"""The attempt deadlines sweeper: idle and total limits without a timer per request."""

from __future__ import annotations

import asyncio

import pytest

from regen.engine.net.deadlines import Deadlines


async def _attempt(deadlines: Deadlines, feed_every: float | None, lasts: float) -> str:
    """Sleeps `lasts` seconds, feeding bytes every `feed_every`; reports how it ended."""
    watch = deadlines.watch()
    try:
        loop = asyncio.get_running_loop()
        end = loop.time() + lasts
        while loop.time() < end:
            await asyncio.sleep(feed_every or lasts)
            watch.received += 1
        return "finished"
    except asyncio.CancelledError:
        if not deadlines.absorb(watch):
            raise
        return deadlines.reason(watch)
    finally:
        deadlines.unwatch(watch)


async def test_silence_past_the_idle_limit_ends_the_attempt() -> None:
    deadlines = Deadlines(idle_s=0.1, total_s=10)
    assert await _attempt(deadlines, None, 1.0) == "no data for 0.1 s"
    assert deadlines.watched == 0
    await deadlines.close()


async def test_bytes_arriving_keep_the_attempt_alive_until_the_total_limit() -> None:
    deadlines = Deadlines(idle_s=0.1, total_s=0.4)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await _attempt(deadlines, 0.02, 5.0) == "no complete answer within request_timeout_s (0.4 s)"
    # Never early, at most about a tick late.
    assert 0.4 <= loop.time() - t0 < 0.4 + 3 * deadlines.tick_s
    await deadlines.close()


async def test_attempts_within_their_limits_finish() -> None:
    deadlines = Deadlines(idle_s=0.1, total_s=1.0)
    results = await asyncio.gather(*(_attempt(deadlines, 0.02, 0.3) for _ in range(50)))
    assert results == ["finished"] * 50
    await deadlines.close()


async def test_an_outside_cancel_propagates() -> None:
    deadlines = Deadlines(idle_s=0.05, total_s=10)
    task = asyncio.create_task(_attempt(deadlines, None, 1.0))
    await asyncio.sleep(0.01)
    task.cancel()  # the operator's stop, before the limit
    with pytest.raises(asyncio.CancelledError):
        await task
    assert deadlines.watched == 0
    await deadlines.close()


async def test_the_sweeper_stops_when_nothing_is_watched_and_restarts_on_demand() -> None:
    deadlines = Deadlines(idle_s=0.05, total_s=10)
    assert await _attempt(deadlines, 0.01, 0.05) == "finished"
    await asyncio.sleep(deadlines.tick_s * 3)
    assert deadlines._sweeper is not None and deadlines._sweeper.done()
    assert await _attempt(deadlines, None, 1.0) == "no data for 0.05 s"
    await deadlines.close()
