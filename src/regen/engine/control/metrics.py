"""/metrics: the job's figures in Prometheus' text format, served from the job's own event loop.

Off unless `[metrics] listen` is set (engine/config/settings.py `MetricsSettings`). Nothing is
counted for it on the hot path: a scrape reads the job's parts with the snapshot builder's rules
(engine/job/snapshot.py; the whole snapshot would fold every route's percentiles, which no family
needs) and the per-route folds beside them (engine/job/stats.py: prompt tokens and the latency
buckets every attempt feeds anyway). Every family is in `FAMILIES`, the one list docs/metrics.md
documents (a test holds the two together) and dashboards/regen.json queries.

Money is in each ledger's unit, named in the family: `_dollars` for OpenRouter's, `_gpu_seconds` for
the GPU time of SGLang's (docs/money.md). Counters count this process's attempts (a restart starts
them again, which Prometheus' rate() expects); the datasets' gauges count the whole job.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry, exposition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from regen.engine.job.job import Job
from regen.engine.job.lanes import Lane
from regen.engine.job.snapshot import dataset_view, lane_state
from regen.engine.job.stats import Buckets
from regen.engine.run.state import JobState
from regen.engine.schema import MoneyView
from regen.engine.units import GPU_SECONDS, UNITS, unit_name

PATH = "/metrics"

# A ledger's unit (engine/money/ledger.py) as the suffix of the families that carry its amounts.
LANE_STATES = ("running", "paused", "held", "out", "closed", "budget")  # engine/schema.py LaneView.state
FIDELITY_STATES = ("learning", "ok", "drift")  # engine/schema.py FidelityView.state

B, R = ("backend",), ("backend", "route")


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family: its name as scraped (a counter's with `_total`), type, labels and meaning."""

    name: str
    kind: str  # counter | gauge | histogram
    labels: tuple[str, ...]
    unit: str
    help: str


def _money(what: str, labels: tuple[str, ...], meaning: str) -> list[Family]:
    """The same amount in each ledger's unit: one family per unit."""
    return [
        Family(f"regen_{what}_{suffix}", "gauge", labels, suffix.replace("_", "-"), meaning)
        for suffix in (unit_name(unit, metric=True) for unit in UNITS)
    ]


