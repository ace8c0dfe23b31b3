"""Providers and money against the simulator: catalog, precision guard, credits, statistics, exact spend."""

from __future__ import annotations

import json
import random
import subprocess
import urllib.request
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import orjson

from regen.engine.config.settings import Settings
from regen.engine.job.job import Job, StopReason
from regen.engine.run.recovery import read_journals
from regen.engine.schema import ProviderView
from regen.sim.openrouter.server import OpenRouterSim
from tests.support.datasets import one_row_per_prompt, read_rows, write_dataset
from tests.support.jobs import openrouter, run_job
from tests.support.processes import ENV, kill_at_random_moments, regen_argv, settings_file


def figure(view: ProviderView, key: str) -> float:
    """One of a provider's latency figures, measured once it has served requests (None before)."""
    value = view.get(key)
    assert isinstance(value, int | float), (key, value)
    return value


def test_catalog_marks_every_endpoint_and_plans_the_budget(sim_process: str, tmp_path: Path) -> None:
    data = [write_dataset(tmp_path, "A", 500), write_dataset(tmp_path, "B", 300)]
    settings = settings_file(
        tmp_path, sim_process, data, budget_usd=0.05
    )  # 800 prompts x 64 tokens cost more
    text = settings.read_text().replace(
        "max_tokens = 64\n", 'max_tokens = 64\n[openrouter.provider]\nignore = ["together"]\n'
    )
    settings.write_text(text)
    env = {**ENV, "OPENROUTER_API_KEY": "sk-sim-test"}
    done = subprocess.run(
        regen_argv("catalog", "--json", "--settings", str(settings)), env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    rows = {row["slug"]: row for row in report["endpoints"]}
    assert len(rows) == 11
    assert (
        rows["deepinfra"]["allowed"] is False
        and "fp4 below the allowed set (int4" in rows["deepinfra"]["reason"]
    )
    assert rows["gmicloud"]["allowed"] is False and "nvfp4 below" in rows["gmicloud"]["reason"]
    assert rows["together"]["allowed"] is False and rows["together"]["reason"] == "named in provider.ignore"
    assert rows["moonshotai"]["allowed"] is True and rows["moonshotai"]["reason"] is None
    assert "down or degraded" in (rows["chutes"]["reason"] or "")
    assert rows["parasail"]["completion_usd_per_m"] == 2.2, "exact from the $/token string"
    plan = report["plan"]
    assert plan["remaining_prompts"] == 800
    # Before any row exists each prompt is assumed to take its whole max_tokens (64 here).
    assert plan["output_tokens"] == 800 * 64, "assumed tokens per prompt before any row exists"
    assert plan["fits"] is False and plan["ways_out"]["token_budget"]["dataset_token_budget"] > 0
    human = subprocess.run(
        regen_argv("catalog", "--settings", str(settings)), env=env, capture_output=True, text=True
    )
    assert "does not fit" in human.stdout and "excluded: named in provider.ignore" in human.stdout


async def test_a_provider_serving_outside_the_allowlist_is_quarantined_and_excluded(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    # DeepInfra serves fp4 and is the cheapest; this simulator serves it despite the allowlist.
    sim.config.rogue_providers = ["deepinfra"]
    a = write_dataset(tmp_path, "A", 40)
    job = await run_job(
        make_settings(sim.base_url, [a], concurrency=4, openrouter={"provider": {"sort": "price"}})
    )
    assert job.outcome is not None and job.outcome.reason is StopReason.DONE
    rows = one_row_per_prompt(a, 40)
    assert all(row["provider"] != "DeepInfra" for row in rows)
    quarantined = [orjson.loads(x) for x in (job.run_dir / "quarantine.jsonl").read_bytes().splitlines()]
    assert quarantined and all(q["provider"] == "DeepInfra" for q in quarantined)
    assert "fp4" in quarantined[0]["quarantine_reason"]
    assert len(quarantined) <= 4, "excluded after the first offence: only what was in flight"
    routes = job.lanes[0].backend.routes
    assert routes is not None and "deepinfra" in routes.excluded
    events = [orjson.loads(x) for x in (job.run_dir / "events.jsonl").read_bytes().splitlines()]
    assert any(
        e["event"] == "exclude" and e["provider"] == "deepinfra" and e["source"] == "guard" for e in events
    )
    assert any(e["event"] == "quarantine" for e in events)
    snap = job.snapshot()
    assert snap["quarantined"] == len(quarantined)
    assert snap["lanes"][0]["money"]["waste"]["quarantined"]["amount"] > 0
    # The exclusion survives a restart (rebuilt from the event journal).
    again = Job(make_settings(sim.base_url, [a]))
    await again.prepare()
    routes = again.lanes[0].backend.routes
    assert routes is not None and "deepinfra" in routes.excluded
    await again.run()


async def test_credit_below_the_remaining_budget_warns_and_is_shown(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.key_limit = 0.01
    a = write_dataset(tmp_path, "A", 20)
    job = Job(make_settings(sim.base_url, [a], concurrency=2, openrouter={"key_poll_interval_s": 0.05}))
    await job.prepare()
    await job.run()
    events = [orjson.loads(x) for x in (job.run_dir / "events.jsonl").read_bytes().splitlines()]
    warning = next(e for e in events if e["event"] == "credits_low")
    assert warning["remaining"] <= 0.01 and "below the job's remaining budget" in warning["message"]
    assert openrouter(job).credits["limit"] == 0.01 and "limit_remaining" in openrouter(job).credits


async def test_credits_exhausted_by_the_key_limit_stop_the_run(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.key_limit = 0.003
    sim.config.time_scale = 0.02
    a = write_dataset(tmp_path, "A", 300)
    job = await run_job(
        make_settings(sim.base_url, [a], concurrency=4, openrouter={"key_poll_interval_s": 0.05})
    )
    assert job.outcome is not None and job.outcome.reason is StopReason.CREDITS
    assert "credits" in job.outcome.message.lower()
    assert 0 < len(read_rows(a)) < 300


async def test_statistics_follow_the_providers_latency_profiles(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.time_scale = 1.0
    sim.config.min_completion_tokens = 20
    sim.config.max_completion_tokens = 30
    sim.config.chunk_interval_s = 0.01
    sim.config.endpoint_overrides = {
        "fireworks": {"ttft_s": 0.15, "ttft_jitter": 0.0, "tokens_per_s": 200.0},
        "moonshotai": {"ttft_s": 0.5, "ttft_jitter": 0.0, "tokens_per_s": 50.0},
    }
    a = write_dataset(tmp_path, "A", 60)
    settings = make_settings(
        sim.base_url,
        [a],
        concurrency=20,
        openrouter={"provider": {"only": ["fireworks", "moonshotai"], "sort": None}},
    )
    job = await run_job(settings)
    views = {p["slug"]: p for p in job.snapshot()["lanes"][0]["providers"]}
    fast, slow = views["fireworks"], views["moonshotai"]
    assert fast["requests"] and slow["requests"], "both providers served"
    assert abs(figure(fast, "ttft_p50_s") - 0.15) < 0.08 and abs(figure(slow, "ttft_p50_s") - 0.5) < 0.12
    assert abs(figure(fast, "tpot_s") - 1 / 200) < 0.004 and abs(figure(slow, "tpot_s") - 1 / 50) < 0.008
    assert figure(slow, "latency_p50_s") > figure(fast, "latency_p50_s") * 1.8
    assert figure(slow, "latency_p95_s") >= figure(slow, "latency_p50_s")
    assert figure(slow, "latency_p99_s") >= figure(slow, "latency_p95_s")
    assert abs(fast["share"] + slow["share"] - 1.0) < 1e-9
    for view in (fast, slow):
        assert view["cost_per_m_output"] is not None and 2.0 < view["cost_per_m_output"] < 4.0
        assert view["status"] in ("OK", "SLOW")
    assert slow["status"] == "SLOW" or fast["status"] == "OK"


async def test_waste_and_useful_spend_add_up(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.faults = {"mid_stream_error": 0.2}
    sim.config.max_completion_tokens = 90
    a = write_dataset(tmp_path, "A", 60)
    job = await run_job(make_settings(sim.base_url, [a], max_attempts=20))
    money = job.snapshot()["lanes"][0]["money"]
    assert abs(money["useful"] + money["waste_total"] - money["spent"]) < 1e-9
    assert money["waste"]["truncated"]["amount"] > 0, "max_tokens 64 truncates some 90-token answers"
    assert money["useful_per_m"] is not None
    restarted = Job(job.settings)
    await restarted.prepare()
    again = restarted.snapshot()["lanes"][0]["money"]
    assert (
        abs(again["useful"] - money["useful"]) < 1e-9
        and abs(again["waste_total"] - money["waste_total"]) < 1e-9
    )
    await restarted.run()


async def test_cost_missing_from_the_response_is_reconciled_from_generation(
    sim: OpenRouterSim, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim.config.faults = {"missing_cost": 0.5}
    a = write_dataset(tmp_path, "A", 30)
    job = await run_job(make_settings(sim.base_url, [a]))
    assert job.lanes[0].ledger.estimated == 0, "every estimate was replaced by the billed amount"
    assert job.lanes[0].ledger.spent == sim.billing.billed_total
    journal = [orjson.loads(x) for x in (job.run_dir / "attempts.jsonl").read_bytes().splitlines()]
    assert any(r["k"] == "reconciled" for r in journal)


def test_sigkill_then_resume_the_ledger_equals_the_bill(sim_process: str, tmp_path: Path) -> None:
    data = [write_dataset(tmp_path, "A", 1200)]
    settings = settings_file(tmp_path, sim_process, data, concurrency=32, max_attempts=20)
    env = {**ENV, "OPENROUTER_API_KEY": "sk-sim-test"}
    kill_at_random_moments(settings, env, random.Random(4), 3, 0.8, 2.0)
    final = subprocess.run(
        regen_argv("run", "--headless", "--settings", str(settings)),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert final.returncode == 0, final.stdout[-1500:]
    with urllib.request.urlopen(sim_process.replace("/api/v1", "/_sim/ledger")) as response:
        bill = json.loads(response.read())
    journal = read_journals(tmp_path / "run" / "attempts.jsonl", tmp_path / "run" / "events.jsonl")
    records = [orjson.loads(x) for x in (tmp_path / "run" / "attempts.jsonl").read_bytes().splitlines()]
    known_ids = {r["gen"] for r in records if r.get("gen")}
    billed_known = sum(
        (Decimal(repr(r["cost"])) for r in bill["records"] if r["id"] in known_ids), Decimal(0)
    )
    billed_blind = sum(
        (Decimal(repr(r["cost"])) for r in bill["records"] if r["id"] not in known_ids), Decimal(0)
    )
    assert billed_known + billed_blind == Decimal(bill["billed_total"])
    # Every generation whose id regen journaled is settled at exactly what was billed, to the micro-dollar
    # and beyond; those killed before their response headers have no id to look up, so their worst case
    # stays in the ledger, flagged as estimated, never below what they really cost, until the key's
    # usage bounds them at the end (docs/money.md): then spend is exactly the bill.
    assert journal.spent - journal.estimated == billed_known
    assert billed_blind <= journal.estimated
    blind = [r for r in records if r["k"] == "end" and r.get("est") and not r.get("gen")]
    assert journal.estimated <= sum((Decimal(r["cost"]) for r in blind), Decimal(0))
    if journal.estimates.unknowable_count:
        assert journal.estimates.bounded_by == "key_usage"
        assert journal.spent == Decimal(bill["billed_total"])
