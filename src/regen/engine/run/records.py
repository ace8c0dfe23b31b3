"""The journals' records, kind by kind: the one schema of attempts.jsonl and of the events.jsonl records
recovery reads back (docs/architecture.md, "Files a run writes").

The journals are the one format that must survive versions: a run folder written by any earlier
regen is read by every later one. So a key on disk is never renamed and never changes its meaning;
a record may grow new keys and a journal new kinds. Each kind has here

- a TypedDict naming its keys exactly as they are on disk, each with what it means; the keys its
  reader checks are `Required` (code reading a record indexes those, and `.get`s the others);
- one writer (`start_record`, ...) that every place writing that kind calls, so the keys and their
  order (the bytes on disk) are made in one place;
- one reader (`read_start`, ...) that checks the fields recovery relies on and hands the record on
  typed, or raises `BadRecord` saying what is wrong. Readers are lenient where older journals
  differ (amounts may be plain numbers, keys a later regen added may be absent or null); a kind
  nobody reads is passed over.

`replay` reads a journal through a table kind -> handler (`on(reader, handler)`), naming file:line
of a record its reader refuses (`RecoveryError`): guessing would lose or double money or rows
(docs/inputs.md, "Results and journals").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Required, TypedDict, TypeVar, cast

from regen.engine.data.jsonl import JsonlError, is_money, is_optional, iter_lines, parse_line

# A journal line as parsed, before its reader has looked at it.
Raw = Mapping[str, object]


class RecoveryError(JsonlError):
    """A results file or journal line regen cannot have written; the message says which and what to do."""


class BadRecord(ValueError):
    """A record its reader refuses; `problem` says what is wrong with it (`replay` adds file:line)."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


def stop_message(path: Path, line: int, problem: str) -> str:
    # file:N is 1-based, as editors count; regen never leaves a bad complete line behind (a torn
    # last one is cut at start), so this one came from elsewhere and only a person can judge it.
    return f"{path}:{line + 1}: {problem}; regen did not write this line: fix or delete it, then run again"


class _Absent(Enum):
    ABSENT = 0


# A key the writer leaves out (not the same as null: older shapes of a record are kept byte for byte).
ABSENT = _Absent.ABSENT


# ============================================================================ attempts.jsonl
# One record per step of an attempt, key `k` naming its kind. A `start` without an `end` was in
# flight at a crash: the next start charges its worst case as an estimate, and reconciles it when
# its handle (`gen`) is known (engine/run/recovery.py).


class StartRecord(TypedDict, total=False):
    """Written durably before the request leaves (engine/job/dispatch.py)."""

    k: Required[Literal["start"]]
    rid: Required[
        str
    ]  # the attempt's request id: f"{dataset}-{line:08d}#{attempt}" (docs/data-contract.md §2)
    ds: Required[str]  # the dataset's name
    line: Required[int]  # the prompt's line in the dataset's prompts.jsonl, 0-based
    reserved: Required[
        str
    ]  # the reservation held for it: a decimal string in its ledger's unit (docs/money.md)
    # The backend that sends it (engine/backends/base.py `Backend.name`); absent in journals of
    # single-backend runs before lanes: those attempts belong to `job.backend`.
    be: str
    ts: float  # when it was written, epoch seconds


class GenRecord(TypedDict):
    """The attempt's handle (OpenRouter's generation id) as soon as it is known; its backend is its start's."""

    k: Literal["gen"]
    rid: str  # the start's request id
    gen: str  # the handle: what a later cost lookup asks for


class BackendFields(TypedDict, total=False):
    """The backend's own fields of an end record (`AttemptOutcome.journal`), between `be` and `outcome`."""

    model: str | None  # the model that answered (OpenRouter), None when no answer named one
    # The HTTP status of the answer, None when none came: with no handle and an estimated cost, an
    # end record of an older regen whose message says the request never left is repaired to 0
    # (docs/faults.md, outages).
    http: int | None


