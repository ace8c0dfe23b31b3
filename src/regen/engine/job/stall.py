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
# With the servers' own sign of a stall (their /metrics unanswered), this many, once an answer time
# is measured; before any, the sign is required and shortens nothing (`stalled`).
SIGNED_FACTOR = 2.0
# And never less than this many steering intervals: one late tick must not make a stall.
STALL_TICKS = 3.0


def expected_answer_s(lane: Lane, before_any_s: float) -> float:
    """The lane's mean time in flight per attempt (Little's law: in-flight seconds over attempts
    landed) as it stood when the last attempt landed, or `before_any_s` (from the settings) before
    the first has.

    As it stood then, not now: counted up to now, the in-flight seconds grow with the silence itself
    (by the attempts in flight each second) and the expectation with them, so a lane that had landed
    fewer than STALL_FACTOR attempts per one in flight could never be silent long enough. Nor the
    mean over the attempts that came back alone: early in a run those are the shortest answers, and
    a slow start on a loaded machine would look like a stall. This one errs long while a lane ramps
    up (the attempts still in flight count, their answers not yet), never short."""
    if lane.landed <= 0:
        return before_any_s
    return lane.landed_busy_s / lane.landed


def stall_after_s(lane: Lane, interval_s: float, before_any_s: float, *, signed: bool = False) -> float:
    """How long the lane may be silent with attempts in flight before it counts as stalled: at least
    STALL_TICKS steering intervals and STALL_FACTOR expected answer times, SIGNED_FACTOR of them
    with its servers' own sign (`signed`) once an answer time is measured."""
    factor = SIGNED_FACTOR if signed and lane.landed > 0 else STALL_FACTOR
    return max(STALL_TICKS * interval_s, factor * expected_answer_s(lane, before_any_s))


def stalled(lane: Lane, now: float, interval_s: float, before_any_s: float) -> str | None:
    """Why `lane` is stalled at monotonic `now` (its words for the operator), or None while it answers:
    attempts in flight and nothing landed or streamed for `stall_after_s`."""
    if lane.closed is not None or lane.in_flight <= 0:
        return None
    heard = lane.backend.heard_at()
    # Silent: nothing landed and no answer streamed a chunk. A slow fleet streams; a stopped process
    # or a wedged scheduler does not, and a request still queued hears nothing either way.
    silent = now - (lane.quiet_since if heard is None else max(lane.quiet_since, heard))
    if silent < STALL_TICKS * interval_s:
        return None  # the shortest silence that is a stall: no need to ask the servers yet
    sign = lane.backend.stall_sign(now)
    if lane.landed <= 0 and sign is None:
        # No answer yet in this run: its expected answer time is only the settings' guess, and a
        # slow start (a loaded host, a fleet ten times slower than guessed, its first chunks then a
        # pause) is as silent as a stopped one. The servers' own sign must say it too.
        return None
    if silent < stall_after_s(lane, interval_s, before_any_s, signed=sign is not None):
        return None
    expected = duration(expected_answer_s(lane, before_any_s), "fine")
    said = f" ({sign})" if sign is not None else ""
    return (
        f"{lane.backend.title} stalled: {lane.in_flight} requests in flight and none answered or streamed for "
        f"{duration(silent, 'fine')} (an answer takes about {expected}){said}"
    )
