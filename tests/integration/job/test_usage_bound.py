"""Money no bill can name, bounded by the key's usage (docs/money.md, "Bounded by the key's usage").

A job is SIGKILLed (a real process, `regen run --headless`) while non-streamed requests are in
flight: their generation id comes only with the whole answer, so the kill leaves attempts that no
/generation lookup can ever settle. The next start (in this process, so the ledger can be read)
runs the work to its end; the simulator runs over loopback in this test's loop, its ledger the truth.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import SecretStr

from regen.engine.config.settings import Settings
from regen.engine.control.headless import money_line
from regen.engine.job.job import Job, StopReason
from regen.engine.money.ledger import Ledger
from regen.engine.run.recovery import read_journals
from regen.sim.openrouter.server import OpenRouterSim
from tests.support.datasets import write_dataset
from tests.support.journals import journal
from tests.support.openrouter_sim import SIM_KEY, fast_sim_config
from tests.support.processes import ROOT, free_port

OTHER_KEY = "sk-sim-other-user"
PROMPTS = 120


def sim_config(**overrides: Any) -> Any:
    # Slow enough that a kill finds requests in flight, fast enough for a test.
    base: dict[str, Any] = {
        "api_keys": [SIM_KEY, OTHER_KEY],
        "time_scale": 0.05,
        "min_completion_tokens": 8,
        "max_completion_tokens": 40,
    }
    base.update(overrides)
    return fast_sim_config(**base)


def settings_toml(path: Path, base_url: str, dataset: Path, run_dir: Path, settle_s: float) -> Path:
    path.write_text(
        f'[openrouter]\nbase_url = "{base_url}"\nmax_tokens = 64\nstream = false\n'
        f"usage_settle_s = {settle_s}\nusage_settle_max_s = 30.0\n"
        f'[job]\ndatasets = ["{dataset}"]\nrun_dir = "{run_dir}"\nconcurrency = 16\n'
        "backoff_base_s = 0.01\nbackoff_max_s = 0.05\ncommit_interval_s = 0.001\n"
        "[headless]\nstatus_interval_s = 0.2\n"
    )
    return path


async def start_and_kill(settings: Path, run_dir: Path) -> list[dict[str, Any]]:
    """Run the job in its own process and SIGKILL it while requests are in flight before any id."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OPENROUTER_API_KEY": SIM_KEY}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "regen.cli.main", "run", "--headless", "--settings", str(settings),
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    attempts = run_dir / "attempts.jsonl"
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        assert proc.returncode is None, "the job ended before it could be killed"
        assert asyncio.get_running_loop().time() < deadline, "the job never had requests in flight"
        records = journal(attempts, complete_only=True)
        if sum(r["k"] == "end" for r in records) >= 10 and len(in_flight_without_id(records)) >= 8:
            break
        await asyncio.sleep(0.02)
    proc.kill()
    await proc.wait()
    records = journal(attempts, complete_only=True)
    ends = {r["rid"] for r in records if r["k"] == "end"}
    assert ends, "some attempts ended before the kill"
    assert in_flight_without_id(records), "the kill cut requests before their generation id"
    return records


def in_flight_without_id(records: list[dict[str, Any]]) -> set[str]:
    started = {r["rid"] for r in records if r["k"] == "start"}
    done = {r["rid"] for r in records if r["k"] in ("end", "gen")}
    return started - done


async def bill_outside(sim: OpenRouterSim, key: str, count: int) -> Decimal:
    """Requests on the same simulator outside the job (another user of `key`); what they were billed."""
    total = Decimal(0)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        for n in range(count):
            body = {"messages": [{"role": "user", "content": f"outside {n}"}], "max_tokens": 16}
            async with session.post(f"{sim.base_url}/chat/completions", json=body) as resp:
                assert resp.status == 200
                total += Decimal(repr((await resp.json())["usage"]["cost"]))
    return total


def resume_settings(
    make_settings: Callable[..., Settings],
    sim: OpenRouterSim,
    dataset: Path,
    settle_s: float,
    **openrouter: Any,
) -> Settings:
    return make_settings(
        sim.base_url,
        [dataset],
        concurrency=16,
        openrouter={"stream": False, "usage_settle_s": settle_s, "usage_settle_max_s": 30.0, **openrouter},
    )


async def resume(settings: Settings, during: Callable[[], Any] | None = None) -> Job:
    job = Job(settings)
    await job.prepare()
    assert job.lanes[0].ledger.estimates.unknowable_count > 0, "the crash left money no bill can name"
    runner = asyncio.create_task(job.run())
    if during is not None:
        await during()
    outcome = await asyncio.wait_for(runner, 120)
    assert outcome.reason is StopReason.DONE, outcome.message
    return job


def events_named(run_dir: Path, name: str) -> list[dict[str, Any]]:
    return [e for e in journal(run_dir / "events.jsonl", complete_only=True) if e["event"] == name]


