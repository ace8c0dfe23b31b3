"""The snapshot's schema: what the job sends its consoles a few times a second, defined once.

The engine's builder (engine/job/snapshot.py) makes these and the console reads them; the tests check
real jobs' snapshots against them at run time (tests/integration/job/test_snapshot_schema.py). Money is in the
ledger's `unit` ("usd" for OpenRouter, "gpu_s" for SGLang): no key is named for dollars. The top level holds what is
the job's; everything that belongs to one backend (its money, limit, holds, routes, account, plan)
is in that backend's `LaneView`, one per backend, a single-backend job included.

Version of this shape on the control socket: engine/control/server.py PROTOCOL_VERSION.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, NotRequired, Required, TypedDict, TypeVar

from regen.engine.units import Unit

# ------------------------------------------------------------------------------------ the backends


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


class OpenRouterCredits(TypedDict, total=False):
    """The key's credit (engine/backends/openrouter/account.py read_credits): empty until the first
    read, `key_error` when /key refused, else what /key and /credits said."""

    checked_at: float
    key_error: str
    limit: float | None
    limit_remaining: float | None
    usage: float | None
    usage_daily: float | None
    is_free_tier: bool | None
    limit_reset: str | None
    balance: float | None  # None: the key may not read /credits
    remaining: float | None  # the least of limit_remaining and balance, when either is known


class OpenRouterAccount(OpenRouterCredits, total=False):
    kind: Required[Literal["openrouter"]]


class SGLangServerView(TypedDict):
    """One SGLang server (or the router in front of several): what it said, its GPU time, its load."""

    url: str
    worker: str
    version: str | None
    served_model_name: str | None
    model_path: str | None
    weight_version: str | None
    gpus: int
    max_running_requests: int | None
    context_length: int | None
    in_flight: int
    gpu_s: float
    running: float | None  # None: not scraped yet
    queued: float | None
    kv_usage: float | None
    gen_throughput: float | None
    retracted_total: float | None
    generation_tokens_total: float | None
    checked_at: float | None  # wall clock of the last scrape
    down: bool
    error: str | None


class RouterView(TypedDict):
    """The SGLang router regen runs in front of several hosts (engine/host/router.py)."""

    url: str
    state: str
    pid: int | None
    version: str | None
    workers: int
    removed: list[str]
    error: str | None
    log: str


class TunnelView(TypedDict):
    """An SSH tunnel to one host's SGLang server (engine/host/tunnel.py)."""

    host: str
    url: str
    remote_port: int
    state: str
    error: str | None
    drops: int
    reopens: int
    connections: int


class FleetWorkerView(TunnelView):
    """A host behind the router: its tunnel and its health (engine/host/fleet.py)."""

    out: bool  # taken out of the router by regen
    health_failures: int
    health_error: str | None
    removals: int


class ClusterNodeView(TypedDict):
    """One node's server in a cluster job (engine/cluster/base.py `NodeServer`)."""

    node: str
    worker: str  # the worker's name in the fleet and the rows: CLUSTER/NODE
    state: str  # pending | starting | ready | failed | stopped | lost
    phase: str | None
    url: str | None
    failure: str | None


class ClusterView(TypedDict):
    """A cluster's job as the run's fleet last saw it (engine/cluster/fleet.py)."""

    cluster: str
    kind: str
    job_id: str | None
    job_state: str | None
    reason: str | None
    wanted: int
    nodes: list[ClusterNodeView]


class HostFleetView(TypedDict):
    router: RouterView | None
    workers: list[FleetWorkerView]
    clusters: list[ClusterView]  # the clusters the workers come from; empty for [[hosts]]


class SGLangAccount(TypedDict):
    """SGLang's servers: what the GPU time is buying (engine/backends/sglang/backend.py)."""

    kind: Literal["sglang"]
    servers: list[SGLangServerView]
    gpu_s: float
    router: SGLangServerView | None  # the router as the backend sees it, with several hosts
    fleet: HostFleetView | None
    concurrency_ceiling: int | None
    ceiling_reason: str | None
    watch_error: str | None


AccountView = OpenRouterAccount | SGLangAccount


class BackendView(TypedDict):
    """The backend's own part of its lane's view; what its abilities add (the routes excluded, the
    precisions allowed) the snapshot's builder reads from them (engine/backends/base.py)."""

    name: str
    unit: Unit
    model: str
    routes: list[RouteView]
    account: AccountView


# ------------------------------------------------------------------------------------- the routes


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


# One failed attempt of a route (engine/job/stats.py): when, its error class, the backend's words.
RecentError = TypedDict("RecentError", {"ts": float, "class": str | None, "message": str})


