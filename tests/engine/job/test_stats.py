"""Per-provider windows: exact counts at any rate, percentiles from the latest successes."""

from __future__ import annotations

from decimal import Decimal

from regen.engine.job.stats import WINDOW_QUANTILE_SAMPLES, ProviderStats


def test_the_window_counts_every_attempt_however_fast_they_come() -> None:
    stats = ProviderStats("Fast")
    # 40,000 attempts over 20 s: far more than any sample buffer holds.
    for k in range(40_000):
        now = 1000.0 + k * 0.0005
        stats.record(
            ok=k % 10 != 0,
            e2e=0.5,
            ttft=0.1,
            tokens=100,
            cost=Decimal("0.001"),
            error="rate_limited",
            now=now,
        )
    window = stats.window(1020.0, span_s=20.0)
    assert window["requests"] == 40_000
    assert window["ok"] == 36_000
    assert window["errors"] == {"rate_limited": 4_000}
    assert window["output_tokens_per_s"] == 36_000 * 100 / 20.0
    assert window["spent"] == 40.0
    assert window["e2e_s"]["p50"] == 0.5


def test_old_seconds_leave_the_window_and_percentiles_follow_the_latest() -> None:
    stats = ProviderStats("P", window_s=60.0)
    for k in range(100):
        stats.record(ok=True, e2e=9.0, ttft=1.0, tokens=10, cost=Decimal(0), now=100.0 + k * 0.01)
    for k in range(WINDOW_QUANTILE_SAMPLES):
        stats.record(ok=True, e2e=1.0, ttft=0.2, tokens=10, cost=Decimal(0), now=200.0 + k * 0.001)
    window = stats.window(201.0, span_s=60.0)
    assert window["requests"] == WINDOW_QUANTILE_SAMPLES  # the attempts at t=100 are older than 60 s
    assert window["e2e_s"] == {"p50": 1.0, "p95": 1.0, "p99": 1.0}
    assert stats.run_view()["requests"] == 100 + WINDOW_QUANTILE_SAMPLES
    empty = stats.window(400.0, span_s=60.0)
    assert empty["requests"] == 0 and empty["e2e_s"]["p50"] is None
