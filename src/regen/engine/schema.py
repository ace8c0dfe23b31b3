"""The snapshot's schema: what the job sends its consoles a few times a second, defined once.

The engine's builder (engine/job/snapshot.py) makes these; the console reads them, and its scripted
job for tests and demos (console/source.py) builds the same types. Money is in the ledger's `unit`
("usd" for OpenRouter, "gpu_s" for SGLang): no key is named for dollars. A job with several
backends adds `lanes`, one view per backend.

Version of this shape on the control socket: engine/control/server.py PROTOCOL_VERSION.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class RouteView(TypedDict):
    """One route of the backend (a provider endpoint, a worker), allowed or not."""

    name: str
    slug: str
    allowed: bool
    kept_out: str | None  # one word: precision, settings, price, max_tokens, guard, operator, down
    reason: str | None  # why it is kept out (or a caveat about an allowed one), as a sentence
    prompt_per_m: float | None  # price per million prompt tokens, in the ledger's unit
    completion_per_m: float | None
    precision: str | None


class BackendView(TypedDict):
    """The backend's own part of the snapshot."""

    name: str
    unit: str
    model: str
    supports_exclude: bool
    routes: list[RouteView]
    excluded: list[str]
    allowed_precisions: list[str] | None
    account: dict[str, Any]  # OpenRouter: the key's credit (/key, /credits)


class BackendSummary(TypedDict):
    name: str
    unit: str
    model: str
    supports_exclude: bool
    account: dict[str, Any]


class Quantiles(TypedDict):
    p50: float | None
    p95: float | None
    p99: float | None


class RouteWindow(TypedDict):
    requests: int
    ok: int
    errors: dict[str, int]
    error_share: float
    output_tokens_per_s: float
    e2e_s: Quantiles
    ttft_s: Quantiles
    tpot_s: Quantiles
    spent: float


class RouteRun(TypedDict):
    requests: int
    ok: int
    errors: dict[str, int]
    output_tokens: int
    spent: float
    e2e_s: Quantiles
    ttft_s: Quantiles
    tpot_s: Quantiles
    cost_per_m_output: float | None


class ProviderView(TypedDict):
    """One row of the providers (or workers) pane."""

    name: str
    slug: str
    excluded: bool  # excluded at run time (operator or guard)
    allowed: bool  # false also for routes the settings keep out
    kept_out: str | None
    reason: str | None
    precision: str | None
    prompt_price_per_m: float | None
    completion_price_per_m: float | None
    requests: int
    ok: int
    share: float
    in_flight: int
    output_tokens: int
    spent: float
    errors: dict[str, int]
    throttled: int
    latency_p50_s: float | None
    latency_p95_s: float | None
    latency_p99_s: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    ttft_p99_s: float | None
    tpot_s: float | None
    output_tokens_per_s: float
    cost_per_m_output: float | None
    recent_errors: list[dict[str, Any]]
    window: RouteWindow
    run: RouteRun
    status: str  # OK | SLOW | FAIL | EXCL (engine/job/stats.py status_word)


class EstimateView(TypedDict):
    amount: float
    requests: int


class WasteView(TypedDict):
    amount: float
    tokens: int


class MoneyView(TypedDict):
    unit: str
    spent: float  # confirmed + estimated
    confirmed: float  # as billed
    estimated: float  # pending + unknowable
    pending: EstimateView  # estimates the bill will still replace
    unknowable: EstimateView  # cut before any handle arrived: the worst case stays counted
    # "key_usage": the unknowable amount is bounded by the key's usage (docs/money.md), and how
    # long this run's end waited for that usage to settle (None: read back from an earlier run).
    unknowable_bound: NotRequired[str]
    unknowable_bound_wait_s: NotRequired[float | None]
    reserved: float
    budget: float | None  # None: no budget (a GPU-time ledger)
    headroom: float | None
    blocked: bool  # the next request's worst case does not fit
    burn_per_h: float
    projected_total: float | None
    useful: float
    useful_output_tokens: int
    useful_per_m: float | None
    waste: dict[str, WasteView]
    waste_total: float