class EndRecord(BackendFields, total=False):
    """The settled attempt with its cost (engine/job/settle.py): answered, failed, cancelled by a stop,
    or settled at the next start after a crash (from its row, else at its worst case). regen writes
    every key but those marked otherwise; its reader needs only the request id."""

    k: Required[Literal["end"]]
    rid: Required[str]  # the start's request id
    ds: str  # the dataset (the start's)
    line: int  # the prompt line
    gen: str | None  # the handle, None when none came
    provider: str | None  # the route that served it; not written when settled after a crash
    be: str  # the backend; absent in single-backend runs before lanes (`job.backend`)
    # What became of it: a row status ("ok", "truncated"), the failure's class ("rate_limited",
    # "network", ...), "quarantined", "cancelled", "taken_back" (its prompt was sent again elsewhere:
    # docs/fleets.md, "Work taken back") or "lost_at_crash".
    outcome: str
    cost: str  # the ledger's charge: a decimal string in its unit (a number in older journals)
    est: bool  # the cost is an estimate (the worst case), correctable by a `reconciled` record
    ptok: int | None  # prompt tokens the backend reported; not written when cancelled or crashed
    # Completion tokens the backend reported (older journals hold the API's value as it came:
    # anything but an int counts as 0); not written when cancelled.
    ctok: int | None
    e2e: float  # seconds from send to the end of the answer, rounded to 0.1 ms; not when cancelled or crashed
    ttft: float | None  # seconds to the first token, None when none came; likewise
    ts: float  # when it was written, epoch seconds
    # Why it failed (the failure's message, cut at 300 characters), or why it was quarantined.
    msg: str  # only on a failure or a quarantine
    sent: Literal[False]  # only when the request never left: it cost nothing


class ReconciledRecord(TypedDict, total=False):
    """A later correction of an estimated cost: the backend's bill for it (engine/job/settle.py)."""

    k: Required[Literal["reconciled"]]
    rid: Required[str]  # the request id of the end record it corrects
    be: str  # the backend; absent in older journals (the start's, else `job.backend`)
    gen: str | None  # the handle the bill was looked up by; None for an `unsent` repair
    outcome: str  # the end record's outcome (absent in older journals: "lost_at_crash")
    cost: str  # what the backend billed, a decimal string
    delta: str  # billed less the estimate: what the ledger's spent moves by (a number in older journals)
    # Present (true) on the repair of an end record an older regen charged at its worst case although
    # the request never left (docs/faults.md, outages): it cost 0, and is repaired once.
    unsent: Literal[True]
    ts: float


class GaveUpRecord(TypedDict, total=False):
    """A prompt that used up its attempts in this run; the next run tries it again. Read by no one yet."""

    k: Required[Literal["gave_up"]]
    ds: Required[str]
    line: Required[int]
    attempts: int  # attempts made in this run
    why: str  # the last failure's message (300 characters at most)
    # Why it was given up (engine/job/giveup.py): "attempts" (they ran out on failures a rerun may
    # not meet) or the refusal's error class ("bad_request", "over_context", ...: a rerun cannot fix
    # it). Absent in records of regen before issue 32.
    reason: str
    ts: float


class RequeuedRecord(TypedDict, total=False):
    """A row taken back after the fact (docs/fidelity.md): copied to quarantine.jsonl, its prompt
    to be sent again. Its attempt's end record counted its money as useful (or truncated); from this
    record on it is waste with `cause`. The row leaves raw_responses.jsonl at the next compaction
    (engine/run/requeue.py), matched by dataset, line and generation id."""

    k: Required[Literal["requeued"]]
    ds: Required[str]
    line: Required[int]
    gen: str | None  # the row's generation_id: which of the prompt's rows it was
    be: str  # the row's backend
    provider: str | None  # the route that served it
    outcome: Required[str]  # the row's status ("ok", "truncated"): the spend it leaves
    cost: Required[str]  # the row's cost, a decimal string in the ledger's unit
    ctok: int  # its output tokens
    cause: Required[str]  # the waste it becomes: "fidelity"
    why: str  # the evidence, or the operator's command (300 characters at most)
    ts: float


AttemptRecord = StartRecord | GenRecord | EndRecord | ReconciledRecord | GaveUpRecord | RequeuedRecord


