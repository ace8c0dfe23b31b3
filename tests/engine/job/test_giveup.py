"""The run's last line about its given-up prompts (engine/job/giveup.py): how many attempts each took,
and what a rerun can fix told apart from what it cannot, for each give-up cause."""

from __future__ import annotations

from regen.engine.backends.base import Disposition, Failure
from regen.engine.job.giveup import ATTEMPTS_RAN_OUT, GivenUp, reason_for, summary


def given_up(line: int, failure: Failure, attempts: int, ds: str = "A") -> GivenUp:
    return GivenUp(ds, line, attempts, reason_for(failure), failure.error_class, failure.message)


RETRY_502 = Failure(Disposition.RETRY, "server", "502 Bad Gateway")
RETRY_429 = Failure(Disposition.RETRY, "rate_limited", "429 Too Many Requests", throttle=True)
BAD = Failure(Disposition.GIVE_UP, "bad_request", "refused by http://gpu1 (400): bad input", refused=True)
LONG = Failure(Disposition.GIVE_UP, "over_context", "4200 prompt tokens do not fit the context of 4096")


def test_each_cause_is_rerun_fixable_or_not() -> None:
    assert reason_for(RETRY_502) is ATTEMPTS_RAN_OUT and ATTEMPTS_RAN_OUT.rerun_fixes
    for failure in (
        BAD,
        LONG,
        Failure(Disposition.GIVE_UP, "bad_prompt", "template"),
        Failure(Disposition.GIVE_UP, "too_costly", "weight_exceeds_budget"),
    ):
        assert not reason_for(failure).rerun_fixes, failure.error_class
        assert reason_for(failure).name == failure.error_class
    # A give-up class nobody listed is a refusal all the same, named by its class.
    new = reason_for(Failure(Disposition.GIVE_UP, "unsafe_content", "flagged"))
    assert (new.name, new.rerun_fixes, new.words) == ("unsafe_content", False, "refused (unsafe content)")


def test_attempts_that_ran_out_say_how_many_and_run_again() -> None:
    line = summary([given_up(i, RETRY_502, 6) for i in range(3)])
    assert line == "3 prompts failed after 6 attempts each (server); run again to retry them"
    assert (
        summary([given_up(4, RETRY_429, 2)])
        == "1 prompt failed after 2 attempts (rate_limited); run again to retry it"
    )


def test_bad_requests_say_one_attempt_name_the_first_lines_and_no_rerun() -> None:
    line = summary([given_up(i, BAD, 1) for i in (40, 3, 7, 12, 90)])
    assert line == (
        "5 prompts refused as a bad request after 1 attempt each, which a rerun cannot fix: "
        "A line 3, A line 7, A line 12 and 2 more (refused by http://gpu1 (400): bad input); change them first"
    )
    assert "run again" not in line and "6 attempts" not in line


def test_prompts_longer_than_the_context() -> None:
    assert summary([given_up(2, LONG, 1, ds="B")]) == (
        "1 prompt longer than the model's context after 1 attempt, which a rerun cannot fix: "
        "B line 2 (4200 prompt tokens do not fit the context of 4096); change it first"
    )


def test_a_mix_tells_each_group_apart_refusals_first() -> None:
    items = [given_up(1, RETRY_502, 6), given_up(2, RETRY_429, 4), given_up(5, BAD, 1), given_up(9, LONG, 1)]
    assert summary(items) == (
        "4 prompts failed: "
        "1 refused as a bad request after 1 attempt, which a rerun cannot fix: A line 5 "
        "(refused by http://gpu1 (400): bad input); change it first; "
        "1 longer than the model's context after 1 attempt, which a rerun cannot fix: A line 9 "
        "(4200 prompt tokens do not fit the context of 4096); change it first; "
        "2 failed after 4 to 6 attempts (rate_limited, server); run again to retry them"
    )
