"""The stall rule (engine/job/stall.py): silence, shortened by the servers' own sign, never made by it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from regen.engine.job.lanes import Lane
from regen.engine.job.stall import STALL_FACTOR, STALL_TICKS, stalled

INTERVAL_S = 1.0


@dataclass
class Servers:
    """What the rule asks of a backend: its title and its servers' sign."""

    sign: str | None = None
    title: str = "SGLang"
    asked: int = 0

    def stall_sign(self, now: float) -> str | None:
        self.asked += 1
        return self.sign


def lane_answering_every(answer_s: float, servers: Servers, landed: int = 10) -> Lane:
    # `landed` attempts came back, each after `answer_s` in flight, the last at t=100; 4 in flight.
    lane = Lane(servers, None, None, None, None)  # type: ignore[arg-type]
    lane.fly(+4, 0.0)
    for i in range(landed):
        back = 100.0 - (landed - 1 - i)
        lane.land(back, back - answer_s)
    return lane


def test_a_short_silence_is_no_stall_and_the_servers_are_not_asked() -> None:
    servers = Servers(sign="127.0.0.1:30000: /metrics unanswered for 9s")
    lane = lane_answering_every(10.0, servers)
    assert stalled(lane, 100.0 + STALL_TICKS * INTERVAL_S - 0.1, INTERVAL_S, 1.0) is None
    assert servers.asked == 0


def test_silence_of_several_answer_times_is_a_stall_without_a_sign() -> None:
    servers = Servers()
    lane = lane_answering_every(10.0, servers)
    assert stalled(lane, 100.0 + 30.0, INTERVAL_S, 1.0) is None, "3 answer times: a slow answer"
    reason = stalled(lane, 100.0 + STALL_FACTOR * 10.0 + 0.5, INTERVAL_S, 1.0)
    assert reason is not None and reason.startswith(
        "SGLang stalled: 4 requests in flight and none answered for"
    )
    assert "an answer takes about 10s" in reason


def test_the_servers_sign_shortens_the_silence_to_a_few_ticks() -> None:
    sign = "127.0.0.1:30000: token counter frozen for 2.5s"
    lane = lane_answering_every(10.0, Servers(sign=sign))
    reason = stalled(lane, 100.0 + STALL_TICKS * INTERVAL_S + 0.1, INTERVAL_S, 1.0)
    assert reason is not None and reason.endswith(f"(an answer takes about 10s) ({sign})"), reason


@pytest.mark.parametrize("sign", [None, "127.0.0.1:30000: /metrics unanswered for 60s"])
def test_a_lane_with_nothing_in_flight_or_closed_is_never_stalled(sign: str | None) -> None:
    lane = lane_answering_every(1.0, Servers(sign=sign))
    lane.closed = "its backend failed"
    assert stalled(lane, 1000.0, INTERVAL_S, 1.0) is None
    lane.closed = None
    lane.fly(-4, 100.0)
    assert stalled(lane, 1000.0, INTERVAL_S, 1.0) is None


def test_a_lane_that_landed_few_per_one_in_flight_is_still_said_stalled() -> None:
    # 3 came back while 4 wait: measured as in-flight seconds over those landed, the expected answer
    # time grew with the silence (4/3 s a second) faster than a quarter of the silence, so no
    # silence was ever a stall. Measured on those that came back, it is their 10 s.
    lane = lane_answering_every(10.0, Servers(), landed=3)
    reason = stalled(lane, 100.0 + STALL_FACTOR * 10.0 + 0.5, INTERVAL_S, 1.0)
    assert reason is not None and "an answer takes about 10s" in reason, reason