# -- writers -----------------------------------------------------------------------------------


def start_record(rid: str, ds: str, line: int, reserved: Decimal, be: str, ts: float) -> StartRecord:
    return {"k": "start", "rid": rid, "ds": ds, "line": line, "reserved": str(reserved), "be": be, "ts": ts}


def gen_record(rid: str, gen: str) -> GenRecord:
    return {"k": "gen", "rid": rid, "gen": gen}


def end_record(
    rid: str,
    ds: str,
    line: int,
    gen: str | None,
    be: str,
    outcome: str,
    cost: Decimal,
    est: bool,
    ts: float,
    *,
    provider: str | _Absent | None = ABSENT,
    fields: BackendFields | None = None,
    ptok: int | _Absent | None = ABSENT,
    ctok: int | _Absent | None = ABSENT,
    e2e: float | _Absent = ABSENT,
    ttft: float | _Absent | None = ABSENT,
    msg: str | None = None,
    sent: bool = True,
) -> EndRecord:
    """An end record in the order its keys have always had; a key left ABSENT is not written (an
    answer's record has them all, a cancelled one no tokens or timings, a crashed one no route)."""
    record: EndRecord = {"k": "end", "rid": rid, "ds": ds, "line": line, "gen": gen}
    if provider is not ABSENT:
        record["provider"] = provider
    record["be"] = be
    if fields:  # the backend's own, in their order (openrouter: both; sglang: http)
        if "model" in fields:
            record["model"] = fields["model"]
        if "http" in fields:
            record["http"] = fields["http"]
    record["outcome"] = outcome
    record["cost"] = str(cost)
    record["est"] = est
    if ptok is not ABSENT:
        record["ptok"] = ptok
    if ctok is not ABSENT:
        record["ctok"] = ctok
    if e2e is not ABSENT:
        record["e2e"] = round(e2e, 4)
    if ttft is not ABSENT:
        record["ttft"] = None if ttft is None else round(ttft, 4)
    record["ts"] = ts
    if msg is not None:
        record["msg"] = msg
    if not sent:
        record["sent"] = False
    return record


def reconciled_record(
    rid: str,
    be: str,
    gen: str | None,
    outcome: str,
    cost: Decimal,
    delta: Decimal,
    ts: float,
    *,
    unsent: bool = False,
) -> ReconciledRecord:
    if unsent:
        return {
            "k": "reconciled",
            "rid": rid,
            "be": be,
            "gen": gen,
            "outcome": outcome,
            "cost": str(cost),
            "delta": str(delta),
            "unsent": True,
            "ts": ts,
        }
    return {
        "k": "reconciled",
        "rid": rid,
        "be": be,
        "gen": gen,
        "outcome": outcome,
        "cost": str(cost),
        "delta": str(delta),
        "ts": ts,
    }


def gave_up_record(ds: str, line: int, attempts: int, why: str, ts: float, reason: str) -> GaveUpRecord:
    return {
        "k": "gave_up",
        "ds": ds,
        "line": line,
        "attempts": attempts,
        "why": why[:300],
        "reason": reason,
        "ts": ts,
    }


def requeued_record(
    ds: str,
    line: int,
    gen: str | None,
    be: str,
    provider: str | None,
    outcome: str,
    cost: Decimal,
    ctok: int,
    cause: str,
    why: str,
    ts: float,
) -> RequeuedRecord:
    return {
        "k": "requeued",
        "ds": ds,
        "line": line,
        "gen": gen,
        "be": be,
        "provider": provider,
        "outcome": outcome,
        "cost": str(cost),
        "ctok": ctok,
        "cause": cause,
        "why": why[:300],
        "ts": ts,
    }


# -- readers -----------------------------------------------------------------------------------


# Each reader checks the request id first and the backend last, in its own words; the checks are
# written out in each (a reader runs once per journal line at every start, so no helper calls).