FAMILIES: tuple[Family, ...] = (
    # ---- the job
    Family(
        "regen_job_state",
        "gauge",
        ("state",),
        "",
        "1 for the job's state now (STARTING, RUNNING, PAUSED, DRAINING, STOPPED, DONE), 0 for the others.",
    ),
    Family(
        "regen_job_start_time_seconds", "gauge", (), "seconds", "When this job process started, Unix time."
    ),
    Family(
        "regen_queue_depth",
        "gauge",
        (),
        "prompts",
        "Prompts waiting to be sent: not written, not given up, not in flight (fresh and retries).",
    ),
    Family(
        "regen_eta_seconds",
        "gauge",
        (),
        "seconds",
        "The work left at the rows per second measured now; absent until a rate is measured.",
    ),
    Family(
        "regen_deadline_timestamp_seconds",
        "gauge",
        (),
        "seconds",
        "The job's deadline (job.deadline), Unix time; absent without one.",
    ),
    Family(
        "regen_deadline_fits",
        "gauge",
        (),
        "",
        "1 when the deadline is met within the budget (the verdict, docs/fleets.md), else 0; absent without a deadline.",
    ),
    # ---- datasets (the whole job: earlier runs included)
    Family("regen_dataset_prompts", "gauge", ("dataset",), "prompts", "The dataset's valid prompts."),
    Family(
        "regen_dataset_done",
        "gauge",
        ("dataset", "status"),
        "prompts",
        "The dataset's prompts done, by status: ok and truncated rows, and failed (given up) prompts.",
    ),
    # ---- each backend (lane)
    Family(
        "regen_lane_state",
        "gauge",
        ("backend", "state"),
        "",
        "1 for the backend's state now (running, paused, held, out, closed, budget), 0 for the others.",
    ),
    Family(
        "regen_rows_total",
        "counter",
        ("backend", "status"),
        "rows",
        "Rows written by this process, by status (ok, truncated).",
    ),
    Family(
        "regen_attempts_total",
        "counter",
        B,
        "requests",
        "Attempts settled by this process, whatever their end (those that never named a route included).",
    ),
    Family(
        "regen_errors_total", "counter", ("backend", "class"), "requests", "Failed attempts by error class."
    ),
    Family("regen_quarantined_total", "counter", B, "rows", "Answers the precision guard quarantined."),
    Family("regen_in_flight", "gauge", B, "requests", "Attempts in flight now."),
    Family(
        "regen_concurrency_limit",
        "gauge",
        B,
        "requests",
        "The in-flight limit obeyed now: the adaptive limit, under the deadline control's ceiling when it sets one.",
    ),
    Family(
        "regen_concurrency_configured",
        "gauge",
        B,
        "requests",
        "The in-flight limit the settings allow (job.concurrency, job.backend_concurrency).",
    ),
    Family(
        "regen_concurrency_ceiling",
        "gauge",
        B,
        "requests",
        "The deadline control's ceiling on the backend's in-flight attempts; absent while it runs flat out.",
    ),
    Family(
        "regen_holds_total",
        "counter",
        B,
        "holds",
        "Holds on every route of the backend (a platform limit, docs/openrouter.md §7.3) this run.",
    ),
    Family(
        "regen_outages_total",
        "counter",
        B,
        "outages",
        "Times the backend became unreachable this run (docs/faults.md, outages).",
    ),
    Family(
        "regen_held_seconds",
        "gauge",
        B,
        "seconds",
        "Seconds left of a hold on every route of the backend (a platform limit); 0 when not held.",
    ),
    Family(
        "regen_outage_current_seconds",
        "gauge",
        B,
        "seconds",
        "How long the backend has been unreachable, this outage; 0 while it answers.",
    ),
    Family(
        "regen_outage_seconds_total", "counter", B, "seconds", "The backend's outages of this run, in all."
    ),
    *_money(
        "spent", B, "Spent: confirmed by the bill plus the estimates still standing (pending and unknowable)."
    ),
    *_money("reserved", B, "Reserved for the worst case of the attempts in flight."),
    *_money("pending", B, "Estimated for attempts whose bill is still to be looked up."),
    *_money(
        "unknowable", B, "The worst case of attempts cut before any bill could name them (docs/money.md)."
    ),
    *_money("budget", B, "The budget (job.budget_usd); absent for a ledger without one (GPU time)."),
    *_money("waste", ("backend", "cause"), "Spent on attempts that made no row, by cause."),
    Family("regen_pending_requests", "gauge", B, "requests", "Attempts whose bill is still to be looked up."),
    Family(
        "regen_unknowable_requests", "gauge", B, "requests", "Attempts cut before any bill could name them."
    ),
    # ---- each route (OpenRouter's providers, SGLang's servers)
    Family("regen_requests_total", "counter", R, "requests", "Attempts settled that named this route."),
    Family(
        "regen_request_errors_total",
        "counter",
        ("backend", "route", "class"),
        "requests",
        "Those that failed, by error class (a quarantined answer counts as unknown).",
    ),
    Family("regen_output_tokens_total", "counter", R, "tokens", "Output tokens of the successful attempts."),
    Family("regen_prompt_tokens_total", "counter", R, "tokens", "Prompt tokens of the successful attempts."),
    Family("regen_route_in_flight", "gauge", R, "requests", "Attempts in flight that have named this route."),
    *_money("route_spent", R, "Spent on this route's attempts."),
    Family(
        "regen_request_duration_seconds",
        "histogram",
        R,
        "seconds",
        "Time to the last byte of the successful attempts.",
    ),
    Family(
        "regen_time_to_first_token_seconds",
        "histogram",
        R,
        "seconds",
        "Time to the first content or reasoning token of the successful attempts.",
    ),
    # ---- SGLang's servers, as the backend scrapes them
    Family("regen_sglang_server_up", "gauge", R, "", "1 while the server answers, 0 while it is down."),
    Family(
        "regen_sglang_server_running",
        "gauge",
        R,
        "requests",
        "Requests the server is running, from its own /metrics.",
    ),
    Family(
        "regen_sglang_server_queued",
        "gauge",
        R,
        "requests",
        "Requests waiting in the server's queue, from its own /metrics.",
    ),
    # ---- each route's fingerprint against the others (engine/job/fidelity.py, docs/fidelity.md)
    Family(
        "regen_fidelity_state",
        "gauge",
        ("backend", "route", "state"),
        "",
        "1 for the route's fidelity now (learning, ok, drift: its answers are not the others'), 0 for the others; absent with openrouter.fidelity = off.",
    ),
    Family(
        "regen_fidelity_responses_total", "counter", R, "responses", "Answers fingerprinted on this route."
    ),
    Family(
        "regen_fidelity_looks_total",
        "counter",
        R,
        "looks",
        "Tests run on this route so far (each spends its share of the error rate).",
    ),
    Family(
        "regen_fidelity_finish_similarity",
        "gauge",
        R,
        "",
        "1 minus the total variation distance of the route's finish-reason mix and its reference's; absent until tested.",
    ),
)


