"""Provider fidelity in real jobs against the simulators' impostors (docs/fidelity.md): flagged,
excluded, requeued, taken back by hand, audited; honest providers left be."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import orjson
import pytest

from regen.console.screens import fidelity_lines
from regen.engine.backends.openrouter.audit import plan_audit, run_audit
from regen.engine.config.settings import Settings, TokenizerSettings
from regen.engine.control.headless import status_line, summary_lines
from regen.engine.control.wire import encode
from regen.engine.data.tokenizer import TargetTokenizer
from regen.engine.job.job import StopReason
from regen.engine.run.recovery import read_journals, read_lanes
from regen.engine.schema import Snapshot
from regen.sim.openrouter.chat import estimate_prompt_tokens
from regen.sim.openrouter.server import OpenRouterSim
from tests.support.datasets import one_row_per_prompt, read_rows, write_dataset
from tests.support.jobs import openrouter, run_job
from tests.support.processes import run_regen, settings_file
from tests.support.schema_check import problems
from tests.support.sglang_sim import model_folder
from tests.support.tiktoken_model import build_tiktoken_tokenizer


async def test_an_impostor_provider_is_flagged_and_excluded_and_honest_ones_are_not(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    # Four fp8 providers; Together declares fp8 too, but serves another model.
    sim.config.impostor_providers = {"together": 0.2}
    sim.config.min_completion_tokens, sim.config.max_completion_tokens = 20, 60
    a = write_dataset(tmp_path, "A", 1200)
    only = {"only": ["together", "fireworks", "parasail", "baseten"], "sort": None}  # balanced by price
    job = await run_job(
        make_settings(sim.base_url, [a], concurrency=32, openrouter={"provider": only, "fidelity": "exclude"})
    )
    assert job.outcome is not None and job.outcome.reason is StopReason.DONE
    rows = one_row_per_prompt(a, 1200)
    served = {
        name: sum(1 for row in rows if row["provider"] == name)
        for name in ("Together", "Fireworks", "Parasail", "BaseTen")
    }
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
    settings = make_settings(
        sim.base_url, [a], concurrency=32, openrouter={"provider": only, "fidelity": "requeue"}
    )
    job = await run_job(settings)
    assert job.outcome is not None and job.outcome.reason is StopReason.DONE
    rows = one_row_per_prompt(a, 600)  # compacted at the end: the rows taken back are gone
    assert all(row["provider"] != "Together" for row in rows)
    quarantined = [orjson.loads(x) for x in (job.run_dir / "quarantine.jsonl").read_bytes().splitlines()]
    taken = [q for q in quarantined if q.get("requeued")]
    assert taken and all(
        q["provider"] == "Together" and q["quarantine_reason"].startswith("fidelity: ") for q in taken
    )
    # Nothing deleted: every answer Together gave is in quarantine.jsonl, as a row taken back or as
    # one that landed after the flag.
    assert all(q["provider"] == "Together" for q in quarantined)
    ledger = job.lanes[0].ledger
    assert ledger.spent == sim.billing.billed_total
    waste = job.snapshot()["lanes"][0]["money"]["waste"]
    assert waste["fidelity"]["amount"] > 0
    # Every answer Together gave is waste `fidelity`, those in flight when it was flagged too; the
    # useful spend is the rows kept, no more.
    breakdown = job.lanes[0].settler.breakdown
    assert float(breakdown.waste["fidelity"]) == pytest.approx(sum(q["cost"] for q in quarantined))
    assert float(breakdown.useful) == pytest.approx(sum(row["cost"] for row in rows if row["status"] == "ok"))
    # The journals say the same after the fact: the money, and its split.
    journal = read_journals(job.run_dir / "attempts.jsonl", job.run_dir / "events.jsonl")
    assert journal.spent == sim.billing.billed_total
    assert journal.breakdown.waste["fidelity"] == job.lanes[0].settler.breakdown.waste["fidelity"]
    assert sum(len(lines) for lines in journal.requeued.values()) == len(taken)
    # `regen report`'s one pass over both journals books the rows taken back as recovery does.
    [lane] = read_lanes(
        job.run_dir / "attempts.jsonl", job.run_dir / "events.jsonl", ["openrouter"], "openrouter"
    ).values()
    assert (lane.spent, lane.breakdown.waste, lane.requeued) == (
        journal.spent,
        journal.breakdown.waste,
        journal.requeued,
    )


async def test_regen_quarantine_takes_a_routes_rows_back_after_the_fact_and_the_next_run_redoes_them(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    a = write_dataset(tmp_path, "A", 200)
    only = {"only": ["together", "fireworks"], "sort": None}
    job = await run_job(
        make_settings(sim.base_url, [a], concurrency=16, openrouter={"provider": only, "fidelity": "off"})
    )
    assert job.outcome is not None and job.outcome.reason is StopReason.DONE
    served = sum(1 for row in one_row_per_prompt(a, 200) if row["provider"] == "Together")
    assert served > 0
    settings = settings_file(tmp_path, sim.base_url, [a])
    later = run_regen(
        "quarantine", "--settings", str(settings), "--route", "together", "--since", "2999-01-01T00:00Z"
    )
    assert later.returncode == 0 and "no rows of together" in later.stdout
    bad = run_regen("quarantine", "--settings", str(settings), "--route", "together", "--since", "yesterday")
    assert bad.returncode == 2 and "not a time: 'yesterday'" in bad.stderr
    done = run_regen("quarantine", "--settings", str(settings), "--route", "together")
    assert done.returncode == 0, done.stderr
    assert f"{served} rows of together moved to" in done.stdout
    left = read_rows(a)
    assert len(left) == 200 - served and all(row["provider"] != "Together" for row in left)
    quarantined = [orjson.loads(x) for x in (job.run_dir / "quarantine.jsonl").read_bytes().splitlines()]
    assert len(quarantined) == served and all(
        q["requeued"] and q["provider"] == "Together" for q in quarantined
    )
    again = run_regen("quarantine", "--settings", str(settings), "--route", "together")
    assert again.returncode == 0 and "no rows of together" in again.stdout  # nothing is taken twice
    # The next run sends those prompts again, elsewhere; the money stays the bill, split.
    job = await run_job(
        make_settings(sim.base_url, [a], concurrency=16, openrouter={"provider": {"only": ["fireworks"]}})
    )
    assert job.outcome is not None and job.outcome.reason is StopReason.DONE
    rows = one_row_per_prompt(a, 200)
    assert all(row["provider"] == "Fireworks" for row in rows)
    assert job.lanes[0].ledger.spent == sim.billing.billed_total
    journal = read_journals(job.run_dir / "attempts.jsonl", job.run_dir / "events.jsonl")
    assert journal.breakdown.waste["fidelity"] == sum(Decimal(str(q["cost"])) for q in quarantined)


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
    assert (
        len(plan.prompts) == 4 and plan.prompts == (await plan_audit(settings, 4, 7, 256)).prompts
    )  # seeded
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
    assert all(
        row["verdict"] == "same" and row["similarity_mean"] == 1.0
        for name, row in rows.items()
        if name != "Together"
    )
    assert Decimal(str(report["spent_usd"])) == sim.billing.billed_total - before <= plan.worst_usd
    # Its money is in the run's journal, so the next run's ledger counts it against the budget.
    journal = read_journals(settings.job.run_dir / "attempts.jsonl", settings.job.run_dir / "events.jsonl")
    assert (
        journal.spent == sim.billing.billed_total - before
        and journal.breakdown.waste["audit"] == journal.spent
    )


def test_regen_audit_refuses_without_the_target_tokenizer(sim_process: str, tmp_path: Path) -> None:
    settings = settings_file(tmp_path, sim_process, [write_dataset(tmp_path, "A", 5)])
    done = run_regen("audit", "--settings", str(settings))
    assert done.returncode == 2 and "tokenizer.path: empty" in done.stderr


async def test_a_provider_on_another_template_is_flagged_by_prompt_token_parity(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    """Every OpenRouter answer's usage.prompt_tokens against the reference tokenizer's count of the
    prompt regen rendered (docs/fidelity.md, "prompt_tokens"): Parasail counts 12 tokens more on every
    prompt (a system prompt of its own), and only it is flagged, on that statistic alone."""
    sim.config.prompt_token_offsets = {"parasail": 12}
    sim.config.min_completion_tokens, sim.config.max_completion_tokens = 20, 60
    a = write_dataset(tmp_path, "A", 800)
    only = {"only": ["together", "fireworks", "parasail", "baseten"], "sort": None}
    settings = make_settings(
        sim.base_url, [a], concurrency=32, openrouter={"provider": only, "fidelity": "warn"}
    )
    settings.tokenizer = TokenizerSettings(
        path=build_tiktoken_tokenizer(tmp_path / "Kimi-K2.5"), trust_remote_code=True, workers=1
    )
    job = await run_job(settings)
    assert job.outcome is not None and job.outcome.reason is StopReason.DONE
    events = [orjson.loads(x) for x in (job.run_dir / "events.jsonl").read_bytes().splitlines()]
    drifts = [e for e in events if e["event"] == "drift"]
    assert [(d["provider"], d["statistic"]) for d in drifts] == [("Parasail", "prompt_tokens")], drifts
    assert "mean offset" in drifts[0]["evidence"] and "(routes, " in drifts[0]["evidence"]
    for row in read_rows(a):
        messages = [
            {"role": "user", "content": f"A question {row['line']}: explain topic {row['line'] % 17}."}
        ]
        extra = 12 if row["provider"] == "Parasail" else 0
        assert row["usage"]["prompt_tokens"] == estimate_prompt_tokens(messages) + extra
        assert row["num_prompt_tokens"] == len(row["prompt_ids"]) > 0
    views = {p["name"]: p for p in job.snapshot()["lanes"][0]["providers"]}
    stats = {s["name"]: s for s in views["Parasail"]["fidelity"]["stats"]}  # type: ignore[index]
    assert stats["prompt_tokens"]["flagged"] and not any(
        s["flagged"] for name, s in stats.items() if name != "prompt_tokens"
    )
