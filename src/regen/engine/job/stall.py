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
# And never less than this many steering intervals: one late tick must not make a stall.
STALL_TICKS = 3.0


def expected_answer_s(lane: Lane, now: float, before_any_s: float) -> float:
    """The lane's mean time in flight per attempt (Little's law: in-flight seconds over attempts
    landed), or `before_any_s` (from the settings) before the first attempt has landed."""
    if lane.landed <= 0:
        return before_any_s
    return lane.busy_s(now) / lane.landed


def stall_after_s(lane: Lane, now: float, interval_s: float, before_any_s: float) -> float:
    """How long the lane may be silent with attempts in flight before it counts as stalled."""
    return max(STALL_TICKS * interval_s, STALL_FACTOR * expected_answer_s(lane, now, before_any_s))


def stalled(lane: Lane, now: float, interval_s: float, before_any_s: float) -> str | None:
    """Why `lane` is stalled at monotonic `now` (its words for the operator), or None while it answers:
    attempts in flight and nothing landed for `stall_after_s`."""
    if lane.closed is not None or lane.in_flight <= 0:
        return None
    silent = now - lane.quiet_since
    limit = stall_after_s(lane, now, interval_s, before_any_s)
    if silent < limit:
        return None
    return (
        f"{lane.backend.title} stalled: {lane.in_flight} requests in flight and none answered for "
        f"{duration(silent, 'fine')} (an answer takes about {duration(limit / STALL_FACTOR, 'fine')})"
    )
