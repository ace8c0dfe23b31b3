"""Rebuild a job's state from what it wrote: rows, the attempt journal and the event journal.

Attempt journal records (one JSON object per line, key `k`):
- `start`: written durably before the request goes out, with its reservation;
- `gen`: the generation id, as soon as the response headers arrive;
- `end`: the settled attempt with its cost (`est` when the cost is an estimate);
- `reconciled`: a later correction of an estimated cost from /generation (`delta` dollars), or
  (`unsent`) the repair of an attempt journaled at its worst case although it never left;
- `gave_up`: a prompt that exhausted its attempts in that run.
A `start` without an `end` was in flight at a crash: its worst case is charged as an estimate at the
next start, and reconciled through /generation when its generation id is known.

Event journal records recovery reads: `exclude`/`include` (routes), `key_usage_base` (the key's
usage at the run's first start) and `usage_bound` (unknowable money the key's usage took off, by
outcome), docs/money.md "Bounded by the key's usage".

A complete line that is not what regen writes (garbage added by hand, another tool's output) stops
the rebuild with `RecoveryError` naming the file and line: guessing would lose or double money or
rows (docs/inputs.md, "Results and journals").
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from regen.engine.data.jsonl import CorruptLine, JsonlError, iter_jsonl, repair_torn_tail
from regen.engine.data.scan import DIGEST_BYTES
from regen.engine.money.ledger import Estimates, SpendBreakdown


class RecoveryError(JsonlError):
    """A results file or journal line regen cannot have written; the message says which and what to do."""


@dataclass(slots=True)
class DatasetProgress:
    """Rows already written for one dataset."""

    # line -> the first DIGEST_BYTES of its row's prompt_sha256 (b"" when that is not hex): what
    # the check against the prompts compares, at a third of the hex string's memory.
    done: dict[int, bytes] = field(default_factory=dict)
    ok: int = 0
    truncated: int = 0
    output_tokens: int = 0
    duplicates: int = 0
    torn_bytes: int = 0
    # Rows of lines whose attempt the journal left unsettled: they settle it exactly.
    settling: dict[int, dict[str, Any]] = field(default_factory=dict)


@dataclass(slots=True)
class Unsettled:
    """An attempt whose cost is not known exactly yet."""

    rid: str
    dataset: str
    line: int
    generation_id: str | None
    estimate: Decimal
    outcome: str = "lost_at_crash"
    provider: str | None = None


@dataclass(slots=True)
class JournalState:
    """Money and attempt history rebuilt from the attempt and event journals."""

    spent: Decimal = Decimal(0)
    estimates: Estimates = field(default_factory=Estimates)
    attempts: dict[str, dict[int, int]] = field(default_factory=dict)  # dataset -> line -> attempts
    crashed: list[Unsettled] = field(default_factory=list)  # start without end
    to_reconcile: list[Unsettled] = field(default_factory=list)  # estimated end with a gen id
    # Ends charged at their worst case by a regen that did not yet tell a request that never left
    # (connection refused, DNS, TLS, connect timeout) from one that was sent: they cost nothing.
    never_sent: list[Unsettled] = field(default_factory=list)
    excluded: dict[str, str] = field(default_factory=dict)  # route -> who excluded it
    breakdown: SpendBreakdown = field(default_factory=SpendBreakdown)
    torn_bytes: int = 0
    first_start_ts: float | None = None  # the run's first start (epoch seconds): durations count from it
    deadline: dict[str, Any] | None = None  # the last `deadline` event: the instant a restart keeps
    # The key's usage when the run first started, before any attempt (docs/money.md, "Bounded by
    # the key's usage"), and the key it is of; None: no base (an older run, /key unreadable then,
    # or a later start with another key voided it).
    usage_base: Decimal | None = None
    usage_account: str | None = None
    # Whether anything was ever tried or started in this run folder: a base taken later would miss
    # the bills of what came before it.
    begun: bool = False

    @property
    def estimated(self) -> Decimal:
        return self.estimates.total


def prompt_digest(sha256: object) -> bytes:
    """The part of a prompt's sha256 (hex) that the scan keeps per line; b"" for anything else."""
    if not isinstance(sha256, str):
        return b""
    try:
        return bytes.fromhex(sha256[: DIGEST_BYTES * 2])
    except ValueError:
        return b""


