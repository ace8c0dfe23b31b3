"""Provider fidelity (docs/fidelity.md): the two-sample tests on known counts, the fingerprint's
error rate on honest routes, and a real job against the simulator's impostor provider."""

from __future__ import annotations

import random
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

from regen.console.screens import fidelity_lines
from regen.engine.backends.openrouter.audit import compare, plan_audit, run_audit
from regen.engine.config.settings import Settings
from regen.engine.control.headless import status_line, summary_lines
from regen.engine.control.wire import encode
from regen.engine.data.idcompare import common_prefix, majority
from regen.engine.data.idcompare import similarity as id_similarity
from regen.engine.data.tokenizer import TargetTokenizer
from regen.engine.job.fidelity import FidelityMonitor, Fingerprint, leaks, length_bin
from regen.engine.job.job import StopReason
from regen.engine.job.twosample import chi2_sf, events, histograms, similarity
from regen.engine.run.recovery import read_journals
from regen.engine.schema import Snapshot
from regen.sim.openrouter.server import OpenRouterSim
from tests.support.datasets import one_row_per_prompt, read_rows, write_dataset
from tests.support.jobs import openrouter, run_job
from tests.support.processes import run_regen, settings_file
from tests.support.schema_check import problems
from tests.support.sglang_sim import model_folder


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
    assert [length_bin(n) for n in (0, 7, 8, 9, 10, 12, 15, 16, 31, 32)] == [0, 7, 8, 8, 9, 10, 11, 12, 15, 16]
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
        monitor.observe("sglang", "http://gpu:30000", finish_reason="stop", output_tokens=40, reasoning_tokens=None,
                        content="x", reasoning="", truncated=False, degenerate=False)
    against, reference = monitor.reference("openrouter", "Together")
    assert against == "sglang" and reference.n == 10
    against, reference = monitor.reference("sglang", "http://gpu:30000")
    assert against is None and reference == Fingerprint()  # a worker alone has no one to compare with


