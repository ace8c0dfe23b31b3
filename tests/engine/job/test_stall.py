"""The stall rule (engine/job/stall.py): silence against an expected answer time that the silence
itself does not move, shortened by the servers' own sign, never made by it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from regen.engine.job.lanes import Lane
from regen.engine.job.stall import SIGNED_FACTOR, STALL_FACTOR, STALL_TICKS, expected_answer_s, stalled

INTERVAL_S = 2.0
BEFORE_ANY_S = 5.0
SIGN = "127.0.0.1:30000: /metrics unanswered for 9s"


@dataclass
class Servers:
    """What the rule asks of a lane's backend: its title, for the words, when it last heard a chunk,
    and its servers' sign."""

    sign: str | None = None
    title: str = "SGLang"
    asked: int = 0
    heard: float | None = None  # when a chunk of an answer last arrived

    def heard_at(self) -> float | None:
        return self.heard

    def stall_sign(self, now: float) -> str | None:
        self.asked += 1
        return self.sign


def lane_with(in_flight: int, servers: Servers | None = None) -> Lane:
    lane = Lane(servers or Servers(), None, None, None, None)  # type: ignore[arg-type]
    lane.fly(+in_flight, 0.0)
    return lane


def come_back(lane: Lane, at: float) -> None:
    """One attempt lands at `at` and the dispatcher sends the next in its place (the lane stays full)."""
    lane.land(at)
    lane.fly(-1, at)
    lane.fly(+1, at)


def test_a_lane_that_landed_few_per_one_in_flight_is_still_said_stalled() -> None:
    # 4 in flight from t=0, 3 came back at t=8..10, then nothing. Counted up to now, the in-flight
    # seconds over those landed grew by 4/3 s a second of silence, faster than a quarter of the
    # silence: no silence was ever a stall. As they stood at the last landing: 40 s / 3.
    lane = lane_with(4)
    for at in (8.0, 9.0, 10.0):
        come_back(lane, at)
    expected = 40.0 / 3
    assert expected_answer_s(lane, BEFORE_ANY_S) == pytest.approx(expected)
    assert stalled(lane, 10.0 + STALL_FACTOR * expected - 0.5, INTERVAL_S, BEFORE_ANY_S) is None
    reason = stalled(lane, 10.0 + STALL_FACTOR * expected + 0.5, INTERVAL_S, BEFORE_ANY_S)
    assert (
        reason
        == "SGLang stalled: 4 requests in flight and none answered or streamed for 54s (an answer takes about 14s)"
    )


def test_the_expected_answer_time_does_not_grow_with_the_silence() -> None:
    lane = lane_with(8)
    for i in range(40):
        come_back(lane, 1.0 + i * 0.25)  # a steady lane: 8 in flight, 4 back a second, 2 s each
    at_last = expected_answer_s(lane, BEFORE_ANY_S)
    lane_then = lane.busy_s(10.75)
    assert lane.busy_s(60.0) > lane_then  # the silence adds in-flight seconds ...
    assert expected_answer_s(lane, BEFORE_ANY_S) == at_last  # ... and not expectation
    assert at_last == pytest.approx(lane_then / 40)


def test_a_slow_start_whose_shortest_answers_came_first_is_no_stall() -> None:
    # 32 sent at t=0; the two shortest answers came back at t=1 and the rest take 8 s. Their own mean
    # (1 s) would call 6 s of waiting a stall; counted with the 30 still in flight it is 16 s.
    lane = lane_with(32)
    come_back(lane, 1.0)
    come_back(lane, 1.0)
    assert expected_answer_s(lane, BEFORE_ANY_S) == pytest.approx(16.0)
    assert stalled(lane, 8.5, INTERVAL_S, BEFORE_ANY_S) is None