class _Page:
    """The families of one scrape, every one present (with no samples when nothing applies)."""

    def __init__(self) -> None:
        self.metrics: dict[str, Metric] = {}
        for family in FAMILIES:
            labels = list(family.labels)
            if family.kind == "counter":
                self.metrics[family.name] = CounterMetricFamily(family.name, family.help, labels=labels)
            elif family.kind == "histogram":
                self.metrics[family.name] = HistogramMetricFamily(family.name, family.help, labels=labels)
            else:
                self.metrics[family.name] = GaugeMetricFamily(family.name, family.help, labels=labels)

    def add(self, name: str, labels: Sequence[str], value: float) -> None:
        family = self.metrics[name]
        assert isinstance(family, CounterMetricFamily | GaugeMetricFamily), name
        family.add_metric(list(labels), value)

    def histogram(self, name: str, labels: Sequence[str], buckets: Buckets) -> None:
        family = self.metrics[name]
        assert isinstance(family, HistogramMetricFamily), name
        family.add_metric(list(labels), [(le, float(n)) for le, n in buckets.cumulative()], buckets.total)


class JobCollector:
    """A prometheus-client collector that reads the job at scrape time, part by part, with the
    snapshot builder's own rules (engine/job/snapshot.py): the same figures a snapshot would show,
    without folding every route's percentiles, which no family needs."""

    def __init__(self, job: Job) -> None:
        self.job = job

    def describe(self) -> list[Metric]:
        # Nothing to read at registration: the job's figures are read only when scraped.
        return []

    def collect(self) -> Iterator[Metric]:
        job = self.job
        figures = job.figures
        now = time.monotonic()
        remaining = figures.remaining()
        page = _Page()
        _job(page, job, figures.eta_s(now, remaining))
        for lane in job.lanes:
            _lane(page, job, lane, now)
            money = figures.money(lane, now, remaining, lane.stats.counters.rows)
            _money_of(page, lane.name, money)
            _routes(page, job, lane, unit_name(money["unit"], metric=True))
            if lane.ledger.unit == GPU_SECONDS:
                _servers(page, lane)
        yield from page.metrics.values()


def _job(page: _Page, job: Job, eta_s: float | None) -> None:
    for state in JobState:
        page.add("regen_job_state", [state.value], 1.0 if job.state is state else 0.0)
    page.add("regen_job_start_time_seconds", [], job.started_at)
    waiting = 0
    for name, progress in job.datasets.items():
        d = dataset_view(name, progress)
        waiting += max(0, d["total"] - d["done"] - d["failed"] - d["in_flight"])
        page.add("regen_dataset_prompts", [name], d["total"])
        for status, n in (("ok", d["ok"]), ("truncated", d["truncated"]), ("failed", d["failed"])):
            page.add("regen_dataset_done", [name, status], n)
    page.add("regen_queue_depth", [], waiting)
    if eta_s is not None:
        page.add("regen_eta_seconds", [], eta_s)
    control = job.deadline_control
    if control.deadline_ts is not None:
        page.add("regen_deadline_timestamp_seconds", [], control.deadline_ts)
        page.add("regen_deadline_fits", [], 1.0 if control.view()["fits"] else 0.0)


def _lane(page: _Page, job: Job, lane: Lane, now: float) -> None:
    b = lane.name
    state, _ = lane_state(lane, now)
    for word in LANE_STATES:
        page.add("regen_lane_state", [b, word], 1.0 if state == word else 0.0)
    counters = lane.stats.counters
    for status in sorted({"ok", "truncated", *counters.statuses}):
        page.add("regen_rows_total", [b, status], counters.statuses[status])
    page.add("regen_attempts_total", [b], counters.attempts)
    for cls, n in sorted(counters.errors.items()):
        page.add("regen_errors_total", [b, cls], n)
    page.add("regen_quarantined_total", [b], lane.settler.quarantined)
    page.add("regen_in_flight", [b], lane.in_flight)
    ceilings = job.dispatcher.ceilings
    ceiling = None if ceilings is None else ceilings.lane_ceiling(b)
    limit = lane.limit.current
    page.add("regen_concurrency_limit", [b], limit if ceiling is None else min(limit, ceiling))
    page.add("regen_concurrency_configured", [b], lane.limit.configured)
    if ceiling is not None:
        page.add("regen_concurrency_ceiling", [b], ceiling)
    page.add("regen_holds_total", [b], lane.holds)
    page.add("regen_outages_total", [b], lane.outages)
    page.add("regen_held_seconds", [b], max(0.0, lane.held_until - now) if lane.held_until else 0.0)
    outage_s = lane.outage_s(now)
    page.add("regen_outage_current_seconds", [b], outage_s or 0.0)
    page.add("regen_outage_seconds_total", [b], lane.outage_total_s + (outage_s or 0.0))


