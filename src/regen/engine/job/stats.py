"""Folded statistics: rates over a sliding window, per-provider latency and money, errors by class.

The job folds every settled attempt in here; snapshots read the folds a few times a second, so no
consumer ever sees one event per token or per response. Latency definitions follow SGLang's
bench_serving (docs/sglang.md): TTFT is the time to the first content or reasoning token,
E2E the time to the last byte, TPOT = (E2E - TTFT) / (output tokens - 1).
"""

from __future__ import annotations

import random
import time
from collections import Counter, deque
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from regen.engine.schema import (
    FidelityView,
    ProviderView,
    Quantiles,
    RecentError,
    RouteRun,
    RouteView,
    RouteWindow,
)

WINDOW_QUANTILE_SAMPLES = 1024


class RateMeter:
    """Sums per whole second over the last `window_s` seconds."""

    def __init__(self, window_s: int = 30) -> None:
        self.window_s = window_s
        self._buckets: deque[list[float]] = deque()  # [second, amount]

    def add(self, amount: float, now: float | None = None) -> None:
        second = float(int(time.monotonic() if now is None else now))
        if self._buckets and self._buckets[-1][0] == second:
            self._buckets[-1][1] += amount
        else:
            self._buckets.append([second, amount])
            self._trim(second)

    def _trim(self, now_second: float) -> None:
        while self._buckets and self._buckets[0][0] <= now_second - self.window_s:
            self._buckets.popleft()

    def rate(self, now: float | None = None, started: float | None = None) -> float:
        """Per-second rate over the window (or since `started` when the job is younger)."""
        now = time.monotonic() if now is None else now
        self._trim(float(int(now)))
        total = sum(amount for _, amount in self._buckets)
        span = float(self.window_s)
        if started is not None:
            span = min(span, max(now - started, 1.0))
        return total / span


def percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


class Reservoir:
    """A uniform sample of at most `size` values of a stream (Algorithm R): whole-run percentiles."""

    def __init__(self, size: int = 2048, seed: int = 0) -> None:
        self.size = size
        self.seen = 0
        self.values: list[float] = []
        self._random = random.Random(seed)

    def add(self, value: float) -> None:
        self.seen += 1
        if len(self.values) < self.size:
            self.values.append(value)
            return
        slot = int(self._random.random() * self.seen)
        if slot < self.size:
            self.values[slot] = value


def _quantiles(values: list[float]) -> Quantiles:
    ordered = sorted(values)
    return {
        "p50": percentile(ordered, 0.5),
        "p95": percentile(ordered, 0.95),
        "p99": percentile(ordered, 0.99),
    }


class _Second:
    """What one provider's attempts settled within one whole second."""

    __slots__ = ("errors", "ok", "requests", "second", "spent", "tokens")

    def __init__(self, second: int) -> None:
        self.second = second
        self.requests = 0
        self.ok = 0
        self.tokens = 0
        self.spent = Decimal(0)
        self.errors: Counter[str] | None = None


@dataclass(slots=True)
class StatusRules:
    """When a provider's status word turns from OK to SLOW or FAIL."""

    fail_error_share: float = 0.5
    slow_factor: float = 2.0
    min_samples: int = 5


