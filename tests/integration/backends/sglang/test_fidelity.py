"""The SGLang backend feeds the same fingerprints (docs/fidelity.md): a worker serving another model
under the job's model name is flagged against the other workers, and warned of (a lane without
routes to exclude can do no more)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path

import orjson
from pydantic import SecretStr

from regen.engine.backends.openrouter.audit import plan_audit, run_audit
from regen.engine.config.settings import Settings
from regen.engine.data.tokenizer import TargetTokenizer
from regen.engine.job.job import Job, StopReason
from regen.sim.openrouter.server import OpenRouterSim
from regen.sim.sglang.tokens import SimTokenizer
from tests.support.datasets import one_row_per_prompt, write_dataset
from tests.support.openrouter_sim import SIM_KEY, fast_sim_config
from tests.support.recording_sim import recording_sim, sim_config


async def test_a_drifting_worker_is_flagged_and_the_honest_ones_are_not(
    tmp_path: Path, sim_tok: SimTokenizer, sglang_settings: Callable[..., Settings]
) -> None:
    async with AsyncExitStack() as stack:
        honest = [await stack.enter_async_context(recording_sim(sim_config(), sim_tok)) for _ in range(2)]
        drifting = await stack.enter_async_context(recording_sim(sim_config(drift=0.3), sim_tok))
        data = write_dataset(tmp_path, "A", 300)
        settings = sglang_settings([s.base_url for s in (*honest, drifting)], [data])
        settings.openrouter.fidelity = "exclude"
        job = Job(settings)
        await job.prepare()
        outcome = await job.run()
    assert outcome.reason is StopReason.DONE, outcome.message
    one_row_per_prompt(data, 300)  # warned only: a worker cannot be excluded
    worker = drifting.base_url.split("://", 1)[1]  # a worker is named by its host and port
    views = {p["name"]: p for p in job.snapshot()["lanes"][0]["providers"]}
    assert len(views) == 3 and all(view["fidelity"] is not None for view in views.values())
    assert [name for name, view in views.items() if view["status"] == "DRIFT"] == [worker]
    fidelity = views[worker]["fidelity"]
    assert fidelity is not None and fidelity["action"] == "warn" and fidelity["against"] == "pool"
    events = [orjson.loads(x) for x in (job.run_dir / "events.jsonl").read_bytes().splitlines()]
    assert [e["provider"] for e in events if e["event"] == "drift"] == [worker]


async def test_the_audit_takes_the_gpu_fleets_answers_as_the_reference(
    tmp_path: Path, sim_tok: SimTokenizer, sglang_settings: Callable[..., Settings]
) -> None:
    data = write_dataset(tmp_path, "A", 20)
    async with AsyncExitStack() as stack:
        gpu = await stack.enter_async_context(recording_sim(sim_config(), sim_tok))
        openrouter = OpenRouterSim(fast_sim_config())
        await openrouter.start()
        stack.push_async_callback(openrouter.stop)
        settings = sglang_settings([gpu.base_url], [data], backends=["sglang", "openrouter"], budget_usd=1.0)
        settings.openrouter = settings.openrouter.model_copy(
            update={"base_url": openrouter.base_url, "api_key": SecretStr(SIM_KEY)}
        )
        settings.openrouter.provider.only = ["fireworks", "parasail"]
        plan = await plan_audit(settings, 3, 1, 64)
        assert plan.fits and len(plan.providers) == 2
        tokenizer = TargetTokenizer.from_settings(settings.tokenizer, path=settings.tokenizer.path)
        report = await run_audit(settings, plan, tokenizer.encode)
    assert report["reference"] == "sglang"
    rows = {row["provider"]: row for row in report["providers"]}
    server = f"sglang {gpu.base_url.split('://', 1)[1]}"
    assert rows[server]["answers"] == 3 and rows[server]["similarity_mean"] == 1.0
    # The two simulators are two different models: against the fleet, both providers differ.
    assert {rows[name]["verdict"] for name in ("Fireworks", "Parasail")} == {"differs"}