class DatasetView(TypedDict):
    name: str
    total: int
    done: int
    ok: int
    truncated: int
    failed: int
    invalid: int
    in_flight: int
    output_tokens: int
    token_budget: int | None
    state: str


class OutcomeView(TypedDict):
    reason: str
    message: str


class ConcurrencyView(TypedDict):
    configured: int
    effective: int


class RatesView(TypedDict):
    output_tokens_per_s: float
    rows_per_s: float
    attempts_per_s: float


class LaneView(TypedDict):
    """One backend's share of a job (engine/job/lanes.py): what it made and spent, in its own unit."""

    name: str
    title: str
    unit: str
    model: str
    state: str  # running | paused | held | out | closed | budget
    reason: str | None  # why it is held, out or closed
    rows: int
    rows_share: float  # of the job's rows this run
    output_tokens: int
    attempts: int
    errors: dict[str, int]
    in_flight: int
    concurrency: ConcurrencyView
    suggested: int | None  # the backend's own ceiling (SGLang's /metrics), None: no opinion
    ceiling: int | None  # the steering hook's ceiling, None: flat out
    rates: RatesView
    money: MoneyView
    providers: list[ProviderView]


class FleetView(TypedDict):
    """The two-fleet plan and the deadline controller (engine/job/deadline_control.py, docs/fleets.md): present
    in a job with several backends or a deadline."""

    deadline: str | None  # as set ("12h", "06:30"); None: no deadline
    deadline_ts: float | None  # its resolved instant, epoch seconds (journaled: a restart keeps it)
    time_left_s: float | None  # to the deadline; negative once it has passed
    steered: bool  # OpenRouter's share follows the deadline (a GPU lane, a dollar lane and a deadline)
    ceiling: int | None  # OpenRouter's in-flight ceiling now; None: no limit
    reason: str  # the controller's one line: what moved and why, or what does fit
    plan: dict[str, Any]  # engine/money/fleetplan/plan.py FleetPlan.to_dict(): the live plan
    fits: bool  # the plan meets the deadline within the budget
    eta_s: float | None  # the work left at the pace measured now, both fleets together
    gpu_tokens_per_s: float  # the GPU fleet's rate the plan uses (smoothed)
    openrouter_tokens_per_s: float  # OpenRouter's rate measured now
    request_tokens_per_s: float  # OpenRouter's tokens/s per request in flight (smoothed)
    aim_tokens_per_s: float | None  # the OpenRouter rate the ceiling aims at; None: flat out
    projected_usd: float | None  # dollars spent + what the plan still buys; None: no dollar lane


class Snapshot(TypedDict):
    state: str
    outcome: OutcomeView | None
    elapsed_s: float
    model: str
    backend: BackendSummary
    in_flight: int
    held_s: float | None  # a hold on every route: seconds left
    held_reason: str | None  # why dispatch is held (a platform limit, or the backend unreachable)
    outage_s: float | None  # the backend unreachable: for how long so far
    outage_total_s: float  # outages of this run, in all
    concurrency: ConcurrencyView
    rates: RatesView
    money: MoneyView
    plan: dict[str, Any] | None
    errors: dict[str, int]
    rows: int
    attempts: int
    quarantined: int
    eta_s: float | None
    excluded: list[str]
    allowed_precisions: list[str] | None
    datasets: list[DatasetView]
    providers: list[ProviderView]
    hosts: list[dict[str, Any]]  # per GPU host: connection, GPUs, disk, last inspect (engine/host/monitor.py)
    # One entry per backend, in the order of job.backends. The single-backend keys above (backend,
    # money, concurrency, held, providers, plan) describe the main lane: the one holding the budget,
    # else the first; rows, attempts, errors, rates and in_flight count the whole job.
    lanes: NotRequired[list[LaneView]]
    fleet: NotRequired[FleetView]
    events: NotRequired[list[dict[str, Any]]]  # added per client by the control server


class JobInfo(TypedDict):
    """What does not change while the job runs, for a console's hello."""

    pid: int
    run_dir: str
    model: str
    backend: str
    base_url: str
    datasets: list[str]
    started_at: float
    backends: NotRequired[list[str]]  # every backend of the job, in the order of job.backends