def _money_of(page: _Page, b: str, money: MoneyView) -> None:
    unit = unit_name(money["unit"], metric=True)
    page.add(f"regen_spent_{unit}", [b], money["spent"])
    page.add(f"regen_reserved_{unit}", [b], money["reserved"])
    page.add(f"regen_pending_{unit}", [b], money["pending"]["amount"])
    page.add(f"regen_unknowable_{unit}", [b], money["unknowable"]["amount"])
    if money["budget"] is not None:
        page.add(f"regen_budget_{unit}", [b], money["budget"])
    for cause, waste in money["waste"].items():
        page.add(f"regen_waste_{unit}", [b, cause], waste["amount"])
    page.add("regen_pending_requests", [b], money["pending"]["requests"])
    page.add("regen_unknowable_requests", [b], money["unknowable"]["requests"])


def _routes(page: _Page, job: Job, lane: Lane, unit: str | None) -> None:
    b = lane.name
    flying = job.dispatcher.in_flight_by_route(lane)
    for name in sorted(set(lane.stats.routes) | set(flying)):
        labels = [b, name]
        page.add("regen_route_in_flight", labels, flying.get(name, 0))
        stats = lane.stats.routes.get(name)
        if stats is None:
            continue  # in flight on a route that has not settled an attempt yet
        page.add("regen_requests_total", labels, stats.requests)
        for cls, n in sorted(stats.errors.items()):
            page.add("regen_request_errors_total", [*labels, cls], n)
        page.add("regen_output_tokens_total", labels, stats.output_tokens)
        page.add("regen_prompt_tokens_total", labels, stats.prompt_tokens)
        if unit is not None:
            page.add(f"regen_route_spent_{unit}", labels, float(stats.spent))
        page.histogram("regen_request_duration_seconds", labels, stats.e2e_buckets)
        page.histogram("regen_time_to_first_token_seconds", labels, stats.ttft_buckets)
        fidelity = None if job.fidelity is None else job.fidelity.view(b, name)
        if fidelity is not None:
            for word in FIDELITY_STATES:
                page.add("regen_fidelity_state", [*labels, word], 1.0 if fidelity["state"] == word else 0.0)
            page.add("regen_fidelity_responses_total", labels, fidelity["responses"])
            page.add("regen_fidelity_looks_total", labels, fidelity["looks"])
            if fidelity["finish_similarity"] is not None:
                page.add("regen_fidelity_finish_similarity", labels, fidelity["finish_similarity"])


def _servers(page: _Page, lane: Lane) -> None:
    """SGLang's servers as its backend last scraped them (its account in the snapshot)."""
    account = lane.backend.view()["account"]
    if account["kind"] != "sglang":
        return
    for server in account["servers"]:
        labels = [lane.name, server["worker"]]
        page.add("regen_sglang_server_up", labels, 0.0 if server["down"] else 1.0)
        if server["running"] is not None:
            page.add("regen_sglang_server_running", labels, server["running"])
        if server["queued"] is not None:
            page.add("regen_sglang_server_queued", labels, server["queued"])


class MetricsServer:
    """GET /metrics over HTTP on the job's own event loop (aiohttp), rendered by prometheus-client
    from a registry holding only the job's collector."""

    def __init__(self, job: Job, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(JobCollector(job))
        app = web.Application()
        app.router.add_get(PATH, self._metrics)
        self._runner = web.AppRunner(app, access_log=None)

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    async def start(self) -> None:
        """Listen; raises OSError (the address in use, not this machine's) with nothing left open."""
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.host, self.port).start()
        except OSError:
            await self._runner.cleanup()
            raise

    async def close(self) -> None:
        await self._runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        # The format the scraper asks for (Prometheus' text, or OpenMetrics), as the library's own server.
        encode, content_type = exposition.choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encode(self.registry), headers={"Content-Type": content_type})
