"""Provider fidelity's statistics (docs/fidelity.md): the two-sample tests on known counts, the
fingerprint's error rate on honest routes and its power on a drifting one, and the audit's comparison
in ids. No job runs here; tests/integration/job/test_fidelity.py runs them."""

from __future__ import annotations

import random
from typing import Any

from regen.engine.backends.openrouter.audit import compare
from regen.engine.data.idcompare import common_prefix, majority
from regen.engine.data.idcompare import similarity as id_similarity
from regen.engine.job.fidelity import FidelityMonitor, Fingerprint, leaks, length_bin, offset_test
from regen.engine.job.twosample import chi2_sf, events, histograms, similarity


def test_the_chi_square_tail_matches_its_tables() -> None:
    assert abs(chi2_sf(3.841458820694124, 1) - 0.05) < 1e-12
    assert abs(chi2_sf(18.307038053275146, 10) - 0.05) < 1e-12
    assert abs(chi2_sf(0.5, 3) - 0.918891411654676) < 1e-12
    assert abs(chi2_sf(100.0, 4) - 1.0e-20) < 1e-21  # far in the tail the continued fraction holds
    assert chi2_sf(0.0, 3) == 1.0


def test_histograms_merge_sparse_bins_and_measure_the_distance() -> None:
    same = histograms([50, 50, 0, 1], [500, 500, 0, 9])
    assert same.p > 0.5 and same.effect < 0.01 and same.df == 1  # the sparse tail merged into its neighbour
    apart = histograms([90, 10], [500, 500])
    assert apart.p < 1e-12 and abs(apart.effect - 0.4) < 1e-12
    assert histograms([0, 0], [5, 5]).p == 1.0


def test_the_events_test_is_exact_for_rare_events_and_symmetric() -> None:
    # 3 events in all, all in the route that holds 1/10 of the answers: (1/10)^3 twice.
    assert abs(events(3, 100, 0, 900).p - 2 * 0.1**3) < 1e-12
    assert events(5, 100, 50, 1000).p == 1.0  # the same rate
    assert events(0, 100, 0, 900).p == 1.0
    many = events(3000, 10000, 2000, 10000)  # the normal approximation, far past the exact sum's reach
    assert many.p < 1e-30 and abs(many.effect - 0.1) < 1e-12


def test_finish_similarity_is_one_minus_the_total_variation() -> None:
    assert similarity([90, 10, 0, 0], [100, 0, 0, 0]) == 0.9
    assert similarity([0, 0, 0, 0], [1, 0, 0, 0]) is None


def test_lengths_fall_in_quarter_octave_bins_and_leaks_are_looked_for_at_the_ends() -> None:
    assert [length_bin(n) for n in (0, 7, 8, 9, 10, 12, 15, 16, 31, 32)] == [
        0,
        7,
        8,
        8,
        9,
        10,
        11,
        12,
        15,
        16,
    ]
    assert length_bin(1 << 40) == 95
    assert leaks("text<|im_end|>") and leaks("</think>the answer") and not leaks("a plain answer")
    assert leaks("x" * 1000 + "<|im_end|>") and not leaks("x" * 300 + "<|" + "x" * 300)


def honest(rng: random.Random) -> dict[str, Any]:
    n = rng.randint(20, 60)
    return {
        "finish_reason": "stop" if rng.random() > 0.02 else "length",
        "output_tokens": n,
        "reasoning_tokens": n // 3,
        "content": "An answer.",
        "reasoning": "Thinking.",
        "truncated": False,
        "degenerate": rng.random() < 0.01,
    }


def test_honest_routes_are_not_flagged_over_many_looks() -> None:
    rng = random.Random(7)
    monitor = FidelityMonitor(alpha=1e-3)
    for _ in range(20_000):
        route = f"p{rng.randrange(8)}"
        assert monitor.observe("openrouter", route, **honest(rng)) is None
    views = [monitor.view("openrouter", f"p{i}") for i in range(8)]
    assert all(v is not None and v["state"] == "ok" and v["looks"] >= 90 for v in views)


def test_a_route_whose_lengths_drift_is_flagged_with_its_evidence() -> None:
    rng = random.Random(8)
    monitor = FidelityMonitor(alpha=1e-3)
    flagged = None
    for i in range(6000):
        route = f"p{i % 9}"
        answer = honest(rng)
        if route == "p8":
            answer["output_tokens"] = int(answer["output_tokens"] * 1.3)
        drift = monitor.observe("openrouter", route, **answer)
        if drift is not None:
            flagged = flagged or drift
    assert flagged is not None and flagged.route == "p8" and flagged.statistic == "output_len"
    assert flagged.responses <= 300
    view = monitor.view("openrouter", "p8")
    assert view is not None and view["state"] == "drift" and view["against"] == "pool"
    assert "output_len: mean" in (view["evidence"] or "")
    assert all(monitor.view("openrouter", f"p{i}")["state"] == "ok" for i in range(8))  # type: ignore[index]


