"""A scripted `JobSource` for tests, demos and screenshots: a seeded, simulated job.

`SimulatedJob` evolves deterministically from a seed and speaks the engine's own types: it builds
`regen.engine.schema.Snapshot`, judges providers with `regen.engine.job.stats.status_word`, counts the engine's
error classes and waste causes, and runs commands through `regen.engine.job.commands.run_command`, so the
console tested here is the console a real job drives. `ScriptedSource` plays a fixed number of
frames, then holds until a test releases more or a command changes its state, so tests wait on
`await source.idle()` instead of sleeping.
"""

from __future__ import annotations

import asyncio
import copy
import math
import random
from collections import Counter, deque
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from regen.engine.control.server import PROTOCOL_VERSION
from regen.engine.durations import duration
from regen.engine.job.commands import run_command
from regen.engine.job.stats import StatusRules, judge, percentile
from regen.engine.money.fleetplan import DeadlineError, RouteOffer, Work, parse_deadline, resolve_deadline
from regen.engine.money.fleetplan.pacing import Facts, PaceDecision, Pacer
from regen.engine.money.ledger import WASTE_CAUSES, RoutePrice
from regen.engine.run.state import JobError
from regen.engine.schema import (
    EventRecord,
    FleetView,
    LaneView,
    MoneyView,
    ProviderView,
    Quantiles,
    RecentError,
    RouteWindow,
    SGLangServerView,
    Snapshot,
    WasteView,
)

# Wall-clock time the simulated job started at: fixed, so frames (and screenshots) are reproducible.
SIM_EPOCH = 1_750_000_000.0
MAX_TOKENS = 4096
RULES = StatusRules()


@dataclass(slots=True)
class _Provider:
    name: str
    slug: str
    ttft_s: float
    tokens_per_s: float
    usd_per_m_output: float
    error_rate: float
    weight: float
    error_class: str
    precision: str
    kept_out: str | None = None  # why the settings keep it out (it never serves)
    gpus: int = 0  # an SGLang worker's GPUs: its GPU time is gpus x the seconds it is busy
    requests: int = 0
    ok: int = 0
    output_tokens: int = 0
    spent: float = 0.0
    in_flight: int = 0
    tokens_rate: float = 0.0
    errors: Counter[str] = field(default_factory=Counter)
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=200))
    ttfts: deque[float] = field(default_factory=lambda: deque(maxlen=200))
    recent_errors: deque[RecentError] = field(default_factory=lambda: deque(maxlen=10))


@dataclass(slots=True)
class _Dataset:
    name: str
    total: int
    tokens_per_row: float
    token_budget: int | None
    done: int = 0
    ok: int = 0
    truncated: int = 0
    failed: int = 0
    output_tokens: int = 0
    in_flight: int = 0

    @property
    def open(self) -> bool:
        budget_left = self.token_budget is None or self.output_tokens < self.token_budget
        return self.done < self.total and budget_left

    @property
    def state(self) -> str:
        if self.done >= self.total:
            return "done"
        if self.token_budget is not None and self.output_tokens >= self.token_budget:
            return "token budget"
        return "running" if self.in_flight else "waiting"


@dataclass(slots=True)
class _Lane:
    """One backend's share of a two-fleet job: what it made, its own pause, its rates."""

    name: str
    title: str
    unit: str
    paused: bool = False
    rows: int = 0
    output_tokens: int = 0
    attempts: int = 0
    spent: float = 0.0  # in the lane's unit: dollars, or GPU-seconds
    burn_per_s: float = 0.0
    errors: Counter[str] = field(default_factory=Counter)
    rates: dict[str, float] = field(
        default_factory=lambda: {"output_tokens_per_s": 0.0, "rows_per_s": 0.0, "attempts_per_s": 0.0}
    )

    @property
    def state(self) -> str:
        return "paused" if self.paused else "running"


_PRECISION_FLOOR = "precision fp4 below the allowed set (int4 and finer)"
_PROVIDERS = (
    # name, slug, ttft, tokens/s per stream, $/M output, error rate, routing weight, usual error, precision
    ("DeepInfra", "deepinfra", 0.8, 45.0, 2.20, 0.01, 3.0, "rate_limited", "int4"),
    ("Together", "together", 0.6, 70.0, 3.00, 0.005, 2.0, "network", "fp8"),
    ("Fireworks", "fireworks", 0.4, 90.0, 3.00, 0.01, 2.0, "rate_limited", "int4"),
    ("Novita", "novita", 1.6, 16.0, 2.50, 0.02, 1.5, "network", "int4"),
    ("Parasail", "parasail", 0.9, 50.0, 2.40, 0.6, 1.0, "server", "int4"),
    ("Chutes", "chutes", 1.0, 40.0, 2.20, 0.03, 2.5, "server", "int4"),
)
# Endpoints of the catalog that the settings keep out: listed, dimmed, with the reason.
_KEPT_OUT = (("Baseten", "baseten", 1.80, "nvfp4"), ("AtlasCloud", "atlas-cloud", 1.90, "fp4"))
# The GPU fleet of a two-fleet job: SGLang workers (name, slug, ttft, tokens/s per stream, error rate,
# routing weight, usual error, GPUs) and the requests the SGLang lane keeps in flight.
_WORKERS = (
    ("gpu-a:30000", "gpu-a:30000", 0.3, 12.0, 0.0, 1.0, "server", 4),
    ("gpu-b:30000", "gpu-b:30000", 0.3, 11.0, 0.002, 1.0, "server", 4),
)
GPU_CONCURRENCY = 64
TOKENS_PER_ROW = 800.0
PROMPT_TOKENS = 300
PROMPT_USD_PER_M = 0.6
_DATASETS = (("chat", 4000, 650.0, None), ("code", 3000, 900.0, 1_500_000), ("reasoning", 2000, 1400.0, None))
_ERROR_MESSAGES = {
    "rate_limited": "429 Too Many Requests from upstream",
    "network": "no byte for 60 s; attempt abandoned",
    "server": "502 Bad Gateway from upstream",
}