@dataclass(slots=True)
class ProviderStats:
    """What one upstream provider did, over the whole run and over a sliding window."""

    name: str
    window_s: float = 60.0
    requests: int = 0
    ok: int = 0
    output_tokens: int = 0
    spent: Decimal = Decimal(0)
    errors: Counter[str] = field(default_factory=Counter)
    e2e: Reservoir = field(default_factory=Reservoir)
    ttft: Reservoir = field(default_factory=Reservoir)
    tpot: Reservoir = field(default_factory=Reservoir)
    # The window: counts per whole second (exact however fast the provider is), and the latest
    # successes' latencies for percentiles (enough for p99, cheap at four snapshots a second).
    seconds: deque[_Second] = field(default_factory=deque)
    latest: deque[tuple[float, float, float | None, float | None]] = field(
        default_factory=lambda: deque(maxlen=WINDOW_QUANTILE_SAMPLES)
    )
    recent_errors: deque[RecentError] = field(default_factory=lambda: deque(maxlen=20))

    def record(
        self,
        *,
        ok: bool,
        e2e: float,
        ttft: float | None,
        tokens: int,
        cost: Decimal,
        error: str | None = None,
        message: str = "",
        now: float | None = None,
    ) -> None:
        now = time.monotonic() if now is None else now
        self.requests += 1
        self.spent += cost
        tpot = (e2e - ttft) / (tokens - 1) if ok and ttft is not None and tokens > 1 else None
        if ok:
            self.ok += 1
            self.output_tokens += tokens
            self.e2e.add(e2e)
            if ttft is not None:
                self.ttft.add(ttft)
            if tpot is not None:
                self.tpot.add(tpot)
        else:
            self.errors[error or "unknown"] += 1
            self.recent_errors.append({"ts": time.time(), "class": error, "message": message[:200]})
        second = int(now)
        seconds = self.seconds
        if seconds and seconds[-1].second == second:
            bucket = seconds[-1]
        else:
            bucket = _Second(second)
            seconds.append(bucket)
            self._trim(now)
        bucket.requests += 1
        bucket.spent += cost
        if ok:
            bucket.ok += 1
            bucket.tokens += tokens
            self.latest.append((now, e2e, ttft, tpot))
        else:
            if bucket.errors is None:
                bucket.errors = Counter()
            bucket.errors[error or "unknown"] += 1

    def adjust_cost(self, delta: Decimal) -> None:
        """A cost estimate replaced by the billed amount."""
        self.spent += delta

    def _trim(self, now: float) -> None:
        # A second belongs to the window while any of it is younger than window_s.
        first = int(now - self.window_s) + 1
        seconds = self.seconds
        while seconds and seconds[0].second < first:
            seconds.popleft()

    def window(self, now: float, span_s: float) -> RouteWindow:
        self._trim(now)
        requests = ok = tokens = 0
        spent = Decimal(0)
        errors: Counter[str] = Counter()
        for bucket in self.seconds:
            requests += bucket.requests
            ok += bucket.ok
            tokens += bucket.tokens
            spent += bucket.spent
            if bucket.errors:
                errors.update(bucket.errors)
        horizon = now - self.window_s
        latest = [sample for sample in self.latest if sample[0] >= horizon]
        return {
            "requests": requests,
            "ok": ok,
            "errors": dict(errors),
            "error_share": (requests - ok) / requests if requests else 0.0,
            "output_tokens_per_s": tokens / span_s if span_s > 0 else 0.0,
            "e2e_s": _quantiles([s[1] for s in latest]),
            "ttft_s": _quantiles([s[2] for s in latest if s[2] is not None]),
            "tpot_s": _quantiles([s[3] for s in latest if s[3] is not None]),
            "spent": float(spent),
        }

    def run_view(self) -> RouteRun:
        return {
            "requests": self.requests,
            "ok": self.ok,
            "errors": dict(self.errors),
            "output_tokens": self.output_tokens,
            "spent": float(self.spent),
            "e2e_s": _quantiles(self.e2e.values),
            "ttft_s": _quantiles(self.ttft.values),
            "tpot_s": _quantiles(self.tpot.values),
            "cost_per_m_output": float(self.spent) / self.output_tokens * 1e6 if self.output_tokens else None,
        }


def status_word(
    *,
    excluded: bool,
    drift: bool = False,
    window_requests: int,
    error_share: float,
    latency_p50_s: float | None,
    ok: int,
    typical_p50_s: float | None,
    rules: StatusRules,
) -> str:
    """OK, SLOW, FAIL, DRIFT or EXCL: the one definition (the console shows the job's word). DRIFT:
    the route's answers are not the others' (engine/job/fidelity.py), whatever its speed."""
    if excluded:
        return "EXCL"
    if drift:
        return "DRIFT"
    if window_requests >= rules.min_samples and error_share >= rules.fail_error_share:
        return "FAIL"
    if (
        typical_p50_s is not None
        and latency_p50_s is not None
        and ok >= rules.min_samples
        and latency_p50_s > rules.slow_factor * typical_p50_s
    ):
        return "SLOW"
    return "OK"


def typical_latency(rows: Iterable[Mapping[str, Any]], rules: StatusRules) -> float | None:
    """The median of the routes' median latencies, over routes with enough samples."""
    medians = sorted(
        float(r["latency_p50_s"])
        for r in rows
        if r.get("latency_p50_s") is not None and int(r.get("ok") or 0) >= rules.min_samples
    )
    return percentile(medians, 0.5)


