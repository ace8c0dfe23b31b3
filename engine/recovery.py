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
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from engine.jsonl import iter_jsonl, repair_torn_tail
from engine.money import Estimates, SpendBreakdown


@dataclass(slots=True)
class DatasetProgress:
    """Rows already written for one dataset."""

    done: dict[int, str] = field(default_factory=dict)  # line -> prompt_sha256
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
    attempts: dict[tuple[str, int], int] = field(default_factory=dict)
    crashed: list[Unsettled] = field(default_factory=list)  # start without end
    to_reconcile: list[Unsettled] = field(default_factory=list)  # estimated end with a gen id
    # Ends charged at their worst case by a regen that did not yet tell a request that never left
    # (connection refused, DNS, TLS, connect timeout) from one that was sent: they cost nothing.
    never_sent: list[Unsettled] = field(default_factory=list)
    excluded: dict[str, str] = field(default_factory=dict)  # route -> who excluded it
    breakdown: SpendBreakdown = field(default_factory=SpendBreakdown)
    torn_bytes: int = 0

    @property
    def estimated(self) -> Decimal:
        return self.estimates.total


def read_rows(results_path: Path, unsettled_lines: Collection[int] = ()) -> DatasetProgress:
    """Rows of one raw_responses.jsonl, repairing a torn last line first.

    For lines in `unsettled_lines` (an attempt started, no end record) the row's generation id,
    cost and tokens are kept: the row and the end record are written concurrently, so a crash can
    leave the row without its end record, and the row then settles the attempt.
    """
    progress = DatasetProgress(torn_bytes=repair_torn_tail(results_path))
    if not results_path.exists():
        return progress
    for _, row in iter_jsonl(results_path):
        line = row.get("line")
        if not isinstance(line, int):
            continue
        if line in progress.done:
            progress.duplicates += 1
            continue
        progress.done[line] = str(row.get("prompt_sha256"))
        if line in unsettled_lines:
            progress.settling[line] = {
                "gen": row.get("generation_id"),
                # A GPU-time row keeps its ledger amount beside the (null) dollar cost.
                "cost": row.get("cost") if row.get("cost") is not None else row.get("gpu_s"),
                "est": bool(row.get("cost_estimated")),
                "status": row.get("status"),
                "ctok": (row.get("usage") or {}).get("completion_tokens"),
                "provider": row.get("provider"),
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


def read_journals(attempts_path: Path, events_path: Path) -> JournalState:
    """Spend, attempt counts, unsettled attempts and exclusions from the two journals."""
    state = JournalState(torn_bytes=repair_torn_tail(attempts_path))
    repair_torn_tail(events_path)
    starts: dict[str, dict[str, Any]] = {}
    generation: dict[str, str] = {}
    estimated: dict[str, Unsettled] = {}
    unsent: dict[str, Unsettled] = {}
    attempts: dict[tuple[str, int], int] = defaultdict(int)
    if attempts_path.exists():
        for _, rec in iter_jsonl(attempts_path):
            kind = rec.get("k")
            rid = str(rec.get("rid", ""))
            if kind == "start":
                starts[rid] = rec
                attempts[(rec["ds"], rec["line"])] += 1
            elif kind == "gen":
                generation[rid] = rec["gen"]
            elif kind == "end":
                start = starts.pop(rid, None)
                cost = Decimal(str(rec.get("cost") or 0))
                state.spent += cost
                outcome = str(rec.get("outcome"))
                tokens = rec.get("ctok") or 0
                state.breakdown.add(outcome, cost, tokens if isinstance(tokens, int) else 0)
                if rec.get("est"):
                    gen = rec.get("gen") or generation.get(rid)
                    state.estimates.add(cost, knowable=bool(gen))
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
                    state.estimates.settle(repaired.estimate, knowable=False)
    for rid, start in starts.items():
        state.crashed.append(
            Unsettled(rid, start["ds"], start["line"], generation.get(rid), Decimal(str(start["reserved"])))
        )
    state.to_reconcile = list(estimated.values())
    state.never_sent = list(unsent.values())
    state.attempts = dict(attempts)
    if events_path.exists():
        for _, event in iter_jsonl(events_path):
            name = event.get("event")
            if name == "exclude":
                state.excluded[str(event["provider"]).lower()] = str(event.get("source") or "operator")
            elif name == "include":
                state.excluded.pop(str(event["provider"]).lower(), None)
    return state
