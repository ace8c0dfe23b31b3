"""The dispatcher: take a prompt, pick a lane, pass its gates, launch the attempt, land it; hold,
drain, cancel.

One work queue serves every lane (engine/job/lanes.py, one per backend). For each prompt taken, the
first lane with room gets it; a lane's gates, in order: paused or closed, its in-flight limit (and
the ceiling hook's ceiling), its outage (one probe at a time), a hold on all its routes (a
platform-wide limit), its request-rate cap, then its money gate (docs/money.md): an attempt goes out
only while that lane's spent + reserved + its own reservation fits the lane's budget. Each attempt
is one task in the in-flight table; its bookkeeping is released in a done callback, so a task
cancelled before it ever ran is released too.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Protocol

from regen.engine.backends.base import Backend, Failure
from regen.engine.config.settings import JobSettings
from regen.engine.data.jsonl import WriteFailed
from regen.engine.job import giveup
from regen.engine.job.concurrency import AdaptiveLimit
from regen.engine.job.lanes import Lane, LaneCeilings, Outage
from regen.engine.job.settle import Flight, Settler
from regen.engine.job.stats import JobStats
from regen.engine.job.workqueue import WorkItem, WorkQueue
from regen.engine.money.ledger import Ledger
from regen.engine.run.events import EventLog
from regen.engine.run.records import gen_record, start_record
from regen.engine.run.results import ResultsWriter
from regen.engine.run.state import DatasetState, JobError, StopReason
from regen.engine.schema import holding_budget

# A hold lasts at least this long: a reset already past (clock skew, millisecond rounding) would
# otherwise open and close a hold per response of a storm.
HOLD_MIN_S = 1.0
# Holds reported within this long of the current one's end are the same burst.
HOLD_MERGE_S = 1.0
# This many attempts in a row that could not reach the backend, and none that did, is an outage.
OUTAGE_AFTER = 3
# While out, an attempt probes the backend without waiting for a sign of life (in case only
# generations answer), first after this long, doubling to the cap; a sign of life (asked every
# job.outage_probe_s) sends it at once (docs/faults.md, outages).
PROBE_FIRST_S = 1.0
PROBE_MAX_S = 60.0

__all__ = ["Dispatcher", "LaneHooks", "Outage"]

Stop = Callable[[StopReason, str], None]


class JobHooks(Protocol):
    """What a lane's settling asks of the job itself (through its `LaneHooks`)."""

    def fatal(self, reason: StopReason, message: str) -> None: ...
    def exclude_route(self, route: str, source: str, backend: str | None = None) -> None: ...