def read_rows(results_path: Path, unsettled_lines: Collection[int] = ()) -> DatasetProgress:
    """Rows of one raw_responses.jsonl, repairing a torn last line first.

    For lines in `unsettled_lines` (an attempt started, no end record) the row's generation id,
    cost and tokens are kept: the row and the end record are written concurrently, so a crash can
    leave the row without its end record, and the row then settles the attempt.
    """
    progress = DatasetProgress(torn_bytes=repair_torn_tail(results_path))
    if not results_path.exists():
        return progress
    for _, row in _records(results_path, _row_problem):
        line = row["line"]
        if line in progress.done:
            progress.duplicates += 1
            continue
        progress.done[line] = prompt_digest(row.get("prompt_sha256"))
        if line in unsettled_lines:
            progress.settling[line] = {
                "gen": row.get("generation_id"),
                # A GPU-time row keeps its ledger amount beside the (null) dollar cost.
                "cost": row.get("cost") if row.get("cost") is not None else row.get("gpu_s"),
                "est": bool(row.get("cost_estimated")),
                "status": row.get("status"),
                "ctok": (row.get("usage") or {}).get("completion_tokens"),
                "provider": row.get("provider"),
                "backend": row.get("backend"),
            }
        if row.get("status") == "truncated":
            progress.truncated += 1
        else:
            progress.ok += 1
        usage = row.get("usage") or {}
        tokens = usage.get("completion_tokens")
        progress.output_tokens += tokens if isinstance(tokens, int) else 0
    return progress


# How the client used to word an attempt that failed before its request left (aiohttp's connector
# errors and the connect timeout); new journals say so with `sent: false` and cost 0 instead.
_NEVER_LEFT = (
    "ClientConnectorError",
    "ClientConnectorDNSError",
    "ClientConnectorSSLError",
    "ClientConnectorCertificateError",
    "ConnectionTimeoutError",
)


def never_left(message: str) -> bool:
    """Whether a journaled error message says the request never left this machine."""
    return message.startswith(_NEVER_LEFT) or message == "connect timed out" or "Connect call failed" in message