def read_start(raw: Raw) -> StartRecord:
    if type(raw.get("rid")) is not str:
        raise BadRecord("start record without a request id")
    if (
        type(raw.get("ds")) is not str
        or type(raw.get("line")) is not int
        or not is_money(raw.get("reserved"))
    ):
        raise BadRecord("start record without its dataset, line or reservation")
    be = raw.get("be")
    if be is not None and type(be) is not str:
        raise BadRecord("start record with a malformed backend")
    return cast(StartRecord, raw)


def read_gen(raw: Raw) -> GenRecord:
    if type(raw.get("rid")) is not str:
        raise BadRecord("gen record without a request id")
    if type(raw.get("gen")) is not str:
        raise BadRecord("gen record without a generation id")
    return cast(GenRecord, raw)


def read_end(raw: Raw) -> EndRecord:
    if type(raw.get("rid")) is not str:
        raise BadRecord("end record without a request id")
    cost = raw.get("cost")
    if cost is not None and not is_money(cost):
        raise BadRecord("end record whose cost is not a number")
    if not is_optional(raw.get("ds"), str) or not is_optional(raw.get("line"), int):
        raise BadRecord("end record with a malformed dataset or line")
    if not is_optional(raw.get("gen"), str) or not is_optional(raw.get("est"), bool):
        raise BadRecord("end record with a malformed generation id or estimate flag")
    if not is_optional(raw.get("provider"), str) or not is_optional(raw.get("outcome"), str):
        raise BadRecord("end record with a malformed provider or outcome")
    msg = raw.get("msg")
    if msg is not None and type(msg) is not str:
        raise BadRecord("end record with a malformed message")
    be = raw.get("be")
    if be is not None and type(be) is not str:
        raise BadRecord("end record with a malformed backend")
    return cast(EndRecord, raw)


def read_reconciled(raw: Raw) -> ReconciledRecord:
    if type(raw.get("rid")) is not str:
        raise BadRecord("reconciled record without a request id")
    delta = raw.get("delta")
    if delta is not None and not is_money(delta):
        raise BadRecord("reconciled record whose delta is not a number")
    outcome = raw.get("outcome")
    if outcome is not None and type(outcome) is not str:
        raise BadRecord("reconciled record with a malformed outcome")
    be = raw.get("be")
    if be is not None and type(be) is not str:
        raise BadRecord("reconciled record with a malformed backend")
    return cast(ReconciledRecord, raw)


def read_requeued(raw: Raw) -> RequeuedRecord:
    if type(raw.get("ds")) is not str or type(raw.get("line")) is not int:
        raise BadRecord("requeued record without its dataset or line")
    if type(raw.get("outcome")) is not str or type(raw.get("cause")) is not str:
        raise BadRecord("requeued record without its outcome or cause")
    if not is_money(raw.get("cost")):
        raise BadRecord("requeued record whose cost is not a number")
    gen, be = raw.get("gen"), raw.get("be")
    if (gen is not None and type(gen) is not str) or (be is not None and type(be) is not str):
        raise BadRecord("requeued record with a malformed generation id or backend")
    return cast(RequeuedRecord, raw)


def read_gave_up(raw: Raw) -> GaveUpRecord:
    if type(raw.get("ds")) is not str or type(raw.get("line")) is not int:
        raise BadRecord("gave_up record without its dataset or line")
    return cast(GaveUpRecord, raw)


# ============================================================================ events.jsonl
# Every event is {"ts": epoch seconds, "event": its name, ...its fields} (engine/run/events.py).
# These are the ones recovery reads back; the others (operator actions, state changes) are for
# people and consoles. In a job with several lanes, an event about one lane names it (`backend`);
# one without it belongs to `job.backend`.


class StartEvent(TypedDict, total=False):
    """The job started (engine/job/job.py): the run's first one is when its durations count from."""

    ts: float
    event: Required[Literal["start"]]
    pid: int
    datasets: list[str]
    budget: str  # the budget lane's budget, a decimal string ("None" for a job without a budget)
    spent: str  # what the journals had spent when it started
    concurrency: int
    excluded: list[str]  # routes excluded at the start
    backends: list[str]  # the lanes, in order, when there are several


