"""The report's time bins and latency histograms (engine/run/report_data.py): bounded however long
the run, nothing lost when they widen, percentiles within the histogram's promise."""

from __future__ import annotations

import itertools
import math
import random
import statistics

from regen.engine.run.report_data import MAX_BINS, Bins, Latency

WEEK_S = 7 * 24 * 3600.0


def test_a_weeks_records_fit_the_bins_and_every_amount_is_kept() -> None:
    rng = random.Random(4)
    bins = Bins(2)
    start = 1_796_119_200.0
    added = [0.0, 0.0]
    # Mostly in order, as a journal is, with some records a few seconds behind the last.
    for n in range(200_000):
        ts = start + n * WEEK_S / 200_000 - rng.uniform(0, 5)
        column = n % 2
        amount = rng.uniform(0, 3)
        bins.add(ts, column, amount)
        added[column] += amount
    assert bins.high - bins.low < MAX_BINS
    # Widened by doubling from a second: a power of two, and just wide enough.
    assert math.log2(bins.width_s).is_integer() and WEEK_S / MAX_BINS <= bins.width_s < 2 * WEEK_S / MAX_BINS
    for column in (0, 1):
        starts, values = bins.series(column)
        assert abs(sum(values) - added[column]) < 1e-6 * added[column]
        assert all(abs(b - a - bins.width_s) < 1e-6 for a, b in itertools.pairwise(starts))
        assert starts[0] <= start and starts[-1] + bins.width_s > start + WEEK_S - 5


def test_an_instant_lands_in_the_bin_that_spans_it() -> None:
    bins = Bins(1)
    for ts in (100.0, 100.5, 101.0, 99.0, 103.9):
        bins.add(ts, 0, 1)
    starts, values = bins.series(0)
    assert list(zip(starts, values, strict=True)) == [
        (99.0, 1),
        (100.0, 2),
        (101.0, 1),
        (102.0, 0),
        (103.0, 1),
    ]


def test_latency_percentiles_read_from_the_histogram_are_within_six_percent() -> None:
    rng = random.Random(9)
    times = [rng.lognormvariate(0.5, 0.8) for _ in range(20_000)]
    latency = Latency()
    for seconds in times:
        latency.e2e[Latency.bin(seconds)] += 1
    exact = statistics.quantiles(times, n=100)
    for q in (5, 25, 50, 75, 95):
        read = Latency.quantile(latency.e2e, q / 100)
        assert read is not None and abs(read / exact[q - 1] - 1) < 0.065, (q, read, exact[q - 1])
    assert Latency.quantile([0] * len(latency.e2e), 0.5) is None
    assert Latency.bin(0.0) == 0 and Latency.bin(1e9) == len(latency.e2e) - 1
