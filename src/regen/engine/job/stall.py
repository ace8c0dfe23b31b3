"""A stalled fleet: a lane with attempts in flight that lands nothing for several times its expected
answer time (docs/fleets.md, "A stalled fleet").

Hysteresis damps noise, not facts: a fleet that stops answering never produces the rows that would
move a rate measured from rows, so its silence is the evidence. The deadline control asks this rule
every tick (engine/job/deadline_control.py); from the tick it answers, the lane's rate counts as zero
and the verdict is judged afresh.
"""

from __future__ import annotations

from regen.engine.durations import duration
from regen.engine.job.lanes import Lane

# Silence this many times the lane's expected answer time is a stall, not a slow answer: a request's
# time in flight varies (a long answer, a queue a few deep), a whole lane landing nothing does not.
STALL_FACTOR = 4.0
# And never less than this many steering intervals: one late tick must not make a stall. With the
# servers' own sign (their /metrics unanswered or frozen), this alone.
STALL_TICKS = 3.0


def expected_answer_s(lane: Lane, before_any_s: float) -> float:
    """The mean time in flight of the lane's attempts that came back (queue included), or
    `before_any_s` (from the settings) before the first has. Those that came back only: counting
    the time of those still in flight (in-flight seconds over attempts landed) makes the expectation
    grow with the silence itself, by in-flight / landed per second, so with fewer than STALL_FACTOR
    landed per one in flight no silence would ever be long enough."""
    if lane.landed <= 0:
        return before_any_s
    return lane.landed_s / lane.landed


def stall_after_s(lane: Lane, interval_s: float, before_any_s: float, *, signed: bool = False) -> float:
    """How long the lane may be silent with attempts in flight before it counts as stalled: with
    its servers' own sign of a stall (`signed`), STALL_TICKS steering intervals; else also at
    least STALL_FACTOR expected answer times (an answer may take minutes; a sign says sooner)."""
    ticks = STALL_TICKS * interval_s
    if signed:
        return ticks
    return max(ticks, STALL_FACTOR * expected_answer_s(lane, before_any_s))


def stalled(lane: Lane, now: float, interval_s: float, before_any_s: float) -> str | None:
    """Why `lane` is stalled at monotonic `now` (its words for the operator), or None while it answers:
    attempts in flight and nothing landed for `stall_after_s`."""
    if lane.closed is not None or lane.in_flight <= 0:
        return None
    silent = now - lane.quiet_since
    if silent < STALL_TICKS * interval_s:
        return None  # the shortest silence that is a stall: no need to ask the servers yet
    sign = lane.backend.stall_sign(now)
    limit = stall_after_s(lane, interval_s, before_any_s, signed=sign is not None)
    if silent < limit:
        return None
    expected = duration(expected_answer_s(lane, before_any_s), "fine")
    said = f" ({sign})" if sign is not None else ""
    return (
        f"{lane.backend.title} stalled: {lane.in_flight} requests in flight and none answered for "
        f"{duration(silent, 'fine')} (an answer takes about {expected}){said}"
    )