async def test_an_impostor_provider_is_flagged_and_excluded_and_honest_ones_are_not(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    # Four fp8 providers; Together declares fp8 too, but serves another model.
    sim.config.impostor_providers = {"together": 0.2}
    sim.config.min_completion_tokens, sim.config.max_completion_tokens = 20, 60
    a = write_dataset(tmp_path, "A", 1200)
    only = {"only": ["together", "fireworks", "parasail", "baseten"], "sort": None}  # balanced by price
    job = await run_job(make_settings(sim.base_url, [a], concurrency=32, openrouter={"provider": only, "fidelity": "exclude"}))
    assert job.outcome is not None and job.outcome.reason is StopReason.DONE
    rows = one_row_per_prompt(a, 1200)
    served = {name: sum(1 for row in rows if row["provider"] == name) for name in ("Together", "Fireworks", "Parasail", "BaseTen")}
    assert served["Together"] <= 330, served  # flagged within 300 of its answers (and those in flight)
    events = [orjson.loads(x) for x in (job.run_dir / "events.jsonl").read_bytes().splitlines()]
    drifts = [e for e in events if e["event"] == "drift"]
    assert [d["provider"] for d in drifts] == ["Together"] and drifts[0]["action"] == "exclude"
    assert drifts[0]["evidence"] and drifts[0]["p"] < drifts[0]["threshold"]
    assert any(e["event"] == "exclude" and e["source"] == "fidelity" for e in events)
    assert "together" in openrouter(job).excluded
    snap = job.snapshot()
    views = {p["name"]: p for p in snap["lanes"][0]["providers"]}
    assert views["Together"]["status"] == "EXCL"
    assert views["Together"]["fidelity"]["state"] == "drift"  # type: ignore[index]
    for name in ("Fireworks", "Parasail", "BaseTen"):
        fidelity = views[name]["fidelity"]
        assert fidelity is not None and fidelity["state"] == "ok" and views[name]["status"] == "OK"


async def test_a_warned_drift_shows_as_drift_in_the_snapshot_the_headless_lines_and_the_detail(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.impostor_providers = {"together": 0.3}
    sim.config.min_completion_tokens, sim.config.max_completion_tokens = 20, 60
    a = write_dataset(tmp_path, "A", 500)
    only = {"only": ["together", "fireworks", "parasail"], "sort": None}
    job = await run_job(make_settings(sim.base_url, [a], concurrency=32, openrouter={"provider": only}))
    assert job.outcome is not None and job.outcome.reason is StopReason.DONE
    one_row_per_prompt(a, 500)  # warned only: its rows stay rows
    snap = job.snapshot()
    assert not problems(snap, Snapshot)
    encode(snap)
    views = {p["name"]: p for p in snap["lanes"][0]["providers"]}
    together = views["Together"]
    assert together["status"] == "DRIFT" and not together["excluded"]
    fidelity = together["fidelity"]
    assert fidelity is not None and fidelity["action"] == "warn" and fidelity["statistic"] is not None
    assert any(stat["flagged"] for stat in fidelity["stats"])
    assert "DRIFT Together" in status_line(snap)
    summary = "\n".join(summary_lines(snap, job.outcome))
    assert f"DRIFT Together (warn): {fidelity['evidence']}" in summary
    detail = fidelity_lines(together)
    assert "fidelity      DRIFT:" in detail and "evidence" in detail and " ✗" in detail
    assert "fidelity      ok:" in fidelity_lines(views["Fireworks"])
    assert fidelity_lines(views["Novita"]) == ""  # never served: no fingerprint


async def test_requeued_rows_end_as_one_row_per_prompt_with_spend_equal_to_the_bill(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.impostor_providers = {"together": 0.3}
    sim.config.min_completion_tokens, sim.config.max_completion_tokens = 20, 60
    a = write_dataset(tmp_path, "A", 600)
    only = {"only": ["together", "fireworks", "parasail"], "sort": None}
    settings = make_settings(sim.base_url, [a], concurrency=32, openrouter={"provider": only, "fidelity": "requeue"})
    job = await run_job(settings)
    assert job.outcome is not None and job.outcome.reason is StopReason.DONE
    rows = one_row_per_prompt(a, 600)  # compacted at the end: the rows taken back are gone
    assert all(row["provider"] != "Together" for row in rows)
    quarantined = [orjson.loads(x) for x in (job.run_dir / "quarantine.jsonl").read_bytes().splitlines()]
    taken = [q for q in quarantined if q.get("requeued")]
    assert taken and all(q["provider"] == "Together" and q["quarantine_reason"].startswith("fidelity: ") for q in taken)
    # Nothing deleted: every answer Together gave is in quarantine.jsonl, as a row taken back or as
    # one that landed after the flag.
    assert all(q["provider"] == "Together" for q in quarantined)
    ledger = job.lanes[0].ledger
    assert ledger.spent == sim.billing.billed_total
    waste = job.snapshot()["lanes"][0]["money"]["waste"]
    assert waste["fidelity"]["amount"] > 0
    # The journals say the same after the fact: the money, and its split.
    journal = read_journals(job.run_dir / "attempts.jsonl", job.run_dir / "events.jsonl")
    assert journal.spent == sim.billing.billed_total
    assert journal.breakdown.waste["fidelity"] == job.lanes[0].settler.breakdown.waste["fidelity"]
    assert sum(len(lines) for lines in journal.requeued.values()) == len(taken)


async def test_regen_quarantine_takes_a_routes_rows_back_after_the_fact_and_the_next_run_redoes_them(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    a = write_dataset(tmp_path, "A", 200)
    only = {"only": ["together", "fireworks"], "sort": None}
    job = await run_job(make_settings(sim.base_url, [a], concurrency=16, openrouter={"provider": only, "fidelity": "off"}))
    assert job.outcome is not None and job.outcome.reason is StopReason.DONE
    served = sum(1 for row in one_row_per_prompt(a, 200) if row["provider"] == "Together")
    assert served > 0
    settings = settings_file(tmp_path, sim.base_url, [a])
    later = run_regen("quarantine", "--settings", str(settings), "--route", "together", "--since", "2999-01-01T00:00Z")
    assert later.returncode == 0 and "no rows of together" in later.stdout
    bad = run_regen("quarantine", "--settings", str(settings), "--route", "together", "--since", "yesterday")
    assert bad.returncode == 2 and "not a time: 'yesterday'" in bad.stderr
    done = run_regen("quarantine", "--settings", str(settings), "--route", "together")
    assert done.returncode == 0, done.stderr
    assert f"{served} rows of together moved to" in done.stdout
    left = read_rows(a)
    assert len(left) == 200 - served and all(row["provider"] != "Together" for row in left)
    quarantined = [orjson.loads(x) for x in (job.run_dir / "quarantine.jsonl").read_bytes().splitlines()]
    assert len(quarantined) == served and all(q["requeued"] and q["provider"] == "Together" for q in quarantined)
    again = run_regen("quarantine", "--settings", str(settings), "--route", "together")
    assert again.returncode == 0 and "no rows of together" in again.stdout  # nothing is taken twice
    # The next run sends those prompts again, elsewhere; the money stays the bill, split.
    job = await run_job(make_settings(sim.base_url, [a], concurrency=16, openrouter={"provider": {"only": ["fireworks"]}}))
    assert job.outcome is not None and job.outcome.reason is StopReason.DONE
    rows = one_row_per_prompt(a, 200)
    assert all(row["provider"] == "Fireworks" for row in rows)
    assert job.lanes[0].ledger.spent == sim.billing.billed_total
    journal = read_journals(job.run_dir / "attempts.jsonl", job.run_dir / "events.jsonl")
    assert journal.breakdown.waste["fidelity"] == sum(Decimal(str(q["cost"])) for q in quarantined)


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


async def test_the_audit_plans_its_cost_then_finds_the_impostor_in_token_ids(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.impostor_providers = {"together": 0.0}
    sim.config.impostor_prefix_tokens = 24
    sim.config.min_completion_tokens, sim.config.max_completion_tokens = 100, 200
    a = write_dataset(tmp_path, "A", 50)
    settings = make_settings(sim.base_url, [a], budget_usd=1.0)
    settings.tokenizer.path = model_folder(tmp_path / "model")
    plan = await plan_audit(settings, 4, 7, 256)
    assert len(plan.prompts) == 4 and plan.prompts == (await plan_audit(settings, 4, 7, 256)).prompts  # seeded
    names = {e.provider_name for e in plan.providers}
    assert "Together" in names and "DeepInfra" not in names  # allowed providers only (fp4 is kept out)
    assert plan.fits and 0 < plan.worst_usd < 1
    tight = make_settings(sim.base_url, [a], budget_usd=1e-6)
    assert not (await plan_audit(tight, 4, 7, 256)).fits
    before = sim.billing.billed_total
    tokenizer = TargetTokenizer.from_settings(settings.tokenizer, path=settings.tokenizer.path)
    report = await run_audit(settings, plan, tokenizer.encode)
    rows = {row["provider"]: row for row in report["providers"]}
    assert rows["Together"]["verdict"] == "differs"
    assert 0 < rows["Together"]["prefix_median"] < 100  # the reference's first words, then another text
    assert all(row["verdict"] == "same" and row["similarity_mean"] == 1.0 for name, row in rows.items() if name != "Together")
    assert Decimal(str(report["spent_usd"])) == sim.billing.billed_total - before <= plan.worst_usd
    # Its money is in the run's journal, so the next run's ledger counts it against the budget.
    journal = read_journals(settings.job.run_dir / "attempts.jsonl", settings.job.run_dir / "events.jsonl")
    assert journal.spent == sim.billing.billed_total - before and journal.breakdown.waste["audit"] == journal.spent


def test_regen_audit_refuses_without_the_target_tokenizer(sim_process: str, tmp_path: Path) -> None:
    settings = settings_file(tmp_path, sim_process, [write_dataset(tmp_path, "A", 5)])
    done = run_regen("audit", "--settings", str(settings))
    assert done.returncode == 2 and "tokenizer.path: empty" in done.stderr