class Dispatcher:
    """One work queue, one in-flight table, and a lane per backend that serves the attempts."""

    def __init__(
        self,
        job: JobSettings,
        datasets: dict[str, DatasetState],
        results: ResultsWriter,
        events: EventLog,
        stop: Stop,
    ) -> None:
        self.job = job
        self.datasets = datasets
        self.results = results
        self.events = events
        self._stop = stop
        self.lanes: list[Lane] = []
        self.ceilings: LaneCeilings | None = None  # the ceiling hook (engine/job/lanes.py)
        self.queue: WorkQueue | None = None
        self.paused = False
        self.stopping = False
        self._flights: dict[asyncio.Task[None], tuple[Lane, Flight]] = {}
        self._changed = asyncio.Event()

    # -------------------------------------------------------------------------------- lanes

    def add_lane(self, backend: Backend, ledger: Ledger, stats: JobStats, job: JobHooks) -> Lane:
        """A lane for `backend`, after those added before it (the order of `job.backends`), with its
        settling, whose hooks are bound to it: what a failure holds, closes or stops is this lane."""
        settings = self.job
        named = [limit for name, limit in settings.backend_concurrency.items() if name == backend.name]
        concurrency = named[0] if named else settings.concurrency
        limit = AdaptiveLimit(
            concurrency,
            minimum=settings.min_concurrency,
            adaptive=settings.adaptive_concurrency,
            ceiling=concurrency,
        )
        caps = [c for c in (settings.requests_per_minute, backend.requests_per_minute) if c is not None]
        lane = Lane(backend, ledger, stats, limit, min(caps) if caps else None)
        hooks = LaneHooks(self, job, lane)
        lane.settler = Settler(
            settings, backend, ledger, stats, self.datasets, self.results, self.events, hooks
        )
        self.lanes.append(lane)
        return lane

    @property
    def budget_lane(self) -> Lane:
        """The lane holding the job's budget, else the first (engine/schema.py `holding_budget`)."""
        return holding_budget(self.lanes, lambda lane: lane.ledger.budget)

    def lane(self, name: str) -> Lane:
        for lane in self.lanes:
            if lane.name == name:
                return lane
        raise JobError(
            f"no backend {name!r} in this job (it uses {', '.join(lane.name for lane in self.lanes)})"
        )

    def lane_fields(self, lane: Lane) -> dict[str, Any]:
        """Events of a job with several lanes name the lane; a single backend's stay as they were."""
        return {"backend": lane.name} if len(self.lanes) > 1 else {}

    # ------------------------------------------------------------------------------- the loop

    async def run(self) -> None:
        """Dispatch until told to stop or there is nothing left, then wait for what is in flight."""
        try:
            await self._dispatch()
            # What was taken back is done elsewhere: its attempts are not waited for (a stalled
            # server may never answer); cut, they are journaled as taken back (docs/fleets.md).
            for task, (_, flight) in list(self._flights.items()):
                if flight.taken_back and not flight.landed:
                    task.cancel()
            while self._flights:
                await asyncio.wait(list(self._flights))
        finally:
            probers = [
                p for lane in self.lanes if lane.outage is not None and (p := lane.outage.prober) is not None
            ]
            for prober in probers:
                prober.cancel()
            await asyncio.gather(*probers, return_exceptions=True)

    def _live(self) -> bool:
        """Attempts in flight whose outcome is still wanted (a taken-back one's is not)."""
        return any(not flight.taken_back for _, flight in self._flights.values())

    def _room(self, lane: Lane, now: float) -> float:
        """0 when `lane` may take an attempt now; else the seconds until it may (inf: until
        something changes)."""
        if lane.paused or lane.closed is not None or lane.stalled is not None:
            return math.inf
        limit = lane.limit.current
        ceilings = self.ceilings
        if ceilings is not None:
            ceiling = ceilings.lane_ceiling(lane.name)
            if ceiling is not None and ceiling < limit:
                limit = max(0, ceiling)
        if lane.probation:
            limit = min(limit, 1)  # after a stall ended on weak evidence (`_came_back`)
        if lane.in_flight >= limit:
            return math.inf
        outage = lane.outage
        if outage is not None:
            if outage.probe is not None:
                return math.inf
            if not outage.alive and now < outage.next_probe_at:
                return outage.next_probe_at - now
            # One attempt goes out; its response headers end the outage, its failure backs it off.
        if lane.held_until:
            if now < lane.held_until:
                return lane.held_until - now
            lane.held_until = 0.0
            lane.held_reason = None
            self.events.event("hold_end", **self.lane_fields(lane))
        cap = lane.requests_per_minute
        if cap is not None:
            sent = lane.sent_at
            while sent and sent[0] <= now - 60.0:
                sent.popleft()
            if len(sent) >= cap:
                return sent[0] + 60.0 - now
        return 0.0

    async def _dispatch(self) -> None:
        queue = self.queue
        assert queue is not None
        lanes = self.lanes
        while True:
            self._changed.clear()
            if self.stopping:
                return
            if self.paused:
                await self._changed.wait()
                continue
            now = time.monotonic()
            ready: list[Lane] = []
            soonest = math.inf
            for lane in lanes:
                wait = self._room(lane, now)
                if wait <= 0.0:
                    ready.append(lane)
                elif wait < soonest:
                    soonest = wait
            if not ready:
                await self._wait_changed(None if soonest == math.inf else soonest)
                continue
            item, wait_s = queue.take(now, self._dataset_open)
            if item is None:
                if wait_s is None and not self._live():
                    self._finish_when_empty()
                    return
                await self._wait_changed(wait_s)
                continue
            for lane in ready:
                reservation = lane.backend.reservation(item.prompt)
                if lane.ledger.fits(reservation):
                    lane.budget_blocked = False
                    outage = lane.outage
                    if outage is not None:
                        outage.probe = item
                        outage.probes += 1
                        outage.alive = False
                    self._launch(lane, item, reservation)
                    break
                lane.budget_blocked = True
            else:
                queue.push_front(item)
                if not self._live() and all(lane.ledger.budget is not None or lane.closed for lane in lanes):
                    paid = self.budget_lane
                    self._stop(
                        StopReason.BUDGET,
                        f"budget reached: spent ${paid.ledger.spent:.4f} of ${paid.ledger.budget:.2f}; "
                        f"the next request's worst case (${paid.backend.reservation(item.prompt):.4f}) "
                        "does not fit",
                    )
                    return
                # A lane without a budget may have room later (its hold ends, its probe is due).
                await self._wait_changed(None if soonest == math.inf else soonest)
                continue

    async def _wait_changed(self, timeout: float | None) -> None:
        if timeout is None:
            await self._changed.wait()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout=max(timeout, 0.001))

    def _dataset_open(self, name: str) -> bool:
        return not self.datasets[name].budget_reached

    def _finish_when_empty(self) -> None:
        given_up = [g for lane in self.lanes for g in lane.settler.given_up]
        if given_up:
            self._stop(StopReason.FAILED_PROMPTS, giveup.summary(given_up))
        else:
            budgeted = [name for name, s in self.datasets.items() if s.budget_reached and s.remaining > 0]
            note = f" ({', '.join(budgeted)} stopped at the token budget)" if budgeted else ""
            self._stop(StopReason.DONE, f"every dataset is done{note}")

    # ---------------------------------------------------------------------------- one attempt

    def _launch(self, lane: Lane, item: WorkItem, reservation: Decimal) -> None:
        if lane.requests_per_minute is not None:
            lane.sent_at.append(time.monotonic())
        lane.ledger.reserve(reservation)
        rid = f"{item.prompt.id}#{item.attempts}"
        item.attempts += 1
        item.run_attempts += 1
        if item.first_started is None:
            item.first_started = time.time()
        self.datasets[item.prompt.dataset].in_flight += 1
        launched = time.monotonic()
        lane.fly(+1, launched)
        flight = Flight(item, reservation, rid, launched)
        task = asyncio.get_running_loop().create_task(self._attempt(lane, flight))
        self._flights[task] = (lane, flight)
        task.add_done_callback(self._landed)

    def _landed(self, task: asyncio.Task[None]) -> None:
        entry = self._flights.pop(task, None)
        if entry is None:
            return
        lane, flight = entry
        if not flight.released:
            lane.ledger.release(flight.reservation)
            flight.released = True
        lane.fly(-1, time.monotonic())
        self.datasets[flight.item.prompt.dataset].in_flight -= 1
        self._changed.set()

    async def _attempt(self, lane: Lane, flight: Flight) -> None:
        prompt = flight.item.prompt
        results = self.results
        settled = False
        try:
            # Durable before the request leaves: a crash from here on is settled at the next start,
            # on the ledger of the backend named here.
            # Awaited, so its failure is seen here (not through journal()'s done callback).
            await results.attempts.append(
                start_record(
                    flight.rid, prompt.dataset, prompt.line, flight.reservation, lane.name, time.time()
                )
            )

            if flight.taken_back:
                # Taken back before it left (engine/job/dispatch.py `take_back`): never sent.
                lane.settler.cancelled(flight)
                return

            def on_handle(handle: str | None) -> None:
                flight.handle = handle
                # A handle that is the rid (Backend.handle_is_rid) is in the start record already.
                if handle and handle != flight.rid:
                    flight.gen_ticket = results.journal_nowait(gen_record(flight.rid, handle))

            def on_route(name: str) -> None:
                flight.route = name

            outcome = await lane.backend.attempt(prompt, flight.rid, on_handle, on_route)
            settled = True
            flight.landed = True
            self._came_back(lane, flight)
            if _marked(flight):  # by `take_back`, while it was out
                lane.settler.discard(flight, outcome)
                return
            await lane.settler.settle(flight, outcome)
        except WriteFailed:
            # The job is stopping on it (Job._write_failed); this attempt is settled by the next start
            # from its start record, like one in flight at a crash.
            return
        except asyncio.CancelledError:
            if not settled:
                with contextlib.suppress(WriteFailed):
                    lane.settler.cancelled(flight)
            raise

    # ------------------------------------------------- what settling, backends and the job ask of it

    @property
    def in_flight(self) -> int:
        return len(self._flights)

    def in_flight_by_route(self, lane: Lane) -> Counter[str]:
        """Requests in flight per serving route (known once the attempt names it), of one lane."""
        return Counter(f.route for on, f in self._flights.values() if on is lane and f.route)

    def wake(self) -> None:
        self._changed.set()

    # ---------------------------------------------------- a stalled fleet (docs/fleets.md)

    def _came_back(self, lane: Lane, flight: Flight) -> None:
        """An attempt came back from the lane's backend: it answers, so it is not stalled. One taken
        back is weak evidence (a wedged scheduler's HTTP side still answers its abort, docs/fleets.md):
        the lane comes back on probation, one attempt at a time, until one it still wanted comes back."""
        lane.land(time.monotonic())
        weak = flight.taken_back
        if lane.stalled is not None:
            lane.stalled = None
            lane.probation = weak
            self.events.event("stall_end", probation=weak, **self.lane_fields(lane))
            self._changed.set()
        elif lane.probation and not weak:
            lane.probation = False
            self.events.event("probation_end", **self.lane_fields(lane))
            self._changed.set()

    def stall(self, lane: Lane, reason: str) -> None:
        """The lane lands nothing (engine/job/stall.py): it takes no new work until an attempt comes
        back from it, and what it holds is taken back."""
        if lane.stalled is None:
            lane.stalled = reason
            self.events.event("stall", reason=reason, in_flight=lane.in_flight, **self.lane_fields(lane))
        # Taken back only where another lane can take it: else it would wait for this one anyway.
        if any(other is not lane and other.closed is None for other in self.lanes):
            self.take_back(lane, reason)

    def take_back(self, lane: Lane, reason: str, count: int | None = None) -> int:
        """Every attempt in flight on `lane` that has not come back (or the `count` newest of them),
        taken back: ended on its server by rid where the backend can (its `aborts` ability), and its
        prompt queued again at the front, for whichever lane has room. Exactly once: the attempt is
        marked before its prompt is queued, and whatever it comes back with later is waste, never a
        row (engine/job/settle.py `discard`). The newest first: a server serves its queue in the
        order it came (SGLang's default policy), so those are the ones it has not started. The
        number taken back."""
        aborts = lane.backend.aborts
        held = [f for on, f in self._flights.values() if on is lane and not f.landed and not f.taken_back]
        if count is not None:
            held = sorted(held, key=lambda f: f.launched_at, reverse=True)[: max(0, count)]
        taken = 0
        for flight in held:
            flight.taken_back = True
            if aborts is not None:
                aborts.abort(flight.rid)
            item = flight.item
            item.run_attempts -= 1  # not the prompt's failure: the cap counts its own attempts
            self.put_back(item)
            taken += 1
        if taken:
            lane.taken_back += taken
            self.events.event("taken_back", prompts=taken, reason=reason, **self.lane_fields(lane))
            self._changed.set()
        return taken

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

    def close_lane(self, lane: Lane, reason: str) -> None:
        """A lane whose backend failed for good takes nothing more; the other lanes go on."""
        if lane.closed is None:
            lane.closed = reason
            self.events.event("lane_closed", backend=lane.name, reason=reason)
            self._changed.set()

    def throttled(self, lane: Lane, now: float) -> None:
        lane.limit.on_throttle(now)

    def suggest(self, ceiling: int | None, reason: str, lane: Lane) -> None:
        """A backend's concurrency ceiling (docs/architecture.md); journaled when it changes."""
        if ceiling == lane.limit.suggested:
            return
        lane.limit.suggest(ceiling)
        self.events.event(
            "concurrency_hint",
            ceiling=ceiling,
            applied=lane.limit.current,
            reason=reason,
            **self.lane_fields(lane),
        )
        self._changed.set()

    def succeeded(self, lane: Lane, now: float) -> None:
        lane.limit.on_success(now)

    def unreachable(self, lane: Lane, item: WorkItem, failure: Failure) -> None:
        """An attempt could not reach the lane's backend. The prompt keeps its attempts; enough of
        these in a row, with nothing getting through, hold that lane until a probe answers. The
        prompt goes back to the queue, where another lane may take it."""
        now = time.monotonic()
        outage = lane.outage
        if outage is None:
            lane.unreachable_streak += 1
            if lane.unreachable_streak < OUTAGE_AFTER:
                # A lone failed connection is not an outage; that prompt waits a moment.
                self.retry(item, now + PROBE_FIRST_S)
                return
            reason = f"{lane.backend.title} unreachable ({failure.message[:160]})"
            outage = lane.outage = Outage(now, reason, PROBE_FIRST_S, next_probe_at=now + PROBE_FIRST_S)
            lane.outages += 1
            lane.up.clear()
            outage.prober = asyncio.get_running_loop().create_task(self._ask_alive(lane, outage))
            self.events.event("outage", reason=reason, **self.lane_fields(lane))
        elif item is outage.probe:
            outage.probe = None
            outage.probe_interval_s = min(PROBE_MAX_S, outage.probe_interval_s * 2)
            outage.next_probe_at = now + outage.probe_interval_s
        self.put_back(item)
        self._changed.set()

    def reached(self, lane: Lane, launched_at: float) -> None:
        """The lane's backend answered an attempt sent at `launched_at` (the attempt has settled).
        One sent during an outage ends it; answers to attempts sent before it began (streams cut
        when the server went away) say nothing about now. An outage usually ends earlier, at the
        headers of its probe (`answered`)."""
        lane.unreachable_streak = 0
        outage = lane.outage
        if outage is None or launched_at < outage.began:
            return
        self._end_outage(lane, outage)

    def answered(self, lane: Lane, generation: bool) -> None:
        """A sign of life from the lane's backend, now (engine/backends/base.py `JobContext.answered`):
        a generation's status line ends an outage at once, whenever that attempt was sent (the
        answer came through now); any other answer (`alive`, a lookup, a credit read) sends the
        attempt that confirms it without waiting for the probe schedule."""
        if generation:
            lane.unreachable_streak = 0
        outage = lane.outage
        if outage is None:
            return
        if generation:
            self._end_outage(lane, outage)
        elif not outage.alive:
            outage.alive = True
            self._changed.set()

    def _end_outage(self, lane: Lane, outage: Outage) -> None:
        """Back to the lane's full concurrency at once; every bill still pending is looked up again."""
        lasted = time.monotonic() - outage.began
        lane.outage = None
        lane.up.set()
        lane.outage_total_s += lasted
        if outage.prober is not None:
            outage.prober.cancel()
        self.events.event(
            "outage_end",
            seconds=round(lasted, 1),
            probes=outage.probes,
            checks=outage.checks,
            **self.lane_fields(lane),
        )
        lane.settler.relook()
        self._changed.set()

    async def _ask_alive(self, lane: Lane, outage: Outage) -> None:
        """While `outage` lasts, ask the backend every `job.outage_probe_s` whether it answers;
        an ask that hangs is given up at the next one's time."""
        interval = self.job.outage_probe_s
        next_at = time.monotonic() + interval
        while lane.outage is outage:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            if lane.outage is not outage:
                return
            next_at = time.monotonic() + interval
            outage.checks += 1
            try:
                alive = await asyncio.wait_for(lane.backend.alive(), timeout=interval)
            except TimeoutError:
                alive = False
            if alive and lane.outage is outage:
                self.answered(lane, generation=False)

    def hold(self, lane: Lane, seconds: float, reason: str) -> None:
        """Stop the lane's dispatch for `seconds`: every request would meet the same limit, and
        some quotas count refused requests too (docs/openrouter.md §7.3)."""
        wait = max(seconds, HOLD_MIN_S)
        until = time.monotonic() + wait
        if until <= lane.held_until + HOLD_MERGE_S:
            return  # the requests in flight when the limit hit all report it; one hold is enough
        lane.held_until = until
        lane.held_reason = reason
        lane.holds += 1
        self.events.event("hold", seconds=round(wait, 1), reason=reason, **self.lane_fields(lane))
        self._changed.set()


