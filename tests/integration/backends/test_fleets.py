"""One job, both fleets: the SGLang and OpenRouter simulators at once behind one dispatcher.

The GPUs are the first lane, OpenRouter the second (engine/job/lanes.py): exactly one row per prompt,
each row naming the backend that made it; OpenRouter's share follows what the GPUs cannot make;
its dollar budget holds; a SIGKILL and a resume keep each backend's accounting.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import random
import signal
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest

from regen.engine.config.loading import SettingsError, load_settings
from regen.engine.config.settings import JobSettings, OpenRouterSettings, Settings
from regen.engine.data.datasets import Dataset
from regen.engine.data.verify import verify_dataset
from regen.engine.job.job import Job, JobError, StopReason
from regen.engine.run.recovery import journal_spend, read_journals
from regen.engine.schema import budget_lane
from regen.sim.openrouter.server import OpenRouterSim
from regen.sim.sglang.server import SGLangSim
from regen.sim.sglang.tokens import SimTokenizer
from tests.support.backend_cases import BOTH, openrouter_case, sglang_case
from tests.support.datasets import one_row_per_prompt, write_dataset
from tests.support.journals import journal, spend_by_backend
from tests.support.openrouter_sim import SIM_KEY, fast_sim_config
from tests.support.processes import ENV, regen_argv, wait_for_attempts
from tests.support.sglang_sim import fast_config


def lane_rows(job: Job) -> dict[str, int]:
    return {lane.name: lane.stats.counters.rows for lane in job.lanes}


async def test_one_row_per_prompt_and_the_share_follows_the_gpus(
    gpu_sim: SGLangSim, paid_sim: OpenRouterSim, fleet_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    data = write_dataset(tmp_path, "A", 700)
    settings = fleet_settings(gpu_sim.base_url, paid_sim.base_url, [data], budget_usd=50.0)
    job = Job(settings)
    await job.prepare()
    assert [lane.name for lane in job.lanes] == BOTH and job.dispatcher.budget_lane.ledger.unit == "usd"
    runner = asyncio.create_task(job.run())
    while sum(lane_rows(job).values()) < 300 and not runner.done():
        await asyncio.sleep(0.01)
    fast = lane_rows(job)
    # The GPUs slow to a crawl mid-run (as if another tenant took them): OpenRouter takes up the slack.
    gpu_sim.apply_config(
        gpu_sim.config.model_copy(update={"time_scale": 1.0, "output_len_min": 100, "output_len_max": 150})
    )
    outcome = await runner
    assert outcome.reason is StopReason.DONE, outcome.message
    end = lane_rows(job)
    rows = one_row_per_prompt(data, 700)
    made = Counter(row["backend"] for row in rows)
    assert made == Counter(end), "each row names the backend whose lane made it"
    share_fast = fast["openrouter"] / sum(fast.values())
    slow_total = sum(end.values()) - sum(fast.values())
    share_slow = (end["openrouter"] - fast["openrouter"]) / slow_total
    assert share_fast < 0.25, f"with fast GPUs OpenRouter made {share_fast:.0%} of the rows"
    assert share_slow > share_fast + 0.3, (
        f"slowed GPUs: OpenRouter's share went {share_fast:.0%} -> {share_slow:.0%}"
    )
    # Money, per lane in its own unit: OpenRouter's rows cost what its ledger spent, which is what
    # the simulator billed; the GPU lane's rows carry GPU-seconds and no dollars.
    paid, gpus = job.dispatcher.lane("openrouter"), job.dispatcher.lane("sglang")
    paid_rows = [row for row in rows if row["backend"] == "openrouter"]
    gpu_rows = [row for row in rows if row["backend"] == "sglang"]
    assert (
        sum(Decimal(str(row["cost"])) for row in paid_rows)
        == paid.ledger.spent
        == paid_sim.billing.billed_total
    )
    assert all(row["cost"] is None and row["gpu_s"] > 0 for row in gpu_rows)
    assert (
        gpus.ledger.budget is None
        and gpus.ledger.spent > 0
        and paid.ledger.reserved == gpus.ledger.reserved == 0
    )
    assert spend_by_backend(settings.job.run_dir / "attempts.jsonl") == {
        "sglang": gpus.ledger.spent,
        "openrouter": paid.ledger.spent,
    }
    # `regen verify` reads the mixed rows and compares their dollars with the journal's dollars only.
    report = verify_dataset(
        Dataset("A", data), journal=journal_spend(settings.job.run_dir / "attempts.jsonl")
    )
    assert not report.violations, dict(report.violations)
    assert report.journal_spend == pytest.approx(float(paid.ledger.spent))
    snap = job.snapshot()
    assert budget_lane(snap)["money"]["unit"] == "usd" and snap["rows"] == 700
    split = {lane["name"]: lane for lane in snap["lanes"]}
    assert split["sglang"]["rows"] == end["sglang"] and split["sglang"]["money"]["unit"] == "gpu_s"
    assert split["openrouter"]["money"]["spent"] == float(paid.ledger.spent)
    assert {p["name"] for p in split["sglang"]["providers"]} == {f"127.0.0.1:{gpu_sim.port}"}


async def test_the_budget_holds_and_the_gpus_finish_the_rest(
    gpu_sim: SGLangSim, paid_sim: OpenRouterSim, fleet_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    # Slow GPUs from the start: OpenRouter would take most of the work, but its budget runs out.
    gpu_sim.apply_config(gpu_sim.config.model_copy(update={"time_scale": 0.05}))
    data = write_dataset(tmp_path, "A", 400)
    settings = fleet_settings(gpu_sim.base_url, paid_sim.base_url, [data], budget_usd=0.002)
    job = Job(settings)
    await job.prepare()
    paid = job.dispatcher.lane("openrouter")
    runner = asyncio.create_task(job.run())
    blocked_seen = False
    while not runner.done():
        ledger = paid.ledger
        assert ledger.budget is not None and ledger.spent + ledger.reserved <= ledger.budget
        blocked_seen = blocked_seen or paid.budget_blocked
        await asyncio.sleep(0.005)
    outcome = runner.result()
    assert outcome.reason is StopReason.DONE, (
        "the GPUs, which have no budget, finish what OpenRouter could not"
    )
    assert blocked_seen, "OpenRouter's lane met its budget"
    rows = one_row_per_prompt(data, 400)
    made = Counter(row["backend"] for row in rows)
    assert made["openrouter"] > 0 and made["sglang"] > 0
    assert paid.ledger.budget is not None and paid.ledger.spent <= paid.ledger.budget
    assert paid.ledger.spent == paid_sim.billing.billed_total, "nothing billed past the budget"


async def test_a_prompt_goes_to_the_first_lane_with_room(
    gpu_sim: SGLangSim, paid_sim: OpenRouterSim, fleet_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    # Fewer prompts than the GPUs' lane has room for: every one goes to the GPUs, none is bought.
    data = write_dataset(tmp_path, "A", 12)
    job = Job(fleet_settings(gpu_sim.base_url, paid_sim.base_url, [data]))
    await job.prepare()
    assert (await job.run()).reason is StopReason.DONE
    assert Counter(row["backend"] for row in one_row_per_prompt(data, 12)) == {"sglang": 12}
    paid = job.dispatcher.lane("openrouter")
    assert paid.stats.counters.attempts == 0 and paid.ledger.spent == 0
    # Listed the other way round, OpenRouter is the first lane and takes them all.
    again = write_dataset(tmp_path / "again", "A", 12)
    job = Job(
        fleet_settings(
            gpu_sim.base_url,
            paid_sim.base_url,
            [again],
            backends=["openrouter", "sglang"],
            run_dir=tmp_path / "run2",
        )
    )
    await job.prepare()
    assert (await job.run()).reason is StopReason.DONE
    assert Counter(row["backend"] for row in one_row_per_prompt(again, 12)) == {"openrouter": 12}


async def test_a_backend_that_fails_for_good_closes_its_lane_and_the_gpus_go_on(
    gpu_sim: SGLangSim, fleet_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    # The OpenRouter account runs dry mid-run (402): its lane closes, the GPUs finish the datasets.
    # The first wave of 16 answers alone overshoots these credits, so the next request sent meets
    # the 402 long before the GPUs run out of prompts (CI once saw 3 waves land under the old 2x).
    gpu_sim.apply_config(gpu_sim.config.model_copy(update={"time_scale": 0.05}))
    paid_sim = OpenRouterSim(fast_sim_config(time_scale=0.3, credits=0.0003))
    await paid_sim.start()
    try:
        data = write_dataset(tmp_path, "A", 600)
        job = Job(fleet_settings(gpu_sim.base_url, paid_sim.base_url, [data]))
        await job.prepare()
        outcome = await job.run()
    finally:
        await paid_sim.stop()
    assert outcome.reason is StopReason.DONE, outcome.message
    paid = job.dispatcher.lane("openrouter")
    assert paid.closed is not None and paid.closed.startswith("credits"), paid.closed
    made = Counter(row["backend"] for row in one_row_per_prompt(data, 600))
    assert made["openrouter"] > 0 and made["sglang"] > made["openrouter"]
    closed = [e for e in journal(job.run_dir / "events.jsonl") if e["event"] == "lane_closed"]
    assert [e["backend"] for e in closed] == ["openrouter"]
    assert {lane["name"]: lane["state"] for lane in job.snapshot()["lanes"]}["openrouter"] == "closed"


async def test_the_gpus_lane_follows_their_healthy_queue_and_openrouter_takes_the_rest(
    fleet_tok: SimTokenizer, paid_sim: OpenRouterSim, fleet_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    # Four requests run at a time on the GPUs; with the healthy band at 2..6 queued and never more
    # queued than a quarter of their slots (docs/sglang.md §11.6), the GPUs' lane should hold about
    # 4 + 1 in flight, not the 48 allowed, and OpenRouter's lane its own 48.
    config = fast_config(
        served_model_name="kimi-k2.5",
        max_running_requests=4,
        output_len_min=30,
        output_len_max=40,
        time_scale=0.2,
    )
    gpu_sim = SGLangSim(config, fleet_tok)
    await gpu_sim.start()
    try:
        await gpu_sim.wait_ready(30)
        data = write_dataset(tmp_path, "A", 400)
        settings = fleet_settings(
            gpu_sim.base_url, paid_sim.base_url, [data], concurrency=48, min_concurrency=2
        )
        settings.sglang.healthy_queue_min, settings.sglang.healthy_queue_max = 2, 6
        job = Job(settings)
        await job.prepare()
        gpus, paid = job.dispatcher.lane("sglang"), job.dispatcher.lane("openrouter")
        runner = asyncio.create_task(job.run())
        while gpus.limit.suggested is None and not runner.done():
            await asyncio.sleep(0.01)
        lowered = gpus.limit.current
        assert lowered < 20, f"the GPUs' ceiling came down to {lowered}"
        while gpus.in_flight > lowered and not runner.done():
            await asyncio.sleep(0.01)
        paid_peak = 0
        seen_limit, seen_in_flight = gpus.limit.current, gpus.in_flight
        for _ in range(40):
            # Nothing new goes past the ceiling; when it comes down, what is above it drains.
            limit = gpus.limit.current
            assert gpus.in_flight <= max(limit, seen_limit, seen_in_flight)
            seen_limit, seen_in_flight = limit, gpus.in_flight
            paid_peak = max(paid_peak, paid.in_flight)
            await asyncio.sleep(0.02)
        assert paid.limit.suggested is None and paid_peak > 20, (
            "OpenRouter's lane is not bound by the GPUs' ceiling"
        )
        assert (await runner).reason is StopReason.DONE
    finally:
        await gpu_sim.stop()
    one_row_per_prompt(data, 400)
    hints = [e for e in journal(settings.job.run_dir / "events.jsonl") if e["event"] == "concurrency_hint"]
    assert hints and {e["backend"] for e in hints} == {"sglang"}


class Ceilings:
    """A ceiling hook as the deadline control would plug in: a ceiling per lane."""

    def __init__(self, **ceilings: int | None) -> None:
        self.ceilings = ceilings
        self.asked: Counter[str] = Counter()

    def lane_ceiling(self, lane: str) -> int | None:
        self.asked[lane] += 1
        return self.ceilings.get(lane)


async def test_the_ceiling_hook_caps_a_lane_and_pause_takes_one_backend(
    gpu_sim: SGLangSim, paid_sim: OpenRouterSim, fleet_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    gpu_sim.apply_config(gpu_sim.config.model_copy(update={"time_scale": 0.05}))
    data = write_dataset(tmp_path, "A", 300)
    settings = fleet_settings(gpu_sim.base_url, paid_sim.base_url, [data])
    job = Job(settings)
    await job.prepare()
    hook = Ceilings(openrouter=0, sglang=3)
    job.set_lane_ceilings(hook)
    paid, gpus = job.dispatcher.lane("openrouter"), job.dispatcher.lane("sglang")
    runner = asyncio.create_task(job.run())
    while gpus.stats.counters.rows < 20:
        assert paid.in_flight == 0 and gpus.in_flight <= 3
        await asyncio.sleep(0.005)
    assert paid.stats.counters.attempts == 0, "a ceiling of 0 sends nothing to that lane"
    assert hook.asked["openrouter"] and hook.asked["sglang"]
    snap = job.snapshot()
    assert {lane["name"]: lane["ceiling"] for lane in snap["lanes"]} == {"sglang": 3, "openrouter": 0}
    # Pause the GPUs through the command table: OpenRouter, let loose, carries on alone.
    assert "paused sglang" in await job.handle_command("pause", {"backend": "sglang"}, "test")
    hook.ceilings = {}
    job.wake()
    while gpus.in_flight:
        await asyncio.sleep(0.005)
    gpu_starts = gpus.stats.counters.attempts
    rows_then = paid.stats.counters.rows
    while paid.stats.counters.rows < rows_then + 20:
        await asyncio.sleep(0.005)
    assert gpus.stats.counters.attempts == gpu_starts, "nothing sent to a paused backend"
    with pytest.raises(JobError, match="no backend 'vllm'"):
        await job.handle_command("pause", {"backend": "vllm"}, "test")
    await job.handle_command("resume", {"backend": "sglang"}, "test")
    assert (await runner).reason is StopReason.DONE
    one_row_per_prompt(data, 300)
    events = journal(settings.job.run_dir / "events.jsonl")
    assert [(e["event"], e.get("backend")) for e in events if e["event"] in ("pause", "resume")] == [
        ("pause", "sglang"),
        ("resume", "sglang"),
    ]


def test_backends_settings_are_checked_with_the_key_named(tmp_path: Path) -> None:
    def load(body: str) -> Settings:
        path = tmp_path / "settings.toml"
        path.write_text(body)
        return load_settings(path)

    for body, words in [
        ("[job]\nbackends = []\n", "job.backends: names no backend"),
        ('[job]\nbackends = ["sglang", "sglang"]\n', "job.backends: names a backend twice"),
        ('[job]\nbackends = ["vllm"]\n', "job.backends.0: Input should be 'openrouter' or 'sglang'"),
        (
            '[job]\ndeadline = "1.5h"\n',
            "job.deadline: not a time of day or a duration; expected a time of day",
        ),
        ('[job]\ndeadline = "0m"\n', "job.deadline: a duration must be longer than 0 seconds"),
        (
            '[job]\nbackends = ["openrouter", "sglang"]\n',
            'sglang.urls: empty and no [[hosts]], but job.backends includes "sglang"',
        ),
    ]:
        with pytest.raises(SettingsError) as caught:
            load(body)
        assert any(words in problem for problem in caught.value.problems), caught.value.problems
    settings = load('[job]\nbackend = "sglang"\nbackends = ["openrouter"]\n')
    assert settings.job.chosen_backends == ["openrouter"], "backends wins over backend"
    assert load("[job]\n").job.chosen_backends == ["openrouter"]
    # The command line refuses bad settings with exit code 2 and one line naming the key.
    (tmp_path / "settings.toml").write_text("[job]\nbackends = []\n")
    done = subprocess.run(
        regen_argv("run", "--headless", "--settings", str(tmp_path / "settings.toml")),
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "job.backends" in done.stderr and "Traceback" not in done.stderr


def test_recovery_puts_each_attempt_on_its_backends_ledger(tmp_path: Path) -> None:
    attempts, events = tmp_path / "attempts.jsonl", tmp_path / "events.jsonl"
    records = [
        # An older single-backend run on OpenRouter: no backend named, so job.backend's.
        {"k": "start", "rid": "A-0#0", "ds": "A", "line": 0, "reserved": "0.5"},
        {"k": "end", "rid": "A-0#0", "ds": "A", "line": 0, "cost": "0.25", "outcome": "server"},
        {"k": "start", "rid": "A-0#1", "ds": "A", "line": 0, "reserved": "0", "be": "sglang"},
        {"k": "end", "rid": "A-0#1", "ds": "A", "line": 0, "cost": "7.5", "outcome": "ok", "be": "sglang"},
        {"k": "start", "rid": "A-1#0", "ds": "A", "line": 1, "reserved": "0.5", "be": "openrouter"},
        {"k": "gen", "rid": "A-1#0", "gen": "gen-1"},
        {
            "k": "end",
            "rid": "A-1#0",
            "ds": "A",
            "line": 1,
            "gen": "gen-1",
            "cost": "0.5",
            "est": True,
            "outcome": "ok",
            "be": "openrouter",
        },
        {"k": "reconciled", "rid": "A-1#0", "gen": "gen-1", "outcome": "ok", "cost": "0.1", "delta": "-0.4"},
        {
            "k": "start",
            "rid": "A-2#0",
            "ds": "A",
            "line": 2,
            "reserved": "0",
            "be": "sglang",
        },  # cut by a crash
    ]
    attempts.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    events.write_bytes(orjson.dumps({"event": "exclude", "provider": "novita", "source": "operator"}) + b"\n")
    paid = read_journals(attempts, events, backend="openrouter", default="openrouter")
    gpus = read_journals(attempts, events, backend="sglang", default="openrouter")
    assert paid.spent == Decimal("0.35") and gpus.spent == Decimal("7.5")
    assert paid.estimates.total == 0 and not paid.to_reconcile
    assert [c.rid for c in gpus.crashed] == ["A-2#0"] and not paid.crashed
    assert paid.excluded == {"novita": "operator"} and gpus.excluded == {}
    # Attempts number a prompt's rids whichever backend made them.
    assert paid.attempts == gpus.attempts == {"A": {0: 2, 1: 1, 2: 1}}
    whole = read_journals(attempts, events)
    assert whole.spent == Decimal("7.85"), "without a backend, every record counts (single-backend readers)"


@pytest.fixture
def both_sims(tmp_path: Path, sglang_model: Path) -> Iterator[tuple[Any, Any]]:
    """Both simulators in processes of their own, for a job run as `regen run --headless`."""
    with openrouter_case(tmp_path) as paid_case, sglang_case(tmp_path, sglang_model) as gpu_case:
        yield paid_case, gpu_case


def test_sigkill_then_resume_keeps_each_backends_accounting(
    both_sims: tuple[Any, Any], tmp_path: Path
) -> None:
    paid, gpus = both_sims
    a = write_dataset(tmp_path, "A", 1200)
    settings = paid.settings_file([a], concurrency=16, max_attempts=20, backends=BOTH, budget_usd=20.0)
    extra = [
        f"[{section}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())
        for section, values in gpus.sections.items()
    ]
    settings.write_text(settings.read_text() + "".join(extra))
    env = {**ENV, "OPENROUTER_API_KEY": SIM_KEY}
    attempts = tmp_path / "run" / "attempts.jsonl"
    rng = random.Random(5)
    for kill in range(3):
        # Killed once the run is under way (both backends open, the tokenizer loaded), mid-flight.
        ends = attempts.read_bytes().count(b'"k":"end"') if attempts.exists() else 0
        # In a session of its own: the SIGKILL takes the job and its tokenizer workers at once,
        # as a machine going down would, and leaves no process behind.
        proc = subprocess.Popen(
            regen_argv("run", "--headless", "--settings", str(settings)),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_for_attempts(attempts, ends + 100, timeout_s=120)
            time.sleep(rng.uniform(0.0, 1.0))
            assert proc.poll() is None, f"run {kill + 1} ended before it was killed"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    final = subprocess.run(
        regen_argv("run", "--headless", "--settings", str(settings)),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert final.returncode == 0, final.stdout[-2000:] + final.stderr[-2000:]
    rows = one_row_per_prompt(a, 1200)
    assert set(Counter(row["backend"] for row in rows)) <= set(BOTH)
    run_dir = tmp_path / "run"
    events = journal(run_dir / "events.jsonl")
    assert any(e.get("event") == "crash_recovered" for e in events), "a kill caught requests in flight"
    # The last run's ledgers, per backend, are the sums over that backend's journaled attempts, less
    # what the key's usage took off the unknowable money at the ends (docs/money.md).
    end = [e for e in events if e["event"] == "end"][-1]
    journaled = spend_by_backend(run_dir / "attempts.jsonl")
    for bound in (e for e in events if e["event"] == "usage_bound"):
        assert bound["backend"] == "openrouter", "GPU time has no account usage to bound by"
        journaled["openrouter"] -= sum((Decimal(cut) for cut in bound["cuts"].values()), Decimal(0))
    for name in BOTH:
        assert Decimal(end["split"][name]["spent"]) == journaled.get(name, Decimal(0)), name
        state = read_journals(
            run_dir / "attempts.jsonl", run_dir / "events.jsonl", backend=name, default="openrouter"
        )
        assert state.spent == journaled.get(name, Decimal(0))
    paid_state = read_journals(run_dir / "attempts.jsonl", run_dir / "events.jsonl", backend="openrouter")
    billed = paid.billed()
    assert paid_state.spent - paid_state.estimates.unknowable <= billed <= paid_state.spent <= Decimal("20")
    # Retries (the simulators' faults) and prompts re-sent after a kill go to whichever lane has room.
    tried: dict[int, set[str]] = defaultdict(set)
    for rec in journal(run_dir / "attempts.jsonl"):
        if rec["k"] == "start":
            tried[rec["line"]].add(rec["be"])
    assert any(len(backends) == 2 for backends in tried.values()), "some prompt moved to the other backend"
    assert "backends:" in final.stdout and "sglang:" in final.stdout and "GPU-h" in final.stdout
    assert "| split sglang" in final.stdout


def test_a_paced_job_killed_and_resumed_counts_each_backends_share_over_the_whole_job(
    both_sims: tuple[Any, Any], tmp_path: Path
) -> None:
    """The summary's `backends:` lines and the `end` event's split count every row of the job, the
    rows of the run before the SIGKILL among them, as the money already does (docs/fleets.md)."""
    paid, gpus = both_sims
    a = write_dataset(tmp_path, "A", 1200)
    settings = paid.settings_file(
        [a], concurrency=16, max_attempts=20, backends=BOTH, budget_usd=20.0, deadline="2h"
    )
    extra = [
        f"[{section}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())
        for section, values in gpus.sections.items()
    ]
    settings.write_text(settings.read_text() + "".join(extra) + "[steering]\ninterval_s = 0.25\n")
    env = {**ENV, "OPENROUTER_API_KEY": SIM_KEY}
    attempts = tmp_path / "run" / "attempts.jsonl"
    proc = subprocess.Popen(
        regen_argv("run", "--headless", "--settings", str(settings)),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # the SIGKILL takes the job and its tokenizer workers at once
    )
    try:
        wait_for_attempts(attempts, 300, timeout_s=120)
        assert proc.poll() is None, "the first run ended before it was killed"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = Counter(
        json.loads(line)["backend"] for line in (a / "raw_responses.jsonl").read_text().splitlines()
    )
    assert sum(before.values()) >= 200 and set(before) == set(BOTH), before
    final = subprocess.run(
        regen_argv("run", "--headless", "--settings", str(settings)),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert final.returncode == 0, final.stdout[-2000:] + final.stderr[-2000:]
    rows = one_row_per_prompt(a, 1200)
    made = Counter(row["backend"] for row in rows)
    tokens: Counter[str] = Counter()
    for row in rows:
        tokens[row["backend"]] += row["usage"]["completion_tokens"]
    end = [e for e in journal(tmp_path / "run" / "events.jsonl") if e["event"] == "end"][-1]
    assert "deadline" in end, "the job was paced to a deadline"
    for name in BOTH:
        assert end["split"][name]["rows"] == made[name] > before[name], (name, end["split"], before)
        assert end["split"][name]["output_tokens"] == tokens[name], name
        line = next(x for x in final.stdout.splitlines() if x.startswith(f"  {name}: ") and " rows (" in x)
        share = made[name] / 1200 * 100
        assert line.startswith(f"  {name}: {made[name]} rows ({share:.1f}%), {tokens[name]} output tokens"), (
            line
        )


def test_a_single_backend_job_keeps_its_files(tmp_path: Path) -> None:
    """The settings without job.backends give one lane, and its events stay as they were."""
    settings = Settings(
        openrouter=OpenRouterSettings(api_key=SIM_KEY),
        job=JobSettings(datasets=[write_dataset(tmp_path, "A", 3)], run_dir=tmp_path / "run"),
    )
    job = Job(settings)
    assert [lane.name for lane in job.lanes] == ["openrouter"] and job.dispatcher.budget_lane is job.lanes[0]
    assert job.dispatcher.lane_fields(job.lanes[0]) == {}, "events of one backend stay as they were"


async def test_the_console_shows_each_backends_share(
    gpu_sim: SGLangSim, paid_sim: OpenRouterSim, fleet_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    """The console attached to a job on both fleets: dollars for the budget, a line per backend."""
    from regen.console.app import RegenApp
    from regen.console.client import SocketSource
    from regen.console.options import ConsoleOptions
    from regen.console.widgets.cost import CostPane
    from regen.engine.control.headless import run_headless
    from regen.engine.control.server import SOCKET_NAME

    gpu_sim.apply_config(gpu_sim.config.model_copy(update={"time_scale": 0.3}))
    data = write_dataset(tmp_path, "A", 400)
    job = Job(fleet_settings(gpu_sim.base_url, paid_sim.base_url, [data]))
    await job.prepare()
    out = io.StringIO()
    runner = asyncio.create_task(run_headless(job, out=out, interval_s=0.2))
    socket = job.run_dir / SOCKET_NAME
    while not socket.exists():
        await asyncio.sleep(0.01)
    app = RegenApp(SocketSource(socket), ConsoleOptions(repaint_interval_s=0), clock=time.time)
    try:
        async with app.run_test(size=(160, 60)) as pilot:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while not (app.displayed and all(lane["rows"] for lane in app.displayed["lanes"])):
                assert loop.time() < deadline
                await pilot.pause(0.05)
            await pilot.pause(0.2)
            lines = app.query_one(CostPane)._lines()
            split = {line.split()[0]: line for line in lines[-2:]}
            assert set(split) == {"sglang", "openrouter"}, lines
            assert "GPU-" in split["sglang"] and "$" not in split["sglang"]
            assert "$" in split["openrouter"] and " rows " in split["openrouter"]
            assert "$" in lines[0], "the budget's dollars head the pane"
            job.stop(cancel=True)
            await runner
    finally:
        if not runner.done():
            job.stop(cancel=True)
            await runner
    assert "| split sglang" in out.getvalue()


def test_each_backend_may_have_its_own_in_flight_limit(
    fleet_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = fleet_settings(
        "http://127.0.0.1:9",
        "http://127.0.0.1:9/api/v1",
        [],
        concurrency=40,
        backend_concurrency={"sglang": 6},
    )
    job = Job(settings)
    limits = {lane.name: lane.limit.configured for lane in job.lanes}
    assert limits == {"sglang": 6, "openrouter": 40}, "a backend not named has job.concurrency"
    path = tmp_path / "bad.toml"
    path.write_text("[job]\nbackend_concurrency = { vllm = 8 }\n")
    with pytest.raises(SettingsError, match=r"job.backend_concurrency.vllm"):
        load_settings(path)
    path.write_text("[job]\nbackend_concurrency = { sglang = 0 }\n")
    with pytest.raises(
        SettingsError, match=r"job.backend_concurrency.sglang: Input should be greater than or equal to 1"
    ):
        load_settings(path)
