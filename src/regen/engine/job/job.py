"""The generation job: datasets in, one row per prompt out, never past the budget.

This is the facade that wires the parts (docs/architecture.md): the backends behind their contract
(engine/backends/), one lane per backend (lanes.py), the dispatcher (dispatch.py), settling (settle.py), the results writer
(results.py), the event log (events.py), operator commands (commands.py), the run lock (runlock.py)
and the input checks (inputs.py). `Job.prepare()` validates every line of every dataset, takes the
run folder's lock, opens the backend and rebuilds state from earlier runs; `Job.run()` dispatches
until every dataset is done or something stops it. The console and the headless loop are both
clients of its commands and its snapshot.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections.abc import Collection, Mapping
from decimal import Decimal
from typing import Any

from regen.engine.backends import make_backends
from regen.engine.backends.base import Backend, BackendError
from regen.engine.config.settings import Settings
from regen.engine.data.jsonl import JsonlError, WriteFailed
from regen.engine.data.scan import iter_prompts
from regen.engine.data.tokenize_pool import TokenizePool
from regen.engine.data.tokenizer import TokenizerError, TokenizerSpec
from regen.engine.host.errors import HostError
from regen.engine.host.monitor import HostMonitor
from regen.engine.job.commands import run_command
from regen.engine.job.deadline_control import DeadlineControl
from regen.engine.job.dispatch import Dispatcher
from regen.engine.job.fidelity import FidelityMonitor
from regen.engine.job.lanes import Lane, LaneCeilings
from regen.engine.job.snapshot import SnapshotBuilder
from regen.engine.job.stats import JobStats, StatusRules
from regen.engine.job.usage_bound import UsageBound
from regen.engine.job.workqueue import WorkQueue
from regen.engine.money.ledger import Ledger, to_dollars
from regen.engine.run.checkpoint import Checkpointer
from regen.engine.run.checkpoint import Lane as CheckpointLane
from regen.engine.run.events import EVENTS_FILE, EventLog
from regen.engine.run.inputs import Scanned, keep_scans, load_progress, scan_datasets
from regen.engine.run.records import route_event, start_event
from regen.engine.run.recovery import JournalState
from regen.engine.run.requeue import compact_all
from regen.engine.run.results import ATTEMPTS_FILE, ResultsWriter
from regen.engine.run.runlock import RunLock, RunLocked
from regen.engine.run.segments import compress
from regen.engine.run.state import DatasetState, JobError, JobState, Outcome, StopReason
from regen.engine.schema import EventRecord, JobInfo, Snapshot
from regen.engine.units import DOLLARS

__all__ = ["Job", "JobError", "JobState", "Outcome", "StopReason"]

# Between checkpoints the journals and rows are read on this often (engine/run/checkpoint.py
# `read_on`): what one read holds is the prompts started since the one before.
READ_ON_S = 15.0


class Job:
    """A generation job over the datasets the settings select."""

    def __init__(
        self,
        settings: Settings,
        *,
        only: Collection[str] | None = None,
        skip_invalid: bool | None = None,
        backend: Backend | None = None,
    ) -> None:
        self.settings = settings
        self.only = only
        self.skip_invalid = settings.job.skip_invalid if skip_invalid is None else skip_invalid
        self.run_dir = settings.job.run_dir
        self.state = JobState.STARTING
        self.prepared = False  # prepare() done: the job may run
        self.outcome: Outcome | None = None
        self.started_at = time.time()
        self.started_mono = time.monotonic()
        # The GPU hosts, polled for the console's host pane (engine/host/monitor.py); made first, as
        # the SGLang backend reaches the hosts' servers over these connections.
        self.hosts = HostMonitor(settings.hosts, sglang=settings.sglang)
        backends = [backend] if backend is not None else make_backends(settings, self.hosts)
        self.datasets: dict[str, DatasetState] = {}
        self.events = EventLog()
        self.results = ResultsWriter()
        self.lock = RunLock(self.run_dir)
        self.dispatcher = Dispatcher(settings.job, self.datasets, self.results, self.events, self._stop_for)
        # One lane per backend, in the order of job.backends (engine/job/lanes.py): its own ledger (the
        # dollar budget on OpenRouter's, none on GPU time), statistics, settling and in-flight limit.
        for chosen in backends:
            budget = to_dollars(settings.job.budget_usd) if chosen.unit == DOLLARS else None
            self.dispatcher.add_lane(
                chosen, Ledger(budget, unit=chosen.unit), JobStats(settings.stats.window_s), self
            )
        self.lanes = self.dispatcher.lanes
        # Every route's fingerprint, for every lane (engine/job/fidelity.py, docs/fidelity.md).
        fidelity = settings.openrouter.fidelity
        self.fidelity = (
            None if fidelity == "off" else FidelityMonitor(alpha=settings.openrouter.fidelity_alpha)
        )
        for lane in self.lanes:
            lane.settler.fidelity = self.fidelity
            lane.settler.fidelity_action = fidelity
        # The deadline control (engine/job/deadline_control.py): the live plan over the fleets, and with a
        # GPU lane, a dollar lane and a deadline, OpenRouter's in-flight ceiling through the lanes' hook.
        self.deadline_control = DeadlineControl(settings, self.dispatcher, self.datasets, self.events)
        if self.deadline_control.paid is not None and self.deadline_control.gpus:
            self.dispatcher.ceilings = self.deadline_control
        self._snapshots = SnapshotBuilder(
            dispatcher=self.dispatcher,
            datasets=self.datasets,
            rules=StatusRules(settings.stats.fail_error_share, settings.stats.slow_factor),
            expected_output_tokens=settings.expected_output_tokens,
            started_mono=self.started_mono,
            deadline_control=self.deadline_control,
            fidelity=self.fidelity,
        )
        self._stop_mode: str | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._usage_bounds: list[
            UsageBound
        ] = []  # the key's usage bound, per lane (engine/job/usage_bound.py)

    # ----------------------------------------------------------------------------- preparation

    async def prepare(self) -> None:
        """Validate inputs, lock the run folder, open the backends, rebuild earlier progress."""
        try:
            for lane in self.lanes:
                lane.backend.check()
        except BackendError as exc:
            raise JobError(str(exc)) from None
        scanned = await scan_datasets(self.settings.job, self.only, self.skip_invalid)
        try:
            self.lock.take()
        except RunLocked as exc:
            raise JobError(str(exc)) from None
        try:
            await keep_scans(scanned)
            self.checkpoints = self._checkpointer(scanned)
            datasets = [entry.dataset for entry in scanned]

            def drop_taken_back(journals: Mapping[str, JournalState]) -> None:
                # Rows taken back that a crash left in their files (engine/run/requeue.py), before they are read.
                compact_all(datasets, [journal.requeued for journal in journals.values()])

            resumed = await asyncio.to_thread(
                self.checkpoints.resume, {item.dataset.name: item.report for item in scanned}, drop_taken_back
            )
            journals = resumed.journals
            self.datasets.update(
                load_progress(scanned, resumed.progress, self.settings.job.dataset_token_budget)
            )
            # The next start reads from here (docs/faults.md, "Checkpoints").
            await asyncio.to_thread(self.checkpoints.write)
            for lane in self.lanes:
                routes = lane.backend.routes
                if routes is not None:
                    routes.restore(journals[lane.name].excluded)
                await lane.backend.open(LaneContext(self, lane))
            pool = await self._start_tokenizer()
            for lane in self.lanes:
                lane.settler.pool = pool
        except (JobError, BackendError, TokenizerError, JsonlError) as exc:
            # JsonlError: a results file or journal holds a line regen did not write (RecoveryError).
            for lane in self.lanes:
                await lane.backend.close()
            await self.hosts.close()
            self.lock.release()
            raise JobError(str(exc)) from None
        await self.events.open(self.run_dir, self.settings.job.commit_interval_s, self._write_failed)
        await self.results.open(
            self.run_dir,
            {name: state.dataset for name, state in self.datasets.items()},
            self.settings.job.commit_interval_s,
            self._write_failed,
        )
        self._journal_repairs(scanned)
        for lane in self.lanes:
            lane.settler.restore(journals[lane.name])
            lane.spent_at_start = journals[lane.name].spent
            lane.rows_before = sum(s.progress.backend_rows.get(lane.name, 0) for s in self.datasets.values())
            lane.tokens_before = sum(
                s.progress.backend_tokens.get(lane.name, 0) for s in self.datasets.values()
            )
        # Before the start event and any attempt: the first start's base must predate every bill.
        self._usage_bounds = [
            UsageBound(account, lane.settler, self.events, journals[lane.name])
            for lane in self.lanes
            if (account := lane.backend.account) is not None
        ]
        for bound in self._usage_bounds:
            await bound.begin()
        self.dispatcher.queue = self._work_queue(scanned, journals[self.lanes[0].name])
        paid = self.dispatcher.budget_lane
        routes = paid.backend.routes
        self.events.write(
            start_event(
                os.getpid(),
                list(self.datasets),
                paid.ledger.budget,
                paid.ledger.spent,
                paid.limit.configured,
                [] if routes is None else sorted(routes.excluded),
                [lane.name for lane in self.lanes] if len(self.lanes) > 1 else None,
                time.time(),
            )
        )
        first = journals[self.lanes[0].name]
        self.deadline_control.restore(first.deadline, first.first_start_ts)
        if self.deadline_control.shown:
            # The plan before the start, from the settings' rates (docs/fleets.md, "In the job").
            plan = self.deadline_control.tick().plan
            self.events.event("fleet_plan", reason=plan.reason, fits=plan.fits, plan=plan.to_dict())
        self.prepared = True

    def _checkpointer(self, scanned: list[Scanned]) -> Checkpointer:
        """Each lane's reading of the journals and each dataset's rows, kept between checkpoints.

        Records an older single-backend run wrote without naming their backend belong to
        `job.backend`; attempt counts are every backend's, counted once, by the first lane's read.
        """
        default = self.settings.job.backend if len(self.lanes) > 1 else self.lanes[0].name
        return Checkpointer(
            self.run_dir,
            self.run_dir / ATTEMPTS_FILE,
            self.run_dir / EVENTS_FILE,
            [CheckpointLane(lane.name, lane.name, default, lane is self.lanes[0]) for lane in self.lanes],
            {item.dataset.name: item.dataset.results_path for item in scanned},
            rotate_from=max(1, int(self.settings.job.journal_segment_mb * (1 << 20))),
        )

    async def _checkpointing(self) -> None:
        """A checkpoint every `job.checkpoint_interval_s` while the job runs, read on every
        `READ_ON_S` between them (engine/run/checkpoint.py `read_on`: what a read holds grows with
        the prompts started since the one before), and the attempt journal rotated when it has
        grown to `job.journal_segment_mb` (engine/run/segments.py)."""
        loop = asyncio.get_running_loop()
        interval = self.settings.job.checkpoint_interval_s
        due = loop.time() + interval
        while True:
            if due - loop.time() > READ_ON_S:
                await asyncio.sleep(READ_ON_S)
                await self._checkpoint(write=False)
                continue
            await asyncio.sleep(max(0.0, due - loop.time()))
            due = loop.time() + interval
            await self._checkpoint()
            if self.checkpoints.rotation_due():
                await self._rotate()

    async def _rotate(self) -> None:
        """The attempt journal moved into its next segment while the job runs, its writer switched
        to a fresh file between two batches (docs/faults.md, "Checkpoints"); then compressed."""
        try:
            moved = await self.results.attempts.switch(self.checkpoints.rotate_attempts)
        except WriteFailed:
            return  # moved with no fresh journal in its place: on_failure stops the job
        except (OSError, JsonlError) as exc:  # nothing moved: the journal goes on, tried again next time
            self.events.event("rotate_failed", reason=str(exc)[:300])
            return
        if moved:
            self._background.add(asyncio.get_running_loop().create_task(self._compress()))

    async def _compress(self) -> None:
        try:
            await asyncio.to_thread(compress, self.run_dir / ATTEMPTS_FILE)
        except OSError as exc:  # the segment stays plain, read as well; the next start tries again
            self.events.event("compress_failed", reason=str(exc)[:300])

    async def _checkpoint(self, write: bool = True) -> None:
        """Read on from the last checkpoint and write the next (without `write`, only read on); a
        failure only costs the next start time."""
        try:
            await asyncio.to_thread(self.checkpoints.advance if write else self.checkpoints.read_on)
        except (OSError, JsonlError) as exc:
            self.events.event("checkpoint_failed", reason=str(exc)[:300])

    async def _start_tokenizer(self) -> TokenizePool | None:
        """Worker processes that turn every row's text into the target model's token ids."""
        tokenizer = self.settings.tokenizer
        if tokenizer.path is None:
            return None
        for lane in self.lanes:
            thinking = lane.backend.thinking
            if tokenizer.thinking != thinking:
                raise JobError(
                    f"tokenizer.thinking is {str(tokenizer.thinking).lower()} but requests "
                    f"{'ask for' if thinking else 'do not ask for'} reasoning ({lane.backend.thinking_setting}): "
                    "the prompt ids would be rendered in the wrong mode"
                )
        pool = TokenizePool(TokenizerSpec.from_settings(tokenizer), workers=tokenizer.workers)
        own = [lane.backend.tokenizer for lane in self.lanes]
        # Every lane renders its own ids (SGLang): the pool names them from the backend's tokenizer.
        await pool.start(loaded=own[0] if all(tok is not None for tok in own) else None)
        return pool

    def _journal_repairs(self, scanned: list[Scanned]) -> None:
        invalid = {item.dataset.name: item.report.invalid for item in scanned}
        for name, state in self.datasets.items():
            if state.progress.torn_bytes:
                self.events.event(
                    "repaired", dataset=name, file="raw_responses.jsonl", bytes=state.progress.torn_bytes
                )
            if state.progress.duplicates:
                self.events.event("duplicate_rows", dataset=name, count=state.progress.duplicates)
            if self.skip_invalid:
                for bad in invalid[name]:
                    self.events.event("invalid_line", dataset=name, line=bad.line, reason=bad.reason)

    def _work_queue(self, scanned: list[Scanned], journal: JournalState) -> WorkQueue:
        invalid = {item.dataset.name: item.report.invalid_lines for item in scanned}
        skip = {}
        for name, state in self.datasets.items():
            skip[name] = lines = state.progress.done.copy()  # a bitmap: 125 KB a million lines
            lines.update(invalid[name])
        # Only prompts still to do need their earlier attempts: drop the rest in place (a copy of a
        # million entries would double the resume's peak memory).
        prior = journal.attempts
        for name, tried in prior.items():
            skipped = skip.get(name)
            if skipped is not None:
                for line in [line for line in tried if line in skipped]:
                    del tried[line]
        return WorkQueue(
            [(name, iter_prompts(state.dataset, skip[name])) for name, state in self.datasets.items()],
            prior_attempts=prior,
        )

    # ---------------------------------------------------------------------------------- running

    async def run(self) -> Outcome:
        """Dispatch until done or stopped; returns how it ended. Call prepare() first."""
        if self.state is JobState.STARTING:
            self.state = JobState.RUNNING
        # Everything prepare() built lives for the whole run: keep the collector from rescanning it.
        gc.freeze()
        loop = asyncio.get_running_loop()
        for lane in self.lanes:
            for work in lane.backend.tasks():
                task = loop.create_task(work)
                self._background.add(task)
        pacing = loop.create_task(self.deadline_control.run())
        self._background.add(pacing)
        self._background.add(loop.create_task(self._checkpointing()))
        # The journal's history a start rotated (engine/run/segments.py), compressed meanwhile.
        self._background.add(loop.create_task(self._compress()))
        self.hosts.start()
        try:
            await self.dispatcher.run()
        finally:
            await self._shutdown()
        assert self.outcome is not None
        self.state = JobState.DONE if self.outcome.reason is StopReason.DONE else JobState.STOPPED
        return self.outcome

    async def _shutdown(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        # A lane still out at the end cannot look its bills up: the next start does.
        await asyncio.gather(
            *(
                lane.settler.finish_reconciling(wait=self._stop_mode != "cancel" and lane.outage is None)
                for lane in self.lanes
            )
        )
        if self._stop_mode != "cancel":  # drained: nothing in flight can still be billed
            for bound in self._usage_bounds:
                await bound.end()
        if self.outcome is not None:
            split: dict[str, Any] = {}
            if len(self.lanes) > 1:
                # Over the whole job, as the money is: the earlier runs' rows and tokens included.
                split["split"] = {
                    lane.name: {
                        "spent": str(lane.ledger.spent),
                        "unit": lane.ledger.unit,
                        "rows": lane.rows,
                        "output_tokens": lane.output_tokens,
                    }
                    for lane in self.lanes
                }
            deadline = self.deadline_control.deadline_ts
            if deadline is not None:
                split["deadline"] = {"at": deadline, "early_s": deadline - time.time()}
            self.events.event(
                "end",
                reason=self.outcome.reason.value,
                message=self.outcome.message,
                spent=str(self.dispatcher.budget_lane.ledger.spent),
                rows=sum(lane.stats.counters.rows for lane in self.lanes),
                **split,
            )
        await self.results.close()
        datasets = [state.dataset for state in self.datasets.values()]
        await asyncio.to_thread(compact_all, datasets, [lane.settler.requeued for lane in self.lanes])
        await self.events.close()
        await self._checkpoint()  # a clean stop: the next start reads nothing but this checkpoint
        for lane in self.lanes:
            await lane.backend.close()
        # After the backend: its last aborts and its tunnels go over these connections.
        await self.hosts.close()
        pool = self.lanes[0].settler.pool  # one pool, every lane's (prepare)
        if pool is not None:
            await pool.close()
        self.lock.release()

    # ----------------------------------------------------------------------- operator commands

    def _check_live(self) -> None:
        if self.state in (JobState.STOPPED, JobState.DONE):
            raise JobError(f"the job has ended ({self.state.value})")

    def pause(self, origin: str = "operator", backend: str | None = None) -> None:
        """Pause the job, or with `backend` only that lane (the others go on)."""
        if backend is not None:
            self._check_live()
            lane = self._lane(backend)
            if not lane.paused:
                lane.paused = True
                self.events.event("pause", source=origin, backend=lane.name)
                self.dispatcher.wake()
            return
        if self.state is JobState.RUNNING:
            self.state = JobState.PAUSED
            self.dispatcher.paused = True
            self.events.event("pause", source=origin)
            self.dispatcher.wake()

    def resume(self, origin: str = "operator", backend: str | None = None) -> None:
        if backend is not None:
            self._check_live()
            lane = self._lane(backend)
            if lane.paused:
                lane.paused = False
                self.events.event("resume", source=origin, backend=lane.name)
                self.dispatcher.wake()
            return
        if self.state is JobState.PAUSED:
            self.state = JobState.RUNNING
            self.dispatcher.paused = False
            self.events.event("resume", source=origin)
            self.dispatcher.wake()

    def _lane(self, backend: str) -> Lane:
        return self.dispatcher.lane(backend.strip().lower())

    def _named(self, lane: Lane) -> str | None:
        """The lane an event names: in a job with several (engine/job/dispatch.py `lane_fields`)."""
        return self.dispatcher.lane_fields(lane).get("backend")

    def _route_lane(self, backend: str | None) -> Lane:
        """The lane an exclude or include is for: the one named, else the first whose routes can be
        excluded (OpenRouter's providers), else the one holding the budget."""
        if backend is not None:
            return self._lane(backend)
        with_routes = [lane for lane in self.lanes if lane.backend.routes is not None]
        return with_routes[0] if with_routes else self.dispatcher.budget_lane

    def exclude(self, name: str, *, origin: str = "operator", backend: str | None = None) -> str:
        """Stop routing to a route (slug or display name); later requests keep away from it."""
        self._check_live()
        lane = self._route_lane(backend)
        routes = lane.backend.routes
        if routes is None:
            raise JobError(
                f"{lane.backend.title} has no routes to exclude: it decides where every request goes"
            )
        route = routes.route_id(name)
        if route in routes.excluded:
            return f"{route} is already excluded"
        try:
            message = routes.exclude(route, origin)
        except BackendError as exc:
            raise JobError(str(exc)) from None
        self.events.write(route_event("exclude", route, origin, self._named(lane), time.time()))
        self.dispatcher.wake()
        return message

    def include(self, name: str, *, origin: str = "operator", backend: str | None = None) -> str:
        self._check_live()
        lane = self._route_lane(backend)
        routes = lane.backend.routes
        if routes is None:
            return f"{name.strip()} is not excluded"  # nothing is, where there are no routes to exclude
        route = routes.route_id(name)
        if route not in routes.excluded:
            return f"{route} is not excluded"
        message = routes.include(route)
        self.events.write(route_event("include", route, origin, self._named(lane), time.time()))
        self.dispatcher.wake()
        return message

    def set_concurrency(self, value: int, origin: str = "operator", backend: str | None = None) -> int:
        """The in-flight limit of every lane, or with `backend` of that lane only."""
        self._check_live()
        lanes = self.lanes if backend is None else [self._lane(backend)]
        applied = 0
        for lane in lanes:
            applied = lane.limit.set_configured(value)
            self.events.event(
                "concurrency",
                value=applied,
                requested=value,
                source=origin,
                **self.dispatcher.lane_fields(lane),
            )
        self.dispatcher.wake()
        return applied

    def set_budget(self, amount: float | Decimal, origin: str = "operator") -> str:
        self._check_live()
        paid = self.dispatcher.budget_lane
        ledger = paid.ledger
        if ledger.budget is None:
            raise JobError(f"the {paid.name} backend has no budget to change")
        budget = to_dollars(amount)
        if budget < ledger.spent:
            raise JobError(f"a budget of ${budget:.2f} is below what is already spent (${ledger.spent:.2f})")
        ledger.budget = budget
        self.events.event("budget", value=str(budget), source=origin)
        self.dispatcher.wake()
        return f"budget ${budget:.2f}"

    def set_deadline(self, text: str | None, origin: str = "operator") -> str:
        """A new deadline ("12h" from now, "06:30" next), or None for none: journaled, re-planned at once."""
        self._check_live()
        message = self.deadline_control.set_deadline(text, origin)
        # As after every command: a cleared deadline lifts OpenRouter's ceiling without a ceiling change
        # being journaled (`steer`).
        self.dispatcher.wake()
        return message

    def set_lane_ceilings(self, ceilings: LaneCeilings | None) -> None:
        """Plug in the ceiling hook (engine/job/lanes.py `LaneCeilings`): a ceiling per lane, read
        at every dispatch decision; None takes it out."""
        self.dispatcher.ceilings = ceilings
        self.dispatcher.wake()

    def inspect_hosts(self, host: str | None, origin: str) -> str:
        try:
            return self.hosts.inspect_now(host)
        except HostError as exc:
            raise JobError(str(exc)) from None

    def sglang_hosts(self, action: str, host: str | None, origin: str) -> str:
        """Start or stop SGLang on the GPU hosts (the console's keys), in the background."""
        try:
            message = self.hosts.sglang_action(action, host)
        except HostError as exc:
            raise JobError(str(exc)) from None
        self.events.event("sglang", action=action, host=host, source=origin)
        return message

    def request_stop(self, *, cancel: bool, origin: str) -> str:
        self._check_live()
        self.stop(cancel=cancel, reason=StopReason.OPERATOR, message=f"stopped by the operator ({origin})")
        return (
            "stopping: cancelling requests in flight" if cancel else "stopping: draining requests in flight"
        )

    async def handle_command(self, name: str, args: Mapping[str, Any], origin: str = "console") -> str:
        """Run an operator command by name; the returned text is shown to the operator."""
        return run_command(self, name, args, origin)

    def stop(
        self, *, cancel: bool = False, reason: StopReason = StopReason.OPERATOR, message: str = ""
    ) -> None:
        """Stop dispatching; let requests in flight finish (drain), or cancel them (they are re-sent later)."""
        if self.outcome is None:
            self.outcome = Outcome(reason, message or f"stopped ({reason.value})")
        if self._stop_mode != "cancel":
            self._stop_mode = "cancel" if cancel else "drain"
            if reason is not StopReason.DONE:
                self.events.event("stop", mode=self._stop_mode, reason=reason.value)
        if self.state not in (JobState.STOPPED, JobState.DONE):
            self.state = JobState.DRAINING
        self.dispatcher.stop(cancel=cancel)

    def _write_failed(self, failure: WriteFailed) -> None:
        """A journal or results file cannot be written: stop at once. What is on disk is whole, and
        the attempts in flight are settled by the next start (docs/faults.md, disk full)."""
        message = (
            f"{failure}; nothing written before it is lost: free space (or mend the disk) "
            "and run the same command again to resume"
        )
        if self._stop_mode is None:
            self.events.remember(
                {"ts": time.time(), "event": "fatal", "reason": "write_failed", "message": message}
            )
        self.stop(cancel=True, reason=StopReason.WRITE_FAILED, message=message)

    def _stop_for(self, reason: StopReason, message: str) -> None:
        self.stop(reason=reason, message=message)

    # ------------------------------------------------------ what settling and backends ask of it

    def fatal(self, reason: StopReason | str, message: str) -> None:
        """Stop on a failure no other prompt can get past; journaled once."""
        if self._stop_mode is None:
            why = StopReason(reason)
            self.events.event("fatal", reason=why.value, message=message)
            self.stop(reason=why, message=message)

    def event(self, name: str, /, **fields: Any) -> None:
        self.events.event(name, **fields)

    @property
    def live(self) -> bool:
        return self.state in (JobState.RUNNING, JobState.PAUSED)

    def exclude_route(self, route: str, source: str, backend: str | None = None) -> None:
        self.exclude(route, origin=source, backend=backend)

    def wake(self) -> None:
        self.dispatcher.wake()

    # --------------------------------------------------------------------------------- snapshot

    @property
    def in_flight(self) -> int:
        return self.dispatcher.in_flight

    def events_since(self, cursor: int) -> tuple[int, list[EventRecord]]:
        return self.events.since(cursor)

    def info(self) -> JobInfo:
        """What does not change while the job runs, for a console's hello."""
        backend = self.dispatcher.budget_lane.backend
        return {
            "pid": os.getpid(),
            "run_dir": str(self.run_dir),
            "model": backend.model,
            "backend": backend.name,
            "base_url": backend.base_url,
            "datasets": list(self.datasets),
            "started_at": self.started_at,
            "backends": [lane.name for lane in self.lanes],
        }

    def snapshot(self) -> Snapshot:
        """A folded view of the job for the console and the headless line."""
        return self._snapshots.build(self.state, self.outcome, self.hosts.view())

    @property
    def figures(self) -> SnapshotBuilder:
        """The snapshot's builder, whose parts /metrics reads one by one at scrape time (the whole
        snapshot folds every route's percentiles, which a scrape does not need: engine/control/metrics.py)."""
        return self._snapshots


class LaneContext:
    """What one lane's backend may ask of the job (engine/backends/base.py `JobContext`): its own
    budget and its own in-flight ceiling; a failure it cannot get past closes only its lane while
    another lane is open."""

    def __init__(self, job: Job, lane: Lane) -> None:
        self.job = job
        self.lane = lane

    def event(self, name: str, /, **fields: Any) -> None:
        self.job.events.event(name, **fields)

    def fatal(self, reason: str, message: str) -> None:
        dispatcher, lane = self.job.dispatcher, self.lane
        if any(other is not lane and other.closed is None for other in dispatcher.lanes):
            dispatcher.close_lane(lane, f"{reason}: {message}")
        else:
            self.job.fatal(reason, message)

    def budget_left(self) -> Decimal:
        left = self.lane.ledger.left
        return Decimal(0) if left is None else left

    @property
    def live(self) -> bool:
        return self.job.live and self.lane.closed is None

    def suggest_concurrency(self, ceiling: int | None, reason: str) -> None:
        self.job.dispatcher.suggest(ceiling, reason, self.lane)

    def answered(self, generation: bool) -> None:
        self.job.dispatcher.answered(self.lane, generation)

    async def reachable(self) -> None:
        await self.lane.up.wait()