class FidelityStat(TypedDict):
    """One statistic of a route's fingerprint at its latest look (docs/fidelity.md)."""

    name: str  # finish, output_len, reasoning_len, thinking_closes, degenerate, truncated, special_leaks, refusals, prompt_tokens
    value: str  # the route's figure, as the operator reads it
    reference: str  # the same figure of what it was compared with
    p: float | None  # the test's p-value; None: not tested (too few answers on either side)
    effect: float  # total variation distance (histograms) or difference of rates (events)
    flagged: bool


class FidelityView(TypedDict):
    """A route's live fingerprint against the others (engine/job/fidelity.py): what the providers
    pane's fidelity column and the detail screen show, and what /metrics exports."""

    responses: int  # answers fingerprinted
    state: Literal["learning", "ok", "drift"]  # learning: too few answers here or in the reference
    against: str | None  # "pool" (the lane's other routes) or "sglang" (the GPU fleet's answers)
    reference_responses: int
    looks: int  # tests run so far (each look spends its share of the error rate)
    threshold: float | None  # the p-value a statistic had to fall under at the latest look
    finish_similarity: float | None  # 1 - total variation distance of the finish-reason mixes
    statistic: str | None  # the statistic that flagged the route
    evidence: str | None  # what it measured, in words
    action: str | None  # what the job did: "warn", "exclude" or "requeue"
    stats: list[FidelityStat]


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
    recent_errors: list[RecentError]
    window: RouteWindow
    run: RouteRun
    status: str  # OK | SLOW | FAIL | EXCL | DRIFT (engine/job/stats.py status_word)
    # The route's fingerprint (engine/job/fidelity.py); absent in recordings made before it.
    fidelity: NotRequired[FidelityView | None]


# -------------------------------------------------------------------------------------- the money


class EstimateView(TypedDict):
    amount: float
    requests: int


class WasteView(TypedDict):
    amount: float
    tokens: int


class MoneyView(TypedDict):
    unit: Unit
    spent: float  # confirmed + estimated
    confirmed: float  # as billed
    estimated: float  # pending + unknowable
    pending: EstimateView  # estimates the bill will still replace (their ids are known)
    unknowable: EstimateView  # cut before any handle arrived: the worst case stays counted
    # "key_usage": the unknowable amount is bounded by the key's usage (docs/money.md), and how
    # long this run's end waited for that usage to settle (None: read back from an earlier run).
    unknowable_bound: NotRequired[str]
    unknowable_bound_wait_s: NotRequired[float | None]
    # The end of a drained run waiting for this many bills still being looked up (the status line's
    # "settling N bills"); None while it is not waiting.
    settling: int | None
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


class PlanCost(TypedDict):
    provider: str
    usd: float


class PlanCosts(TypedDict):
    cheapest: PlanCost
    median: PlanCost
    dearest: PlanCost


class PlanFitsAt(TypedDict):
    cheapest: bool
    median: bool
    dearest: bool


class TokenBudgetWayOut(TypedDict):
    dataset_token_budget: int
    suggested: int
    text: str


class RunUntilSpentWayOut(TypedDict):
    share_of_work: float
    output_tokens: int
    text: str


class WaysOut(TypedDict):
    token_budget: TokenBudgetWayOut
    run_until_spent: RunUntilSpentWayOut


class BudgetPlanView(TypedDict):
    """The budget planner's answer (engine/money/planner.py): what the work left costs at the cheapest,
    median and dearest allowed route, whether the budget left covers it, and if not, the ways out.
    With no allowed route, only `fits` (None) and `reason`."""

    fits: bool | None
    reason: NotRequired[str]
    budget_left: NotRequired[float]
    output_tokens: NotRequired[int]
    remaining_prompts: NotRequired[int]
    cost: NotRequired[PlanCosts]
    fits_at: NotRequired[PlanFitsAt]
    tokens_covered_per_dataset: NotRequired[dict[str, int]]
    over_by_usd: NotRequired[float]  # only when it does not fit
    ways_out: NotRequired[WaysOut]  # only when it does not fit


# ---------------------------------------------------------------------------------------- the job


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
    """One backend's share of a job (engine/job/lanes.py): what it made and spent, in its own unit, and
    everything else that is that backend's (its limit, holds, outage, routes, account, plan)."""

    name: str
    title: str
    unit: Unit
    model: str
    supports_exclude: bool  # whether its routes can be excluded (OpenRouter's providers)
    account: AccountView
    excluded: list[str]  # routes excluded at run time
    allowed_precisions: list[str] | None
    state: str  # running | paused | held | out | closed | budget
    reason: str | None  # why it is held, out or closed
    held_s: float | None  # a hold on every route of this backend: seconds left
    held_reason: str | None  # why its dispatch is held (a platform limit, or the backend unreachable)
    outage_s: float | None  # the backend unreachable: for how long so far
    outage_total_s: float  # its outages of this run, in all
    # Its rows and their output tokens over the whole job, the runs before a resume included (as
    # its money is); the share is of every backend's rows counted so
    rows: int
    rows_share: float
    output_tokens: int
    attempts: int  # this run's
    errors: dict[str, int]
    in_flight: int
    concurrency: ConcurrencyView
    suggested: int | None  # the backend's own ceiling (SGLang's /metrics), None: no opinion
    ceiling: int | None  # the ceiling hook's ceiling (the deadline control's), None: flat out
    rates: RatesView
    money: MoneyView
    plan: BudgetPlanView | None  # the budget planner on live figures; None: no budget (GPU time)
    providers: list[ProviderView]


