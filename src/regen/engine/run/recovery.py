"""Rebuild a job's state from what it wrote: rows, the attempt journal and the event journal.

The journals' records, their keys and their readers are engine/run/records.py. A `start` without an
`end` was in flight at a crash: its worst case is charged as an estimate at the next start, and
reconciled through the backend's bill when its handle (`gen`) is known. From the event journal
recovery reads the run's first `start`, the last `deadline`, `exclude`/`include` (routes),
`key_usage_base`/`key_usage_void` (the key's usage at the run's first start) and `usage_bound`
(unknowable money the key's usage took off, by outcome), docs/money.md "Bounded by the key's usage".

A complete line that is not what regen writes (garbage added by hand, another tool's output) stops
the rebuild with `RecoveryError` naming the file and line: guessing would lose or double money or
rows (docs/inputs.md, "Results and journals").
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

from regen.engine.data.jsonl import CorruptLine, iter_lines, parse_line, repair_torn_tail
from regen.engine.data.row import BadRow, Row, read_row
from regen.engine.data.scan import DIGEST_BYTES, ScanReport
from regen.engine.money.ledger import Estimates, SpendBreakdown
from regen.engine.run.lineset import LineSet
from regen.engine.run.records import (
    ATTEMPTS,
    EVENTS,
    DeadlineEvent,
    EndRecord,
    GenRecord,
    Handler,
    KeyUsageBaseEvent,
    KeyUsageVoidEvent,
    Raw,
    ReconciledRecord,
    RecoveryError,
    RequeuedRecord,
    RouteEvent,
    StartEvent,
    StartRecord,
    UsageBoundEvent,
    on,
    read_deadline_event,
    read_end,
    read_gen,
    read_key_usage_base_event,
    read_key_usage_void_event,
    read_reconciled,
    read_requeued,
    read_route_event,
    read_start,
    read_start_event,
    read_usage_bound_event,
    replay,
    stop_message,
)
from regen.engine.run.rowfacts import SLICE_FROM, RowFacts, row_facts
from regen.engine.run.segments import read_live, segments
from regen.engine.units import DOLLARS, GPU_SECONDS, Unit

__all__ = [
    "DatasetProgress",
    "JournalReplay",
    "JournalState",
    "RecoveryError",
    "Unsettled",
    "journal_spend",
    "ledger_unit",
    "never_left",
    "prompt_digest",
    "read_journals",
    "read_lanes",
    "read_rows",
]


@dataclass(slots=True)
class DatasetProgress:
    """Rows already written for one dataset."""

    done: LineSet = field(default_factory=LineSet)  # lines that have their row
    ok: int = 0
    truncated: int = 0
    output_tokens: int = 0
    duplicates: int = 0
    torn_bytes: int = 0
    # Rows of lines whose attempt the journal left unsettled: they settle it exactly
    # (engine/job/settle.py `_settle_crashed`).
    settling: dict[int, Row] = field(default_factory=dict)
    # Per backend (the row's `backend`): its rows and their output tokens, read at the start; a job on
    # both fleets counts each backend's share over the whole job with them (docs/fleets.md).
    backend_rows: dict[str, int] = field(default_factory=dict)
    backend_tokens: dict[str, int] = field(default_factory=dict)
    # Checked against the prompts' digests while read (read_rows(prompts=...)): the first row whose
    # prompt changed since it was written, and rows naming lines that are not valid prompts.
    changed: int | None = None
    orphans: list[int] = field(default_factory=list)
    # How far the file was read: its complete lines and their bytes (a checkpoint resumes there).
    lines: int = 0
    offset: int = 0


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
    # Rows taken back (records.py RequeuedRecord): dataset -> (line, generation id) of each, what
    # the compaction drops from raw_responses.jsonl (engine/run/requeue.py).
    requeued: dict[str, set[tuple[int, str | None]]] = field(default_factory=dict)
    breakdown: SpendBreakdown = field(default_factory=SpendBreakdown)
    torn_bytes: int = 0
    first_start_ts: float | None = None  # the run's first start (epoch seconds): durations count from it
    deadline: DeadlineEvent | None = None  # the last `deadline` event: the instant a restart keeps
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


def read_rows(
    results_path: Path,
    unsettled_lines: Collection[int] = (),
    prompts: ScanReport | None = None,
    *,
    progress: DatasetProgress | None = None,
    end: int | None = None,
) -> DatasetProgress:
    """Rows of one raw_responses.jsonl, repairing a torn last line first.

    For lines in `unsettled_lines` (an attempt started, no end record) the row's generation id,
    cost and tokens are kept: the row and the end record are written concurrently, so a crash can
    leave the row without its end record, and the row then settles the attempt. With `prompts` (the
    scan's digests) each row is checked against its prompt as it is read (check_rows_match says
    what was found). With `progress` (a checkpoint's) reading goes on from where it stopped; with
    `end` it stops there and repairs nothing (the job is writing the file: engine/run/checkpoint.py).
    """
    if progress is None:
        progress = DatasetProgress()
    if end is None:
        progress.torn_bytes += repair_torn_tail(results_path)
    if not results_path.exists():
        return progress
    digest_of = prompts.digest_of if prompts is not None and prompts.digests is not None else None
    offset = progress.offset
    with _named(results_path):
        for n, raw in iter_lines(results_path, start=progress.offset, first=progress.lines, end=end):
            offset += len(raw)
            # A short row is parsed whole faster than it is sliced (BENCHMARKS.md "Restart").
            facts = row_facts(raw) if len(raw) >= SLICE_FROM else None
            # Short, not regen's key order, or a row that settles an attempt (it needs the fields
            # after `cost`): the whole row.
            if facts is None or facts["line"] in unsettled_lines:
                try:
                    row = read_row(parse_line(results_path, n, raw))
                except BadRow as exc:
                    raise RecoveryError(stop_message(results_path, n, exc.problem)) from None
                if row["line"] in unsettled_lines:
                    progress.settling[row["line"]] = row
                facts = row
            _count_row(progress, facts, digest_of)
            progress.lines = n + 1
            progress.offset = offset
    return progress


def _count_row(
    progress: DatasetProgress, row: RowFacts, digest_of: Callable[[int], bytes | None] | None
) -> None:
    line = row["line"]
    if not progress.done.add(line):
        progress.duplicates += 1
        return
    if digest_of is not None:
        kept = digest_of(line)
        if kept is None:
            progress.orphans.append(line)
        elif progress.changed is None and prompt_digest(row["prompt_sha256"]) != kept:
            # b"" (a row whose prompt_sha256 is not hex) was not written for this prompt either.
            progress.changed = line
    if row.get("status") == "truncated":
        progress.truncated += 1
    else:
        progress.ok += 1
    tokens = row["usage"].get("completion_tokens")
    made = tokens if isinstance(tokens, int) else 0
    progress.output_tokens += made
    backend = row.get("backend")  # absent from the rows of single-backend runs before lanes
    if isinstance(backend, str):
        progress.backend_rows[backend] = progress.backend_rows.get(backend, 0) + 1
        progress.backend_tokens[backend] = progress.backend_tokens.get(backend, 0) + made


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
    return (
        message.startswith(_NEVER_LEFT) or message == "connect timed out" or "Connect call failed" in message
    )


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
    journals = JournalReplay.begin(backend, default, count_attempts)
    journals.repair(attempts_path, events_path)
    journals.read_segments(attempts_path)
    journals.advance(attempts_path, events_path)
    return journals.finish()


class JournalReplay:
    """The two journals read up to a point, and reading on from there: a checkpoint keeps one
    (engine/run/checkpoint.py), so a start reads only the records written after it."""

    def __init__(self, state: JournalState, attempts: _AttemptReplay, events: _EventReplay) -> None:
        self.state = state
        self.attempts = attempts
        self.events = events
        self.attempts_at = (0, 0)  # (byte offset, lines) read of the attempt journal
        self.events_at = (0, 0)

    @classmethod
    def begin(cls, backend: str | None, default: str | None, count_attempts: bool) -> JournalReplay:
        state = JournalState()
        return cls(
            state,
            _AttemptReplay(state, backend, default, count_attempts),
            _EventReplay(state, backend, default),
        )

    def repair(self, attempts_path: Path, events_path: Path) -> None:
        """A torn last line cut off (at a start: nothing is writing the journals then)."""
        self.state.torn_bytes += repair_torn_tail(attempts_path)
        repair_torn_tail(events_path)

    def read_segments(self, attempts_path: Path) -> None:
        """The attempt journal's rotated history (engine/run/segments.py), before the file itself."""
        for part in segments(attempts_path):
            with _named(part):
                replay(part, ATTEMPTS, self.attempts.handlers())

    def advance(self, attempts_path: Path, events_path: Path) -> None:
        """Every complete record after the point read so far (a torn last line is left for later)."""
        if attempts_path.exists():
            with _named(attempts_path):
                self.attempts_at = replay(
                    attempts_path,
                    ATTEMPTS,
                    self.attempts.handlers(),
                    start=self.attempts_at[0],
                    first=self.attempts_at[1],
                )
        if events_path.exists():
            with _named(events_path):
                self.events_at = replay(
                    events_path,
                    EVENTS,
                    self.events.handlers(),
                    start=self.events_at[0],
                    first=self.events_at[1],
                )

    def open_lines(self) -> dict[str, set[int]]:
        """dataset -> lines of attempts started and not ended (so far): their rows may settle them."""
        lines: dict[str, set[int]] = {}
        for start in self.attempts.starts.values():
            lines.setdefault(start["ds"], set()).add(start["line"])
        return lines

    def attempts_counted(self) -> int:
        """How many prompts' attempt counts this replay holds."""
        return sum(len(tried) for tried in self.attempts.attempts.values())

    def forget_done(self, done: Mapping[str, Collection[int]]) -> None:
        """Attempt counts of prompts that have their row: only unfinished prompts need theirs."""
        for name, tried in self.attempts.attempts.items():
            finished = done.get(name)
            if finished:
                for line in [line for line in tried if line in finished]:
                    del tried[line]

    def finish(self) -> JournalState:
        """The state as recovery hands it on (the attempts open now counted as crashed)."""
        self.attempts.finish()
        return self.state


def read_lanes(
    attempts_path: Path,
    events_path: Path,
    lanes: Sequence[str],
    default: str,
    *,
    attempts_seen: Mapping[str, Handler] | None = None,
    events_seen: Mapping[str, Handler] | None = None,
) -> dict[str, JournalState]:
    """Each lane's money, unsettled attempts and exclusions, as `read_journals(backend=lane,
    default=default, count_attempts=False)` gives them, in one pass over each journal, each record
    also handed to `attempts_seen` / `events_seen` (`regen report`'s time series,
    engine/run/report_data.py).

    Read only: a job may be appending to the journals now, so a torn last line is passed over,
    never cut, and an attempt still in flight is one of `crashed` (a start without an end).
    """
    states = {lane: JournalState() for lane in lanes}
    if attempts_path.exists():
        attempts = {lane: _AttemptReplay(states[lane], lane, default, False) for lane in lanes}
        with _named(attempts_path):
            table = _together([_ByLane(attempts, default).handlers()], attempts_seen)
            # The rotated segments first, the job perhaps rotating meanwhile (engine/run/segments.py).
            read_live(attempts_path, _reader(table))
        for each in attempts.values():
            each.finish()
    if events_path.exists():
        events = [_EventReplay(states[lane], lane, default) for lane in lanes]
        with _named(events_path):
            replay(events_path, EVENTS, _together([e.handlers() for e in events], events_seen))
    return states


def _together(tables: list[dict[str, Handler]], seen: Mapping[str, Handler] | None) -> dict[str, Handler]:
    """One table whose handler of a kind hands the record to every table's handler of that kind,
    each reader run once per record (the tables' readers of a kind are the same function)."""
    merged: dict[str, Handler] = {}
    for kind in {kind for table in [*tables, seen or {}] for kind in table}:
        groups: dict[Callable[[Raw], object], list[Callable[[Any], None]]] = {}
        for table in [*tables, seen or {}]:
            handler = table.get(kind)
            if handler is not None:
                groups.setdefault(handler.read, []).append(handler.handle)
        if len(groups) == 1:
            ((read, handles),) = groups.items()
            if len(handles) == 1:
                merged[kind] = Handler(read, handles[0])
                continue
        merged[kind] = Handler(_raw, _fan(list(groups.items())))
    return merged


def _raw(raw: Raw) -> Raw:
    return raw


def _fan(groups: list[tuple[Callable[[Raw], object], list[Callable[[Any], None]]]]) -> Callable[[Raw], None]:
    def handle(raw: Raw) -> None:
        for read, handles in groups:
            record = read(raw)
            for each in handles:
                each(record)

    return handle


class _ByLane:
    """Each attempt record to its own lane's replay only: what every lane's replay would make of
    all the records (another lane's are passed over), at one replay's cost. A record's lane is its
    `be`, else its start's, else `default`, as `_AttemptReplay._owner` has it. The kinds are the
    replays' own table (`_AttemptReplay.handlers`), so a kind added there is routed here too."""

    def __init__(self, replays: Mapping[str, _AttemptReplay], default: str) -> None:
        self.default = default
        self.tables = {lane: replay.handlers() for lane, replay in replays.items()}
        self.open: dict[str, str] = {}  # rid -> the lane of an attempt started and not ended

    def handlers(self) -> dict[str, Handler]:
        reads = {kind: handler.read for table in self.tables.values() for kind, handler in table.items()}
        return {kind: Handler(read, partial(self._route, kind)) for kind, read in reads.items()}

    def _lane(self, kind: str, rec: Mapping[str, Any]) -> str:
        rid = rec.get("rid")
        be = rec.get("be")
        if not isinstance(rid, str):  # a requeued record names a row, not an attempt
            return be or self.default
        if kind == "start":
            lane = self.open[rid] = be or self.default
            return lane
        started = self.open.pop(rid, None) if kind == "end" else self.open.get(rid)
        return be or started or self.default

    def _route(self, kind: str, rec: Mapping[str, Any]) -> None:
        handler = self.tables.get(self._lane(kind, rec), {}).get(kind)
        if handler is not None:
            handler.handle(rec)


class _AttemptReplay:
    """The attempt journal, record by record, into a JournalState (money, attempts, open attempts)."""

    def __init__(
        self, state: JournalState, backend: str | None, default: str | None, count_attempts: bool
    ) -> None:
        self.state = state
        self.backend = backend
        self.default = default
        self.count_attempts = count_attempts
        self.attempts: dict[str, dict[int, int]] = {}  # dataset -> line -> attempts
        self.starts: dict[str, StartRecord] = {}  # this backend's open attempts (start without end)
        # The backend of each other backend's open attempt: its gen record names no backend. End and
        # reconciled records name theirs; those of older single-backend runs are `default`'s.
        self.open_backend: dict[str, str | None] = {}
        self.generation: dict[str, str] = {}  # rid -> handle, of open attempts
        self.estimated: dict[str, Unsettled] = {}  # estimated ends a lookup can still correct
        self.unsent: dict[str, Unsettled] = {}  # estimated ends of requests that never left

    def handlers(self) -> dict[str, Handler]:
        return {
            "start": on(read_start, self.start),
            "gen": on(read_gen, self.gen),
            "end": on(read_end, self.end),
            "reconciled": on(read_reconciled, self.reconciled),
            "requeued": on(read_requeued, self.requeued),
        }

    def _owner(self, rid: str, be: str | None) -> str | None:
        """The backend of a gen, end or reconciled record: its own `be`, else its start's."""
        return be or (self.backend if rid in self.starts else self.open_backend.get(rid, self.default))

    def start(self, rec: StartRecord) -> None:
        self.state.begun = True
        rid = rec["rid"]
        if self.count_attempts:
            tried = self.attempts.get(rec["ds"])
            if tried is None:
                tried = self.attempts[rec["ds"]] = {}
            tried[rec["line"]] = tried.get(rec["line"], 0) + 1
        if self.backend is not None:
            owner = rec.get("be") or self.default
            if owner != self.backend:
                self.open_backend[rid] = owner
                return
        self.starts[rid] = rec

    def gen(self, rec: GenRecord) -> None:
        rid = rec["rid"]
        if self.backend is None or self._owner(rid, None) == self.backend:
            self.generation[rid] = rec["gen"]

    def end(self, rec: EndRecord) -> None:
        rid = rec["rid"]
        if self.backend is not None and self._owner(rid, rec.get("be")) != self.backend:
            self.open_backend.pop(rid, None)  # another backend's attempt: its own ledger counts it
            return
        state = self.state
        start = self.starts.pop(rid, None)
        # Only unsettled attempts need their generation id later: keep the map to those.
        gen_seen = self.generation.pop(rid, None)
        cost = Decimal(str(rec.get("cost") or 0))
        state.spent += cost
        outcome = str(rec.get("outcome"))
        tokens = rec.get("ctok") or 0
        state.breakdown.add(outcome, cost, tokens if isinstance(tokens, int) else 0)
        if not rec.get("est"):
            return
        gen = rec.get("gen") or gen_seen
        state.estimates.add(cost, knowable=bool(gen), outcome=outcome)
        if gen:
            self.estimated[rid] = self._unsettled(rec, start, gen, cost, outcome)
        elif rec.get("http") is None and never_left(rec.get("msg") or ""):
            self.unsent[rid] = self._unsettled(rec, start, None, cost, outcome)

    @staticmethod
    def _unsettled(
        rec: EndRecord, start: StartRecord | None, gen: str | None, cost: Decimal, outcome: str
    ) -> Unsettled:
        ds = rec.get("ds", start["ds"] if start else "")
        line = rec.get("line", start["line"] if start else -1)
        return Unsettled(rec["rid"], ds, line, gen, cost, outcome, rec.get("provider"))

    def reconciled(self, rec: ReconciledRecord) -> None:
        rid = rec["rid"]
        if self.backend is not None and self._owner(rid, rec.get("be")) != self.backend:
            return
        state = self.state
        delta = Decimal(str(rec.get("delta") or 0))
        state.spent += delta
        state.breakdown.add(str(rec.get("outcome", "lost_at_crash")), delta)
        settled = self.estimated.pop(rid, None)
        if settled is not None:
            state.estimates.settle(settled.estimate)
        repaired = self.unsent.pop(rid, None) if rec.get("unsent") else None
        if repaired is not None:
            state.estimates.settle(repaired.estimate, knowable=False, outcome=repaired.outcome)

    def requeued(self, rec: RequeuedRecord) -> None:
        """A row taken back: its money moves from its outcome to its cause; its row is dropped."""
        if self.backend is not None and (rec.get("be") or self.default) != self.backend:
            return
        cost = Decimal(str(rec["cost"]))
        tokens = rec.get("ctok") or 0
        tokens = tokens if isinstance(tokens, int) else 0
        breakdown = self.state.breakdown
        breakdown.add(rec["outcome"], -cost, -tokens)
        breakdown.add(rec["cause"], cost, tokens)
        self.state.requeued.setdefault(rec["ds"], set()).add((rec["line"], rec.get("gen")))

    def finish(self) -> None:
        state = self.state
        state.crashed = [
            Unsettled(
                rid, start["ds"], start["line"], self.generation.get(rid), Decimal(str(start["reserved"]))
            )
            for rid, start in self.starts.items()
        ]
        state.to_reconcile = list(self.estimated.values())
        state.never_sent = list(self.unsent.values())
        state.attempts = self.attempts


class _EventReplay:
    """The events recovery reads back, into a JournalState: the first start, the deadline, the key's
    usage and its bound, exclusions."""

    def __init__(self, state: JournalState, backend: str | None, default: str | None) -> None:
        self.state = state
        self.backend = backend
        self.default = default
        self.started = False  # a start event seen: a base journaled after one is not the first start's

    def handlers(self) -> dict[str, Handler]:
        return {
            "start": on(read_start_event, self.start),
            "deadline": on(read_deadline_event, self.deadline),
            "key_usage_base": on(read_key_usage_base_event, self.key_usage_base),
            "key_usage_void": on(read_key_usage_void_event, self.key_usage_void),
            "usage_bound": on(read_usage_bound_event, self.usage_bound),
            "exclude": on(read_route_event, self.exclude),
            "include": on(read_route_event, self.include),
        }

    def _mine(self, event: Mapping[str, object]) -> bool:
        """Whether a lane's event is this reader's backend's (always, without one)."""
        return self.backend is None or event.get("backend", self.default) == self.backend

    def start(self, event: StartEvent) -> None:
        state = self.state
        self.started = state.begun = True
        ts = event.get("ts")
        if state.first_start_ts is None and isinstance(ts, int | float):
            state.first_start_ts = float(ts)

    def deadline(self, event: DeadlineEvent) -> None:
        self.state.deadline = event

    def key_usage_base(self, event: KeyUsageBaseEvent) -> None:
        if self._mine(event) and not self.started:  # only the first start's: taken before anything was sent
            self.state.usage_base = Decimal(str(event["usage"]))
            self.state.usage_account = event["account"]

    def key_usage_void(self, event: KeyUsageVoidEvent) -> None:
        if self._mine(event):
            self.state.usage_base = self.state.usage_account = None  # and no later base: it follows a start

    def usage_bound(self, event: UsageBoundEvent) -> None:
        if not self._mine(event):
            return
        state = self.state
        cuts = {str(outcome): Decimal(str(cut)) for outcome, cut in event["cuts"].items()}
        lowered = sum(cuts.values(), Decimal(0))
        state.estimates.lower(cuts)
        state.estimates.bounded_by = "key_usage"
        state.spent -= lowered
        for outcome, cut in cuts.items():
            state.breakdown.add(outcome, -cut)

    def exclude(self, event: RouteEvent) -> None:
        if self._mine(event):
            self.state.excluded[event["provider"].lower()] = str(event.get("source") or "operator")

    def include(self, event: RouteEvent) -> None:
        if self._mine(event):
            self.state.excluded.pop(event["provider"].lower(), None)


# -- regen verify's money ------------------------------------------------------------------------

# Backends whose ledger counts something other than dollars (docs/money.md): their attempts' amounts
# are not part of what the rows' `cost` can be compared with.
_NOT_DOLLARS = frozenset({"sglang"})


def ledger_unit(backend: str) -> Unit:
    """The unit a backend's journaled amounts are in, named as its ledger names it (docs/money.md)."""
    return GPU_SECONDS if backend in _NOT_DOLLARS else DOLLARS


def journal_spend(attempts_path: Path) -> dict[str, float]:
    """Dollar spend per dataset from the attempt journal: settled costs plus reconciliations, of the
    attempts of dollar backends only (a job on both fleets journals GPU-seconds beside dollars).

    Read only (the job may be writing it: a torn last line is left alone); a line that is not JSON
    raises CorruptLine, a record regen cannot have written RecoveryError.
    """
    spend: dict[str, float] = {}
    owner: dict[str, str] = {}  # rid -> backend, from start records that name one

    def add(rid: str, ds: str | None, be: str | None, amount: object) -> None:
        if (be or owner.get(rid)) in _NOT_DOLLARS or amount is None:
            return
        if ds is None:
            # A request id is f"{dataset}-{line:08d}#{attempt}" (docs/data-contract.md §2).
            ds = rid.split("#", 1)[0][:-9]
        # The job writes amounts as decimal strings (exact); older journals and tests hold numbers.
        spend[ds] = spend.get(ds, 0.0) + float(str(amount))

    def start(rec: StartRecord) -> None:
        be = rec.get("be")
        if be is not None:
            owner[rec["rid"]] = be

    def end(rec: EndRecord) -> None:
        add(rec["rid"], rec.get("ds"), rec.get("be"), rec.get("cost"))

    def reconciled(rec: ReconciledRecord) -> None:
        add(rec["rid"], None, rec.get("be"), rec.get("delta"))

    handlers = {
        "start": on(read_start, start),
        "end": on(read_end, end),
        "reconciled": on(read_reconciled, reconciled),
    }
    read_live(attempts_path, _reader(handlers))  # the rotated segments first (engine/run/segments.py)
    return spend


def _reader(handlers: Mapping[str, Handler]) -> Callable[[Path, Path, int, int], tuple[int, int]]:
    """A part of the attempt journal's history through `handlers`, for segments.read_live."""

    def read(part: Path, shown: Path, start: int, first: int) -> tuple[int, int]:
        try:
            return replay(part, ATTEMPTS, handlers, start=start, first=first, shown=shown)
        except CorruptLine as exc:  # read through a descriptor: named as the journal it is
            if exc.path == shown:
                raise
            raise CorruptLine(shown, exc.line, exc.problem) from None

    return read


@contextmanager
def _named(path: Path) -> Iterator[None]:
    """A line that is not JSON at all, worded as every other line recovery cannot read."""
    try:
        yield
    except CorruptLine as exc:
        raise RecoveryError(stop_message(path, exc.line, exc.problem)) from None