def route_views(
    routes: dict[str, ProviderStats],
    known: Sequence[RouteView],
    *,
    now: float,
    elapsed_s: float,
    in_flight: Counter[str],
    route_id: Callable[[str], str],
    excluded: Container[str],
    rules: StatusRules,
    fidelity: Callable[[str], FidelityView | None] | None = None,
) -> list[ProviderView]:
    """One row per route for snapshots: every route the backend knows (allowed or kept out, with the
    reason) and every one that served; whole-run and window figures, and a status word."""
    total = sum(p.requests for p in routes.values())
    by_name = {r["name"]: r for r in known}
    names = sorted(set(by_name) | set(routes))
    rows: list[ProviderView] = []
    for name in names:
        stats = routes.get(name) or ProviderStats(name)
        info = by_name.get(name)
        slug = info["slug"] if info is not None else route_id(name)
        span = min(stats.window_s, max(elapsed_s, 1.0))
        window = stats.window(now, span)
        run = stats.run_view()
        enough = window["ok"] >= rules.min_samples
        latency = window["e2e_s"] if enough else run["e2e_s"]
        ttft = window["ttft_s"] if enough else run["ttft_s"]
        tpot = window["tpot_s"] if enough else run["tpot_s"]
        rows.append(
            {
                "name": name,
                "slug": slug,
                "excluded": slug in excluded,
                "allowed": info["allowed"] if info is not None else slug not in excluded,
                "kept_out": info["kept_out"] if info is not None else None,
                "reason": info["reason"] if info is not None else None,
                "precision": info["precision"] if info is not None else None,
                "prompt_price_per_m": info["prompt_per_m"] if info is not None else None,
                "completion_price_per_m": info["completion_per_m"] if info is not None else None,
                "requests": stats.requests,
                "ok": stats.ok,
                "share": stats.requests / total if total else 0.0,
                "in_flight": in_flight.get(name, 0),
                "output_tokens": stats.output_tokens,
                "spent": float(stats.spent),
                "errors": dict(stats.errors),
                "throttled": stats.errors.get("rate_limited", 0),
                "latency_p50_s": latency["p50"],
                "latency_p95_s": latency["p95"],
                "latency_p99_s": latency["p99"],
                "ttft_p50_s": ttft["p50"],
                "ttft_p95_s": ttft["p95"],
                "ttft_p99_s": ttft["p99"],
                "tpot_s": tpot["p50"],
                "output_tokens_per_s": window["output_tokens_per_s"],
                "cost_per_m_output": run["cost_per_m_output"],
                "recent_errors": list(stats.recent_errors),
                "window": window,
                "run": run,
                "status": "OK",
                "fidelity": None if fidelity is None else fidelity(name),
            }
        )
    judge(rows, rules)
    return rows


def judge(rows: Sequence[ProviderView], rules: StatusRules) -> None:
    """Set every row's status word, against the typical latency of the rows together."""
    typical = typical_latency(rows, rules)
    for row in rows:
        # A route the settings keep out never serves; it shows as EXCL with its reason.
        row["status"] = status_word(
            excluded=row["excluded"] or not row["allowed"],
            drift=_drifting(row),
            window_requests=row["window"]["requests"],
            error_share=row["window"]["error_share"],
            latency_p50_s=row["latency_p50_s"],
            ok=row["ok"],
            typical_p50_s=typical,
            rules=rules,
        )


def _drifting(row: ProviderView) -> bool:
    fidelity = row.get("fidelity")
    return fidelity is not None and fidelity["state"] == "drift"


@dataclass(slots=True)
class Counters:
    """Totals since this process started."""

    attempts: int = 0
    rows: int = 0
    output_tokens: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    # Requests refused as bad in a row: with no row at all, the settings are wrong, not the prompts.
    refusal_streak: int = 0


class JobStats:
    """The job's folds: totals, rates and one ProviderStats per route."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.counters = Counters()
        self.routes: dict[str, ProviderStats] = {}
        self.tokens_rate = RateMeter()
        self.rows_rate = RateMeter()
        self.attempts_rate = RateMeter()
        self.spend_rate = RateMeter(window_s=60)

    def route(self, name: str | None) -> ProviderStats | None:
        """The statistics of a route, made on first sight; None for an attempt that named none."""
        if not name:
            return None
        stats = self.routes.get(name)
        if stats is None:
            stats = self.routes[name] = ProviderStats(name, window_s=self.window_s)
        return stats