async def crashed_run(tmp_path: Path, sim: OpenRouterSim, settle_s: float, pre_bills: int = 2) -> Path:
    """Bills on the key before the run (the base is not zero), then a first start killed mid-flight."""
    if pre_bills:
        await bill_outside(sim, SIM_KEY, pre_bills)
        await asyncio.sleep(sim.config.account_staleness_s + 0.1)  # the base sees them
    dataset = write_dataset(tmp_path, "A", PROMPTS)
    run_dir = tmp_path / "run"
    await start_and_kill(
        settings_toml(tmp_path / "s.toml", sim.base_url, dataset, run_dir, settle_s), run_dir
    )
    return dataset


async def test_a_crash_before_any_id_ends_with_spend_equal_to_the_bill(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim = OpenRouterSim(sim_config())
    await sim.start()
    try:
        await bill_outside(sim, SIM_KEY, 2)
        before_run = sim.billing.billed_total
        assert before_run > 0
        dataset = await crashed_run(tmp_path, sim, 0.3, pre_bills=0)
        run_dir = tmp_path / "run"
        base = events_named(run_dir, "key_usage_base")
        assert len(base) == 1 and Decimal(base[0]["usage"]) == before_run, "the first start's usage"
        assert SIM_KEY not in (run_dir / "events.jsonl").read_text(), "never the key itself"
        job = await resume(resume_settings(make_settings, sim, dataset, 0.3))
        billed = sim.billing.billed_total - before_run
    finally:
        await sim.stop()
    bound = events_named(run_dir, "usage_bound")
    assert len(bound) == 1
    assert Decimal(bound[0]["unknowable_after"]) < Decimal(bound[0]["unknowable_before"])
    assert bound[0]["count"] == job.lanes[0].ledger.estimates.unknowable_count > 0
    assert job.lanes[0].ledger.estimates.pending == 0
    assert job.lanes[0].ledger.spent == billed, "the run ends at exactly what the key was billed for it"
    assert job.lanes[0].ledger.estimates.unknowable == billed - job.lanes[0].ledger.confirmed
    money = job.snapshot()["lanes"][0]["money"]
    assert money["unknowable_bound"] == "key_usage" and money["unknowable_bound_wait_s"] is not None
    assert "bounded by what the key's usage grew by" in money_line(money)
    breakdown = job.lanes[0].settler.breakdown
    assert breakdown.useful + sum(breakdown.waste.values()) == job.lanes[0].ledger.spent
    # Read back: a later start begins from the bounded figure.
    state = read_journals(run_dir / "attempts.jsonl", run_dir / "events.jsonl")
    assert state.spent == billed and state.estimates.bounded_by == "key_usage"
    assert state.breakdown.useful + sum(state.breakdown.waste.values()) == billed
    assert events_named(run_dir, "end")[-1]["spent"] == str(billed)


async def test_a_lagging_usage_is_waited_for_and_the_bound_is_still_exact(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim = OpenRouterSim(sim_config(account_staleness_s=1.0))
    await sim.start()
    try:
        dataset = await crashed_run(tmp_path, sim, 1.5)
        before_run = Decimal(events_named(tmp_path / "run", "key_usage_base")[0]["usage"])
        job = await resume(resume_settings(make_settings, sim, dataset, 1.5))
        billed = sim.billing.billed_total - before_run
    finally:
        await sim.stop()
    bound = events_named(tmp_path / "run", "usage_bound")
    assert job.lanes[0].ledger.spent == billed
    assert len(bound) == 1 and bound[0]["waited_s"] >= 1.5, "it waited for the usage to hold still"


async def test_another_user_of_the_key_keeps_the_bound_above_the_bill(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim = OpenRouterSim(sim_config())
    await sim.start()
    outside: list[Decimal] = []

    async def someone_else() -> None:
        outside.append(await bill_outside(sim, SIM_KEY, 3))

    try:
        dataset = await crashed_run(tmp_path, sim, 0.3)
        base = Decimal(events_named(tmp_path / "run", "key_usage_base")[0]["usage"])
        job = await resume(resume_settings(make_settings, sim, dataset, 0.3), someone_else)
        theirs = outside[0]
        truth = sim.billing.billed_total - base - theirs
    finally:
        await sim.stop()
    assert theirs > 0
    spent = job.lanes[0].ledger.spent
    assert truth <= spent, "never under what the job was billed"
    assert spent == truth + theirs, "the other user's bills are all the bound can be off by"


async def test_without_a_base_the_worst_case_stays(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    """An older run's journal (no base event): nothing changes, the worst case stays counted."""
    sim = OpenRouterSim(sim_config())
    await sim.start()
    try:
        dataset = await crashed_run(tmp_path, sim, 0.3)
        base_before = Decimal(events_named(tmp_path / "run", "key_usage_base")[0]["usage"])
        events = tmp_path / "run" / "events.jsonl"
        lines = [line for line in events.read_bytes().splitlines() if b'"key_usage_base"' not in line]
        events.write_bytes(b"".join(line + b"\n" for line in lines))
        job = await resume(resume_settings(make_settings, sim, dataset, 0.3))
        billed = sim.billing.billed_total
    finally:
        await sim.stop()
    assert not events_named(tmp_path / "run", "usage_bound")
    assert not events_named(tmp_path / "run", "key_usage_base"), "no base is taken after the first start"
    assert (
        job.lanes[0].ledger.estimates.unknowable_count > 0
        and job.lanes[0].ledger.estimates.bounded_by is None
    )
    assert job.lanes[0].ledger.confirmed <= billed - base_before < job.lanes[0].ledger.spent
    assert "unknowable_bound" not in job.snapshot()["lanes"][0]["money"]


async def test_a_first_start_that_cannot_read_the_key_takes_no_base(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    """/key answering 503 at the first start (a real HTTP front that passes everything else through)."""
    sim = OpenRouterSim(sim_config())
    await sim.start()
    front = await key_failing_front(sim)
    try:
        dataset = write_dataset(tmp_path, "A", PROMPTS)
        run_dir = tmp_path / "run"
        await start_and_kill(
            settings_toml(tmp_path / "s.toml", front.base_url, dataset, run_dir, 0.3), run_dir
        )
        assert not events_named(run_dir, "key_usage_base")
        job = await resume(resume_settings(make_settings, sim, dataset, 0.3))
        billed = sim.billing.billed_total
    finally:
        await front.stop()
        await sim.stop()
    assert not events_named(run_dir, "usage_bound") and not events_named(run_dir, "key_usage_base")
    assert job.lanes[0].ledger.estimates.bounded_by is None
    assert billed < job.lanes[0].ledger.spent


async def test_a_run_resumed_with_another_key_is_not_bounded(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    sim = OpenRouterSim(sim_config())
    await sim.start()
    try:
        dataset = await crashed_run(tmp_path, sim, 0.3)
        settings = resume_settings(make_settings, sim, dataset, 0.3)
        settings.openrouter.api_key = SecretStr(OTHER_KEY)
        job = await resume(settings)
        billed = sim.billing.billed_total
    finally:
        await sim.stop()
    assert len(events_named(tmp_path / "run", "key_usage_void")) == 1
    assert not events_named(tmp_path / "run", "usage_bound")
    assert billed < job.lanes[0].ledger.spent


def test_pending_estimates_are_not_taken_off_the_room() -> None:
    """With an estimate still waiting for its bill, the bound takes only `usage - confirmed`: the
    bill may come out lower than the estimate, and spend must stay above the truth after it does."""
    ledger = Ledger(None)
    ledger.charge(Decimal("1.00"))  # confirmed
    ledger.charge(Decimal("0.50"), estimated=True, knowable=True)  # pending; its bill is 0.10
    ledger.charge(Decimal("3.00"), estimated=True, knowable=False, outcome="lost_at_crash")  # bill 0.20
    ledger.charge(Decimal("2.00"), estimated=True, knowable=False, outcome="cancelled")  # bill 0.30
    billed_since_base = Decimal("1.60")
    cuts = ledger.usage_cuts(billed_since_base)
    assert ledger.lower_unknowable(cuts, "key_usage") == Decimal("4.40")
    assert cuts == {"cancelled": Decimal("2.00"), "lost_at_crash": Decimal("2.40")}
    assert ledger.estimates.unknowable == Decimal("0.60") and ledger.estimates.unknowable_count == 2
    ledger.confirm(Decimal("0.50"), Decimal("0.10"))
    assert ledger.spent >= billed_since_base, "still above every bill once the pending one is known"
    assert ledger.usage_cuts(Decimal("100")) == {}, "an estimate is never raised"


class Front:
    """An HTTP server in front of the simulator that answers /key with 503 and passes the rest on."""

    def __init__(self, runner: web.AppRunner, port: int) -> None:
        self.runner = runner
        self.base_url = f"http://127.0.0.1:{port}/api/v1"

    async def stop(self) -> None:
        await self.runner.cleanup()


async def key_failing_front(sim: OpenRouterSim) -> Front:
    session = aiohttp.ClientSession()

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path.endswith("/key"):
            return web.json_response({"error": {"code": 503, "message": "unavailable"}}, status=503)
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        async with session.request(
            request.method,
            f"http://127.0.0.1:{sim.port}{request.path_qs}",
            data=await request.read(),
            headers=headers,
        ) as upstream:
            body = await upstream.read()
            keep = {
                k: v for k, v in upstream.headers.items() if k.lower() in ("content-type", "x-generation-id")
            }
            return web.Response(status=upstream.status, body=body, headers=keep)

    async def close_session(_: web.Application) -> None:
        await session.close()

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    app.on_cleanup.append(close_session)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return Front(runner, port)