class DeadlineEvent(TypedDict, total=False):
    """The deadline set, restored or cleared (engine/job/deadline_control.py, docs/fleets.md "In the job")."""

    ts: float
    event: Required[Literal["deadline"]]
    text: str | None  # what was typed (or set), None when cleared
    at: float | None  # the instant, epoch seconds: what a restart keeps while `setting` is unchanged
    local: str | None  # the instant in local ISO time, for people
    setting: str | None  # `job.deadline` when it was journaled
    source: str  # who set it: "settings", "operator", "console", ...


class RouteEvent(TypedDict, total=False):
    """A route excluded from (`exclude`) or allowed again in (`include`) the lane's routing."""

    ts: float
    event: Required[Literal["exclude", "include"]]
    provider: Required[str]  # the route id, as the backend names it (lower case when compared)
    source: str  # who: "operator", "console", "guard" (the precision guard), ...
    backend: str  # the lane, when the job has several


class KeyUsageBaseEvent(TypedDict, total=False):
    """The key's usage at the run's first start, before anything was sent (docs/money.md, "Bounded by
    the key's usage")."""

    ts: float
    event: Required[Literal["key_usage_base"]]
    backend: str  # the lane (absent in older journals: `job.backend`)
    usage: Required[str]  # the key's billed total then, a decimal string in dollars
    account: Required[str]  # which key it is of (a later start under another key voids the base)


class KeyUsageVoidEvent(TypedDict, total=False):
    """A later start under another key: the run is never bounded by the usage again."""

    ts: float
    event: Required[Literal["key_usage_void"]]
    backend: str
    reason: str


class UsageBoundEvent(TypedDict, total=False):
    """Unknowable money the key's usage took off at the end of a run, by outcome (docs/money.md)."""

    ts: float
    event: Required[Literal["usage_bound"]]
    backend: str
    base: str  # the base it counts from, decimal strings from here on
    usage: str  # the key's usage at the end
    confirmed: str  # the job's confirmed bills
    pending: str  # estimates a lookup may still correct
    unknowable_before: str
    unknowable_after: str
    count: int  # attempts whose cost no bill can name
    cuts: Required[dict[str, str]]  # outcome -> the amount taken off it: what recovery applies
    waited_s: float  # how long the usage took to settle


# -- writers (every event recovery reads is written by its writer here) -------------------------


def start_event(
    pid: int,
    datasets: list[str],
    budget: Decimal | None,
    spent: Decimal,
    concurrency: int,
    excluded: list[str],
    backends: list[str] | None,
    ts: float,
) -> StartEvent:
    """`backends` only for a job with several lanes (None: the key is not written)."""
    event: StartEvent = {
        "ts": ts,
        "event": "start",
        "pid": pid,
        "datasets": datasets,
        "budget": str(budget),
        "spent": str(spent),
        "concurrency": concurrency,
        "excluded": excluded,
    }
    if backends is not None:
        event["backends"] = backends
    return event


def route_event(
    kind: Literal["exclude", "include"], provider: str, source: str, backend: str | None, ts: float
) -> RouteEvent:
    """`backend` only for a job with several lanes (None: the key is not written)."""
    event: RouteEvent = {"ts": ts, "event": kind, "provider": provider, "source": source}
    if backend is not None:
        event["backend"] = backend
    return event


def deadline_event(
    text: str | None, at: float | None, local: str | None, setting: str | None, source: str, ts: float
) -> DeadlineEvent:
    return {
        "ts": ts,
        "event": "deadline",
        "text": text,
        "at": at,
        "local": local,
        "setting": setting,
        "source": source,
    }


def key_usage_base_event(backend: str, usage: Decimal, account: str, ts: float) -> KeyUsageBaseEvent:
    return {"ts": ts, "event": "key_usage_base", "backend": backend, "usage": str(usage), "account": account}


def key_usage_void_event(backend: str, reason: str, ts: float) -> KeyUsageVoidEvent:
    return {"ts": ts, "event": "key_usage_void", "backend": backend, "reason": reason}