def test_the_gpu_fleet_is_the_reference_when_it_has_answered_enough() -> None:
    monitor = FidelityMonitor(min_reference=10)
    for _ in range(10):
        monitor.observe(
            "sglang",
            "http://gpu:30000",
            finish_reason="stop",
            output_tokens=40,
            reasoning_tokens=None,
            content="x",
            reasoning="",
            truncated=False,
            degenerate=False,
        )
    against, reference = monitor.reference("openrouter", "Together")
    assert against == "sglang" and reference.n == 10
    against, reference = monitor.reference("sglang", "http://gpu:30000")
    assert against is None and reference == Fingerprint()  # a worker alone has no one to compare with


def test_the_audit_compares_answers_in_ids_by_prefix_and_similarity_against_the_majority() -> None:
    assert common_prefix([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert common_prefix([], [1]) == 0 and common_prefix([5, 6], [5, 6, 7]) == 2
    assert id_similarity([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert id_similarity([1, 2, 3, 4], [1, 2, 9, 4]) == 0.75  # 2 x 3 matched of 8
    assert id_similarity([1, 2], [3, 4]) == 0.0 and id_similarity([], []) == 1.0
    assert majority([[1, 2, 3], [1, 2, 9], [1, 2, 3]]) == 0 and majority([]) is None
    report = compare({"A": [[1, 2, 3, 4]], "B": [[1, 2, 3, 4]], "C": [[1, 7, 8, 9]], "D": [None]}, 1)
    rows = {row["provider"]: row for row in report["providers"]}
    assert rows["A"]["verdict"] == rows["B"]["verdict"] == "same" and rows["A"]["prefix_median"] == 4
    assert rows["C"]["verdict"] == "differs" and rows["C"]["prefix_median"] == 1
    assert rows["C"]["similarity_mean"] == 0.25 and rows["D"]["verdict"] == "no answers"


def test_the_offset_test_is_certain_without_spread_and_a_z_test_with_it() -> None:
    # 100 answers all 12 tokens over: no spread, so the difference is certain; the same as the
    # reference: nothing at all.
    assert offset_test(100, 1200, 14_400, 0.0).p == 0.0 and offset_test(100, 1200, 14_400, 0.0).effect == 12
    assert offset_test(100, 1200, 14_400, 12.0).p == 1.0
    # Offsets 0 and 2 in equal numbers: mean 1, sd about 1; 1 token off the reference is z = 10.
    result = offset_test(100, 100, 200, 0.0)
    assert result.effect == 1.0 and 0 < result.p < 1e-20
    assert offset_test(100, 100, 200, 0.9).p > 0.3


def _parity_run(rng: random.Random, offsets: dict[str, int], n: int, fleet: int = 0) -> FidelityMonitor:
    monitor = FidelityMonitor(alpha=1e-3)
    for _ in range(fleet):
        monitor.observe("sglang", "gpu:30000", **honest(rng))
        monitor.observe_prompt("sglang", "gpu:30000", 50, 50)  # a server counts what it was sent
    for _ in range(n):
        route = f"p{rng.randrange(8)}"
        monitor.observe("openrouter", route, **honest(rng))
        counted = rng.randint(20, 400)
        # Honest providers count the same rendered prompt, give or take their own few tokens.
        reported = counted + rng.choice((0, 0, 0, 1, 2)) + offsets.get(route, 0)
        monitor.observe_prompt("openrouter", route, reported, counted)
        monitor.observe_prompt("openrouter", "never-observed", reported, counted)  # ignored
    return monitor


def test_honest_prompt_token_counts_are_not_flagged() -> None:
    monitor = _parity_run(random.Random(11), {}, 12_000)
    for i in range(8):
        view = monitor.view("openrouter", f"p{i}")
        assert view is not None and view["state"] == "ok"
        assert any(s["name"] == "prompt_tokens" for s in view["stats"])
    assert monitor.view("openrouter", "never-observed") is None


def test_a_route_on_another_template_is_flagged_by_its_prompt_token_offset_against_its_lane() -> None:
    # p3 renders a system prompt of its own: 12 tokens more on every prompt. The GPU fleet is the
    # reference for the rest, but its offsets are 0 by construction: parity is the lane's.
    monitor = _parity_run(random.Random(12), {"p3": 12}, 3000, fleet=200)
    view = monitor.view("openrouter", "p3")
    assert view is not None and view["state"] == "drift" and view["statistic"] == "prompt_tokens"
    assert view["against"] == "sglang"
    evidence = view["evidence"] or ""
    assert evidence.startswith("prompt_tokens: mean offset +12.") and "(routes, " in evidence
    assert all(monitor.view("openrouter", f"p{i}")["state"] == "ok" for i in range(8) if i != 3)  # type: ignore[index]
