"""Live fingerprints per route, and the tests that say a route serves another model (docs/fidelity.md).

Every answer that may become a row is folded, at settle time and for every backend alike, into its
route's fingerprint: counters only (finish reasons, log-binned output and reasoning lengths, thinking
that closes, degenerate, truncated, special-token leaks, refusals), so folding one costs a few
additions and no allocation. Every `look_every` answers of a route, it is compared with a reference:
the GPU fleet's answers when there are enough (the target's own weights), else the pool of the lane's
other routes not flagged themselves. Each statistic has the test that suits it (engine/job/twosample.py);
a route is flagged when one falls under alpha shared out over the statistics, the routes (Bonferroni)
and the looks (alpha-spending: look k gets 6 / (pi^2 k^2) of it), and its effect passes a floor, so an
honest route is flagged with probability at most alpha over the whole run however long it lasts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from regen.engine.job.twosample import Result, events, histograms, similarity
from regen.engine.schema import FidelityStat, FidelityView

FINISH_KINDS = ("stop", "length", "tool_calls")  # then "other"
FINISH_INDEX = {kind: i for i, kind in enumerate(FINISH_KINDS)}
OTHER_FINISH = len(FINISH_KINDS)
LENGTH_BINS = 96  # quarter-octave bins: lengths up to 2^23 tokens, the last bin holds the rest
STATISTICS = (
    "finish",
    "output_len",
    "reasoning_len",
    "thinking_closes",
    "degenerate",
    "truncated",
    "special_leaks",
    "refusals",
    "prompt_tokens",
)
# An answer that opens like these refuses (checked on the first characters only: no scan of the text).
REFUSAL_OPENINGS = (
    "I'm sorry",
    "I’m sorry",
    "I am sorry",
    "Sorry, ",
    "I can't help",
    "I can’t help",
    "I cannot help",
    "I cannot assist",
    "I can't assist",
    "I apologize",
)
# Special tokens that must never reach the text (the reasoning parser or detokenizer of an honest
# server keeps them out); looked for in the first and last LEAK_WINDOW characters only.
LEAK_MARKS = ("<|", "<think>", "</think>")
LEAK_WINDOW = 256
SGLANG = "sglang"


def length_bin(n: int) -> int:
    """Quarter-octave bin of a token count: exact below 8, then four bins per doubling."""
    if n < 8:
        return max(n, 0)
    bits = n.bit_length()
    return min(LENGTH_BINS - 1, 4 * bits + ((n >> (bits - 3)) & 3) - 8)


def leaks(text: str) -> bool:
    """A special token's text at either end of `text`. Every mark opens with "<", and most answers
    have none at their ends: those are done with in two finds, allocating nothing."""
    if text.find("<", 0, LEAK_WINDOW) >= 0 and _marks(text, 0, LEAK_WINDOW):
        return True
    tail = len(text) - LEAK_WINDOW
    return tail > 0 and text.find("<", tail) >= 0 and _marks(text, tail, len(text))


def _marks(text: str, start: int, end: int) -> bool:
    return any(text.find(mark, start, end) >= 0 for mark in LEAK_MARKS)


@dataclass(slots=True)
class Fingerprint:
    """One route's counters."""

    n: int = 0
    finish: list[int] = field(default_factory=lambda: [0] * (len(FINISH_KINDS) + 1))
    output: list[int] = field(default_factory=lambda: [0] * LENGTH_BINS)
    output_sum: int = 0
    reasoning: list[int] = field(default_factory=lambda: [0] * LENGTH_BINS)
    reasoning_n: int = 0  # answers whose reasoning length is known
    reasoning_sum: int = 0
    thinking: int = 0  # answers that reasoned
    closed: int = 0  # of those, answers whose thinking closed (an answer followed)
    degenerate: int = 0
    truncated: int = 0
    leaks: int = 0
    refusals: int = 0
    # Prompt-token parity: usage.prompt_tokens less the reference tokenizer's count of the prompt.
    prompt_n: int = 0  # answers whose prompt tokens both sides counted
    prompt_offset_sum: int = 0
    prompt_offset_squares: int = 0

    def add(self, other: Fingerprint, sign: int = 1) -> None:
        """Add (or with sign -1, take away) another fingerprint's counts."""
        self.n += sign * other.n
        self.finish = [a + sign * b for a, b in zip(self.finish, other.finish, strict=True)]
        self.output = [a + sign * b for a, b in zip(self.output, other.output, strict=True)]
        self.reasoning = [a + sign * b for a, b in zip(self.reasoning, other.reasoning, strict=True)]
        self.output_sum += sign * other.output_sum
        self.reasoning_n += sign * other.reasoning_n
        self.reasoning_sum += sign * other.reasoning_sum
        self.thinking += sign * other.thinking
        self.closed += sign * other.closed
        self.degenerate += sign * other.degenerate
        self.truncated += sign * other.truncated
        self.leaks += sign * other.leaks
        self.refusals += sign * other.refusals
        self.prompt_n += sign * other.prompt_n
        self.prompt_offset_sum += sign * other.prompt_offset_sum
        self.prompt_offset_squares += sign * other.prompt_offset_squares

    def copy(self) -> Fingerprint:
        out = Fingerprint()
        out.add(self)
        return out