def test_before_any_answer_silence_alone_is_no_stall_however_long() -> None:
    # The settings' guess is all there is: a slow start (queued behind a killed run's requests, as in
    # the operator's-night journey) is as silent as a stopped fleet. The servers' sign must say it.
    lane = lane_with(3)
    assert expected_answer_s(lane, BEFORE_ANY_S) == BEFORE_ANY_S
    assert stalled(lane, 1000.0, INTERVAL_S, BEFORE_ANY_S) is None
    signed = lane_with(3, Servers(sign=SIGN))
    assert stalled(signed, STALL_FACTOR * BEFORE_ANY_S - 0.1, INTERVAL_S, BEFORE_ANY_S) is None
    assert stalled(signed, STALL_FACTOR * BEFORE_ANY_S + 0.1, INTERVAL_S, BEFORE_ANY_S) is not None
    quick = lane_with(3, Servers(sign=SIGN))
    assert stalled(quick, STALL_TICKS * INTERVAL_S - 0.1, INTERVAL_S, 0.01) is None
    assert stalled(quick, STALL_TICKS * INTERVAL_S + 0.1, INTERVAL_S, 0.01) is not None


def test_a_lane_with_nothing_in_flight_or_closed_is_never_stalled() -> None:
    lane = lane_with(2)
    lane.closed = "its backend failed"
    assert stalled(lane, 1000.0, INTERVAL_S, BEFORE_ANY_S) is None
    lane.closed = None
    lane.fly(-2, 10.0)
    assert stalled(lane, 1000.0, INTERVAL_S, BEFORE_ANY_S) is None


def steady_lane(servers: Servers) -> Lane:
    """8 in flight, one back every 0.25 s for 10 s (the last at t=10.75): 2 s an answer."""
    lane = lane_with(8, servers)
    for i in range(40):
        come_back(lane, 1.0 + i * 0.25)
    return lane


def test_a_short_silence_is_no_stall_and_the_servers_are_not_asked() -> None:
    servers = Servers(sign=SIGN)
    lane = steady_lane(servers)
    assert stalled(lane, 10.75 + STALL_TICKS * INTERVAL_S - 0.1, INTERVAL_S, BEFORE_ANY_S) is None
    assert servers.asked == 0


def test_the_servers_sign_shortens_the_silence_and_is_said() -> None:
    expected = expected_answer_s(steady_lane(Servers()), BEFORE_ANY_S)
    quick = STALL_FACTOR * expected - 0.5  # over SIGNED_FACTOR answer times and 3 ticks, under 4 answers
    assert quick > max(SIGNED_FACTOR * expected, STALL_TICKS * INTERVAL_S)
    assert stalled(steady_lane(Servers()), 10.75 + quick, INTERVAL_S, BEFORE_ANY_S) is None
    reason = stalled(steady_lane(Servers(sign=SIGN)), 10.75 + quick, INTERVAL_S, BEFORE_ANY_S)
    assert reason is not None and reason.endswith(f"(an answer takes about 3s) ({SIGN})"), reason


def test_before_any_answer_the_sign_shortens_nothing() -> None:
    # A /metrics poll timed out on a loaded host while the fleet warms up is no stall.
    lane = lane_with(8, Servers(sign=SIGN))
    assert stalled(lane, STALL_FACTOR * BEFORE_ANY_S - 0.1, INTERVAL_S, BEFORE_ANY_S) is None
    assert stalled(lane, STALL_FACTOR * BEFORE_ANY_S + 0.1, INTERVAL_S, BEFORE_ANY_S) is not None


def test_a_fleet_whose_answers_stream_is_not_silent_however_long_they_take() -> None:
    # One answer came back at t=2 with 6 in flight: about 12 s an answer, 48 s of silence a stall.
    # Answers that take longer than that still stream chunks: the silence counts from the last.
    servers = Servers()
    lane = lane_with(6, servers)
    come_back(lane, 2.0)
    assert expected_answer_s(lane, BEFORE_ANY_S) == pytest.approx(12.0)
    for at in (20.0, 45.0, 70.0):
        servers.heard = at
        assert stalled(lane, at + 20.0, INTERVAL_S, BEFORE_ANY_S) is None
    assert stalled(lane, 70.0 + 47.9, INTERVAL_S, BEFORE_ANY_S) is None
    reason = stalled(lane, 70.0 + 48.1, INTERVAL_S, BEFORE_ANY_S)
    assert reason is not None and "none answered or streamed for 49s" in reason, reason
