"""Lanes: one per backend of a job, each with its own ledger, in-flight limit, holds and outage.

One work queue and one dispatcher serve every lane (docs/architecture.md, "Lanes"). A prompt taken
from the queue goes to the first lane, in the order of `job.backends`, that has room: under its
in-flight limit (and under the ceiling hook's ceiling), not paused, not closed, not held, not out,
under its request-rate cap, and whose money gate fits the prompt's reservation. A prompt is in flight
on one lane at a time; a retry goes back to the queue and may land on another lane.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Protocol

from regen.engine.backends.base import Backend
from regen.engine.job.concurrency import AdaptiveLimit
from regen.engine.job.settle import Settler
from regen.engine.job.stats import JobStats
from regen.engine.job.workqueue import WorkItem
from regen.engine.money.ledger import Ledger


class LaneCeilings(Protocol):
    """The ceiling hook: a ceiling on a lane's in-flight limit, set from outside the dispatcher (the
    job's deadline control, engine/job/deadline_control.py, with a deadline on both fleets).

    `lane_ceiling(name)` is read at every dispatch decision, so it must be cheap (a dict lookup).
    It answers None for "flat out" (the lane's own limit applies), or the most attempts that lane
    may have in flight now; 0 sends nothing new there. The dispatcher obeys the lower of the lane's
    own limit and this ceiling. When an answer may have risen, call `Job.wake()` so the dispatcher
    looks again.
    """

    def lane_ceiling(self, lane: str) -> int | None: ...


@dataclass(slots=True)
class Outage:
    """A lane's backend unreachable: that lane's dispatch held until the backend answers
    (docs/faults.md, outages). The backend is asked whether it answers (`Backend.alive`, free)
    every `job.outage_probe_s`; its first sign of life sends one attempt at once, whose response
    headers end the outage. Without a sign of life an attempt still goes on a backed-off schedule,
    one at a time."""

    began: float  # monotonic
    reason: str
    probe_interval_s: float
    next_probe_at: float = 0.0
    probe: WorkItem | None = None  # the attempt in flight that probes, if any
    probes: int = 0  # attempts sent while out
    checks: int = 0  # `alive` asked while out
    alive: bool = False  # a sign of life since the last probe attempt left: the next goes now
    prober: asyncio.Task[None] | None = None  # the task asking `alive`


def _up() -> asyncio.Event:
    up = asyncio.Event()
    up.set()
    return up


@dataclass(slots=True, eq=False)
class Lane:
    """One backend's share of the dispatcher: what it may take now and what it has spent."""

    backend: Backend
    ledger: Ledger
    stats: JobStats
    limit: AdaptiveLimit
    requests_per_minute: int | None
    # Made by the dispatcher with the lane, its hooks bound to it (engine/job/dispatch.py `add_lane`).
    settler: Settler = field(init=False)
    paused: bool = False
    closed: str | None = None  # why this lane takes nothing more (its backend failed for good)
    budget_blocked: bool = False
    held_until: float = 0.0  # monotonic; 0 when not held
    held_reason: str | None = None
    outage: Outage | None = None
    outage_total_s: float = 0.0
    holds: int = 0  # this run's holds and outages, counted for /metrics (engine/control/metrics.py)
    outages: int = 0
    # Set while the backend is reachable (no outage): what waits for it (a bill's lookup) waits here.
    up: asyncio.Event = field(default_factory=_up)
    unreachable_streak: int = 0
    in_flight: int = 0
    spent_at_start: Decimal = Decimal(0)
    # This backend's rows and their output tokens written by the runs before this one (the results
    # read at the start): its share is counted over the whole job, as its money is.
    rows_before: int = 0
    tokens_before: int = 0
    sent_at: deque[float] = field(default_factory=deque)
    # In-flight seconds integrated over time (monotonic): tokens per in-flight second is one
    # request's rate, which the deadline control multiplies by a ceiling (engine/job/deadline_control.py).
    _busy_s: float = 0.0
    _busy_at: float = 0.0
    # Silence (docs/fleets.md, "A stalled fleet"): since when (monotonic) the lane has had attempts in
    # flight and none has landed; the attempts it has settled and its in-flight seconds at the last
    # of them, what the expected answer time is measured on; and why it is stalled
    # (engine/job/stall.py), None while it answers.
    quiet_since: float = 0.0
    landed: int = 0
    landed_busy_s: float = 0.0
    stalled: str | None = None
    # The stall ended on the answer of an attempt taken back (its abort's, perhaps): one attempt at a
    # time until one it still wanted comes back (engine/job/dispatch.py `_came_back`).
    probation: bool = False
    taken_back: int = 0  # attempts taken back from it in this run (engine/job/dispatch.py `take_back`)

    def fly(self, change: int, now: float) -> None:
        """One attempt more (+1) or fewer (-1) in flight at monotonic `now`."""
        self._busy_s += self.in_flight * (now - self._busy_at)
        self._busy_at = now
        if self.in_flight == 0 and change > 0:
            self.quiet_since = now  # busy again: silence is counted from here
        self.in_flight += change

    def land(self, now: float) -> None:
        """An attempt of this lane came back from its backend at monotonic `now`: a sign it answers."""
        self.landed += 1
        self.landed_busy_s = self.busy_s(now)
        self.quiet_since = now

    def busy_s(self, now: float) -> float:
        """In-flight seconds up to monotonic `now`: the sum over time of the attempts in flight."""
        return self._busy_s + self.in_flight * (now - self._busy_at)

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def rows(self) -> int:
        """Its rows over the whole job: the earlier runs' and this one's."""
        return self.rows_before + self.stats.counters.rows

    @property
    def output_tokens(self) -> int:
        """Its rows' output tokens over the whole job."""
        return self.tokens_before + self.stats.counters.output_tokens

    def outage_s(self, now: float) -> float | None:
        return None if self.outage is None else now - self.outage.began
