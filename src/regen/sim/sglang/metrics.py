"""/metrics: Prometheus text with SGLang's metric names and labels (docs/sglang.md, "Metrics").

Rendered by prometheus-client from the live counters at scrape time, so every scrape is
consistent with /_sim/state at that moment. Scheduler series carry the scheduler's labels
(model_name, engine_type, tp_rank, pp_rank, moe_ep_rank, and dp_rank with data parallelism: one
series per rank, as every data-parallel rank's scheduler exports its own); the front end's token
and request counters and latency histograms carry model_name and engine_type only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from regen.sim.sglang.state import SGLangState
from regen.sim.sglang.stats import Histogram
from regen.sim.sglang.wire import not_found

__all__ = ["CONTENT_TYPE", "metrics", "render"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
_SCHED = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
_TOK = ["model_name", "engine_type"]


@dataclass(frozen=True, slots=True)
class _Rank:
    """One scheduler's share: what the series of one (data-parallel) rank report."""

    labels: list[str]
    running: int
    queued: int
    kv_used: int
    pool: int
    first: bool  # the rank that carries the scheduler-wide counters


def _ranks(sim: SGLangState) -> list[_Rank]:
    """The schedulers that export series. One, labelled tp_rank 0, without data parallelism; with
    dp_size N, one per rank with its dp_rank (and, under data-parallel attention, the tp_rank of its
    attention group's first GPU), each holding the requests dealt to it (docs/sglang.md §6)."""
    cfg = sim.config
    sched = sim.scheduler
    name = cfg.served_name
    if cfg.dp_size <= 1:
        labels = [name, "unified", "0", "0", "0"]
        return [
            _Rank(labels, len(sched.running), len(sched.waiting), sched.kv_used, cfg.max_total_tokens, True)
        ]
    n = cfg.dp_size
    running, queued, kv = [0] * n, [0] * n, [0] * n
    for req in sched.running:
        running[req.dp_rank % n] += 1
        kv[req.dp_rank % n] += req.kv_tokens
    for req in sched.waiting:
        queued[req.dp_rank % n] += 1
    out = []
    for k in range(n):
        tp_rank = k * cfg.tp_size // n if cfg.enable_dp_attention else 0
        labels = [name, "unified", str(tp_rank), "0", "0", str(k)]
        out.append(_Rank(labels, running[k], queued[k], kv[k], cfg.max_total_tokens // n, k == 0))
    return out


class _Collector:
    def __init__(self, sim: SGLangState) -> None:
        self.sim = sim

    def collect(self) -> Iterator[Metric]:
        sim = self.sim
        cfg = sim.config
        sched = sim.scheduler
        stats = sim.stats
        name = cfg.served_name
        ranks = _ranks(sim)
        slabels = ranks[0].labels
        names = _SCHED + (["dp_rank"] if len(slabels) > len(_SCHED) else [])
        tlabels = [name, "unified"]
        share = 1 / len(ranks)

        def gauge(metric: str, doc: str, value: Callable[[_Rank], float]) -> GaugeMetricFamily:
            g = GaugeMetricFamily(metric, doc, labels=names)
            for rank in ranks:
                g.add_metric(rank.labels, float(value(rank)))
            return g

        yield gauge("sglang:num_running_reqs", "The number of running requests.", lambda r: r.running)
        yield gauge(
            "sglang:num_queue_reqs", "The number of requests in the waiting queue.", lambda r: r.queued
        )
        yield gauge("sglang:num_used_tokens", "The number of used tokens.", lambda r: r.kv_used)
        yield gauge("sglang:token_usage", "The token usage.", lambda r: r.kv_used / r.pool)
        yield gauge("sglang:kv_used_tokens", "The number of KV cache tokens in use.", lambda r: r.kv_used)
        yield gauge(
            "sglang:kv_available_tokens", "The number of free KV cache tokens.", lambda r: r.pool - r.kv_used
        )
        yield gauge("sglang:max_total_num_tokens", "The size of the KV token pool.", lambda r: r.pool)
        yield gauge("sglang:context_len", "The context length.", lambda r: sim.context_len)
        yield gauge(
            "sglang:gen_throughput",
            "The generation throughput (token/s).",
            lambda r: stats.gen_throughput * share,
        )
        yield gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", lambda r: sched.cache.hit_rate())
        yield gauge(
            "sglang:num_retracted_reqs",
            "The number of retracted requests.",
            lambda r: stats.last_retracted if r.first else 0,
        )
        yield gauge("sglang:num_paused_reqs", "The number of paused requests.", lambda r: 0)
        yield gauge(
            "sglang:utilization",
            "The share of the running-request capacity in use.",
            lambda r: r.running / max(1.0, cfg.running_cap * share),
        )
        yield gauge("sglang:spec_accept_length", "The average speculative acceptance length.", lambda r: 0.0)
        yield gauge("sglang:spec_accept_rate", "The speculative acceptance rate.", lambda r: 0.0)

        retracted = CounterMetricFamily(
            "sglang:num_retracted_requests", "The number of retracted requests.", labels=names
        )
        for rank in ranks:
            retracted.add_metric(rank.labels, float(stats.retracted_total if rank.first else 0))
        yield retracted
        yield self._hist(
            "sglang:queue_time_seconds", "Time spent in the waiting queue.", stats.queue, names, slabels
        )

        for metric, doc, value in (
            ("sglang:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens),
            ("sglang:generation_tokens", "Number of generation tokens processed.", stats.generation_tokens),
            ("sglang:cached_tokens", "Number of cached prompt tokens.", stats.cached_tokens),
            ("sglang:num_requests", "Number of requests processed.", stats.requests),
            ("sglang:num_aborted_requests", "Number of requests aborted.", stats.aborted),
        ):
            c = CounterMetricFamily(metric, doc, labels=_TOK)
            c.add_metric(tlabels, float(value))
            yield c
        yield self._hist(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            stats.ttft,
            _TOK,
            tlabels,
        )
        yield self._hist(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            stats.itl,
            _TOK,
            tlabels,
        )
        yield self._hist(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            stats.e2e,
            _TOK,
            tlabels,
        )
        yield self._hist(
            "sglang:request_time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            stats.tpot,
            _TOK,
            tlabels,
        )

        phases = GaugeMetricFamily(
            "sglang:startup_time_seconds",
            "Engine startup duration by phase in seconds.",
            labels=[*_TOK, "phase"],
        )
        for phase, seconds in stats.startup_phases.items():
            phases.add_metric([*tlabels, phase], seconds)
        yield phases
        load = GaugeMetricFamily(
            "sglang:weight_load_duration_seconds", "Time spent loading the weights.", labels=_TOK
        )
        load.add_metric(tlabels, stats.startup_phases.get("load_weight", 0.0))
        yield load

    @staticmethod
    def _hist(
        metric: str, doc: str, h: Histogram, labels: list[str], values: list[str]
    ) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(metric, doc, labels=labels)
        fam.add_metric(values, buckets=h.cumulative(), sum_value=h.total)
        return fam


def render(sim: SGLangState) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(sim))
    return generate_latest(registry)


async def metrics(sim: SGLangState, request: web.Request) -> web.StreamResponse:
    """GET /metrics, when the server runs with --enable-metrics."""
    if not sim.config.enable_metrics:
        return await not_found(request)
    return web.Response(body=render(sim), headers={"Content-Type": CONTENT_TYPE})
