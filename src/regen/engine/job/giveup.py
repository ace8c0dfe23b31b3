"""Why a prompt was given up in this run, and the run's last line about it (docs/faults.md, "Given up").

A prompt is given up for one of two kinds of reason, and the operator's next step differs:

- its attempts ran out on failures that belong to the moment (throttling, server errors, dropped
  streams, an outage's probes): a later run may well not meet them, so *run again*;
- the request is refused as it stands (a bad request, a prompt longer than the model's context, a
  chat template that cannot render it): a rerun sends the same request and meets the same refusal,
  so the line or the settings must change first.

Each reason is listed once here with its kind (`Reason.rerun_fixes`). A backend's give-up is named by
its error class; a class not listed is a refusal all the same (the backend said GIVE_UP: retrying
does not help), named by the class itself, so a new one (an `over_context`) needs no change here to
be told apart, only a row for better words.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from regen.engine.backends.base import Disposition, Failure

__all__ = ["ATTEMPTS_RAN_OUT", "GivenUp", "Reason", "reason_for", "summary"]

SHOWN_LINES = 3  # lines named per refusal reason in the last line; the rest are counted


@dataclass(frozen=True, slots=True)
class Reason:
    """One reason a prompt is given up: its name in the gave_up record, whether a rerun can fix it,
    and how the last line says it."""

    name: str
    rerun_fixes: bool
    words: str


# Retryable failures until the prompt's attempt cap (job.max_attempts); the last one's class is kept.
ATTEMPTS_RAN_OUT = Reason("attempts", True, "failed")

# Refusals of the request as it stands, by the backend's error class.
_REFUSALS = {
    reason.name: reason
    for reason in (
        Reason("bad_request", False, "refused as a bad request"),
        Reason("over_context", False, "longer than the model's context"),
        Reason("bad_prompt", False, "not renderable by the chat template"),
        Reason("too_costly", False, "too costly for the in-flight budget at their worst case"),
    )
}


def reason_for(failure: Failure) -> Reason:
    """Why the prompt whose last attempt failed with `failure` is given up."""
    if failure.disposition is not Disposition.GIVE_UP:
        return ATTEMPTS_RAN_OUT
    known = _REFUSALS.get(failure.error_class)
    if known is not None:
        return known
    return Reason(failure.error_class, False, f"refused ({failure.error_class.replace('_', ' ')})")


@dataclass(frozen=True, slots=True)
class GivenUp:
    """A prompt given up in this run, as its gave_up record says it."""

    dataset: str
    line: int  # 0-based, as regen shows lines everywhere (engine/data/datasets.py)
    attempts: int  # made in this run
    reason: Reason
    error_class: str  # the last failure's
    message: str  # the last failure's, in the operator's words


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _attempts(items: Sequence[GivenUp]) -> str:
    low, high = min(g.attempts for g in items), max(g.attempts for g in items)
    if low == high:
        return f"after {_plural(low, 'attempt')}" + (" each" if len(items) > 1 else "")
    return f"after {low} to {high} attempts"


def _lines(items: Sequence[GivenUp]) -> str:
    shown = ", ".join(f"{g.dataset} line {g.line}" for g in items[:SHOWN_LINES])
    more = len(items) - SHOWN_LINES
    return f"{shown} and {more} more" if more > 0 else shown


def summary(given_up: Iterable[GivenUp]) -> str:
    """The run's last words on its given-up prompts: how many, after how many attempts, and apart,
    those a rerun can retry and those it cannot (each reason with its first lines and message)."""
    items = sorted(given_up, key=lambda g: (g.dataset, g.line))
    groups: dict[str, list[GivenUp]] = {}
    for g in items:
        # Every retryable give-up is one group (one remedy); each refusal reason is its own.
        groups.setdefault(g.reason.name if not g.reason.rerun_fixes else "", []).append(g)
    alone = len(groups) == 1
    parts: list[str] = []
    for name, group in sorted(groups.items(), key=lambda kv: kv[0] == ""):
        count = _plural(len(group), "prompt") if alone else str(len(group))
        them = "it" if len(group) == 1 else "them"
        if name == "":
            classes = ", ".join(sorted({g.error_class for g in group}))
            parts.append(f"{count} failed {_attempts(group)} ({classes}); run again to retry {them}")
        else:
            parts.append(
                f"{count} {group[0].reason.words} {_attempts(group)}, which a rerun cannot fix: "
                f"{_lines(group)} ({group[0].message}); change {them} first"
            )
    if alone:
        return parts[0]
    return f"{_plural(len(items), 'prompt')} failed: " + "; ".join(parts)
