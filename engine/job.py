"""The generation job: datasets in, one row per prompt out, never past the budget.

One asyncio loop holds the dispatcher, the HTTP pool, the writers and the ledger. `Job.prepare()`
validates every line of every dataset, takes the run folder's lock, reads the catalog and rebuilds
state from earlier runs; `Job.run()` dispatches until every dataset is done or something stops it.
Operator commands (pause, resume, exclude, include, concurrency, budget, stop) are plain methods,
journaled as events; the console and the headless loop are both clients of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import os
import random
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from engine.backends.openrouter.account import generation_cost, read_credits
from engine.backends.openrouter.catalog import (
    CatalogError,
    Endpoint,
    allowed_endpoints,
    exclusion_reason,
    fetch_endpoints,
    find_endpoint,
    precision_allowlist,
    quantization_allowed,
)
from engine.backends.openrouter.client import AttemptResult, OpenRouterClient
from engine.backends.openrouter.errors import (
    THROTTLE_CLASSES,
    AttemptError,
    Disposition,
    ErrorClass,
    classify_status,
)
from engine.concurrency import AdaptiveLimit
from engine.datasets import Dataset, DatasetError, discover, iter_prompts, scan
from engine.host.errors import HostError
from engine.host.monitor import HostMonitor
from engine.jobstate import DatasetState, JobError, JobState, Outcome, StopReason
from engine.jsonl import JsonlAppender
from engine.money import (
    TEMPLATE_TOKENS_FIXED,
    Ledger,
    PriceCeiling,
    SpendBreakdown,
    prompt_token_bound,
    to_dollars,
)
from engine.recovery import DatasetProgress, JournalState, Unsettled, read_journals, read_rows
from engine.rows import build_row, requested_thinking
from engine.settings import Settings
from engine.snapshot import build_snapshot
from engine.stats import ProviderStats, RateMeter, StatusRules
from engine.tokenize_pool import TokenizePool
from engine.tokenizer import TokenizeError, TokenizerError, TokenizerSpec
from engine.workqueue import WorkItem, WorkQueue

# After this many 400s in a row with no success at all, the settings are wrong, not the prompts.
BAD_REQUEST_STREAK_FATAL = 20
RECENT_EVENTS = 1000
# Seconds the end of a run waits for pending /generation cost lookups.
RECONCILE_GRACE_S = 5.0
# OpenRouter's platform limit on `:free` model variants (reference §7.3).
FREE_MODEL_REQUESTS_PER_MINUTE = 20
# A platform 429 that names no reset waits this long: the free-model quota counts per minute.
PLATFORM_HOLD_DEFAULT_S = 60.0
PLATFORM_HOLD_MIN_S = 1.0


@dataclass(slots=True)
class _Flight:
    item: WorkItem
    reservation: Decimal
    rid: str
    provider: str | None = None
    generation_id: str | None = None
    released: bool = False


@dataclass(slots=True)
class Counters:
    """Totals since this process started."""

    attempts: int = 0
    rows: int = 0
    output_tokens: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    bad_request_streak: int = 0


class Job:
    """A generation job over the datasets the settings select."""

    def __init__(
        self, settings: Settings, *, only: list[str] | None = None, skip_invalid: bool | None = None
    ) -> None:
        self.settings = settings
        self.only = only
        self.skip_invalid = settings.job.skip_invalid if skip_invalid is None else skip_invalid
        self.run_dir = settings.job.run_dir
        self.state = JobState.STARTING
        self.outcome: Outcome | None = None
        self.datasets: dict[str, DatasetState] = {}
        self.ledger = Ledger(to_dollars(settings.job.budget_usd))
        self.limit = AdaptiveLimit(
            settings.job.concurrency,
            minimum=settings.job.min_concurrency,
            adaptive=settings.job.adaptive_concurrency,
            ceiling=settings.job.concurrency,
        )
        openrouter = settings.openrouter
        allowlist = (
            precision_allowlist(openrouter.native_precision, openrouter.provider.quantizations)
            if openrouter.precision_guard
            else openrouter.provider.quantizations
        )
        # The routing actually sent: the settings' provider object with the precision allowlist.
        self.routing = openrouter.provider.model_copy(update={"quantizations": allowlist})
        self.client = OpenRouterClient(openrouter, pool_size=settings.job.concurrency, routing=self.routing)
        self.endpoints: list[Endpoint] = []
        self.excluded: set[str] = set()
        self.prices = PriceCeiling(Decimal(0), Decimal(0))
        self.counters = Counters()
        self.providers: dict[str, ProviderStats] = {}
        self.tokens_rate = RateMeter()
        self.rows_rate = RateMeter()
        self.attempts_rate = RateMeter()
        self.spend_rate = RateMeter(window_s=60)
        self.spent_at_start = Decimal(0)
        self.started_at = time.time()
        self.started_mono = time.monotonic()
        self._flights: dict[asyncio.Task[None], _Flight] = {}
        self._changed = asyncio.Event()
        self._queue: WorkQueue | None = None
        self._journal: JournalState | None = None
        self._attempts: JsonlAppender | None = None
        self._events: JsonlAppender | None = None
        self._writers: dict[str, JsonlAppender] = {}
        self._lock_fd: int | None = None
        self._reconcile_tasks: set[asyncio.Task[None]] = set()
        self._stop_mode: str | None = None
        self.budget_blocked = False
        # A platform rate limit holds all dispatch until its reset (monotonic; 0 when not held).
        self.held_until = 0.0
        self.held_reason: str | None = None
        self.requests_per_minute = settings.job.requests_per_minute
        if settings.openrouter.model.endswith(":free"):
            self.requests_per_minute = min(
                self.requests_per_minute or FREE_MODEL_REQUESTS_PER_MINUTE, FREE_MODEL_REQUESTS_PER_MINUTE
            )
        self._sent_at: deque[float] = deque()
        self._random = random.Random()
        self.breakdown = SpendBreakdown()
        self.credits: dict[str, Any] = {}
        self.quarantined = 0
        self.rules = StatusRules(settings.stats.fail_error_share, settings.stats.slow_factor)
        self._credit_warned = False
        self._background: set[asyncio.Task[None]] = set()
        self.plan_cache: dict[str, Any] | None = None
        self.plan_at = float("-inf")
        self._quarantine: JsonlAppender | None = None
        self._pool: TokenizePool | None = None
        self._endpoint_names: dict[str, Endpoint | None] = {}
        self._guard_verdicts: dict[str | None, str | None] = {}
        # Recent events for attached consoles: operator actions, state changes and errors.
        self._recent: deque[dict[str, Any]] = deque(maxlen=RECENT_EVENTS)
        self._recent_seq = 0
        # GPU hosts: polled for the console's host pane (engine/host/monitor.py).
        self.hosts = HostMonitor(settings.hosts)

    # ----------------------------------------------------------------------------- preparation

    async def prepare(self) -> None:
        """Validate inputs, lock the run folder, read the catalog, rebuild earlier progress."""
        job = self.settings.job
        if self.settings.openrouter.api_key is None:
            raise JobError("no API key: set OPENROUTER_API_KEY (or openrouter.api_key in the settings file)")
        if not job.datasets and not job.dataset_roots:
            raise JobError("no datasets: set job.datasets or job.dataset_roots in the settings file")
        try:
            found = discover(job.datasets, job.dataset_roots, self.only)
        except DatasetError as exc:
            raise JobError(str(exc)) from None
        if not found:
            raise JobError("the dataset roots hold no dataset (no subfolder with prompts.jsonl)")
        reports = {}
        problems = []
        for dataset in found:
            report = await asyncio.to_thread(scan, dataset)
            reports[dataset.name] = report
            for bad in report.invalid[:20]:
                problems.append(f"{dataset.prompts_path}:{bad.line + 1}: {bad.reason}")
            if len(report.invalid) > 20:
                problems.append(f"{dataset.prompts_path}: and {len(report.invalid) - 20} more invalid lines")
        if problems and not self.skip_invalid:
            raise JobError("invalid prompt lines (fix them or pass --skip-invalid):\n" + "\n".join(problems))
        self._take_lock()
        self._journal = await asyncio.to_thread(
            read_journals, self.run_dir / "attempts.jsonl", self.run_dir / "events.jsonl"
        )
        crashed_lines: dict[str, set[int]] = {}
        for crashed in self._journal.crashed:
            crashed_lines.setdefault(crashed.dataset, set()).add(crashed.line)
        for dataset in found:
            progress = await asyncio.to_thread(
                read_rows, dataset.results_path, crashed_lines.get(dataset.name, set())
            )
            report = reports[dataset.name]
            await asyncio.to_thread(self._check_rows_match, dataset, progress)
            chars = report.content_chars
            self.datasets[dataset.name] = DatasetState(
                dataset,
                report.total,
                len(report.invalid),
                progress,
                token_budget=job.dataset_token_budget,
                # About four characters a token for planning; the reservation uses a strict bound instead.
                prompt_tokens_mean=(sum(chars) / len(chars) / 4 + TEMPLATE_TOKENS_FIXED)
                if len(chars)
                else 0.0,
            )
        await self.client.open()
        try:
            await self._check_key()
            self.endpoints = await fetch_endpoints(self.client, self.settings.openrouter.model)
            self.excluded = set(self._journal.excluded)
            self._reprice()
            if not self.allowed():
                raise JobError(self._no_provider_message())
            # Every provider the settings allow appears from the start (the console lists them and
            # can exclude one before it ever served); run-time exclusions stay listed as EXCL.
            for endpoint in self.endpoints:
                if exclusion_reason(endpoint, self.routing, (), self.settings.openrouter.max_tokens) is None:
                    self._provider_stats(endpoint.provider_name)
            self._pool = await self._start_tokenizer()
        except (JobError, CatalogError, TokenizerError) as exc:
            await self.client.close()
            self._release_lock()
            raise JobError(str(exc)) from None
        self.breakdown = self._journal.breakdown
        self.ledger.spent = self._journal.spent
        self.spent_at_start = self._journal.spent
        self.ledger.spent_estimated = self._journal.spent_estimated
        await self._open_writers()
        for name, state in self.datasets.items():
            if state.progress.torn_bytes:
                self._event(
                    "repaired", dataset=name, file="raw_responses.jsonl", bytes=state.progress.torn_bytes
                )
            if state.progress.duplicates:
                self._event("duplicate_rows", dataset=name, count=state.progress.duplicates)
            if self.skip_invalid:
                for bad in reports[name].invalid:
                    self._event("invalid_line", dataset=name, line=bad.line, reason=bad.reason)
        self._settle_crashed()
        skip = {
            name: set(state.progress.done) | reports[name].invalid_lines
            for name, state in self.datasets.items()
        }
        prior = {key: n for key, n in self._journal.attempts.items() if key[1] not in skip.get(key[0], ())}
        self._queue = WorkQueue(
            [(name, iter_prompts(state.dataset, skip[name])) for name, state in self.datasets.items()],
            prior_attempts=prior,
        )
        self._event(
            "start",
            pid=os.getpid(),
            datasets=list(self.datasets),
            budget=str(self.ledger.budget),
            spent=str(self.ledger.spent),
            concurrency=self.limit.configured,
            excluded=sorted(self.excluded),
        )

    async def _start_tokenizer(self) -> TokenizePool | None:
        """Worker processes that turn every row's text into the target model's token ids."""
        tokenizer = self.settings.tokenizer
        if tokenizer.path is None:
            return None
        thinking = requested_thinking(self.settings.openrouter)
        if tokenizer.thinking != thinking:
            raise JobError(
                f"tokenizer.thinking is {str(tokenizer.thinking).lower()} but requests "
                f"{'ask for' if thinking else 'do not ask for'} reasoning (openrouter.reasoning): "
                "the prompt ids would be rendered in the wrong mode"
            )
        pool = TokenizePool(TokenizerSpec.from_settings(tokenizer), workers=tokenizer.workers)
        await pool.start()
        return pool

    async def _check_key(self) -> None:
        """Refuse to start on a key OpenRouter refuses, before any dataset work is sent."""
        try:
            status, body = await self.client.get_json("/key")
        except Exception as exc:
            raise JobError(
                f"cannot reach {self.settings.openrouter.base_url}: {type(exc).__name__}: {exc}"
            ) from None
        if status in (401, 403):
            raise JobError(f"the API key was refused ({classify_status(status, body, {}).message})")

    def _check_rows_match(self, dataset: Dataset, progress: DatasetProgress) -> None:
        """A row whose prompt changed under it means the input file was edited: stop, never guess."""
        if not progress.done:
            return
        seen = 0
        for prompt in iter_prompts(dataset):
            sha = progress.done.get(prompt.line)
            if sha is None:
                continue
            seen += 1
            if sha != prompt.sha256:
                raise JobError(
                    f"{dataset.prompts_path}:{prompt.line + 1}: prompt changed since its row was written "
                    f"(row in {dataset.results_path.name} has another prompt_sha256); restore the file or "
                    "move the results away"
                )
        if seen != len(progress.done):
            orphans = sorted(set(progress.done) - self._lines_with_prompts(dataset, progress))
            raise JobError(
                f"{dataset.results_path}: {len(orphans)} rows name lines that are not valid prompts "
                f"in {dataset.prompts_path.name} (first: line {orphans[0] + 1})"
            )

    @staticmethod
    def _lines_with_prompts(dataset: Dataset, progress: DatasetProgress) -> set[int]:
        return {p.line for p in iter_prompts(dataset) if p.line in progress.done}

    def _take_lock(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / "job.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise JobError(
                f"{self.run_dir}: another regen job is running on this run folder (pid {other})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    async def _open_writers(self) -> None:
        interval = self.settings.job.commit_interval_s
        self._attempts = await JsonlAppender.open(self.run_dir / "attempts.jsonl", commit_interval_s=interval)
        self._events = await JsonlAppender.open(self.run_dir / "events.jsonl", commit_interval_s=interval)
        self._quarantine = await JsonlAppender.open(
            self.run_dir / "quarantine.jsonl", commit_interval_s=interval
        )
        for name, state in self.datasets.items():
            self._writers[name] = await JsonlAppender.open(
                state.dataset.results_path, commit_interval_s=interval
            )

    def _settle_crashed(self) -> None:
        """Attempts in flight at a crash: settled by their row when it was written, else charged at
        their worst case now and looked up in /generation later."""
        assert self._journal is not None and self._attempts is not None
        for crashed in self._journal.crashed:
            state = self.datasets.get(crashed.dataset)
            row = state.progress.settling.get(crashed.line) if state is not None else None
            if row is not None and crashed.generation_id in (None, row["gen"]) and row["cost"] is not None:
                cost, estimated, outcome = to_dollars(row["cost"]), row["est"], str(row["status"])
                tokens = row["ctok"] if isinstance(row["ctok"], int) else 0
                generation_id = row["gen"]
            else:
                cost, estimated, outcome, tokens = crashed.estimate, True, "lost_at_crash", 0
                generation_id = crashed.generation_id
            self.ledger.charge(cost, estimated=estimated)
            self.breakdown.add(outcome, cost, tokens)
            self._attempts.append(
                {
                    "k": "end",
                    "rid": crashed.rid,
                    "ds": crashed.dataset,
                    "line": crashed.line,
                    "gen": generation_id,
                    "outcome": outcome,
                    "cost": str(cost),
                    "est": estimated,
                    "ctok": tokens,
                    "ts": time.time(),
                }
            )
            if estimated and generation_id:
                self._reconcile_later(
                    Unsettled(crashed.rid, crashed.dataset, crashed.line, generation_id, cost, outcome)
                )
        if self._journal.crashed:
            self._event("crash_recovered", attempts=len(self._journal.crashed))
        for pending in self._journal.to_reconcile:
            self._reconcile_later(pending)

    # ------------------------------------------------------------------------------ providers

    def allowed(self) -> list[Endpoint]:
        return allowed_endpoints(
            self.endpoints,
            self.routing,
            self.excluded,
            self.settings.openrouter.max_tokens,
        )

    def _reprice(self) -> None:
        self.prices = PriceCeiling.of(self.allowed())
        self._ignore = sorted(set(self.settings.openrouter.provider.ignore) | self.excluded)

    def _no_provider_message(self) -> str:
        reasons = Counter(
            exclusion_reason(e, self.routing, self.excluded, self.settings.openrouter.max_tokens)
            for e in self.endpoints
        )
        detail = "; ".join(f"{n} {why}" for why, n in reasons.items() if why) or "the model has no endpoints"
        return (
            f"no provider of {self.settings.openrouter.model} is allowed by the routing settings ({detail})"
        )

    def exclude(self, name: str, *, source: str = "operator") -> str:
        """Stop routing to a provider (slug or display name); later requests carry it in ignore."""
        self._check_live()
        endpoint = find_endpoint(self.endpoints, name)
        slug = endpoint.slug if endpoint is not None else name.strip().lower()
        if slug in self.excluded:
            return f"{slug} is already excluded"
        remaining = [e for e in self.allowed() if e.slug != slug]
        if not remaining:
            raise JobError(f"excluding {slug} would leave no provider for {self.settings.openrouter.model}")
        self.excluded.add(slug)
        self._reprice()
        self._event("exclude", provider=slug, source=source)
        self._changed.set()
        return f"excluded {slug}; {len({e.slug for e in remaining})} providers remain"

    def include(self, name: str, *, source: str = "operator") -> str:
        self._check_live()
        endpoint = find_endpoint(self.endpoints, name)
        slug = endpoint.slug if endpoint is not None else name.strip().lower()
        if slug not in self.excluded:
            return f"{slug} is not excluded"
        self.excluded.discard(slug)
        self._reprice()
        self._event("include", provider=slug, source=source)
        self._changed.set()
        return f"included {slug}"

    # ------------------------------------------------------------------------------- commands

    def _check_live(self) -> None:
        if self.state in (JobState.STOPPED, JobState.DONE):
            raise JobError(f"the job has ended ({self.state.value})")

    def pause(self, source: str = "operator") -> None:
        if self.state is JobState.RUNNING:
            self.state = JobState.PAUSED
            self._event("pause", source=source)
            self._changed.set()

    def resume(self, source: str = "operator") -> None:
        if self.state is JobState.PAUSED:
            self.state = JobState.RUNNING
            self._event("resume", source=source)
            self._changed.set()

    def set_concurrency(self, value: int, source: str = "operator") -> int:
        self._check_live()
        applied = self.limit.set_configured(value)
        self._event("concurrency", value=applied, requested=value, source=source)
        self._changed.set()
        return applied

    def set_budget(self, dollars: float | Decimal, source: str = "operator") -> None:
        self._check_live()
        budget = to_dollars(dollars)
        if budget < self.ledger.spent:
            raise JobError(
                f"a budget of ${budget:.2f} is below what is already spent (${self.ledger.spent:.2f})"
            )
        self.ledger.budget = budget
        self._event("budget", value=str(budget), source=source)
        self._changed.set()

    def stop(
        self, *, cancel: bool = False, reason: StopReason = StopReason.OPERATOR, message: str = ""
    ) -> None:
        """Stop dispatching; let requests in flight finish (drain), or cancel them (they are re-sent later)."""
        if self.outcome is None:
            self.outcome = Outcome(reason, message or f"stopped ({reason.value})")
        if self._stop_mode != "cancel":
            self._stop_mode = "cancel" if cancel else "drain"
            if reason is not StopReason.DONE:
                self._event("stop", mode=self._stop_mode, reason=reason.value)
        if self.state not in (JobState.STOPPED, JobState.DONE):
            self.state = JobState.DRAINING
        if cancel:
            for task in list(self._flights):
                task.cancel()
        self._changed.set()

    # ---------------------------------------------------------------------------------- running

    async def run(self) -> Outcome:
        """Dispatch until done or stopped; returns how it ended. Call prepare() first."""
        assert self._queue is not None
        if self.state is JobState.STARTING:
            self.state = JobState.RUNNING
        # Everything prepare() built lives for the whole run: keep the collector from rescanning it.
        gc.freeze()
        watcher = asyncio.get_running_loop().create_task(self._watch_credits())
        self._background.add(watcher)
        self.hosts.start()  # GPU hosts (engine/host/monitor.py)
        try:
            await self._dispatch()
            while self._flights:
                await asyncio.wait(list(self._flights))
        finally:
            await self._shutdown()
        assert self.outcome is not None
        if self.outcome.reason is StopReason.DONE:
            self.state = JobState.DONE
        else:
            self.state = JobState.STOPPED
        return self.outcome

    def _dataset_open(self, name: str) -> bool:
        return not self.datasets[name].budget_reached

    async def _dispatch(self) -> None:
        queue = self._queue
        assert queue is not None
        max_tokens = self.settings.openrouter.max_tokens
        while True:
            self._changed.clear()
            if self._stop_mode is not None:
                return
            if self.state is JobState.PAUSED or len(self._flights) >= self.limit.effective:
                await self._changed.wait()
                continue
            now = time.monotonic()
            if self.held_until:
                if now < self.held_until:
                    await self._wait_changed(self.held_until - now)
                    continue
                self.held_until = 0.0
                self.held_reason = None
                self._event("hold_end")
            if self.requests_per_minute is not None:
                sent = self._sent_at
                while sent and sent[0] <= now - 60.0:
                    sent.popleft()
                if len(sent) >= self.requests_per_minute:
                    await self._wait_changed(sent[0] + 60.0 - now)
                    continue
            item, wait_s = queue.take(now, self._dataset_open)
            if item is None:
                if wait_s is None and not self._flights:
                    self._finish_when_empty()
                    return
                await self._wait_changed(wait_s)
                continue
            reservation = self.prices.reservation(prompt_token_bound(item.prompt.messages), max_tokens)
            if not self.ledger.fits(reservation):
                queue.push_front(item)
                self.budget_blocked = True
                if not self._flights:
                    self.stop(
                        reason=StopReason.BUDGET,
                        message=(
                            f"budget reached: spent ${self.ledger.spent:.4f} of ${self.ledger.budget:.2f}; "
                            f"the next request's worst case (${reservation:.4f}) does not fit"
                        ),
                    )
                    return
                await self._changed.wait()
                continue
            self.budget_blocked = False
            self._launch(item, reservation)

    async def _wait_changed(self, timeout: float | None) -> None:
        if timeout is None:
            await self._changed.wait()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout=max(timeout, 0.001))

    def _finish_when_empty(self) -> None:
        failed = sum(state.failed for state in self.datasets.values())
        if failed:
            self.stop(
                reason=StopReason.FAILED_PROMPTS,
                message=f"{failed} prompts failed after {self.settings.job.max_attempts} attempts; run again to retry them",
            )
        else:
            budgeted = [name for name, s in self.datasets.items() if s.budget_reached and s.remaining > 0]
            note = f" ({', '.join(budgeted)} stopped at the token budget)" if budgeted else ""
            self.stop(reason=StopReason.DONE, message=f"every dataset is done{note}")

    def _launch(self, item: WorkItem, reservation: Decimal) -> None:
        if self.requests_per_minute is not None:
            self._sent_at.append(time.monotonic())
        self.ledger.reserve(reservation)
        rid = f"{item.prompt.id}#{item.attempts}"
        item.attempts += 1
        item.run_attempts += 1
        if item.first_started is None:
            item.first_started = time.time()
        self.datasets[item.prompt.dataset].in_flight += 1
        task = asyncio.get_running_loop().create_task(self._attempt(item, reservation, rid))
        self._flights[task] = _Flight(item, reservation, rid)
        # Bookkeeping in a done callback, not in the coroutine: a task cancelled before it first
        # runs never enters its body, and its flight must still be released.
        task.add_done_callback(self._landed)

    def _landed(self, task: asyncio.Task[None]) -> None:
        flight = self._flights.pop(task, None)
        if flight is None:
            return
        if not flight.released:
            self.ledger.release(flight.reservation)
            flight.released = True
        self.datasets[flight.item.prompt.dataset].in_flight -= 1
        self._changed.set()

    async def _attempt(self, item: WorkItem, reservation: Decimal, rid: str) -> None:
        assert self._attempts is not None
        prompt = item.prompt
        task = asyncio.current_task()
        assert task is not None
        flight = self._flights[task]
        settled = False
        try:
            await self._attempts.append(
                {
                    "k": "start",
                    "rid": rid,
                    "ds": prompt.dataset,
                    "line": prompt.line,
                    "reserved": str(reservation),
                    "ts": time.time(),
                }
            )

            def on_headers(generation_id: str | None) -> None:
                flight.generation_id = generation_id
                if generation_id:
                    self._attempts.append({"k": "gen", "rid": rid, "gen": generation_id})  # type: ignore[union-attr]

            def on_provider(name: str) -> None:
                flight.provider = name

            result = await self.client.complete(prompt.messages, self._ignore, on_headers, on_provider)
            settled = True
            await self._settle(flight, result)
        except asyncio.CancelledError:
            if not settled:
                self._cancelled(flight)
            raise

    def _cancelled(self, flight: _Flight) -> None:
        """A request cancelled by a stop: its worst case counts until /generation says otherwise."""
        prompt = flight.item.prompt
        self.ledger.charge(flight.reservation, estimated=True)
        self.breakdown.add("cancelled", flight.reservation)
        self.ledger.release(flight.reservation)
        flight.released = True
        assert self._attempts is not None
        self._attempts.append(
            {
                "k": "end",
                "rid": flight.rid,
                "ds": prompt.dataset,
                "line": prompt.line,
                "gen": flight.generation_id,
                "provider": flight.provider,
                "outcome": "cancelled",
                "cost": str(flight.reservation),
                "est": True,
                "ts": time.time(),
            }
        )

    def _cost_of(self, result: AttemptResult, flight: _Flight) -> tuple[Decimal, bool]:
        """The attempt's dollars: usage.cost when given, else an estimate that errs high."""
        if result.cost is not None:
            return to_dollars(result.cost), False
        if result.http_status is not None and result.http_status != 200:
            return Decimal(0), False  # refused before generating: nothing billed
        usage = result.usage or {}
        prompt_tokens, completion_tokens = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(prompt_tokens, int) and isinstance(completion_tokens, int):
            endpoint = self.endpoint_named(result.provider) if result.provider else None
            prices = (
                PriceCeiling(endpoint.prompt_price, endpoint.completion_price) if endpoint else self.prices
            )
            return prices.estimate(prompt_tokens, completion_tokens), True
        return flight.reservation, True

    def _guard_violation(self, provider: str | None) -> str | None:
        """Why a response's serving provider is outside the precision allowlist, or None.

        Asked once per response; the catalog and the allowlist are fixed once the job is prepared,
        so the verdict is kept per provider name.
        """
        try:
            return self._guard_verdicts[provider]
        except KeyError:
            verdict = self._guard_verdicts[provider] = self._judge_provider(provider)
            return verdict

    def _judge_provider(self, provider: str | None) -> str | None:
        if not self.settings.openrouter.precision_guard or self.routing.quantizations is None:
            return None
        if not provider:
            return "the response names no serving provider"
        endpoint = self.endpoint_named(provider)
        if endpoint is None:
            return f"{provider} is not in the catalog for {self.settings.openrouter.model}"
        if not quantization_allowed(endpoint.quantization, self.routing.quantizations):
            return (
                f"{provider} serves {endpoint.quantization}, outside {', '.join(self.routing.quantizations)}"
            )
        return None

    def endpoint_named(self, name: str) -> Endpoint | None:
        """The catalog endpoint a response's provider (display name) or a slug names; cached, it is
        asked once per response."""
        key = name.lower()
        if key not in self._endpoint_names:
            self._endpoint_names[key] = find_endpoint(self.endpoints, name)
        return self._endpoint_names[key]

    async def _settle(self, flight: _Flight, result: AttemptResult) -> None:
        assert self._attempts is not None
        item = flight.item
        prompt = item.prompt
        now = time.time()
        cost, estimated = self._cost_of(result, flight)
        # The cost replaces the reservation in one step, so spent + reserved never counts it twice.
        self.ledger.charge(cost, estimated=estimated)
        self.ledger.release(flight.reservation)
        flight.released = True
        error = result.error
        status = None
        violation = None
        if error is None:
            status = self.settings.job.finish_reasons.get(str(result.finish_reason))
            if status is None:
                error = AttemptError(
                    ErrorClass.FINISH,
                    Disposition.RETRY,
                    f"finish_reason {result.finish_reason} not accepted",
                    200,
                )
            else:
                violation = self._guard_violation(result.provider)
        tokens = result.completion_tokens
        outcome = "quarantined" if violation else (status if error is None else error.error_class.value)
        assert outcome is not None
        self.breakdown.add(outcome, cost, tokens)
        mono = time.monotonic()
        self.spend_rate.add(float(cost), mono)
        self.counters.attempts += 1
        self.attempts_rate.add(1, mono)
        stats = self._provider_stats(result.provider)
        if stats is not None:
            stats.record(
                ok=error is None and violation is None,
                e2e=result.e2e_s,
                ttft=result.ttft_s,
                tokens=tokens,
                cost=cost,
                error=None if error is None else error.error_class.value,
                message="" if error is None else error.message,
                now=mono,
            )
        record: dict[str, Any] = {
            "k": "end",
            "rid": flight.rid,
            "ds": prompt.dataset,
            "line": prompt.line,
            "gen": result.generation_id,
            "provider": result.provider,
            "model": result.served_model,
            "outcome": outcome,
            "http": result.http_status,
            "cost": str(cost),
            "est": estimated,
            "ptok": (result.usage or {}).get("prompt_tokens"),
            "ctok": (result.usage or {}).get("completion_tokens"),
            "e2e": round(result.e2e_s, 4),
            "ttft": None if result.ttft_s is None else round(result.ttft_s, 4),
            "ts": now,
        }
        if estimated and result.generation_id:
            self._reconcile_later(
                Unsettled(
                    flight.rid,
                    prompt.dataset,
                    prompt.line,
                    result.generation_id,
                    cost,
                    outcome,
                    result.provider,
                )
            )
        if error is not None:
            record["msg"] = error.message[:300]
            self._attempts.append(record)
            self._on_failure(item, error, stats)
            return
        assert status is not None
        row = build_row(
            prompt,
            result,
            status,
            self.settings.openrouter,
            cost=float(cost),
            cost_estimated=estimated,
            started_at=item.first_started or now,
            attempts=item.attempts,
            now=now,
        )
        if violation is not None:
            record["msg"] = violation
            await self._attempts.append(record)
            await self._quarantine_row(item, row, violation, result.provider)
            return
        if self._pool is not None:
            try:
                row = await self._pool.fill(row, prompt.request_messages)
            except TokenizeError as exc:
                await self._attempts.append(record)
                self._fatal(StopReason.FATAL, f"tokenizing failed: {exc}")
                return
        # End record and row go to disk together (two files, two group commits): a crash that keeps
        # only the row is settled from the row at the next start, one that keeps only the end record
        # re-sends the prompt with its first cost already counted. Either way no money is lost.
        settled, written = self._attempts.append(record), self._writers[prompt.dataset].append(row)
        await settled
        await written
        dataset = self.datasets[prompt.dataset]
        dataset.progress.done[prompt.line] = prompt.sha256
        dataset.progress.output_tokens += tokens
        if status == "truncated":
            dataset.progress.truncated += 1
        else:
            dataset.progress.ok += 1
        self.counters.rows += 1
        self.counters.output_tokens += tokens
        self.counters.bad_request_streak = 0
        self.tokens_rate.add(tokens, mono)
        self.rows_rate.add(1, mono)
        self.limit.on_success(mono)

    async def _quarantine_row(
        self, item: WorkItem, row: dict[str, Any], why: str, provider: str | None
    ) -> None:
        """A response from a provider outside the allowlist: kept apart, never a training row."""
        assert self._quarantine is not None and self._queue is not None
        self.quarantined += 1
        await self._quarantine.append({**row, "quarantine_reason": why})
        self._event("quarantine", prompt=item.prompt.id, provider=provider, reason=why)
        if provider:
            endpoint = self.endpoint_named(provider)
            slug = endpoint.slug if endpoint is not None else provider.lower()
            if slug not in self.excluded:
                try:
                    self.exclude(slug, source="guard")
                except JobError as exc:
                    self._fatal(StopReason.FATAL, f"precision guard: {why}; {exc}")
        self._queue.push_retry(item, time.monotonic())

    def _provider_stats(self, name: str | None) -> ProviderStats | None:
        if not name:
            return None
        stats = self.providers.get(name)
        if stats is None:
            stats = self.providers[name] = ProviderStats(name, window_s=self.settings.stats.window_s)
        return stats

    def _on_failure(self, item: WorkItem, error: AttemptError, stats: ProviderStats | None) -> None:
        self.counters.errors[error.error_class.value] += 1
        item.last_error = error.message
        self._remember(
            {
                "ts": time.time(),
                "event": "error",
                "class": error.error_class.value,
                "provider": stats.name if stats else None,
                "message": error.message[:200],
                "prompt": item.prompt.id,
            }
        )
        if error.platform_limit:
            self._hold(error)
        elif error.error_class in THROTTLE_CLASSES:
            self.limit.on_throttle()
        if error.error_class in (ErrorClass.BAD_REQUEST, ErrorClass.TOO_COSTLY):
            self.counters.bad_request_streak += 1
            if self.counters.bad_request_streak >= BAD_REQUEST_STREAK_FATAL and self.counters.rows == 0:
                if error.error_class is ErrorClass.TOO_COSTLY:
                    why = (
                        "OpenRouter refuses each request's worst case as above its in-flight budget: "
                        f"lower openrouter.max_tokens ({self.settings.openrouter.max_tokens}) or add credits"
                    )
                else:
                    why = "every request is refused as bad"
                self._fatal(StopReason.FATAL, f"{why}: {error.message}")
                return
        if error.disposition is Disposition.FATAL:
            self._fatal_error(error)
            self._queue.push_front(item)  # type: ignore[union-attr]
            return
        if error.disposition is Disposition.GIVE_UP or item.run_attempts >= self.settings.job.max_attempts:
            self._give_up(item, error)
            return
        job = self.settings.job
        bound = min(job.backoff_max_s, job.backoff_base_s * 2 ** (item.run_attempts - 1))
        delay = self._random.uniform(0, bound)
        if error.retry_after_s is not None:
            delay = max(delay, error.retry_after_s)
        self._queue.push_retry(item, time.monotonic() + delay)  # type: ignore[union-attr]

    def _hold(self, error: AttemptError) -> None:
        """Stop all dispatch until a platform limit resets: every request would meet it, and the
        free-model quotas count refused requests too (reference §7.3)."""
        wait = PLATFORM_HOLD_DEFAULT_S if error.retry_after_s is None else error.retry_after_s
        # A reset already past (clock skew, millisecond rounding) still waits a moment, or a storm
        # of 429s would open and close a hold per response.
        wait = max(wait, PLATFORM_HOLD_MIN_S)
        until = time.monotonic() + wait
        if until <= self.held_until + 1.0:
            return  # the requests in flight when the limit hit all report it; one hold is enough
        self.held_until = until
        self.held_reason = error.message[:200]
        self._event("hold", seconds=round(wait, 1), reason=self.held_reason)
        self._changed.set()

    def _give_up(self, item: WorkItem, error: AttemptError) -> None:
        self.datasets[item.prompt.dataset].failed += 1
        assert self._attempts is not None
        self._attempts.append(
            {
                "k": "gave_up",
                "ds": item.prompt.dataset,
                "line": item.prompt.line,
                "attempts": item.run_attempts,
                "why": error.message[:300],
                "ts": time.time(),
            }
        )

    def _fatal_error(self, error: AttemptError) -> None:
        if error.error_class is ErrorClass.CREDITS:
            self._fatal(StopReason.CREDITS, f"OpenRouter credits exhausted: {error.message}")
        elif error.error_class is ErrorClass.NO_ENDPOINTS:
            p = self.routing
            constraints = ", ".join(
                f"{name}={value}"
                for name, value in (
                    ("ignore", self._ignore),
                    ("only", p.only),
                    ("order", p.order),
                    ("quantizations", p.quantizations),
                    ("max_price", p.max_price),
                    ("allow_fallbacks", p.allow_fallbacks),
                    ("max_tokens", self.settings.openrouter.max_tokens),
                )
                if value not in (None, [], True)
            )
            self._fatal(
                StopReason.FATAL,
                f"no provider of {self.settings.openrouter.model} matches the routing constraints "
                f"({constraints or 'none set'}): {error.message}",
            )
        else:
            self._fatal(StopReason.FATAL, f"{error.error_class.value}: {error.message}")

    def _fatal(self, reason: StopReason, message: str) -> None:
        if self._stop_mode is None:
            self._event("fatal", reason=reason.value, message=message)
            self.stop(reason=reason, message=message)

    # ------------------------------------------------------------------------------- reconciling

    def _reconcile_later(self, pending: Unsettled) -> None:
        task = asyncio.get_running_loop().create_task(self._reconcile(pending))
        self._reconcile_tasks.add(task)
        task.add_done_callback(self._reconcile_tasks.discard)

    async def _reconcile(self, pending: Unsettled) -> None:
        """Replace an estimated cost with what OpenRouter billed for that generation."""
        assert pending.generation_id is not None
        real = await generation_cost(
            self.client, pending.generation_id, self.settings.job.reconcile_timeout_s
        )
        if real is None:
            return
        delta = real - pending.estimate
        self.ledger.spent += delta
        self.ledger.spent_estimated -= pending.estimate
        self.breakdown.add(pending.outcome, delta)
        stats = self.providers.get(pending.provider) if pending.provider else None
        if stats is not None:
            stats.adjust_cost(delta)
        assert self._attempts is not None
        self._attempts.append(
            {
                "k": "reconciled",
                "rid": pending.rid,
                "gen": pending.generation_id,
                "outcome": pending.outcome,
                "cost": str(real),
                "delta": str(delta),
                "ts": time.time(),
            }
        )
        self._changed.set()

    async def _watch_credits(self) -> None:
        """Poll the key's credit; warn when it is below what the job may still spend, stop at zero."""
        while True:
            try:
                self.credits = await read_credits(self.client)
            except Exception as exc:
                self.credits = {"checked_at": time.time(), "key_error": f"{type(exc).__name__}: {exc}"}
            remaining = self.credits.get("remaining")
            if isinstance(remaining, int | float):
                job_left = float(self.ledger.budget - self.ledger.spent)
                if remaining <= 0 and self.state in (JobState.RUNNING, JobState.PAUSED):
                    self._fatal(
                        StopReason.CREDITS, f"OpenRouter credits exhausted (remaining ${remaining:.2f})"
                    )
                elif remaining < job_left and not self._credit_warned:
                    self._credit_warned = True
                    self._event(
                        "credits_low",
                        remaining=round(remaining, 4),
                        budget_left=round(job_left, 4),
                        message=f"the account has ${remaining:.2f} left, below the job's remaining budget ${job_left:.2f}",
                    )
            await asyncio.sleep(self.settings.openrouter.key_poll_interval_s)

    # --------------------------------------------------------------------------------- shutdown

    async def _shutdown(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.hosts.close()  # GPU hosts (engine/host/monitor.py)
        # Give cost lookups a short grace so the summary is exact; what is left stays estimated
        # in the journal and is looked up again by the next start.
        if self._reconcile_tasks and self._stop_mode != "cancel":
            await asyncio.wait(list(self._reconcile_tasks), timeout=RECONCILE_GRACE_S)
        for task in list(self._reconcile_tasks):
            task.cancel()
        if self._reconcile_tasks:
            await asyncio.gather(*self._reconcile_tasks, return_exceptions=True)
        if self.outcome is not None:
            self._event(
                "end",
                reason=self.outcome.reason.value,
                message=self.outcome.message,
                spent=str(self.ledger.spent),
                rows=self.counters.rows,
            )
        for writer in [*self._writers.values(), self._attempts, self._events, self._quarantine]:
            if writer is not None:
                await writer.close()
        await self.client.close()
        if self._pool is not None:
            await self._pool.close()
        self._release_lock()

    def _event(self, event: str, **fields: Any) -> None:
        record = {"ts": time.time(), "event": event, **fields}
        if self._events is not None and not self._events.closed:
            self._events.append(record)
        self._remember(record)

    def _remember(self, record: dict[str, Any]) -> None:
        self._recent_seq += 1
        self._recent.append({"seq": self._recent_seq, **record})

    def events_since(self, cursor: int) -> tuple[int, list[dict[str, Any]]]:
        """Events after `cursor` (or the last -cursor events when negative), and the new cursor."""
        if cursor < 0:
            return self._recent_seq, list(self._recent)[cursor:]
        return self._recent_seq, [e for e in self._recent if e["seq"] > cursor]

    def info(self) -> dict[str, Any]:
        """What does not change while the job runs, for a console's hello."""
        return {
            "pid": os.getpid(),
            "run_dir": str(self.run_dir),
            "model": self.settings.openrouter.model,
            "base_url": self.settings.openrouter.base_url,
            "datasets": list(self.datasets),
            "started_at": self.started_at,
        }

    async def handle_command(self, name: str, args: dict[str, Any], source: str = "console") -> str:
        """Run an operator command by name; the returned text is shown to the operator."""
        if name == "pause":
            self.pause(source)
            return "paused: no new requests; those in flight finish"
        if name == "resume":
            self.resume(source)
            return "resumed"
        if name in ("exclude", "include"):
            provider = str(args.get("provider") or "")
            if not provider:
                raise JobError(f"{name} needs a provider")
            return (
                self.exclude(provider, source=source)
                if name == "exclude"
                else self.include(provider, source=source)
            )
        if name == "concurrency":
            applied = self.set_concurrency(int(args["value"]), source)
            return f"concurrency {applied}"
        if name == "budget":
            self.set_budget(Decimal(str(args["value"])), source)
            return f"budget ${self.ledger.budget:.2f}"
        if name == "stop":
            cancel = bool(args.get("cancel"))
            self._check_live()
            self.stop(
                cancel=cancel, reason=StopReason.OPERATOR, message=f"stopped by the operator ({source})"
            )
            return (
                "stopping: cancelling requests in flight"
                if cancel
                else "stopping: draining requests in flight"
            )
        if name == "inspect":  # GPU hosts (engine/host/monitor.py)
            try:
                return self.hosts.inspect_now(str(args["host"]) if args.get("host") else None)
            except HostError as exc:
                raise JobError(str(exc)) from None
        raise JobError(f"unknown command {name!r}")

    # --------------------------------------------------------------------------------- snapshot

    @property
    def in_flight(self) -> int:
        return len(self._flights)

    def in_flight_by_provider(self) -> Counter[str]:
        """Requests in flight per serving provider (known from a stream's first chunk)."""
        return Counter(f.provider for f in self._flights.values() if f.provider)

    def snapshot(self) -> dict[str, Any]:
        """A folded view of the job for the console and the headless line."""
        return build_snapshot(self)