@dataclass(frozen=True, slots=True)
class Drift:
    """A route flagged: what the job journals and acts on."""

    backend: str
    route: str
    statistic: str
    p: float
    threshold: float
    evidence: str
    responses: int


@dataclass(slots=True)
class RouteFidelity:
    fingerprint: Fingerprint = field(default_factory=Fingerprint)
    looks: int = 0
    against: str | None = None
    reference_n: int = 0
    threshold: float | None = None
    finish_similarity: float | None = None
    stats: list[FidelityStat] = field(default_factory=list)
    drift: Drift | None = None
    action: str | None = None


@dataclass(frozen=True, slots=True)
class Floors:
    """The smallest effects that count, whatever the p-value: with many answers a test finds any
    difference at all, and honest providers differ a little (docs/fidelity.md)."""

    histogram_tv: float = 0.05  # total variation distance of finish mixes and length histograms
    rate: float = 0.005  # difference of rates (degenerate, truncated, leaks, refusals, thinking)
    # Mean prompt-token offsets this many tokens apart: a system prompt of the provider's own is
    # tens; one BOS the target's template does not write is 1, and leaves the answers as they were.
    prompt_offset: float = 2.0


class FidelityMonitor:
    """Every route's fingerprint, for every lane of the job; one per job."""

    def __init__(
        self,
        *,
        alpha: float = 1e-3,
        look_every: int = 25,
        min_responses: int = 25,
        min_reference: int = 100,
        floors: Floors | None = None,
    ) -> None:
        self.alpha = alpha
        self.look_every = look_every
        self.min_responses = min_responses
        self.min_reference = min_reference
        self.floors = floors or Floors()
        self.routes: dict[str, dict[str, RouteFidelity]] = {}  # backend -> route -> its state
        # Each backend's routes summed as they fold, so a look's reference is a subtraction, not a sum.
        self.totals: dict[str, Fingerprint] = {}

    # ------------------------------------------------------------------------------------ folding

    def observe(
        self,
        backend: str,
        route: str,
        *,
        finish_reason: str | None,
        output_tokens: int,
        reasoning_tokens: int | None,
        content: str,
        reasoning: str,
        truncated: bool,
        degenerate: bool,
    ) -> Drift | None:
        """Fold one answer; at a look, test the route. Returns the Drift the first time it is flagged."""
        routes = self.routes.get(backend)
        if routes is None:
            routes = self.routes[backend] = {}
            self.totals[backend] = Fingerprint()
        state = routes.get(route)
        if state is None:
            state = routes[route] = RouteFidelity()
        finish = FINISH_INDEX.get(finish_reason, OTHER_FINISH)  # type: ignore[arg-type]
        output = length_bin(output_tokens)
        thinking = bool(reasoning or reasoning_tokens)
        closed = thinking and bool(content)
        leaked = leaks(content)
        refused = content.startswith(REFUSAL_OPENINGS)
        for fp in (state.fingerprint, self.totals[backend]):
            fp.n += 1
            fp.finish[finish] += 1
            fp.output[output] += 1
            fp.output_sum += output_tokens
            if reasoning_tokens is not None:
                fp.reasoning[length_bin(reasoning_tokens)] += 1
                fp.reasoning_n += 1
                fp.reasoning_sum += reasoning_tokens
            fp.thinking += thinking
            fp.closed += closed
            fp.degenerate += degenerate
            fp.truncated += truncated
            fp.leaks += leaked
            fp.refusals += refused
        n = state.fingerprint.n
        if n % self.look_every or n < self.min_responses:
            return None
        return self.look(backend, route)

    def observe_prompt(self, backend: str, route: str, reported: int | None, counted: int) -> None:
        """Fold one answer's prompt-token parity: what the route says it read (usage.prompt_tokens)
        against what the reference tokenizer counts in the prompt regen rendered (its prompt_ids).
        Folded once the row's ids are made, after `observe`; tested at the route's next look."""
        if reported is None or counted <= 0:
            return
        state = self.routes.get(backend, {}).get(route)
        if state is None:
            return  # only answers `observe` folded have parity
        offset = reported - counted
        for fp in (state.fingerprint, self.totals[backend]):
            fp.prompt_n += 1
            fp.prompt_offset_sum += offset
            fp.prompt_offset_squares += offset * offset

    # -------------------------------------------------------------------------------------- looks

    def reference(self, backend: str, route: str) -> tuple[str | None, Fingerprint]:
        """What a route is compared with: the GPU fleet's unflagged answers when there are enough
        (and the route is not one of them), else the lane's other unflagged routes."""
        if backend != SGLANG and SGLANG in self.totals:
            fleet = self._pool(SGLANG, None)
            if fleet.n >= self.min_reference:
                return SGLANG, fleet
        pool = self._pool(backend, route)
        return ("pool" if pool.n else None), pool

    def _pool(self, backend: str, leave_out: str | None) -> Fingerprint:
        """A backend's routes summed, less `leave_out` and every flagged route."""
        total = self.totals.get(backend)
        if total is None:
            return Fingerprint()
        pool = total.copy()
        for name, state in self.routes[backend].items():
            if name == leave_out or state.drift is not None:
                pool.add(state.fingerprint, -1)
        return pool

    def look(self, backend: str, route: str) -> Drift | None:
        state = self.routes[backend][route]
        against, ref = self.reference(backend, route)
        state.against, state.reference_n = against, ref.n
        if ref.n < self.min_reference:
            return None
        state.looks += 1
        family = max(2, len(self.routes[backend]))
        spent = self.alpha * 6 / (math.pi**2 * state.looks**2)
        threshold = spent / (family * len(STATISTICS))
        state.threshold = threshold
        fp = state.fingerprint
        state.finish_similarity = similarity(fp.finish, ref.finish)
        stats: list[FidelityStat] = []
        worst: tuple[float, FidelityStat, str, int] | None = None
        parity = self._parity_reference(backend, route)
        for name, result, value, reference, floor in self._tests(fp, ref, parity):
            by, by_n = ("routes", parity[1]) if name == "prompt_tokens" and parity else (against, ref.n)
            flagged = result is not None and result.p < threshold and abs(result.effect) >= floor
            stat: FidelityStat = {
                "name": name,
                "value": value,
                "reference": reference,
                "p": None if result is None else result.p,
                "effect": 0.0 if result is None else result.effect,
                "flagged": flagged,
            }
            stats.append(stat)
            if flagged and result is not None and (worst is None or result.p < worst[0]):
                worst = (result.p, stat, str(by), by_n)
        state.stats = stats
        if worst is None or state.drift is not None:
            return None
        p, stat, by, by_n = worst
        evidence = (
            f"{stat['name']}: {stat['value']} against {stat['reference']} ({by}, {by_n} answers); "
            f"p = {p:.1e} < {threshold:.1e} after {fp.n} answers"
        )
        state.drift = Drift(backend, route, stat["name"], p, threshold, evidence, fp.n)
        return state.drift

    def _parity_reference(self, backend: str, route: str) -> tuple[float, int] | None:
        """``(offset, answers)``: the median of the mean prompt-token offsets of the lane's other
        unflagged routes that have enough answers, and the answers behind them; None without any.
        The lane's and not the GPU fleet's, which counts what it was sent (its offset is 0 by
        construction and says nothing of how an honest provider counts); a median, so one route on
        another template among several does not move the others' reference as a pooled mean would."""
        means: list[float] = []
        answers = 0
        for name, state in self.routes[backend].items():
            fp = state.fingerprint
            if name == route or state.drift is not None or fp.prompt_n < self.min_responses:
                continue
            means.append(fp.prompt_offset_sum / fp.prompt_n)
            answers += fp.prompt_n
        if not means or answers < self.min_reference:
            return None
        means.sort()
        mid = len(means) // 2
        median = means[mid] if len(means) % 2 else (means[mid - 1] + means[mid]) / 2
        return median, answers

    def _tests(
        self, fp: Fingerprint, ref: Fingerprint, parity: tuple[float, int] | None
    ) -> list[tuple[str, Result | None, str, str, float]]:
        tv, rate = self.floors.histogram_tv, self.floors.rate
        rows: list[tuple[str, Result | None, str, str, float]] = [
            ("finish", histograms(fp.finish, ref.finish), _mix(fp.finish), _mix(ref.finish), tv),
            (
                "output_len",
                histograms(fp.output, ref.output),
                _mean(fp.output_sum, fp.n),
                _mean(ref.output_sum, ref.n),
                tv,
            ),
        ]
        if fp.reasoning_n and ref.reasoning_n:
            result = histograms(fp.reasoning, ref.reasoning)
            rows.append(
                (
                    "reasoning_len",
                    result,
                    _mean(fp.reasoning_sum, fp.reasoning_n),
                    _mean(ref.reasoning_sum, ref.reasoning_n),
                    tv,
                )
            )
        if fp.thinking and ref.thinking:
            open_a, open_b = fp.thinking - fp.closed, ref.thinking - ref.closed
            rows.append(
                (
                    "thinking_closes",
                    events(open_a, fp.thinking, open_b, ref.thinking),
                    _share(fp.closed, fp.thinking),
                    _share(ref.closed, ref.thinking),
                    rate,
                )
            )
        for name, a, b in (
            ("degenerate", fp.degenerate, ref.degenerate),
            ("truncated", fp.truncated, ref.truncated),
            ("special_leaks", fp.leaks, ref.leaks),
            ("refusals", fp.refusals, ref.refusals),
        ):
            rows.append((name, events(a, fp.n, b, ref.n), _share(a, fp.n), _share(b, ref.n), rate))
        if fp.prompt_n >= self.min_responses and parity is not None:
            rows.append(
                (
                    "prompt_tokens",
                    offset_test(fp.prompt_n, fp.prompt_offset_sum, fp.prompt_offset_squares, parity[0]),
                    _offset(fp.prompt_offset_sum / fp.prompt_n),
                    _offset(parity[0]),
                    self.floors.prompt_offset,
                )
            )
        return rows

    # ---------------------------------------------------------------------------------- the view

    def _state(self, backend: str, route: str) -> RouteFidelity | None:
        routes = self.routes.get(backend)
        return None if routes is None else routes.get(route)

    def drifted(self, backend: str, route: str) -> bool:
        state = self._state(backend, route)
        return state is not None and state.drift is not None

    def acted(self, backend: str, route: str, action: str) -> None:
        state = self._state(backend, route)
        if state is not None:
            state.action = action

    def view(self, backend: str, route: str) -> FidelityView | None:
        state = self._state(backend, route)
        if state is None:
            return None
        drift = state.drift
        return {
            "responses": state.fingerprint.n,
            "state": "drift" if drift is not None else ("ok" if state.looks else "learning"),
            "against": state.against,
            "reference_responses": state.reference_n,
            "looks": state.looks,
            "threshold": state.threshold,
            "finish_similarity": state.finish_similarity,
            "statistic": None if drift is None else drift.statistic,
            "evidence": None if drift is None else drift.evidence,
            "action": state.action,
            "stats": list(state.stats),
        }


def _mix(counts: Sequence[int]) -> str:
    total = sum(counts)
    if not total:
        return "-"
    names = (*FINISH_KINDS, "other")
    return " ".join(f"{name} {count / total:.0%}" for name, count in zip(names, counts, strict=True) if count)


def _mean(total: int, n: int) -> str:
    return f"mean {total / n:.0f} tokens" if n else "-"


def offset_test(n: int, total: int, squares: int, reference: float) -> Result:
    """The route's mean prompt-token offset against the reference's: a z test on the route's own
    spread (an honest route counting as the target does has none, so any difference is certain;
    the floor decides whether it counts). The effect is the difference of the means, in tokens."""
    mean = total / n
    effect = mean - reference
    variance = max(0.0, squares / n - mean * mean) * n / max(1, n - 1)
    if variance == 0.0:
        return Result(0.0 if effect else 1.0, effect)
    z = abs(effect) / math.sqrt(variance / n)
    return Result(min(1.0, math.erfc(z / math.sqrt(2))), effect)


def _offset(mean: float) -> str:
    return f"mean offset {mean:+.1f} tokens"


def _share(count: int, n: int) -> str:
    return f"{count / n:.1%}" if n else "-"
