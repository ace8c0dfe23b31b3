"""Idle and total limits for many concurrent attempts, kept by one sweeper task.

`asyncio.timeout` and aiohttp's total timeout each arm and cancel a loop timer per request; at
2000 requests in flight and thousands a second that is a measurable share of the client's CPU
(bench/throughput.py). One task that looks at every open attempt a few times a second does the
same job for a fixed cost. Its resolution is one tick, a fraction of the shortest limit: a limit
fires at most one tick late and never early.

Cancellation follows `asyncio.timeout`: the sweeper cancels the attempt's task, and the attempt
turns that CancelledError into its own error only when the limit caused it (`Deadlines.absorb`).
A cancellation from outside (an operator's stop) still propagates.
"""

from __future__ import annotations

import asyncio
import contextlib


class Watch:
    """One attempt under watch; the reader adds to `received` as bytes arrive."""

    __slots__ = ("cancelling", "expired", "idle_exempt", "last", "received", "seen", "started", "task")

    def __init__(self, task: asyncio.Task[object], now: float) -> None:
        self.task = task
        self.started = now
        self.last = now
        self.received = 0
        self.seen = 0
        self.idle_exempt = False
        self.expired: str | None = None
        # Cancellations already requested when the watch began are not ours to absorb.
        self.cancelling = task.cancelling()


class Deadlines:
    """Enforces `idle_s` (no byte received) and `total_s` (whole attempt) on watched tasks."""

    def __init__(self, idle_s: float, total_s: float) -> None:
        self.idle_s = idle_s
        self.total_s = total_s
        self.tick_s = min(1.0, max(0.01, min(idle_s, total_s) / 8))
        self._watches: set[Watch] = set()
        self._sweeper: asyncio.Task[None] | None = None

    def watch(self) -> Watch:
        """Start watching the current task; pair with `unwatch` in a finally."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Deadlines.watch() must be called from a task")
        loop = task.get_loop()
        w = Watch(task, loop.time())
        self._watches.add(w)
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = loop.create_task(self._sweep(), name="attempt deadlines")
        return w

    def unwatch(self, w: Watch) -> None:
        self._watches.discard(w)

    @staticmethod
    def absorb(w: Watch) -> bool:
        """With a CancelledError in hand: True when this watch's limit caused it.

        The cancellation is then consumed (the task's cancel count restored) and the caller reports
        the limit instead; False means someone else cancelled the task and the error must propagate.
        """
        return w.expired is not None and w.task.uncancel() <= w.cancelling

    def reason(self, w: Watch) -> str:
        if w.expired == "total":
            return f"no complete answer within request_timeout_s ({self.total_s:g} s)"
        return f"no data for {self.idle_s:g} s"

    @property
    def watched(self) -> int:
        return len(self._watches)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        # Ends when nothing is watched; the next watch() starts a new sweeper.
        while self._watches:
            await asyncio.sleep(self.tick_s)
            now = loop.time()
            idle_since = now - self.idle_s
            total_since = now - self.total_s
            for w in self._watches:
                if w.expired is not None:
                    continue
                if w.received != w.seen:
                    w.seen = w.received
                    w.last = now
                if w.started < total_since:
                    w.expired = "total"
                    w.task.cancel()
                elif w.last < idle_since and not w.idle_exempt:
                    w.expired = "idle"
                    w.task.cancel()