def _quantiles(values: Iterable[float]) -> Quantiles:
    ordered = sorted(values)
    return {"p50": percentile(ordered, 0.5), "p95": percentile(ordered, 0.95), "p99": percentile(ordered, 0.99)}


class SimulatedJob:
    """A plausible job that evolves deterministically from a seed; commands change it like the real one."""

    def __init__(
        self,
        seed: int = 0,
        *,
        concurrency: int = 200,
        budget: float = 50.0,
        scale: float = 1.0,
        fleets: bool = False,
        deadline: str | None = None,
    ) -> None:
        """`fleets` adds a GPU fleet (SGLang workers) beside OpenRouter, as `job.backends = ["sglang",
        "openrouter"]` does, paced by the engine's deadline controller to `deadline` ("1h", "06:30")."""
        self.random = random.Random(seed)
        self.state = "RUNNING"
        self.outcome: dict[str, str] | None = None
        self.elapsed_s = 0.0
        self.configured = concurrency
        self.budget = budget
        self.spent = 0.0
        self.waste_usd = 0.0
        self.waste_tokens = 0
        self.attempts = 0
        self.rows = 0
        self.errors: Counter[str] = Counter()
        self.excluded: set[str] = set()
        self.rates = {"output_tokens_per_s": 0.0, "rows_per_s": 0.0, "attempts_per_s": 0.0}
        self.burn_per_s = 0.0
        self.budget_blocked = False
        self.providers = [_Provider(*row) for row in _PROVIDERS]
        self.providers += [
            _Provider(name, slug, 1.0, 40.0, price, 0.0, 0.0, "server", precision, kept_out=_PRECISION_FLOOR)
            for name, slug, price, precision in _KEPT_OUT
        ]
        self.datasets = [
            _Dataset(
                name, max(1, int(total * scale)), tokens, None if budget_ is None else int(budget_ * scale)
            )
            for name, total, tokens, budget_ in _DATASETS
        ]
        self.events: list[dict[str, Any]] = []
        self._seq = 0
        if deadline is not None and not fleets:
            raise ValueError("a deadline needs both fleets (fleets=True)")
        self.fleets = fleets
        self.workers = [
            _Provider(name, slug, ttft, tps, 0.0, errors, weight, error_class, "int4", gpus=gpus)
            for name, slug, ttft, tps, errors, weight, error_class, gpus in (_WORKERS if fleets else ())
        ]
        self.lanes: dict[str, _Lane] = {}
        self.gpu_configured = GPU_CONCURRENCY
        self.deadline: str | None = None
        self.deadline_ts: float | None = None
        self.steering: Pacer | None = None
        self.steer: PaceDecision | None = None
        if fleets:
            self.lanes = {
                "sglang": _Lane("sglang", "SGLang", "gpu_s"),
                "openrouter": _Lane("openrouter", "OpenRouter", "usd"),
            }
            # The controller's settings before there are samples: what the workers make at full load.
            expected_gpu = sum(
                GPU_CONCURRENCY / len(self.workers) * TOKENS_PER_ROW / (w.ttft_s + TOKENS_PER_ROW / w.tokens_per_s)
                for w in self.workers
            )
            self.steering = Pacer(concurrency, gpu_tokens_per_s=expected_gpu, request_tokens_per_s=40.0)
            if deadline is not None:
                self.set_deadline(deadline, "settings")
                self.events.clear()
            self._steer()

    @property
    def now(self) -> float:
        """The simulated wall clock (epoch seconds)."""
        return SIM_EPOCH + self.elapsed_s

    # ------------------------------------------------------------------------------ commands

    def event(self, name: str, **fields: Any) -> None:
        """Journal an event for the next snapshot."""
        self._seq += 1
        self.events.append({"ts": SIM_EPOCH + self.elapsed_s, "seq": self._seq, "event": name, **fields})

    def command(self, name: str, args: Mapping[str, Any]) -> str:
        """Apply a command through the engine's command table; raises JobError with the refusal."""
        return run_command(self, name, args, "console")

    def _check_live(self) -> None:
        if self.state in ("STOPPED", "DONE"):
            raise JobError(f"the job has ended ({self.state})")

    def _one_backend(self, backend: str | None) -> None:
        # A command naming a backend the job does not use is refused, as the engine does.
        names = list(self.lanes) or ["openrouter"]
        if backend is not None and backend not in names:
            raise JobError(f"no backend {backend!r} in this job (it uses {', '.join(names)})")

    def pause(self, origin: str, backend: str | None = None) -> None:
        self._check_live()
        self._one_backend(backend)
        if backend is not None and self.lanes:
            lane = self.lanes[backend]
            if not lane.paused:
                lane.paused = True
                self.event("pause", backend=backend, source=origin)
            return
        if self.state == "RUNNING":
            self.state = "PAUSED"
            self.event("pause", source=origin)

    def resume(self, origin: str, backend: str | None = None) -> None:
        self._check_live()
        self._one_backend(backend)
        if backend is not None and self.lanes:
            lane = self.lanes[backend]
            if lane.paused:
                lane.paused = False
                self.event("resume", backend=backend, source=origin)
            return
        if self.state == "PAUSED":
            self.state = "RUNNING"
            self.event("resume", source=origin)

    def exclude(self, name: str, *, origin: str, backend: str | None = None) -> str:
        self._check_live()
        self._one_backend(backend)
        slug = self._known(name)
        if slug in self.excluded:
            return f"{slug} is already excluded"
        remaining = {p.slug for p in self._serving()} - {slug}
        if not remaining:
            raise JobError(f"excluding {slug} would leave no provider for the model")
        self.excluded.add(slug)
        self.event("exclude", provider=slug, source=origin)
        return f"excluded {slug}; {len(remaining)} providers remain"

    def include(self, name: str, *, origin: str, backend: str | None = None) -> str:
        self._check_live()
        self._one_backend(backend)
        slug = self._known(name)
        if slug not in self.excluded:
            return f"{slug} is not excluded"
        self.excluded.discard(slug)
        self.event("include", provider=slug, source=origin)
        return f"included {slug}"

    def _known(self, name: str) -> str:
        slug = name.strip().lower()
        if slug not in {p.slug for p in self.providers}:
            raise JobError(f"no provider {slug!r} serves this model")
        return slug

    def set_concurrency(self, value: int, origin: str, backend: str | None = None) -> int:
        self._check_live()
        self._one_backend(backend)
        applied = max(1, value)
        self.configured = applied
        self.event("concurrency", value=applied, requested=value, source=origin)
        return applied

    def set_budget(self, amount: Decimal, origin: str) -> str:
        self._check_live()
        dollars = float(amount)
        if dollars < self.spent:
            raise JobError(f"a budget of ${dollars:.2f} is below what is already spent (${self.spent:.2f})")
        self.budget = dollars
        self.budget_blocked = False
        self.event("budget", value=f"{dollars:.2f}", source=origin)
        return f"budget ${dollars:.2f}"

    def set_deadline(self, text: str | None, origin: str) -> str:
        """Set or clear the deadline: parsed and resolved by the engine's rules (docs/fleets.md)."""
        self._check_live()
        if not self.fleets:
            raise JobError("this job has one backend: a deadline paces OpenRouter against the GPUs")
        if text is None:
            self.deadline, self.deadline_ts = None, None
            self.event("deadline", value=None, source=origin)
            self._steer()
            return "no deadline: both fleets flat out, GPUs first"
        try:
            parsed = parse_deadline(text)
        except DeadlineError as exc:
            raise JobError(str(exc)) from None
        now = datetime.fromtimestamp(self.now, UTC)
        instant = resolve_deadline(parsed, now)
        self.deadline, self.deadline_ts = text.strip(), instant.timestamp()
        self.event("deadline", value=self.deadline, ts=self.deadline_ts, source=origin)
        self._steer()
        local = instant.astimezone().strftime("%H:%M")
        return f"deadline {self.deadline}: {local}, {duration(self.deadline_ts - self.now, 'fine')} from now"

    def inspect_hosts(self, host: str | None, origin: str) -> str:
        raise JobError("no GPU host configured")

    def sglang_hosts(self, action: str, host: str | None, origin: str) -> str:
        raise JobError("no GPU host configured")

    def request_stop(self, *, cancel: bool, origin: str) -> str:
        self._check_live()
        self.state = "DRAINING"
        self.outcome = {"reason": "operator", "message": f"stopped by the operator ({origin})"}
        self.event("stop", mode="cancel" if cancel else "drain", reason="operator")
        if cancel:
            for provider in self.providers:
                provider.in_flight = 0
        return "stopping: cancelling requests in flight" if cancel else "stopping: draining requests in flight"

    # ------------------------------------------------------------------------------ evolution

    def _serving(self) -> list[_Provider]:
        """Providers routing may use now: allowed by the settings and not excluded."""
        return [p for p in self.providers if p.kept_out is None and p.slug not in self.excluded]

    def _poisson(self, mean: float) -> int:
        if mean <= 0:
            return 0
        return max(0, round(self.random.gauss(mean, math.sqrt(mean))))

    def _reservation(self) -> float:
        return 300 * 0.6e-6 + MAX_TOKENS * max(p.usd_per_m_output for p in self._serving() or self.providers) / 1e6

    def step(self, dt: float) -> None:
        """Advance the simulation by `dt` seconds of job time."""
        self.elapsed_s += dt
        if self.state in ("STOPPED", "DONE"):
            self.rates = dict.fromkeys(self.rates, 0.0)
            for lane in self.lanes.values():
                lane.rates = dict.fromkeys(lane.rates, 0.0)
            return
        open_datasets = [d for d in self.datasets if d.open]
        reserve_each = self._reservation()
        in_flight_now = sum(p.in_flight for p in self.providers)
        dispatching = self.state == "RUNNING" and bool(open_datasets)
        if dispatching and self.spent + (in_flight_now + 1) * reserve_each > self.budget:
            if not self.budget_blocked:
                self.event("budget_blocked", spent=f"{self.spent:.2f}", budget=f"{self.budget:.2f}")
            self.budget_blocked = True
        gpus_dispatching = dispatching and self.fleets and not self.lanes["sglang"].paused
        dispatching = dispatching and not self.budget_blocked
        if self.fleets and self.lanes["openrouter"].paused:
            dispatching = False
        allowed = self._serving()
        total_weight = sum(p.weight for p in allowed) or 1.0
        limit = self.openrouter_limit
        step_tokens = step_rows = step_attempts = 0
        step_spent = 0.0
        for provider in self.providers:
            if provider.kept_out is not None:
                continue
            if dispatching and provider in allowed:
                target = round(limit * provider.weight / total_weight)
                headroom = int((self.budget - self.spent) / reserve_each) if self.budget > self.spent else 0
                provider.in_flight = min(target, max(0, headroom))
            else:
                provider.in_flight = int(provider.in_flight * 0.4)
            tokens, oks, attempts, cost = self._serve(provider, dt)
            step_tokens += tokens
            step_rows += oks
            step_attempts += attempts
            step_spent += cost
        if self.fleets:
            self._count("openrouter", dt, step_rows, step_tokens, step_attempts, step_spent)
            gpu_rows, gpu_tokens, gpu_attempts, gpu_seconds = self._step_workers(dt, gpus_dispatching)
            self._count("sglang", dt, gpu_rows, gpu_tokens, gpu_attempts, gpu_seconds)
            self._settle_rows(step_rows + gpu_rows, step_tokens + gpu_tokens)
        else:
            self._settle_rows(step_rows, step_tokens)
        self.spent += step_spent
        self.attempts += step_attempts
        self.rows += step_rows
        if self.fleets:
            self.attempts += gpu_attempts
            self.rows += gpu_rows
            step_tokens, step_rows, step_attempts = (
                step_tokens + gpu_tokens,
                step_rows + gpu_rows,
                step_attempts + gpu_attempts,
            )
        for key, value in (
            ("output_tokens_per_s", step_tokens / dt),
            ("rows_per_s", step_rows / dt),
            ("attempts_per_s", step_attempts / dt),
        ):
            self.rates[key] = 0.7 * self.rates[key] + 0.3 * value if self.elapsed_s > dt else value
        self.burn_per_s = 0.7 * self.burn_per_s + 0.3 * (step_spent / dt)
        in_flight = sum(p.in_flight for p in self.providers) + sum(w.in_flight for w in self.workers)
        if self.state == "DRAINING" and in_flight == 0:
            self.state = "STOPPED"
            self.event("stopped", reason="operator")
        elif not any(d.open for d in self.datasets) and in_flight == 0 and self.state != "STOPPED":
            self.state = "DONE"
            self.outcome = {"reason": "done", "message": "every dataset is done"}
            self.event("done")
        if self.fleets:
            self._steer()

    def _serve(self, provider: _Provider, dt: float) -> tuple[int, int, int, float]:
        """One route's requests over `dt`: (output tokens, rows, attempts, dollars)."""
        tokens_per_row = TOKENS_PER_ROW
        latency = provider.ttft_s + tokens_per_row / provider.tokens_per_s
        attempts = self._poisson(provider.in_flight / latency * dt) if provider.in_flight else 0
        failures = min(attempts, self._poisson(attempts * provider.error_rate))
        oks = attempts - failures
        tokens = max(0, round(oks * self.random.gauss(tokens_per_row, 40.0)))
        wasted_tokens = failures * 120
        cost = (tokens + wasted_tokens) * provider.usd_per_m_output / 1e6 + attempts * 300 * 0.6e-6
        waste = wasted_tokens * provider.usd_per_m_output / 1e6 + failures * 300 * 0.6e-6
        if provider.gpus:
            # GPU time, not dollars: the worker's GPUs for as long as it has work (docs/money.md); the
            # simulation counts no GPU time as waste.
            cost = provider.gpus * dt if provider.in_flight else 0.0
            waste, wasted_tokens = 0.0, 0
        provider.requests += attempts
        provider.ok += oks
        provider.output_tokens += tokens
        provider.spent += cost
        provider.tokens_rate = 0.7 * provider.tokens_rate + 0.3 * (tokens / dt)
        if failures:
            provider.errors[provider.error_class] += failures
            self.errors[provider.error_class] += failures
            provider.recent_errors.append(
                {
                    "ts": SIM_EPOCH + self.elapsed_s,
                    "class": provider.error_class,
                    "message": _ERROR_MESSAGES[provider.error_class],
                }
            )
        for _ in range(min(attempts, 12)):
            ttft = provider.ttft_s * self.random.uniform(0.7, 1.6)
            provider.ttfts.append(ttft)
            provider.latencies.append(ttft + tokens_per_row / provider.tokens_per_s * self.random.uniform(0.8, 1.5))
        self.waste_usd += waste
        self.waste_tokens += wasted_tokens
        return tokens, oks, attempts, cost

    def _step_workers(self, dt: float, dispatching: bool) -> tuple[int, int, int, float]:
        """The GPU fleet over `dt`: (rows, output tokens, attempts, GPU-seconds)."""
        rows = tokens = attempts = 0
        gpu_seconds = 0.0
        total_weight = sum(w.weight for w in self.workers) or 1.0
        for worker in self.workers:
            if dispatching:
                worker.in_flight = round(self.gpu_configured * worker.weight / total_weight)
            else:
                worker.in_flight = int(worker.in_flight * 0.4)
            made, oks, tries, seconds = self._serve(worker, dt)
            rows, tokens, attempts, gpu_seconds = rows + oks, tokens + made, attempts + tries, gpu_seconds + seconds
        return rows, tokens, attempts, gpu_seconds

    def _count(self, name: str, dt: float, rows: int, tokens: int, attempts: int, spent: float) -> None:
        lane = self.lanes[name]
        lane.rows += rows
        lane.output_tokens += tokens
        lane.attempts += attempts
        lane.spent += spent
        first = self.elapsed_s <= dt
        for key, value in (("output_tokens_per_s", tokens / dt), ("rows_per_s", rows / dt), ("attempts_per_s", attempts / dt)):
            lane.rates[key] = value if first else 0.7 * lane.rates[key] + 0.3 * value
        lane.burn_per_s = 0.7 * lane.burn_per_s + 0.3 * (spent / dt)

    @property
    def openrouter_limit(self) -> int:
        """OpenRouter's in-flight limit: the configured concurrency under the controller's ceiling."""
        ceiling = None if self.steer is None else self.steer.ceiling
        return self.configured if ceiling is None else min(self.configured, ceiling)

    def work_left(self) -> Work:
        """The output tokens (and prompts) the open datasets still need, at the simulated row size."""
        rows = sum(d.total - d.done for d in self.datasets if d.open)
        return Work(round(rows * TOKENS_PER_ROW), rows, rows * PROMPT_TOKENS)

    def _steer(self) -> None:
        """One tick of the engine's pacer on what the simulation measured."""
        assert self.steering is not None
        lane = self.lanes["openrouter"]
        in_flight = sum(p.in_flight for p in self.providers)
        per_request = lane.rates["output_tokens_per_s"] / in_flight if in_flight else None
        sampled = self.elapsed_s > 0
        serving = self._serving()
        total_weight = sum(p.weight for p in serving) or 1.0
        request_rate = per_request or self.steering.request_tokens_per_s
        providers = tuple(
            RouteOffer(
                RoutePrice(p.slug, Decimal(str(PROMPT_USD_PER_M)) / 1_000_000, Decimal(str(p.usd_per_m_output)) / 1_000_000),
                self.configured * p.weight / total_weight * request_rate,
            )
            for p in serving
        )
        facts = Facts(
            now=self.now,
            work_left=self.work_left(),
            gpu_tokens_per_s=self.lanes["sglang"].rates["output_tokens_per_s"] if sampled else None,
            request_tokens_per_s=per_request,
            in_flight=in_flight,
            budget_left=Decimal(str(round(self.budget - self.spent, 6))),
            deadline=self.deadline_ts,
            offers=providers,
        )
        self.steer = self.steering.update(facts)

    def _settle_rows(self, rows: int, tokens: int) -> None:
        open_datasets = [d for d in self.datasets if d.open]
        for dataset in self.datasets:
            dataset.in_flight = 0
        if not open_datasets or rows == 0:
            return
        in_flight = sum(p.in_flight for p in self.providers)
        remaining_rows, remaining_tokens = rows, tokens
        for index, dataset in enumerate(open_datasets):
            share = 1.0 / (len(open_datasets) - index)
            take = min(dataset.total - dataset.done, round(remaining_rows * share))
            take_tokens = round(remaining_tokens * take / remaining_rows) if remaining_rows else 0
            truncated = sum(1 for _ in range(take) if self.random.random() < 0.02)
            dataset.done += take
            dataset.ok += take - truncated
            dataset.truncated += truncated
            dataset.output_tokens += take_tokens
            dataset.in_flight = round(in_flight * share) if dataset.open else 0
            remaining_rows -= take
            remaining_tokens -= take_tokens
            if dataset.done >= dataset.total:
                self.event("dataset_done", dataset=dataset.name)

    # ------------------------------------------------------------------------------- snapshot

    def _provider_view(self, p: _Provider, total_requests: int) -> ProviderView:
        latency = _quantiles(p.latencies)
        ttft = _quantiles(p.ttfts)
        tpot: Quantiles = {"p50": 1.0 / p.tokens_per_s, "p95": None, "p99": None}
        per_m = p.spent / p.output_tokens * 1e6 if p.output_tokens else None
        failed = sum(p.errors.values())
        window: RouteWindow = {
            "requests": p.requests,
            "ok": p.ok,
            "errors": dict(p.errors),
            "error_share": failed / p.requests if p.requests else 0.0,
            "output_tokens_per_s": p.tokens_rate,
            "e2e_s": latency,
            "ttft_s": ttft,
            "tpot_s": tpot,
            "spent": round(p.spent, 6),
        }
        return {
            "name": p.name,
            "slug": p.slug,
            "excluded": p.slug in self.excluded,
            "allowed": p.kept_out is None,
            "kept_out": "precision" if p.kept_out else ("console" if p.slug in self.excluded else None),
            "reason": p.kept_out or ("excluded at run time (console)" if p.slug in self.excluded else None),
            "precision": p.precision,
            "prompt_price_per_m": 0.6,
            "completion_price_per_m": p.usd_per_m_output,
            "requests": p.requests,
            "ok": p.ok,
            "share": p.requests / total_requests if total_requests else 0.0,
            "in_flight": p.in_flight,
            "output_tokens": p.output_tokens,
            "spent": round(p.spent, 6),
            "errors": dict(p.errors),
            "throttled": p.errors.get("rate_limited", 0),
            "latency_p50_s": latency["p50"],
            "latency_p95_s": latency["p95"],
            "latency_p99_s": latency["p99"],
            "ttft_p50_s": ttft["p50"],
            "ttft_p95_s": ttft["p95"],
            "ttft_p99_s": ttft["p99"],
            "tpot_s": tpot["p50"],
            "output_tokens_per_s": p.tokens_rate,
            "cost_per_m_output": per_m,
            "recent_errors": list(p.recent_errors),
            "window": window,
            "run": {
                "requests": p.requests,
                "ok": p.ok,
                "errors": dict(p.errors),
                "output_tokens": p.output_tokens,
                "spent": round(p.spent, 6),
                "e2e_s": latency,
                "ttft_s": ttft,
                "tpot_s": tpot,
                "cost_per_m_output": per_m,
            },
            "status": "OK",
        }

    def _money(self, remaining: int, in_flight: int) -> MoneyView:
        useful_tokens = sum(d.output_tokens for d in self.datasets)
        per_row = self.spent / self.rows if self.rows else None
        reserved = round(in_flight * self._reservation(), 6)
        waste: dict[str, WasteView] = {cause: {"amount": 0.0, "tokens": 0} for cause in WASTE_CAUSES}
        waste["retries"] = {"amount": round(self.waste_usd, 6), "tokens": self.waste_tokens}
        return {
            "unit": "usd",
            "spent": round(self.spent, 6),
            "confirmed": round(self.spent, 6),
            "estimated": 0.0,
            "pending": {"amount": 0.0, "requests": 0},
            "unknowable": {"amount": 0.0, "requests": 0},
            "reserved": reserved,
            "budget": self.budget,
            "headroom": self.budget - self.spent - reserved,
            "blocked": self.budget_blocked,
            "burn_per_h": self.burn_per_s * 3600,
            "projected_total": None if per_row is None else self.spent + remaining * per_row,
            "useful": round(self.spent - self.waste_usd, 6),
            "useful_output_tokens": useful_tokens,
            "useful_per_m": (self.spent - self.waste_usd) / useful_tokens * 1e6 if useful_tokens else None,
            "waste": waste,
            "waste_total": round(self.waste_usd, 6),
        }

    def snapshot(self) -> Snapshot:
        """The engine's Snapshot, with the events since the last one: OpenRouter's lane, and with
        `fleets` the GPU fleet's before it (the order of job.backends)."""
        total_requests = sum(p.requests for p in self.providers)
        remaining = sum(d.total - d.done for d in self.datasets if d.open)
        rows_per_s = self.rates["rows_per_s"]
        in_flight = sum(p.in_flight for p in self.providers)
        providers = [self._provider_view(p, total_requests) for p in sorted(self.providers, key=lambda p: p.name)]
        judge(providers, RULES)
        paid = self._paid_lane(providers, self._money(remaining, in_flight), in_flight)
        snap: Snapshot = {
            "state": self.state,
            "outcome": None if self.outcome is None else {"reason": self.outcome["reason"], "message": self.outcome["message"]},
            "elapsed_s": self.elapsed_s,
            "model": paid["model"],
            "in_flight": in_flight + sum(w.in_flight for w in self.workers),
            "rates": {
                "output_tokens_per_s": self.rates["output_tokens_per_s"],
                "rows_per_s": self.rates["rows_per_s"],
                "attempts_per_s": self.rates["attempts_per_s"],
            },
            "errors": dict(self.errors),
            "rows": self.rows,
            "attempts": self.attempts,
            "quarantined": 0,
            "eta_s": remaining / rows_per_s if rows_per_s > 0 and remaining else None,
            "datasets": [
                {
                    "name": d.name,
                    "total": d.total,
                    "done": d.done,
                    "ok": d.ok,
                    "truncated": d.truncated,
                    "failed": d.failed,
                    "invalid": 0,
                    "in_flight": d.in_flight,
                    "output_tokens": d.output_tokens,
                    "token_budget": d.token_budget,
                    "state": d.state,
                }
                for d in self.datasets
            ],
            "hosts": [],
            "lanes": [self._gpu_lane() if name == "sglang" else paid for name in self.lanes] or [paid],
        }
        if self.fleets:
            snap["fleet"] = self._fleet_view()
        snap["events"], self.events = self.events, []
        return snap

    def _paid_lane(self, providers: list[ProviderView], money: MoneyView, in_flight: int) -> LaneView:
        """OpenRouter's lane, the one holding the budget: the whole job's figures when it is the only one."""
        lane = self.lanes.get("openrouter")
        if lane is None:
            output_tokens = sum(p.output_tokens for p in self.providers)
            rows, attempts, errors, rates = self.rows, self.attempts, self.errors, self.rates
            state = "running"
        else:
            output_tokens = lane.output_tokens
            rows, attempts, errors, rates = lane.rows, lane.attempts, lane.errors, lane.rates
            state = lane.state
        return {
            "name": "openrouter",
            "title": "OpenRouter",
            "unit": "usd",
            "model": "moonshotai/kimi-k2.5",
            "supports_exclude": True,
            "account": {
                "kind": "openrouter",
                "limit_remaining": round(200.0 - self.spent, 6),
                "usage": round(12.5 + self.spent, 6),
            },
            "excluded": sorted(self.excluded),
            "allowed_precisions": ["int4", "fp6", "int8", "fp8", "mxfp8", "fp16", "bf16", "fp32"],
            "state": state,
            "reason": None,
            "held_s": None,  # a simulated lane is never held nor out
            "held_reason": None,
            "outage_s": None,
            "outage_total_s": 0.0,
            "rows": rows,
            "rows_share": rows / self.rows if self.rows else 0.0,
            "output_tokens": output_tokens,
            "attempts": attempts,
            "errors": dict(errors),
            "in_flight": in_flight,
            "concurrency": {"configured": self.configured, "effective": self.configured},
            "suggested": None,
            "ceiling": None if self.steer is None else self.steer.ceiling,
            "rates": {
                "output_tokens_per_s": rates["output_tokens_per_s"],
                "rows_per_s": rates["rows_per_s"],
                "attempts_per_s": rates["attempts_per_s"],
            },
            "money": money,
            "plan": None,
            "providers": providers,
        }

    def _gpu_lane(self) -> LaneView:
        """The GPU fleet's lane: SGLang's workers, GPU time, no budget."""
        lane = self.lanes["sglang"]
        total = sum(w.requests for w in self.workers)
        routes = [self._provider_view(w, total) for w in self.workers]
        judge(routes, RULES)
        for route in routes:
            route["prompt_price_per_m"] = route["completion_price_per_m"] = None
            route["cost_per_m_output"] = route["run"]["cost_per_m_output"] = None
        servers: list[SGLangServerView] = [
            {
                "url": f"http://{w.slug}",
                "worker": w.name,
                "version": "0.5.23",
                "served_model_name": "kimi-k2.5",
                "model_path": "moonshotai/Kimi-K2.5",
                "weight_version": None,
                "gpus": w.gpus,
                "max_running_requests": None,
                "context_length": None,
                "in_flight": w.in_flight,
                "gpu_s": round(w.spent, 3),
                "running": float(w.in_flight),
                "queued": 0.0,
                "kv_usage": None,
                "gen_throughput": w.tokens_rate,
                "retracted_total": None,
                "generation_tokens_total": float(w.output_tokens),
                "checked_at": self.now,
                "down": False,
                "error": None,
            }
            for w in self.workers
        ]
        return {
            "name": "sglang",
            "title": lane.title,
            "unit": lane.unit,
            "model": "moonshotai/Kimi-K2.5",
            "supports_exclude": False,
            "account": {
                "kind": "sglang",
                "servers": servers,
                "gpu_s": round(lane.spent, 3),
                "router": None,
                "fleet": None,
                "concurrency_ceiling": None,
                "ceiling_reason": "",
                "watch_error": None,
            },
            "excluded": [],
            "allowed_precisions": None,
            "state": lane.state,
            "reason": None,
            "held_s": None,
            "held_reason": None,
            "outage_s": None,
            "outage_total_s": 0.0,
            "rows": lane.rows,
            "rows_share": lane.rows / self.rows if self.rows else 0.0,
            "output_tokens": lane.output_tokens,
            "attempts": lane.attempts,
            "errors": dict(lane.errors),
            "in_flight": sum(w.in_flight for w in self.workers),
            "concurrency": {"configured": self.gpu_configured, "effective": self.gpu_configured},
            "suggested": None,
            "ceiling": None,
            "rates": {
                "output_tokens_per_s": lane.rates["output_tokens_per_s"],
                "rows_per_s": lane.rates["rows_per_s"],
                "attempts_per_s": lane.rates["attempts_per_s"],
            },
            "money": self._gpu_money(lane),
            "plan": None,
            "providers": routes,
        }

    def _gpu_money(self, lane: _Lane) -> MoneyView:
        """The SGLang lane's ledger: GPU-seconds, no budget."""
        useful_tokens = lane.output_tokens
        return {
            "unit": "gpu_s",
            "spent": round(lane.spent, 6),
            "confirmed": round(lane.spent, 6),
            "estimated": 0.0,
            "pending": {"amount": 0.0, "requests": 0},
            "unknowable": {"amount": 0.0, "requests": 0},
            "reserved": 0.0,
            "budget": None,
            "headroom": None,
            "blocked": False,
            "burn_per_h": lane.burn_per_s * 3600,
            "projected_total": None,
            "useful": round(lane.spent, 6),
            "useful_output_tokens": useful_tokens,
            "useful_per_m": lane.spent / useful_tokens * 1e6 if useful_tokens else None,
            "waste": {cause: {"amount": 0.0, "tokens": 0} for cause in WASTE_CAUSES},
            "waste_total": 0.0,
        }

    def _fleet_view(self) -> FleetView:
        """The plan and the controller's answer, as the engine publishes them (engine/schema.py FleetView)."""
        assert self.steering is not None and self.steer is not None
        steer = self.steer
        work = self.work_left()
        gpu_rate = self.steering.gpu_tokens_per_s
        openrouter_rate = self.lanes["openrouter"].rates["output_tokens_per_s"]
        pace = self.lanes["sglang"].rates["output_tokens_per_s"] + openrouter_rate
        return {
            "deadline": self.deadline,
            "deadline_ts": self.deadline_ts,
            "time_left_s": None if self.deadline_ts is None else self.deadline_ts - self.now,
            "steered": self.deadline_ts is not None,
            "ceiling": steer.ceiling,
            "reason": steer.reason,
            "plan": steer.plan.to_dict(),
            "fits": steer.plan.fits,
            "eta_s": work.output_tokens / pace if pace > 0 else None,
            "gpu_tokens_per_s": gpu_rate,
            "openrouter_tokens_per_s": openrouter_rate,
            "request_tokens_per_s": self.steering.request_tokens_per_s,
            "aim_tokens_per_s": steer.openrouter_tokens_per_s,
            "projected_usd": self.spent + float(steer.plan.cost),
        }