def usage_bound_event(
    backend: str,
    base: Decimal,
    usage: Decimal,
    confirmed: Decimal,
    pending: Decimal,
    unknowable_before: Decimal,
    unknowable_after: Decimal,
    count: int,
    cuts: Mapping[str, Decimal],
    waited_s: float,
    ts: float,
) -> UsageBoundEvent:
    return {
        "ts": ts,
        "event": "usage_bound",
        "backend": backend,
        "base": str(base),
        "usage": str(usage),
        "confirmed": str(confirmed),
        "pending": str(pending),
        "unknowable_before": str(unknowable_before),
        "unknowable_after": str(unknowable_after),
        "count": count,
        "cuts": {outcome: str(cut) for outcome, cut in cuts.items()},
        "waited_s": waited_s,
    }


# -- readers -----------------------------------------------------------------------------------


def read_start_event(raw: Raw) -> StartEvent:
    # Only `ts` is read, and a start without a usable one is simply not the run's first instant.
    return cast(StartEvent, raw)


def read_deadline_event(raw: Raw) -> DeadlineEvent:
    at = raw.get("at")
    if not (at is None or type(at) in (int, float)):
        raise BadRecord("deadline event without an instant (at)")
    if not is_optional(raw.get("text"), str):
        raise BadRecord("deadline event with a malformed text")
    return cast(DeadlineEvent, raw)


def read_route_event(raw: Raw) -> RouteEvent:
    if type(raw.get("provider")) is not str:
        raise BadRecord(f"{raw.get('event')} event without a provider")
    return cast(RouteEvent, raw)


def read_key_usage_base_event(raw: Raw) -> KeyUsageBaseEvent:
    if not is_money(raw.get("usage")) or type(raw.get("account")) is not str:
        raise BadRecord("key_usage_base event without its usage or account")
    return cast(KeyUsageBaseEvent, raw)


def read_key_usage_void_event(raw: Raw) -> KeyUsageVoidEvent:
    return cast(KeyUsageVoidEvent, raw)


def read_usage_bound_event(raw: Raw) -> UsageBoundEvent:
    cuts = raw.get("cuts")
    if type(cuts) is not dict or not all(type(k) is str and is_money(v) for k, v in cuts.items()):
        raise BadRecord("usage_bound event without its cuts")
    return cast(UsageBoundEvent, raw)


# ============================================================================ reading a journal

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Handler:
    """A table entry: the kind's reader, then what the caller does with the record it returns
    (made by `on`, which checks that the two agree on the record's type)."""

    read: Callable[[Raw], object]
    handle: Callable[[Any], None]


def on(read: Callable[[Raw], R], handle: Callable[[R], None]) -> Handler:
    return Handler(read, handle)


@dataclass(frozen=True, slots=True)
class Journal:
    key: str  # the key naming a record's kind
    unnamed: str  # the problem of a record without one


ATTEMPTS = Journal("k", "not an attempt record (no kind 'k')")
EVENTS = Journal("event", "not an event record (no event name)")


def replay(
    path: Path,
    journal: Journal,
    handlers: Mapping[str, Handler],
    *,
    start: int = 0,
    first: int = 0,
    shown: Path | None = None,
) -> tuple[int, int]:
    """Every complete line of `path` through its kind's handler, in order; kinds without one are
    passed over (a newer regen's, or one this reader has no use for). From byte `start`, line
    `first` (a checkpoint's, engine/run/checkpoint.py); returns where it stopped: the byte after
    the last complete line and the number of lines.

    Raises RecoveryError naming file:line (`shown`, else `path`) for a record without a kind or one
    its reader refuses; a line that is not JSON raises CorruptLine (the caller words it).
    """
    where = path if shown is None else shown
    offset, lines = start, first
    for n, line in iter_lines(path, start=start, first=first):
        raw = parse_line(path, n, line)
        kind = raw.get(journal.key)
        if type(kind) is not str:
            raise RecoveryError(stop_message(where, n, journal.unnamed))
        handler = handlers.get(kind)
        if handler is not None:
            try:
                handler.handle(handler.read(raw))
            except BadRecord as exc:
                raise RecoveryError(stop_message(where, n, exc.problem)) from None
        offset += len(line)
        lines = n + 1
    return offset, lines