def read_journals(
    attempts_path: Path,
    events_path: Path,
    *,
    backend: str | None = None,
    default: str | None = None,
    count_attempts: bool = True,
) -> JournalState:
    """Spend, attempt counts, unsettled attempts and exclusions from the two journals.

    With `backend`, money, unsettled attempts and exclusions are those of that backend's attempts
    only (each ledger counts in its own unit); attempt counts per prompt are always every backend's,
    as they number the prompt's attempts (a job reading once per backend counts them once:
    `count_attempts`). An attempt's backend is its records' `be`; records without one were written
    by a single-backend run and belong to `default`.
    """
    state = JournalState(torn_bytes=repair_torn_tail(attempts_path))
    # The backend of each attempt still open (start without end): its gen record names no backend.
    # End and reconciled records name theirs; those of older single-backend runs are `default`'s.
    open_backend: dict[str, str | None] = {}
    repair_torn_tail(events_path)
    starts: dict[str, dict[str, Any]] = {}
    generation: dict[str, str] = {}
    estimated: dict[str, Unsettled] = {}
    unsent: dict[str, Unsettled] = {}
    attempts: dict[str, dict[int, int]] = {}
    if attempts_path.exists():
        for _, rec in _records(attempts_path, _attempt_problem):
            kind = rec.get("k")
            rid = str(rec.get("rid", ""))
            if kind == "start":
                state.begun = True
                if count_attempts:
                    tried = attempts.get(rec["ds"])
                    if tried is None:
                        tried = attempts[rec["ds"]] = {}
                    tried[rec["line"]] = tried.get(rec["line"], 0) + 1
                if backend is not None:
                    owner = rec.get("be") or default
                    if owner != backend:
                        open_backend[rid] = owner
                        continue
                starts[rid] = rec
                continue
            if backend is not None:
                owner = rec.get("be") or (backend if rid in starts else open_backend.get(rid, default))
                if owner != backend:
                    if kind == "end":
                        open_backend.pop(rid, None)
                    continue  # another backend's attempt: its own ledger counts it
            if kind == "gen":
                generation[rid] = rec["gen"]
            elif kind == "end":
                start = starts.pop(rid, None)
                # Only unsettled attempts need their generation id later: keep the map to those.
                gen_seen = generation.pop(rid, None)
                cost = Decimal(str(rec.get("cost") or 0))
                state.spent += cost
                outcome = str(rec.get("outcome"))
                tokens = rec.get("ctok") or 0
                state.breakdown.add(outcome, cost, tokens if isinstance(tokens, int) else 0)
                if rec.get("est"):
                    gen = rec.get("gen") or gen_seen
                    state.estimates.add(cost, knowable=bool(gen), outcome=outcome)
                    if not gen and rec.get("http") is None and never_left(str(rec.get("msg") or "")):
                        ds = rec.get("ds", start["ds"] if start else "")
                        line = rec.get("line", start["line"] if start else -1)
                        unsent[rid] = Unsettled(rid, ds, line, None, cost, outcome, rec.get("provider"))
                    if gen:
                        ds = rec.get("ds", start["ds"] if start else "")
                        line = rec.get("line", start["line"] if start else -1)
                        estimated[rid] = Unsettled(rid, ds, line, gen, cost, outcome, rec.get("provider"))
            elif kind == "reconciled":
                delta = Decimal(str(rec.get("delta") or 0))
                state.spent += delta
                state.breakdown.add(str(rec.get("outcome", "lost_at_crash")), delta)
                settled = estimated.pop(rid, None)
                if settled is not None:
                    state.estimates.settle(settled.estimate)
                repaired = unsent.pop(rid, None) if rec.get("unsent") else None
                if repaired is not None:
                    state.estimates.settle(repaired.estimate, knowable=False, outcome=repaired.outcome)
    for rid, start in starts.items():
        state.crashed.append(
            Unsettled(rid, start["ds"], start["line"], generation.get(rid), Decimal(str(start["reserved"])))
        )
    state.to_reconcile = list(estimated.values())
    state.never_sent = list(unsent.values())
    state.attempts = attempts
    if events_path.exists():
        started = False  # a start event seen: a base journaled after one is not the first start's
        for _, event in _records(events_path, _event_problem):
            name = event.get("event")
            if name == "start":
                started = state.begun = True
            if (
                backend is not None
                and name in ("exclude", "include", *_USAGE_EVENTS)
                and event.get("backend", default) != backend
            ):
                continue
            if name == "start" and state.first_start_ts is None and isinstance(event.get("ts"), int | float):
                state.first_start_ts = float(event["ts"])
            elif name == "deadline":
                state.deadline = event
            elif name in _USAGE_EVENTS:
                _read_usage_event(state, name, event, started)
            elif name == "exclude":
                state.excluded[str(event["provider"]).lower()] = str(event.get("source") or "operator")
            elif name == "include":
                state.excluded.pop(str(event["provider"]).lower(), None)
    return state


_USAGE_EVENTS = ("key_usage_base", "key_usage_void", "usage_bound")


def _read_usage_event(state: JournalState, name: str, event: dict[str, Any], started: bool) -> None:
    if name == "key_usage_base":
        if not started:  # only the first start's counts: it was taken before anything was sent
            state.usage_base = Decimal(str(event["usage"]))
            state.usage_account = str(event["account"])
    elif name == "key_usage_void":
        state.usage_base = state.usage_account = None  # and no later base: it follows a start
    else:
        cuts = {str(outcome): Decimal(str(cut)) for outcome, cut in event["cuts"].items()}
        lowered = sum(cuts.values(), Decimal(0))
        state.estimates.lower(cuts)
        state.estimates.bounded_by = "key_usage"
        state.spent -= lowered
        for outcome, cut in cuts.items():
            state.breakdown.add(outcome, -cut)