class ShareView(TypedDict):
    """One provider's share of a fleet plan (engine/money/fleetplan/plan.py Share)."""

    provider: str
    tokens: int
    usd: float
    capacity: int | None  # what it could carry in the time; None: unbounded
    per_million: float


class FleetPlanView(TypedDict):
    """The two-fleet plan (engine/money/fleetplan/plan.py FleetPlan.to_dict, docs/fleets.md)."""

    output_tokens: int
    prompts: int
    time_left_s: float | None
    horizon_s: float | None
    gpu_tokens_per_s: float
    gpu_alone_finish_s: float | None
    gpus_alone_meet: bool
    gpu_tokens: int
    openrouter_tokens: int
    shares: list[ShareView]
    cost: float
    budget_left: float | None
    reachable: bool
    affordable: bool
    fits: bool
    earliest_s: float | None
    tokens_by_deadline: int
    share_by_deadline: float
    reason: str


class FleetView(TypedDict):
    """The two-fleet plan and the deadline control (engine/job/deadline_control.py, docs/fleets.md): present
    in a job with several backends or a deadline."""

    deadline: str | None  # as set ("12h", "06:30"); None: no deadline
    deadline_ts: float | None  # its resolved instant, epoch seconds (journaled: a restart keeps it)
    time_left_s: float | None  # to the deadline; negative once it has passed
    # OpenRouter's share is paced to the deadline (a GPU lane, a dollar lane and a deadline); the key
    # keeps its protocol name
    steered: bool
    ceiling: int | None  # OpenRouter's in-flight ceiling now; None: no limit
    reason: str  # the pacer's one line: what moved and why, or what does fit
    plan: FleetPlanView  # the live plan
    # The verdict: the deadline is met within the budget, changed only on evidence (docs/fleets.md,
    # "The verdict"); the live plan's own answer is plan["fits"]
    fits: bool
    # The verdict in the operator's words beside the plan's figures, never "fits" next to a cost over
    # the budget left or an ETA past the deadline (engine/money/fleetplan/pacing.py `verdict_words`):
    # "fits", "at risk: ...", "too slow", "over the budget", "not yet within reach"
    verdict: str
    eta_s: float | None  # the work left at the pace measured now, both fleets together
    gpu_tokens_per_s: float  # the GPU fleet's rate the plan uses (smoothed)
    openrouter_tokens_per_s: float  # OpenRouter's rate measured now
    request_tokens_per_s: float  # OpenRouter's tokens/s per request in flight (smoothed)
    aim_tokens_per_s: float | None  # the OpenRouter rate the ceiling aims at; None: flat out
    projected_usd: float | None  # dollars spent + what the plan still buys; None: no dollar lane


# ------------------------------------------------------------------------------------- the hosts


class GpuProcessView(TypedDict):
    pid: int | float | None
    name: str
    memory_mib: int | float | None


class GpuView(TypedDict):
    """One GPU as nvidia-smi reports it (engine/host/scripts/probe.py gpus); None where it says N/A."""

    index: int | float | None
    name: str
    memory_used_mib: int | float | None
    memory_total_mib: int | float | None
    utilization_pct: int | float | None
    processes: list[GpuProcessView]


class DiskView(TypedDict):
    """The filesystem that holds a path (engine/host/scripts/probe.py disk), or why it cannot be read."""

    path: str
    exists: NotRequired[bool]
    total_bytes: NotRequired[int]
    free_bytes: NotRequired[int]
    error: NotRequired[str]


class HostDisks(TypedDict, total=False):
    """Empty until the first poll; then the data root's disk and the model's (None: no model path)."""

    data_root: DiskView | None
    model_path: DiskView | None


class InspectDatasetView(TypedDict):
    name: str | None
    lines: int
    invalid: int


class InspectCounts(TypedDict):
    """What the host pane shows of an inspect (engine/host/inspect.py summary)."""

    datasets: int
    prompts: int
    valid: int
    invalid: int
    duplicates: int
    results_rows: int
    by_dataset: list[InspectDatasetView]


