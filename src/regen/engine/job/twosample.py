"""Two-sample tests cheap enough to run on counters while the job runs (docs/fidelity.md).

Both samples are counts already folded: a histogram (finish reasons, log-binned lengths) or a number
of events out of a number of answers. Nothing here keeps a response; a test costs a pass over a
histogram's few dozen bins, or over the few events of a rare flag.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Cells of the chi-square test are merged until each expects at least this many in either sample,
# where the chi-square law of the statistic holds (Cochran's rule).
MIN_EXPECTED = 5.0
# Past this many events in all, the binary test's normal approximation is exact enough and the
# exact sum would cost a pass over them.
EXACT_EVENTS_MAX = 2000


@dataclass(frozen=True, slots=True)
class Result:
    """One test's answer: the p-value and the effect it measured (what the floors compare)."""

    p: float
    effect: float  # total variation distance for histograms, difference of rates for events
    df: int = 0


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X chi-square with `df` degrees of freedom (the regularized upper gamma)."""
    if x <= 0 or df <= 0:
        return 1.0
    return _gamma_q(df / 2.0, x / 2.0)


def _gamma_q(a: float, x: float) -> float:
    """Q(a, x): the series below a + 1, the continued fraction above (Numerical Recipes 6.2)."""
    gln = math.lgamma(a)
    if x < a + 1.0:
        term = total = 1.0 / a
        ap = a
        for _ in range(500):
            ap += 1.0
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(-x + a * math.log(x) - gln))
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 500):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return min(1.0, math.exp(-x + a * math.log(x) - gln) * h)


def histograms(a: Sequence[int], b: Sequence[int]) -> Result:
    """Chi-square test of homogeneity of two histograms over the same ordered bins, neighbouring
    bins merged until every cell expects MIN_EXPECTED in both samples."""
    na, nb = sum(a), sum(b)
    if na == 0 or nb == 0:
        return Result(1.0, 0.0)
    total = na + nb
    small = min(na, nb) / total
    cells: list[tuple[int, int]] = []
    ca = cb = 0
    for x, y in zip(a, b, strict=True):
        ca += x
        cb += y
        if (ca + cb) * small >= MIN_EXPECTED:
            cells.append((ca, cb))
            ca = cb = 0
    if ca or cb:
        if cells:
            last = cells.pop()
            cells.append((last[0] + ca, last[1] + cb))
        else:
            cells.append((ca, cb))
    stat = 0.0
    tv = 0.0
    for x, y in cells:
        both = x + y
        ea = both * na / total
        eb = both * nb / total
        stat += (x - ea) ** 2 / ea + (y - eb) ** 2 / eb
        tv += abs(x / na - y / nb)
    df = len(cells) - 1
    return Result(chi2_sf(stat, df) if df > 0 else 1.0, tv / 2, df)


def events(a: int, na: int, b: int, nb: int) -> Result:
    """Two-sided test that a/na and b/nb are the same rate: exact given the events in all (the
    events fall to the first sample as Binomial(a + b, na / (na + nb)) when they are), the normal
    approximation when there are many."""
    if na == 0 or nb == 0:
        return Result(1.0, 0.0)
    effect = a / na - b / nb
    m = a + b
    if m == 0 or m == na + nb:
        return Result(1.0, effect)
    share = na / (na + nb)
    if m > EXACT_EVENTS_MAX:
        mean = m * share
        sd = math.sqrt(m * share * (1 - share))
        z = abs(a - mean) / sd
        return Result(min(1.0, math.erfc(z / math.sqrt(2))), effect)
    upper = _binomial_tail(a, m, share, up=True)
    lower = _binomial_tail(a, m, share, up=False)
    return Result(min(1.0, 2 * min(upper, lower)), effect)


def _binomial_tail(k: int, n: int, p: float, *, up: bool) -> float:
    """P(X >= k) (up) or P(X <= k) for X ~ Binomial(n, p), summed outward from k until the terms
    no longer count."""
    log_p, log_q = math.log(p), math.log1p(-p)
    lg_n1 = math.lgamma(n + 1)

    def term(i: int) -> float:
        return math.exp(lg_n1 - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q)

    total = 0.0
    i = k
    step = 1 if up else -1
    while 0 <= i <= n:
        t = term(i)
        total += t
        if t < total * 1e-17 and ((up and i > n * p) or (not up and i < n * p)):
            break
        i += step
    return min(1.0, total)


def similarity(a: Sequence[int], b: Sequence[int]) -> float | None:
    """1 - the total variation distance between two mixes (finish reasons): 1.0 when they are the
    same; a distribution's counterpart of K2 Vendor Verifier's finish-reason similarity (docs/fidelity.md)."""
    na, nb = sum(a), sum(b)
    if na == 0 or nb == 0:
        return None
    return 1.0 - sum(abs(x / na - y / nb) for x, y in zip(a, b, strict=True)) / 2
