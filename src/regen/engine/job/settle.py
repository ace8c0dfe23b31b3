"""Settling an attempt: its outcome into the ledger, the statistics and the journal, then a row, a
retry, a give-up, a stop or a quarantine.

Also the attempts nobody settled: those a crash left in flight (settled at the next start from their
row when it was written, else at their worst case) and the estimates the backend can still correct
(docs/money.md).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Protocol, cast

from regen.engine.backends.base import Account, AttemptOutcome, Backend, Disposition, Failure
from regen.engine.config.settings import JobSettings
from regen.engine.data.datasets import Prompt
from regen.engine.data.row import QuarantinedRow, Row, RowStatus, row_amount, row_attempts
from regen.engine.data.scan import iter_prompts
from regen.engine.data.tokenize_pool import TokenizePool
from regen.engine.data.tokenizer import TokenizeError
from regen.engine.job.fidelity import Drift, FidelityMonitor
from regen.engine.job.giveup import GivenUp, reason_for
from regen.engine.job.rows import build_row
from regen.engine.job.stats import JobStats, ProviderStats
from regen.engine.job.workqueue import WorkItem
from regen.engine.money.ledger import Ledger, SpendBreakdown, to_dollars
from regen.engine.run.events import EventLog
from regen.engine.run.records import EndRecord, end_record, gave_up_record, reconciled_record
from regen.engine.run.recovery import JournalState, Unsettled
from regen.engine.run.requeue import CAUSE, route_rows, taken_back
from regen.engine.run.results import ResultsWriter
from regen.engine.run.state import DatasetState, JobError, StopReason

# The end record's outcome, and the waste, of an attempt taken back from a stalled fleet (docs/fleets.md).
TAKEN_BACK = "taken_back"

# After this many refusals in a row with no row at all, the settings are wrong, not the prompts.
REFUSAL_STREAK_FATAL = 20


@dataclass(slots=True)
class Flight:
    """One attempt in flight."""

    item: WorkItem
    reservation: Decimal
    rid: str
    launched_at: float = 0.0  # monotonic
    route: str | None = None
    handle: str | None = None
    released: bool = False
    # The backend came back with its outcome (it becomes a row, a retry...: no longer taken back).
    landed: bool = False
    # Taken back (engine/job/dispatch.py `take_back`): its prompt is queued again, so whatever this
    # attempt comes back with is waste (docs/fleets.md, "Work taken back"), never a row.
    taken_back: bool = False
    gen_ticket: int | None = None  # the gen record's place in the journal's queue (results.py `commit_row`)


@dataclass(slots=True)
class Verdict:
    """What an attempt's outcome comes to, judged once (`Settler._judge`): what it costs, how the
    journal names it, and what is delivered: a row, or the failure or the violation that stops it."""

    cost: Decimal  # in the ledger's unit: the charge, or the worst case when `estimated`
    estimated: bool
    # The end record's outcome: the row's status, the failure's class, "quarantined" (the guard's
    # veto) or "fidelity" (an answer of a route whose rows are taken back: docs/fidelity.md).
    result: str
    failure: Failure | None  # None: an answer that may become a row
    violation: str | None  # why the answer is kept apart instead (quarantine.jsonl), or None
    row: Row | None  # the row built from the answer; None with a failure
    taken_back: bool = False  # the route drifted and its rows are being requeued


class SettleHooks(Protocol):
    """What settling asks of the dispatcher and the job, for its lane (engine/job/dispatch.py `LaneHooks`)."""

    def retry(self, item: WorkItem, ready_at: float) -> None: ...
    def put_back(self, item: WorkItem) -> None: ...
    def hold(self, seconds: float, reason: str) -> None: ...
    def throttled(self, now: float) -> None: ...
    def succeeded(self, now: float) -> None: ...
    def fatal(self, reason: StopReason, message: str) -> None: ...
    def exclude_route(self, route: str, source: str) -> None: ...  # raises JobError when it cannot
    def wake(self) -> None: ...  # something the budget gate reads has changed
    def unreachable(self, item: WorkItem, failure: Failure) -> None: ...  # an outage failure
    def reached(self, launched_at: float) -> None: ...  # the backend answered an attempt sent then


def _listed(path: Path, route: str) -> list[Row]:
    return list(route_rows(path, route))


class Settler:
    """Turns outcomes into money, statistics, journal records and rows."""

    def __init__(
        self,
        job: JobSettings,
        backend: Backend,
        ledger: Ledger,
        stats: JobStats,
        datasets: dict[str, DatasetState],
        results: ResultsWriter,
        events: EventLog,
        hooks: SettleHooks,
    ) -> None:
        self.job = job
        self.backend = backend
        self.ledger = ledger
        self.stats = stats
        self.datasets = datasets
        self.results = results
        self.events = events
        self.hooks = hooks
        # The backend's abilities (engine/backends/base.py), read once: None where it has none.
        self.guard = backend.guard
        self.routes = backend.routes
        self.account = backend.account
        self.breakdown = SpendBreakdown()
        self.given_up: list[GivenUp] = []  # this run's, for its last line (engine/job/giveup.py)
        self.pool: TokenizePool | None = None
        # The job's fingerprints of every route (engine/job/fidelity.py), None when they are off, and
        # what a drifting route gets (openrouter.fidelity; set by the job with the monitor).
        self.fidelity: FidelityMonitor | None = None
        self.fidelity_action = "warn"
        # Rows taken back in this run, per dataset: (line, generation id), what the compaction drops.
        self.requeued: dict[str, set[tuple[int, str | None]]] = {}
        self.quarantined = 0
        self._random = random.Random()
        self._reconciling: set[asyncio.Task[None]] = set()
        # Estimates whose lookup gave up in this run, by rid: looked up again when an outage ends.
        self._unbilled: dict[str, Unsettled] = {}
        self._settling = False  # the end of a drained run is waiting for the bills still coming

    # ------------------------------------------------------------------------------- settling

    async def settle(self, flight: Flight, outcome: AttemptOutcome) -> None:
        """One attempt's outcome: judged, accounted, journaled, then delivered as a row, a retry, a
        give-up, a stop or a quarantine."""
        now = time.time()
        verdict, drift = self._judge(flight, outcome, now)
        if drift is not None:
            await self._requeue(drift.route, drift.evidence)
        if verdict.taken_back and verdict.violation is None:
            verdict.violation = f"fidelity: {outcome.route} drifted; its rows are requeued"
        mono = time.monotonic()
        route = self._account(flight, outcome, verdict, mono)
        record = self._record(flight, outcome, verdict, now)
        item = flight.item
        prompt = item.prompt
        # The bill is looked up only once the end record is queued: a lookup that answered while
        # the row was still being tokenized would journal its `reconciled` record before the `end`
        # it corrects, and a replay (a resume, `regen report`) would find the estimate still pending.
        lookup = (
            Unsettled(
                flight.rid,
                prompt.dataset,
                prompt.line,
                outcome.handle,
                verdict.cost,
                verdict.result,
                outcome.route,
            )
            if verdict.estimated and outcome.handle
            else None
        )
        failure, row = verdict.failure, verdict.row
        if failure is not None:
            self.results.journal(record)
            self._look_up(lookup)
            self._failed(item, failure, route, flight.launched_at)
            return
        # Delivered here, not in an awaited helper: that would make one more coroutine per attempt.
        assert row is not None
        if verdict.violation is not None:
            journaled = self.results.journal(record)
            self._look_up(lookup)
            await journaled
            await self._quarantine(item, row, verdict.violation, outcome.route)
            return
        if self.pool is not None:
            try:
                row = await self.pool.fill(row, prompt.request_messages)
            except TokenizeError as exc:
                journaled = self.results.journal(record)
                self._look_up(lookup)
                await journaled
                self.hooks.fatal(StopReason.FATAL, f"tokenizing failed: {exc}")
                return
        if self.fidelity is not None and outcome.route:
            # Prompt-token parity (docs/fidelity.md): known once the row's prompt ids are.
            self.fidelity.observe_prompt(
                self.backend.name, outcome.route, row["usage"]["prompt_tokens"], row["num_prompt_tokens"]
            )
        # The end record names the handle only when it is the handle the gen record journaled.
        supersedes = flight.gen_ticket if outcome.handle == flight.handle else None
        committed = self.results.commit_row(prompt.dataset, record, row, supersedes)
        self._look_up(lookup)
        await committed
        self._progress(prompt, row["status"], outcome.completion_tokens, mono)
        self.hooks.reached(flight.launched_at)
        self.hooks.succeeded(mono)

    def _judge(self, flight: Flight, outcome: AttemptOutcome, now: float) -> tuple[Verdict, Drift | None]:
        """What the outcome comes to (a plain call: settle makes no more coroutines per attempt), and
        the drift whose route's rows are to be taken back now, if its answer flagged one."""
        cost, estimated = self.backend.charge(outcome, flight.reservation)
        failure = outcome.failure
        status: RowStatus | None = None
        violation = None
        if failure is None:
            status = self.job.finish_reasons.get(str(outcome.finish_reason))
            if status is None:
                failure = Failure(
                    Disposition.RETRY, "finish", f"finish_reason {outcome.finish_reason} not accepted"
                )
            elif self.guard is not None:
                violation = self.guard.reject(outcome)
        if failure is not None:
            return Verdict(cost, estimated, failure.error_class, failure, None, None), None
        assert status is not None
        item = flight.item
        row = build_row(
            item.prompt,
            outcome,
            status,
            self.backend,
            cost=float(cost),
            cost_estimated=estimated,
            started_at=item.first_started or now,
            attempts=item.attempts,
            now=now,
        )
        # Before the money is booked: an answer of a route whose rows are taken back is waste
        # `fidelity`, as those rows are (docs/fidelity.md), not useful spend.
        drift, taken_back = None, False
        fidelity = self.fidelity
        if fidelity is not None and outcome.route:
            drift = self._fingerprint(fidelity, outcome, row)
            taken_back = self.fidelity_action == "requeue" and fidelity.drifted(
                self.backend.name, outcome.route
            )
        result = "fidelity" if taken_back else "quarantined" if violation is not None else status
        return Verdict(cost, estimated, result, None, violation, row, taken_back), drift

    def _fingerprint(self, fidelity: FidelityMonitor, outcome: AttemptOutcome, row: Row) -> Drift | None:
        """An answer into its route's fingerprint (engine/job/fidelity.py), acting on a drift it
        shows; the drift whose route's rows are to be taken back now (openrouter.fidelity = requeue),
        else None."""
        assert outcome.route
        drift = fidelity.observe(
            self.backend.name,
            outcome.route,
            finish_reason=outcome.finish_reason,
            output_tokens=outcome.completion_tokens,
            reasoning_tokens=outcome.usage["reasoning_tokens"],
            content=outcome.content,
            reasoning=outcome.reasoning,
            truncated=row["status"] == "truncated",
            degenerate="degenerate_content" in row["flags"],
        )
        return drift if drift is not None and self._drifted(fidelity, drift) == "requeue" else None

    def _account(
        self, flight: Flight, outcome: AttemptOutcome, verdict: Verdict, mono: float
    ) -> ProviderStats | None:
        """The cost into the ledger, the spend breakdown and the statistics; the route's statistics."""
        tokens = outcome.completion_tokens
        cost = verdict.cost
        # The cost replaces the reservation in one step, so spent + reserved never counts it twice.
        self.ledger.charge(
            cost, estimated=verdict.estimated, knowable=outcome.handle is not None, outcome=verdict.result
        )
        self.ledger.release(flight.reservation)
        flight.released = True
        self.breakdown.add(verdict.result, cost, tokens)
        stats = self.stats
        stats.spend_rate.add(float(cost), mono)
        stats.counters.attempts += 1
        stats.attempts_rate.add(1, mono)
        route = stats.route(outcome.route)
        if route is not None:
            failure = verdict.failure
            route.record(
                ok=failure is None and verdict.violation is None,
                e2e=outcome.e2e_s,
                ttft=outcome.ttft_s,
                tokens=tokens,
                cost=cost,
                error=None if failure is None else failure.error_class,
                message="" if failure is None else failure.message,
                now=mono,
                prompt_tokens=outcome.usage["prompt_tokens"] or 0,
            )
        return route

    def _record(self, flight: Flight, outcome: AttemptOutcome, verdict: Verdict, now: float) -> EndRecord:
        """The attempt's end record (engine/run/records.py)."""
        prompt = flight.item.prompt
        usage = outcome.usage
        failure = verdict.failure
        return end_record(
            flight.rid,
            prompt.dataset,
            prompt.line,
            outcome.handle,
            self.backend.name,
            verdict.result,
            verdict.cost,
            verdict.estimated,
            now,
            provider=outcome.route,
            fields=outcome.journal,
            ptok=usage["prompt_tokens"],
            ctok=usage["completion_tokens"],
            e2e=outcome.e2e_s,
            ttft=outcome.ttft_s,
            msg=verdict.violation if failure is None else failure.message[:300],
            sent=failure is None or failure.sent,
        )

    def _progress(self, prompt: Prompt, status: str, tokens: int, mono: float) -> None:
        """A row written: its dataset's progress and the job's counters."""
        progress = self.datasets[prompt.dataset].progress
        progress.done.add(prompt.line)
        progress.output_tokens += tokens
        if status == "truncated":
            progress.truncated += 1
        else:
            progress.ok += 1
        stats = self.stats
        counters = stats.counters
        counters.rows += 1
        counters.statuses[status] += 1
        counters.output_tokens += tokens
        counters.refusal_streak = 0
        stats.tokens_rate.add(tokens, mono)
        stats.rows_rate.add(1, mono)

    def cancelled(self, flight: Flight) -> None:
        """An attempt cancelled by a stop (or a taken-back one cut at the end of the run): its worst
        case counts until the backend says otherwise."""
        prompt = flight.item.prompt
        outcome = TAKEN_BACK if flight.taken_back else "cancelled"
        self.stats.counters.attempts += 1  # settled, as every attempt with an end record is
        self.ledger.charge(
            flight.reservation, estimated=True, knowable=flight.handle is not None, outcome=outcome
        )
        self.breakdown.add(outcome, flight.reservation)
        self.ledger.release(flight.reservation)
        flight.released = True
        self.results.journal(
            end_record(
                flight.rid,
                prompt.dataset,
                prompt.line,
                flight.handle,
                self.backend.name,
                outcome,
                flight.reservation,
                True,
                time.time(),
                provider=flight.route,
            )
        )

    def discard(self, flight: Flight, outcome: AttemptOutcome) -> None:
        """What a taken-back attempt came back with (the server's answer to the abort, or a late
        answer): its cost into the ledger as waste `taken_back`, its end record journaled, and
        nothing delivered: its prompt was queued again when it was taken back (docs/fleets.md)."""
        cost, estimated = self.backend.charge(outcome, flight.reservation)
        failure = outcome.failure
        verdict = Verdict(cost, estimated, TAKEN_BACK, failure, "taken back: its prompt was sent again", None)
        self._account(flight, outcome, verdict, time.monotonic())
        self.results.journal(self._record(flight, outcome, verdict, time.time()))

    async def _quarantine(self, item: WorkItem, row: Row, why: str, route: str | None) -> None:
        """An answer the backend rejects after the fact: kept apart, never a training row."""
        self.quarantined += 1
        quarantined = cast(QuarantinedRow, {**row, "quarantine_reason": why})
        await self.results.quarantine(quarantined)
        self.events.event("quarantine", prompt=item.prompt.id, provider=route, reason=why)
        routes = self.routes
        if route and routes is not None:
            route_id = routes.route_id(route)
            if route_id not in routes.excluded:
                try:
                    self.hooks.exclude_route(route_id, "guard")
                except JobError as exc:
                    self.hooks.fatal(StopReason.FATAL, f"precision guard: {why}; {exc}")
        self.hooks.retry(item, time.monotonic())

    def _drifted(self, fidelity: FidelityMonitor, drift: Drift) -> str:
        """A route flagged by its fingerprint (docs/fidelity.md): journaled with its evidence, then
        warned of, or kept out as the precision guard keeps a route out (a lane without routes to
        exclude, SGLang's, can only warn). The action taken."""
        routes = self.routes
        action = self.fidelity_action if routes is not None else "warn"
        fidelity.acted(drift.backend, drift.route, action)
        self.events.event(
            "drift",
            backend=drift.backend,
            provider=drift.route,
            statistic=drift.statistic,
            p=drift.p,
            threshold=drift.threshold,
            responses=drift.responses,
            evidence=drift.evidence,
            action=action,
        )
        if action == "warn" or routes is None:
            return action
        route_id = routes.route_id(drift.route)
        if route_id not in routes.excluded:
            try:
                self.hooks.exclude_route(route_id, "fidelity")
            except JobError as exc:
                self.hooks.fatal(StopReason.FATAL, f"fidelity: {drift.evidence}; {exc}")
                return "exclude"
        return action

    async def _requeue(self, route: str, why: str) -> None:
        """Every row the route served, taken back (engine/run/requeue.py): to quarantine.jsonl, its
        money to waste `fidelity`, its prompt back to the queue. Awaited by the settling of the
        answer that flagged it, so the job cannot end before the prompts are queued again."""
        now = time.time()
        found: list[Row] = []
        for name, state in self.datasets.items():
            rows = await asyncio.to_thread(_listed, state.dataset.results_path, route)
            taken = self.requeued.setdefault(name, set())
            found.extend(row for row in rows if (row["line"], row.get("generation_id")) not in taken)
        for row in found:
            quarantined, record = taken_back(row, why, now)
            await self.results.quarantine(quarantined)
            await self.results.journal(record)
            name, line = row["dataset"], row["line"]
            self.requeued[name].add((line, row.get("generation_id")))
            progress = self.datasets[name].progress
            progress.done.discard(line)
            if row.get("status") == "truncated":
                progress.truncated -= 1
            else:
                progress.ok -= 1
            progress.output_tokens -= record.get("ctok") or 0
            cost = Decimal(record["cost"])
            self.breakdown.add(record["outcome"], -cost, -(record.get("ctok") or 0))
            self.breakdown.add(record["cause"], cost, record.get("ctok") or 0)
        attempts = {(row["dataset"], row["line"]): row_attempts(row) for row in found}
        for prompt in await asyncio.to_thread(self._prompts, attempts):
            self.hooks.retry(
                WorkItem(prompt, attempts=attempts[(prompt.dataset, prompt.line)]), time.monotonic()
            )
        self.events.event("requeued", backend=self.backend.name, provider=route, rows=len(found), cause=CAUSE)

    def _prompts(self, wanted: dict[tuple[str, int], int]) -> list[Prompt]:
        """The prompts of the rows taken back, read again from their datasets (one pass each)."""
        out: list[Prompt] = []
        for name in {ds for ds, _ in wanted}:
            lines = {line for ds, line in wanted if ds == name}
            for prompt in iter_prompts(self.datasets[name].dataset):
                if prompt.line in lines:
                    out.append(prompt)
                    lines.discard(prompt.line)
                    if not lines:
                        break
        return out

    def _failed(
        self, item: WorkItem, failure: Failure, route: ProviderStats | None, launched_at: float
    ) -> None:
        counters = self.stats.counters
        counters.errors[failure.error_class] += 1
        item.last_error = failure.message
        self.events.remember(
            {
                "ts": time.time(),
                "event": "error",
                "class": failure.error_class,
                "provider": route.name if route else None,
                "message": failure.message[:200],
                "prompt": item.prompt.id,
            }
        )
        if failure.outage:
            # Not this prompt's fault: its attempt is given back, and the dispatcher decides
            # whether the backend is down (docs/faults.md, outages).
            item.run_attempts -= 1
            self.hooks.unreachable(item, failure)
            return
        self.hooks.reached(launched_at)
        if failure.hold_s is not None:
            self.hooks.hold(failure.hold_s, failure.message[:200])
        elif failure.throttle:
            self.hooks.throttled(time.monotonic())
        if failure.refused:
            counters.refusal_streak += 1
            if counters.refusal_streak >= REFUSAL_STREAK_FATAL and counters.rows == 0:
                why = failure.streak_hint or "every request is refused"
                self.hooks.fatal(StopReason.FATAL, f"{why}: {failure.message}")
                return
        if failure.disposition is Disposition.FATAL:
            self.hooks.fatal(StopReason(failure.stop_reason), self.backend.describe_fatal(failure))
            self.hooks.put_back(item)
            return
        if failure.disposition is Disposition.GIVE_UP or item.run_attempts >= self.job.max_attempts:
            self._give_up(item, failure)
            return
        bound = min(self.job.backoff_max_s, self.job.backoff_base_s * 2 ** (item.run_attempts - 1))
        delay = self._random.uniform(0, bound)
        if failure.retry_after_s is not None:
            delay = max(delay, failure.retry_after_s)
        self.hooks.retry(item, time.monotonic() + delay)

    def _give_up(self, item: WorkItem, failure: Failure) -> None:
        self.datasets[item.prompt.dataset].failed += 1
        prompt, reason = item.prompt, reason_for(failure)
        self.given_up.append(
            GivenUp(
                prompt.dataset, prompt.line, item.run_attempts, reason, failure.error_class, failure.message
            )
        )
        self.results.journal(
            gave_up_record(
                prompt.dataset, prompt.line, item.run_attempts, failure.message, time.time(), reason.name
            )
        )

    # ---------------------------------------------------------------------- earlier runs' money

    def restore(self, journal: JournalState) -> None:
        """Money as the journals left it; then settle what a crash left in flight."""
        self.breakdown = journal.breakdown
        self.ledger.spent = journal.spent
        self.ledger.estimates = journal.estimates
        for crashed in journal.crashed:
            self._settle_crashed(crashed)
        if journal.crashed:
            self.events.event("crash_recovered", attempts=len(journal.crashed))
        for pending in journal.to_reconcile:
            self.reconcile_later(pending)
        for unsent in journal.never_sent:
            self._forgive(unsent)
        if journal.never_sent:
            self.events.event("repaired", file="attempts.jsonl", never_sent=len(journal.never_sent))

    def _forgive(self, unsent: Unsettled) -> None:
        """An attempt an older regen charged at its worst case although it never left: it cost 0."""
        delta = self.ledger.confirm(unsent.estimate, Decimal(0), knowable=False, outcome=unsent.outcome)
        self.breakdown.add(unsent.outcome, delta)
        self.results.journal(
            reconciled_record(
                unsent.rid,
                self.backend.name,
                None,
                unsent.outcome,
                Decimal(0),
                delta,
                time.time(),
                unsent=True,
            )
        )

    def _settle_crashed(self, crashed: Unsettled) -> None:
        """Settled by its row when that was written, else charged at its worst case now and looked up
        later when its handle is known."""
        state = self.datasets.get(crashed.dataset)
        row = state.progress.settling.get(crashed.line) if state is not None else None
        # No gen record names a handle that is the rid (dispatch.py `on_handle`).
        known = crashed.generation_id or (crashed.rid if self.backend.handle_is_rid else None)
        amount = None if row is None else row_amount(row)
        if (
            row is not None
            and row.get("backend") in (None, self.backend.name)
            and known in (None, row.get("generation_id"))
            and amount is not None
        ):
            cost, estimated, outcome = to_dollars(amount), bool(row.get("cost_estimated")), str(row["status"])
            made = row["usage"].get("completion_tokens")
            tokens = made if isinstance(made, int) else 0
            handle = row.get("generation_id")
        else:
            cost, estimated, outcome, tokens = crashed.estimate, True, "lost_at_crash", 0
            handle = known
        self.ledger.charge(cost, estimated=estimated, knowable=handle is not None, outcome=outcome)
        self.breakdown.add(outcome, cost, tokens)
        self.results.journal(
            end_record(
                crashed.rid,
                crashed.dataset,
                crashed.line,
                handle,
                self.backend.name,
                outcome,
                cost,
                estimated,
                time.time(),
                ctok=tokens,
            )
        )
        if estimated and handle:
            self.reconcile_later(Unsettled(crashed.rid, crashed.dataset, crashed.line, handle, cost, outcome))

    def _look_up(self, pending: Unsettled | None) -> None:
        if pending is not None:
            self.reconcile_later(pending)

    def reconcile_later(self, pending: Unsettled) -> None:
        account = self.account
        if account is None:
            return  # no bill comes later: what the backend charged is all there is to know
        task = asyncio.get_running_loop().create_task(self._reconcile(account, pending))
        self._reconciling.add(task)
        task.add_done_callback(self._reconciling.discard)

    async def _reconcile(self, account: Account, pending: Unsettled) -> None:
        """Replace an estimate with what the backend's account billed for that attempt."""
        billed = await account.reconcile(pending)
        if billed is None:
            self._unbilled[pending.rid] = pending
            return
        delta = self.ledger.confirm(pending.estimate, billed)
        self.breakdown.add(pending.outcome, delta)
        route = self.stats.routes.get(pending.provider) if pending.provider else None
        if route is not None:
            route.adjust_cost(delta)
        self.results.journal(
            reconciled_record(
                pending.rid,
                self.backend.name,
                pending.generation_id,
                pending.outcome,
                billed,
                delta,
                time.time(),
            )
        )
        self.hooks.wake()

    def relook(self) -> None:
        """Look up again every estimate whose lookup gave up in this run (an outage has ended:
        docs/money.md); those still being looked up go on by themselves."""
        unbilled, self._unbilled = self._unbilled, {}
        for pending in unbilled.values():
            self.reconcile_later(pending)

    @property
    def settling(self) -> int | None:
        """The bills the end of a drained run is waiting for; None when it is not waiting."""
        return len(self._reconciling) if self._settling else None

    async def finish_reconciling(self, wait: bool) -> None:
        """With `wait` (a drained run), wait for the bills still coming so the summary is exact, at
        most `job.reconcile_timeout_s`; what is left stays estimated in the journal and is looked
        up again by the next start."""
        if self._reconciling and wait:
            self._settling = True
            try:
                await asyncio.wait(list(self._reconciling), timeout=self.job.reconcile_timeout_s)
            finally:
                self._settling = False
        for task in list(self._reconciling):
            task.cancel()
        if self._reconciling:
            await asyncio.gather(*self._reconciling, return_exceptions=True)