# -- what a line must hold to be read -------------------------------------------------------------
# Only the fields recovery reads are checked, so records may grow new fields (and the journals new
# kinds, which are passed over) without breaking older readers.


def _records(
    path: Path, problem_of: Callable[[dict[str, Any]], str | None]
) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        for n, rec in iter_jsonl(path):
            problem = problem_of(rec)
            if problem is not None:
                raise RecoveryError(_stop_message(path, n, problem))
            yield n, rec
    except CorruptLine as exc:
        raise RecoveryError(_stop_message(path, exc.line, exc.problem)) from None


def _stop_message(path: Path, line: int, problem: str) -> str:
    # file:N is 1-based, as editors count; regen never leaves a bad complete line behind (a torn
    # last one is cut at start), so this one came from elsewhere and only a person can judge it.
    return f"{path}:{line + 1}: {problem}; regen did not write this line: fix or delete it, then run again"


def _is_int(value: Any) -> bool:
    return type(value) is int


def _is_money(value: Any) -> bool:
    """A dollar amount as regen writes it: a decimal string (or a plain number), finite."""
    if type(value) not in (str, int, float):
        return False
    try:
        return Decimal(str(value)).is_finite()
    except InvalidOperation:
        return False


def _optional(value: Any, *types: type) -> bool:
    return value is None or type(value) in types


def _row_problem(row: dict[str, Any]) -> str | None:
    line = row.get("line")
    if type(line) is not int or line < 0:
        return "not a result row (no line number)"
    if type(row.get("prompt_sha256")) is not str:
        return "not a result row (no prompt_sha256)"
    if not _optional(row.get("status"), str) or not _optional(row.get("generation_id"), str):
        return "result row with a malformed status or generation_id"
    if row.get("cost") is not None and not _is_money(row["cost"]):
        return "result row whose cost is not a number"
    usage = row.get("usage")
    if not _optional(usage, dict) or (usage and not _optional(usage.get("completion_tokens"), int)):
        return "result row with malformed usage"
    return None


def _attempt_problem(rec: dict[str, Any]) -> str | None:
    kind = rec.get("k")
    if type(kind) is not str:
        return "not an attempt record (no kind 'k')"
    if kind not in ("start", "gen", "end", "reconciled"):
        return None
    if type(rec.get("rid")) is not str:
        return f"{kind} record without a request id"
    if kind == "start":
        if (
            type(rec.get("ds")) is not str
            or not _is_int(rec.get("line"))
            or not _is_money(rec.get("reserved"))
        ):
            return "start record without its dataset, line or reservation"
    elif kind == "gen":
        if type(rec.get("gen")) is not str:
            return "gen record without a generation id"
    elif kind == "end":
        if rec.get("cost") is not None and not _is_money(rec["cost"]):
            return "end record whose cost is not a number"
        if not _optional(rec.get("ds"), str) or not _optional(rec.get("line"), int):
            return "end record with a malformed dataset or line"
        if not _optional(rec.get("gen"), str) or not _optional(rec.get("est"), bool):
            return "end record with a malformed generation id or estimate flag"
        if not _optional(rec.get("provider"), str) or not _optional(rec.get("outcome"), str):
            return "end record with a malformed provider or outcome"
    elif rec.get("delta") is not None and not _is_money(rec["delta"]):
        return "reconciled record whose delta is not a number"
    return None


def _event_problem(event: dict[str, Any]) -> str | None:
    name = event.get("event")
    if type(name) is not str:
        return "not an event record (no event name)"
    if name in ("exclude", "include") and type(event.get("provider")) is not str:
        return f"{name} event without a provider"
    if name == "deadline" and not (event.get("at") is None or type(event.get("at")) in (int, float)):
        return "deadline event without an instant (at)"
    if name == "key_usage_base" and (not _is_money(event.get("usage")) or type(event.get("account")) is not str):
        return "key_usage_base event without its usage or account"
    if name == "usage_bound":
        cuts = event.get("cuts")
        if type(cuts) is not dict or not all(type(k) is str and _is_money(v) for k, v in cuts.items()):
            return "usage_bound event without its cuts"
    return None