class LaneHooks:
    """What one lane's settling asks of the dispatcher and the job (engine/job/settle.py
    `SettleHooks`), bound to that lane."""

    __slots__ = ("dispatcher", "job", "lane")

    def __init__(self, dispatcher: Dispatcher, job: JobHooks, lane: Lane) -> None:
        self.dispatcher = dispatcher
        self.job = job
        self.lane = lane

    def retry(self, item: WorkItem, ready_at: float) -> None:
        self.dispatcher.retry(item, ready_at)

    def put_back(self, item: WorkItem) -> None:
        self.dispatcher.put_back(item)

    def hold(self, seconds: float, reason: str) -> None:
        self.dispatcher.hold(self.lane, seconds, reason)

    def throttled(self, now: float) -> None:
        self.dispatcher.throttled(self.lane, now)

    def succeeded(self, now: float) -> None:
        self.dispatcher.succeeded(self.lane, now)

    def fatal(self, reason: StopReason, message: str) -> None:
        """With other lanes still open, a failure only this backend cannot get past closes its
        lane; the last open lane stops the job as a single backend does."""
        dispatcher, lane = self.dispatcher, self.lane
        others = [other for other in dispatcher.lanes if other is not lane and other.closed is None]
        if others and lane.closed is None:
            dispatcher.close_lane(lane, f"{reason.value}: {message}")
        elif lane.closed is None or not others:
            self.job.fatal(reason, message)

    def exclude_route(self, route: str, source: str) -> None:
        self.job.exclude_route(route, source, self.lane.name)

    def wake(self) -> None:
        self.dispatcher.wake()

    def unreachable(self, item: WorkItem, failure: Failure) -> None:
        self.dispatcher.unreachable(self.lane, item, failure)

    def reached(self, launched_at: float) -> None:
        self.dispatcher.reached(self.lane, launched_at)


def _marked(flight: Flight) -> bool:
    """Whether `take_back` has marked the attempt: read afresh after an await (a check before it
    would otherwise be taken by the type checker to hold still)."""
    return flight.taken_back
