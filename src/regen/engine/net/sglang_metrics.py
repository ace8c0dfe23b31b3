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


# Labels that tell apart the ranks *within* one scheduler group; every other label (dp_rank, a
# router's worker) tells apart groups whose figures add up.
_RANK_LABELS = ("tp_rank", "pp_rank", "moe_ep_rank")


def _rank(labels: dict[str, str]) -> tuple[int, ...]:
    return tuple(int(labels[k]) if labels.get(k, "").isdigit() else 0 for k in _RANK_LABELS)


def parse_metrics(text: str) -> ServerLoad:
    """The figures regen steers by (docs/sglang.md §6). Each scheduler group speaks through its
    lowest rank: without data parallelism that is tp_rank 0; with `--dp N` every data-parallel rank
    exports its own series (a `dp_rank` label, and under data-parallel attention its own tp_rank),
    and those add up. A router's merged text (several workers, told apart by a label) is summed
    the same way. KV usage is the fullest group's."""
    load = ServerLoad()
    for family in text_string_to_metric_families(text):
        field = _GAUGES.get(family.name) or _COUNTERS.get(family.name)
        if field is None:
            continue
        groups: dict[tuple[tuple[str, str], ...], tuple[tuple[int, ...], float]] = {}
        for s in family.samples:
            if s.name.endswith(("_created", "_bucket")):
                continue
            group = tuple(sorted((k, v) for k, v in s.labels.items() if k not in _RANK_LABELS))
            rank = _rank(s.labels)
            kept = groups.get(group)
            if kept is None or rank < kept[0]:
                groups[group] = (rank, s.value)
        if not groups:
            continue
        values = [value for _, value in groups.values()]
        setattr(load, field, max(values) if field == "kv_usage" else sum(values))
    return load


__all__ = ["ServerLoad", "parse_metrics"]
