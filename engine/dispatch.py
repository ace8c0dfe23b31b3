"""The dispatcher: take a prompt, pass the gates, launch its attempt, land it; hold, drain, cancel.

Gates, in order: paused, the in-flight limit, a hold on every route (a platform-wide limit), the
request-rate cap, then the money gate (docs/money.md): a request goes out only while spent +
reserved + its own reservation fits the budget. Each attempt is one task in the in-flight table;
its bookkeeping is released in a done callback, so a task cancelled before it ever ran is released
too.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

from engine.backends.base import Backend, Failure
from engine.concurrency import AdaptiveLimit
from engine.events import EventLog
from engine.jobstate import DatasetState, StopReason
from engine.jsonl import WriteFailed
from engine.money import Ledger
from engine.results import ResultsWriter
from engine.settings import JobSettings
from engine.settle import Flight, Settler
from engine.workqueue import WorkItem, WorkQueue

# A hold lasts at least this long: a reset already past (clock skew, millisecond rounding) would
# otherwise open and close a hold per response of a storm.
HOLD_MIN_S = 1.0
# Holds reported within this long of the current one's end are the same burst.
HOLD_MERGE_S = 1.0
# This many attempts in a row that could not reach the backend, and none that did, is an outage.
OUTAGE_AFTER = 3
# While out, one attempt probes the backend, first after this long, doubling to the cap.
PROBE_FIRST_S = 1.0
PROBE_MAX_S = 60.0


@dataclass(slots=True)
class Outage:
    """The backend unreachable: all dispatch held, one probe at a time, backed off."""

    began: float  # monotonic
    reason: str
    probe_interval_s: float = PROBE_FIRST_S
    next_probe_at: float = 0.0
    probe: WorkItem | None = None  # the attempt in flight that probes, if any
    probes: int = 0

Stop = Callable[[StopReason, str], None]


class Dispatcher:
    """One work queue, one gate, one in-flight table, for whatever backend serves the attempts."""

    def __init__(
        self,
        job: JobSettings,
        backend: Backend,
        ledger: Ledger,
        datasets: dict[str, DatasetState],
        results: ResultsWriter,
        events: EventLog,
        settler: Settler,
        stop: Stop,
    ) -> None:
        self.job = job
        self.backend = backend
        self.ledger = ledger
        self.datasets = datasets
        self.results = results
        self.events = events
        self.settler = settler
        self._stop = stop
        self.limit = AdaptiveLimit(
            job.concurrency, minimum=job.min_concurrency, adaptive=job.adaptive_concurrency, ceiling=job.concurrency
        )
        self.queue: WorkQueue | None = None
        self.paused = False
        self.stopping = False
        self.budget_blocked = False
        # A limit on the whole account holds all dispatch until it resets (monotonic; 0 when not held).
        self.held_until = 0.0
        self.held_reason: str | None = None
        caps = [c for c in (job.requests_per_minute, backend.requests_per_minute) if c is not None]
        self.requests_per_minute = min(caps) if caps else None
        self._sent_at: deque[float] = deque()
        self.outage: Outage | None = None
        self.outage_total_s = 0.0
        self._unreachable_streak = 0
        self._flights: dict[asyncio.Task[None], Flight] = {}
        self._changed = asyncio.Event()

    # ------------------------------------------------------------------------------- the loop

    async def run(self) -> None:
        """Dispatch until told to stop or there is nothing left, then wait for what is in flight."""
        await self._dispatch()
        while self._flights:
            await asyncio.wait(list(self._flights))

    async def _dispatch(self) -> None:
        queue = self.queue
        assert queue is not None
        while True:
            self._changed.clear()
            if self.stopping:
                return
            if self.paused or len(self._flights) >= self.limit.current:
                await self._changed.wait()
                continue
            now = time.monotonic()
            outage = self.outage
            probe = False
            if outage is not None:
                if outage.probe is not None or now < outage.next_probe_at:
                    await self._wait_changed(None if outage.probe is not None else outage.next_probe_at - now)
                    continue
                probe = True  # one attempt goes out; its answer ends the outage or backs it off
            if self.held_until:
                if now < self.held_until:
                    await self._wait_changed(self.held_until - now)
                    continue
                self.held_until = 0.0
                self.held_reason = None
                self.events.event("hold_end")
            if self.requests_per_minute is not None:
                sent = self._sent_at
                while sent and sent[0] <= now - 60.0:
                    sent.popleft()
                if len(sent) >= self.requests_per_minute:
                    await self._wait_changed(sent[0] + 60.0 - now)
                    continue
            item, wait_s = queue.take(now, self._dataset_open)
            if item is None:
                if wait_s is None and not self._flights:
                    self._finish_when_empty()
                    return
                await self._wait_changed(wait_s)
                continue
            reservation = self.backend.reservation(item.prompt)
            if not self.ledger.fits(reservation):
                queue.push_front(item)
                self.budget_blocked = True
                if not self._flights:
                    self._stop(
                        StopReason.BUDGET,
                        f"budget reached: spent ${self.ledger.spent:.4f} of ${self.ledger.budget:.2f}; "
                        f"the next request's worst case (${reservation:.4f}) does not fit",
                    )
                    return
                await self._changed.wait()
                continue
            self.budget_blocked = False
            if probe and outage is not None:
                outage.probe = item
                outage.probes += 1
            self._launch(item, reservation)

    async def _wait_changed(self, timeout: float | None) -> None:
        if timeout is None:
            await self._changed.wait()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout=max(timeout, 0.001))

    def _dataset_open(self, name: str) -> bool:
        return not self.datasets[name].budget_reached

    def _finish_when_empty(self) -> None:
        failed = sum(state.failed for state in self.datasets.values())
        if failed:
            self._stop(
                StopReason.FAILED_PROMPTS,
                f"{failed} prompts failed after {self.job.max_attempts} attempts; run again to retry them",
            )
        else:
            budgeted = [name for name, s in self.datasets.items() if s.budget_reached and s.remaining > 0]
            note = f" ({', '.join(budgeted)} stopped at the token budget)" if budgeted else ""
            self._stop(StopReason.DONE, f"every dataset is done{note}")

    # ---------------------------------------------------------------------------- one attempt

    def _launch(self, item: WorkItem, reservation: Decimal) -> None:
        if self.requests_per_minute is not None:
            self._sent_at.append(time.monotonic())
        self.ledger.reserve(reservation)
        rid = f"{item.prompt.id}#{item.attempts}"
        item.attempts += 1
        item.run_attempts += 1
        if item.first_started is None:
            item.first_started = time.time()
        self.datasets[item.prompt.dataset].in_flight += 1
        flight = Flight(item, reservation, rid, time.monotonic())
        task = asyncio.get_running_loop().create_task(self._attempt(flight))
        self._flights[task] = flight
        task.add_done_callback(self._landed)

    def _landed(self, task: asyncio.Task[None]) -> None:
        flight = self._flights.pop(task, None)
        if flight is None:
            return
        if not flight.released:
            self.ledger.release(flight.reservation)
            flight.released = True
        self.datasets[flight.item.prompt.dataset].in_flight -= 1
        self._changed.set()

    async def _attempt(self, flight: Flight) -> None:
        prompt = flight.item.prompt
        results = self.results
        settled = False
        try:
            # Durable before the request leaves: a crash from here on is settled at the next start.
            await results.journal(
                {
                    "k": "start",
                    "rid": flight.rid,
                    "ds": prompt.dataset,
                    "line": prompt.line,
                    "reserved": str(flight.reservation),
                    "ts": time.time(),
                }
            )

            def on_handle(handle: str | None) -> None:
                flight.handle = handle
                if handle:
                    results.journal({"k": "gen", "rid": flight.rid, "gen": handle})

            def on_route(name: str) -> None:
                flight.route = name

            outcome = await self.backend.attempt(prompt, flight.rid, on_handle, on_route)
            settled = True
            await self.settler.settle(flight, outcome)
        except WriteFailed:
            # The job is stopping on it (Job._write_failed); this attempt is settled by the next start
            # from its start record, like one in flight at a crash.
            return
        except asyncio.CancelledError:
            if not settled:
                with contextlib.suppress(WriteFailed):
                    self.settler.cancelled(flight)
            raise

    # ------------------------------------------------------------------------------- steering

    @property
    def in_flight(self) -> int:
        return len(self._flights)

    def in_flight_by_route(self) -> Counter[str]:
        """Requests in flight per serving route (known once the attempt names it)."""
        return Counter(f.route for f in self._flights.values() if f.route)

    def wake(self) -> None:
        self._changed.set()

    def stop(self, *, cancel: bool) -> None:
        """Stop dispatching; with `cancel`, cancel what is in flight (it is re-sent by a later run)."""
        self.stopping = True
        if cancel:
            for task in list(self._flights):
                task.cancel()
        self._changed.set()

    def retry(self, item: WorkItem, ready_at: float) -> None:
        assert self.queue is not None
        self.queue.push_retry(item, ready_at)

    def put_back(self, item: WorkItem) -> None:
        assert self.queue is not None
        self.queue.push_front(item)

    def throttled(self, now: float) -> None:
        self.limit.on_throttle(now)

    def suggest(self, ceiling: int | None, reason: str) -> None:
        """The backend's concurrency ceiling (docs/architecture.md); journaled when it changes."""
        if ceiling == self.limit.suggested:
            return
        self.limit.suggest(ceiling)
        self.events.event("concurrency_hint", ceiling=ceiling, applied=self.limit.current, reason=reason)
        self._changed.set()

    def succeeded(self, now: float) -> None:
        self.limit.on_success(now)

    def unreachable(self, item: WorkItem, failure: Failure) -> None:
        """An attempt could not reach the backend. The prompt keeps its attempts; enough of these
        in a row, with nothing getting through, hold every route until a probe answers."""
        now = time.monotonic()
        outage = self.outage
        if outage is None:
            self._unreachable_streak += 1
            if self._unreachable_streak < OUTAGE_AFTER:
                # A lone failed connection is not an outage; that prompt waits a moment.
                self.retry(item, now + PROBE_FIRST_S)
                return
            reason = f"{self.backend.title} unreachable ({failure.message[:160]})"
            self.outage = Outage(now, reason, next_probe_at=now + PROBE_FIRST_S)
            self.events.event("outage", reason=reason)
        elif item is outage.probe:
            outage.probe = None
            outage.probe_interval_s = min(PROBE_MAX_S, outage.probe_interval_s * 2)
            outage.next_probe_at = now + outage.probe_interval_s
        self.put_back(item)
        self._changed.set()

    def reached(self, launched_at: float) -> None:
        """The backend answered an attempt sent at `launched_at`. One sent during an outage (the
        probe) ends it, and dispatch goes back to full concurrency; answers to attempts sent before
        it began (streams cut when the server went away) say nothing about now."""
        self._unreachable_streak = 0
        outage = self.outage
        if outage is None or launched_at < outage.began:
            return
        lasted = time.monotonic() - outage.began
        self.outage = None
        self.outage_total_s += lasted
        self.events.event("outage_end", seconds=round(lasted, 1), probes=outage.probes)
        self._changed.set()

    def outage_s(self, now: float) -> float | None:
        return None if self.outage is None else now - self.outage.began

    def hold(self, seconds: float, reason: str) -> None:
        """Stop all dispatch for `seconds`: every request would meet the same limit, and some
        quotas count refused requests too (docs/openrouter.md §7.3)."""
        wait = max(seconds, HOLD_MIN_S)
        until = time.monotonic() + wait
        if until <= self.held_until + HOLD_MERGE_S:
            return  # the requests in flight when the limit hit all report it; one hold is enough
        self.held_until = until
        self.held_reason = reason
        self.events.event("hold", seconds=round(wait, 1), reason=reason)
        self._changed.set()
