"""A SGLang server's load from its `/metrics` text (docs/sglang.md §6).

Here, below both, because the backend steers by it and `regen sglang status` reports it.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

# The gauges and counters read, by family name (the parser drops a counter's `_total`).
_GAUGES = {
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "queued",
    "sglang:token_usage": "kv_usage",
    "sglang:gen_throughput": "gen_throughput",
    "sglang:num_retracted_reqs": "retracted_now",
}
_COUNTERS = {
    "sglang:num_retracted_requests": "retracted_total",
    "sglang:generation_tokens": "generation_tokens_total",
    "sglang:num_requests": "requests_total",
    "sglang:num_aborted_requests": "aborted_total",
}


@dataclass(slots=True)
class ServerLoad:
    """One scrape of one server."""

    running: float = 0.0
    queued: float = 0.0
    kv_usage: float = 0.0
    gen_throughput: float = 0.0
    retracted_now: float = 0.0
    retracted_total: float = 0.0
    generation_tokens_total: float = 0.0
    requests_total: float = 0.0
    aborted_total: float = 0.0


def parse_metrics(text: str) -> ServerLoad:
    """The figures regen steers by. Scheduler series are per TP rank; rank 0 speaks for the server.
    A router's merged text (several workers, told apart by a label) is summed, KV usage maxed."""
    load = ServerLoad()
    for family in text_string_to_metric_families(text):
        field = _GAUGES.get(family.name) or _COUNTERS.get(family.name)
        if field is None:
            continue
        values = [
            s.value
            for s in family.samples
            if s.labels.get("tp_rank", "0") == "0" and not s.name.endswith(("_created", "_bucket"))
        ]
        if not values:
            continue
        setattr(load, field, max(values) if field == "kv_usage" else sum(values))
    return load


__all__ = ["ServerLoad", "parse_metrics"]