# ------------------------------------------------------------------------------ scripted source


class ScriptedSource:
    """A `JobSource` that plays given frames, or a `SimulatedJob`, and records every command.

    `count` frames are played at once, then the source holds: `advance(n)` releases n more, a
    command releases one (so the console sees its effect), `finish()` ends the stream. With
    `count=None` it plays forever, one frame every `interval_s` (for `python -m regen.console.launch`).
    """

    def __init__(
        self,
        frames: Iterable[Snapshot] | None = None,
        *,
        seed: int = 0,
        count: int | None = 10,
        step_s: float = 1.0,
        interval_s: float = 0.25,
        readonly: bool = False,
        job: SimulatedJob | None = None,
        hello: dict[str, Any] | None = None,
    ) -> None:
        self.readonly = readonly
        self.commands: list[tuple[str, dict[str, Any]]] = []
        self.step_s = step_s
        self.interval_s = interval_s
        self.connected = False
        self.closed = False
        self._frames = None if frames is None else [copy.deepcopy(f) for f in frames]
        self._frame_index = 0
        self._last: Snapshot | None = None
        self.job = None if self._frames is not None else job or SimulatedJob(seed)
        self._endless = count is None
        self._allowance = 0 if count is None else count
        self._ended = False
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._pending_events: list[EventRecord] = []
        self.hello = hello or {
            "protocol": PROTOCOL_VERSION,
            "job": {
                "pid": 4242,
                "run_dir": "/srv/regen-run",
                "model": "moonshotai/kimi-k2.5",
                "backend": "openrouter",
                "base_url": "https://openrouter.ai/api/v1",
                "datasets": [name for name, *_ in _DATASETS],
                "started_at": SIM_EPOCH,
            },
            "readonly": readonly,
            "events": [{"ts": SIM_EPOCH, "seq": 0, "event": "start", "datasets": 3}],
        }
        if hello is None and self.job is not None and self.job.fleets:
            self.hello["job"]["backends"] = list(self.job.lanes)

    async def connect(self) -> dict[str, Any]:
        self.connected = True
        return copy.deepcopy(self.hello)

    def _next_frame(self) -> Snapshot | None:
        if self.job is not None:
            self.job.step(self.step_s)
            return self.job.snapshot()
        assert self._frames is not None
        if self._frame_index < len(self._frames):
            frame = self._frames[self._frame_index]
            self._frame_index += 1
            self._last = frame
            frame = copy.deepcopy(frame)
        elif self._last is not None:
            frame = copy.deepcopy(self._last)
            frame["events"] = []
        else:
            return None
        frame["events"] = [*frame.get("events", []), *self._pending_events]
        self._pending_events = []
        return frame

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        while not (self._ended or self.closed):
            if not self._endless and self._allowance <= 0:
                self._idle.set()
                await self._wake.wait()
                self._wake.clear()
                continue
            self._allowance -= 1
            frame = self._next_frame()
            if frame is not None:
                yield frame
            if self._endless:
                await asyncio.sleep(self.interval_s)
        self._idle.set()

    async def command(self, name: str, **args: Any) -> dict[str, Any]:
        self.commands.append((name, dict(args)))
        if self.readonly:
            return {"ok": False, "message": "this console is read-only"}
        if self.job is None:
            self._pending_events.append({"ts": SIM_EPOCH, "event": name, **args})
            result = {"ok": True, "message": f"{name} sent"}
        else:
            try:
                result = {"ok": True, "message": self.job.command(name, args)}
            except JobError as exc:
                result = {"ok": False, "message": str(exc)}
        self.advance(1)
        return result

    def advance(self, frames: int = 1) -> None:
        """Release `frames` more frames (no effect when playing endlessly)."""
        self._allowance += frames
        self._idle.clear()
        self._wake.set()

    def finish(self) -> None:
        """End the stream, as a job that goes away does."""
        self._ended = True
        self._idle.clear()
        self._wake.set()

    async def idle(self) -> None:
        """Wait until every released frame has been taken by the console."""
        await self._idle.wait()

    async def close(self) -> None:
        self.closed = True
        self._wake.set()