class InspectView(TypedDict, total=False):
    """The last inspect of a host's datasets: its state, and the counts (InspectCounts) once one is
    done, kept while the next runs."""

    state: Required[str]  # running | done | failed
    error: str | None
    started_at: float
    finished_at: float
    seconds: float
    datasets: int
    prompts: int
    valid: int
    invalid: int
    duplicates: int
    results_rows: int
    by_dataset: list[InspectDatasetView]


class HostSGLangView(TypedDict):
    """The host pane's part of an SGLang status (engine/host/monitor.py; None where it said nothing)."""

    ok: bool | None
    error: str | None
    state: str | None  # stopped | dead | running | starting | not answering | ready
    pid: int | None
    alive: bool | None
    phase: str | None
    failure: str | None
    ready: bool | None
    version: str | None
    launched_version: str | None
    served_model_name: str | None
    running: float | None
    queued: float | None
    gen_throughput: float | None
    kv_usage: float | None
    retractions: float | None
    port: int | None


class SGLangActionView(TypedDict):
    """An SGLang start or stop the console asked for: what, how far, how it ended."""

    what: str  # start | stop
    state: str  # running | done | failed
    started_at: float
    progress: list[str]
    message: str | None
    finished_at: NotRequired[float]


class ConnectionView(TypedDict):
    """The job's SSH connection to a host (engine/host/ssh.py)."""

    name: str
    address: str
    state: str
    error: str | None
    retries: int
    connected_at: float | None


class HostView(ConnectionView):
    """One GPU host (engine/host/monitor.py): the connection, GPUs, disk, the last inspect, SGLang."""

    gpus: list[GpuView]
    gpu_error: str | None
    disk: HostDisks
    polled_at: float | None
    polls: int
    inspect: InspectView | None
    tunnel: TunnelView | None
    sglang: HostSGLangView | None
    sglang_action: SGLangActionView | None


# ---------------------------------------------------------------------------------- the snapshot


# One journal event as a console gets it (engine/run/events.py): `ts`, `event`, `seq` (the job's
# count of events shown, from 1: a console skips one it has seen) and the event's own fields, which
# differ from one event to the next (engine/run/records.py types the journaled ones; the console
# words them by name: console/history.py `event_line`). A mapping, not a TypedDict: a TypedDict
# cannot hold the fields it does not name.
EventRecord = dict[str, Any]


class Snapshot(TypedDict):
    state: str
    outcome: OutcomeView | None
    elapsed_s: float
    model: str  # as the budget lane names it (budget_lane below)
    in_flight: int
    rates: RatesView  # the whole job's: every lane's summed
    errors: dict[str, int]
    rows: int
    attempts: int
    quarantined: int
    eta_s: float | None
    datasets: list[DatasetView]
    hosts: list[HostView]
    # One entry per backend, in the order of job.backends: everything that is one backend's.
    lanes: list[LaneView]
    fleet: NotRequired[FleetView]
    events: NotRequired[list[EventRecord]]  # added per client by the control server
    events_dropped: NotRequired[int]  # on the socket: events a slow client could not be kept


class Hello(TypedDict):
    """The job's answer to a console's hello on the control socket (engine/control/server.py)."""

    protocol: int  # PROTOCOL_VERSION: the console refuses a job that speaks another
    job: JobInfo
    readonly: bool  # this console may watch, not steer
    events: list[EventRecord]  # the last events before it came, so its log starts with context


class CommandReply(TypedDict):
    """The job's answer to one command: done or refused, and what to tell the operator why."""

    ok: bool
    message: str


class CommandAnswer(CommandReply):
    """A `CommandReply` on the socket, with the id of the command it answers."""

    id: int | str | None


class JobInfo(TypedDict):
    """What does not change while the job runs, for a console's hello."""

    pid: int
    run_dir: str
    model: str
    backend: str  # the budget lane's
    base_url: str
    datasets: list[str]
    started_at: float
    backends: NotRequired[list[str]]  # every backend of the job, in the order of job.backends


# --------------------------------------------------------------------------------- the budget lane

_Lane = TypeVar("_Lane")


def holding_budget(lanes: Sequence[_Lane], budget: Callable[[_Lane], object]) -> _Lane:
    """The lane that holds the job's budget (OpenRouter's dollars), else the first: the one rule for
    whose money the headless line, the console's header and its cost pane show, whose routes its
    providers pane lists, and whose budget `budget` sets. For the dispatcher's lanes
    (engine/job/dispatch.py `Dispatcher.budget_lane`) and the snapshot's (`budget_lane`)."""
    return next((lane for lane in lanes if budget(lane) is not None), lanes[0])


def budget_lane(snap: Snapshot) -> LaneView:
    """The snapshot's lane that holds the budget, else its first (`holding_budget`)."""
    return holding_budget(snap["lanes"], lambda lane: lane["money"]["budget"])
