"""/metrics of a real job on both fleets (the SGLang and OpenRouter simulators on loopback), scraped
while it runs and at its end, parsed by prometheus-client's own parser: its counters are the
snapshot's and the journal's figures, dollars and GPU-seconds each in their own family."""

from __future__ import annotations

import asyncio
import io
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from regen.engine.config.settings import MetricsSettings, Settings
from regen.engine.control.headless import run_headless
from regen.engine.control.metrics import MetricsServer
from regen.engine.job.job import Job, StopReason
from regen.engine.schema import Snapshot
from regen.sim.openrouter.server import OpenRouterSim
from regen.sim.sglang.server import SGLangSim
from tests.support.datasets import one_row_per_prompt, write_dataset
from tests.support.journals import journal, spend_by_backend
from tests.support.metrics_page import Page, dashboard_names, scrape
from tests.support.processes import free_port

BACKENDS = ("sglang", "openrouter")


def lane_figures(snap: Snapshot) -> dict[str, tuple[int, int, int]]:
    """Per backend: rows, attempts, and the output tokens of its routes' successes (rows on their way to
    the results file among them), as the snapshot counts them."""
    return {
        lane["name"]: (lane["rows"], lane["attempts"], sum(p["output_tokens"] for p in lane["providers"]))
        for lane in snap["lanes"]
    }


def page_figures(page: Page) -> dict[str, tuple[int, int, int]]:
    return {
        b: (
            int(page.total("regen_rows_total", backend=b)),
            int(page.total("regen_attempts_total", backend=b)),
            int(page.total("regen_output_tokens_total", backend=b)),
        )
        for b in BACKENDS
    }


async def test_the_metrics_page_counts_what_the_snapshot_and_the_journal_count(
    gpu_sim: SGLangSim, paid_sim: OpenRouterSim, fleet_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    gpu_sim.apply_config(gpu_sim.config.model_copy(update={"time_scale": 0.3}))
    paid_sim.config.time_scale = 0.2  # OpenRouter makes its first rows within a second, too
    data = write_dataset(tmp_path, "A", 150)
    port = free_port()
    settings = fleet_settings(gpu_sim.base_url, paid_sim.base_url, [data])
    settings = settings.model_copy(update={"metrics": MetricsSettings(listen=str(port))})
    job = Job(settings)
    await job.prepare()
    # The headless run serves the settings' /metrics and closes it with the run; a second server on
    # the same job is read once the run has ended.
    after_end = MetricsServer(job, "127.0.0.1", free_port())
    await after_end.start()
    out = io.StringIO()
    runner = asyncio.create_task(run_headless(job, out=out, interval_s=60))
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not all(lane.stats.counters.rows >= 3 for lane in job.lanes):
            assert loop.time() < deadline and not runner.done(), "both fleets make rows"
            await asyncio.sleep(0.02)
        job.set_deadline("12h", origin="test")
        before = job.snapshot()
        live = await scrape(f"127.0.0.1:{port}")
        after = job.snapshot()
        # Counters only grow: what the page said lies between the snapshots taken either side of it.
        low, seen, high = lane_figures(before), page_figures(live), lane_figures(after)
        for b in BACKENDS:
            assert all(lo <= s <= hi for lo, s, hi in zip(low[b], seen[b], high[b], strict=True)), (
                b,
                low,
                seen,
                high,
            )
        assert live.total("regen_job_state", state="RUNNING") == 1 and live.total("regen_job_state") == 1
        fleet = after.get("fleet")
        assert fleet is not None and fleet["deadline_ts"] is not None
        assert live.values("regen_deadline_timestamp_seconds") == [pytest.approx(fleet["deadline_ts"])]
        assert live.values("regen_deadline_fits") in ([0.0], [1.0])
        assert live.values("regen_budget_dollars", backend="openrouter") == [settings.job.budget_usd]
        assert live.values("regen_budget_gpu_seconds") == [], "GPU time has no budget"
        assert live.values("regen_sglang_server_up", backend="sglang", route=f"127.0.0.1:{gpu_sim.port}") == [
            1.0
        ]
        assert 0 < live.total("regen_in_flight") <= live.total("regen_concurrency_configured")
        # Every name the dashboard queries is on the page.
        assert dashboard_names() <= live.names, sorted(dashboard_names() - live.names)
        outcome = await runner
    finally:
        if not runner.done():
            job.stop(cancel=True)
            await runner
    try:
        assert outcome.reason is StopReason.DONE, outcome.message
        page = await scrape(after_end.address)
    finally:
        await after_end.close()
    assert f"metrics: http://127.0.0.1:{port}/metrics\n" in out.getvalue()
    with pytest.raises(aiohttp.ClientError):
        await scrape(f"127.0.0.1:{port}")  # closed with the run

    snap = job.snapshot()
    rows = one_row_per_prompt(data, 150)
    ends = [rec for rec in journal(settings.job.run_dir / "attempts.jsonl") if rec["k"] == "end"]
    spent = spend_by_backend(settings.job.run_dir / "attempts.jsonl")
    assert page.total("regen_job_state", state="DONE") == 1
    assert page_figures(page) == lane_figures(snap)
    assert page.total("regen_rows_total") == snap["rows"] == len(rows) == 150
    views = [p.get("fidelity") for lane in snap["lanes"] for p in lane["providers"]]
    fingerprinted = sum(view["responses"] for view in views if view is not None)
    assert page.total("regen_fidelity_responses_total") == fingerprinted > 0
    assert page.values("regen_queue_depth") == [0.0] and page.values("regen_dataset_done", status="ok") == [
        float(snap["datasets"][0]["ok"])
    ]
    for b in BACKENDS:
        lane = next(lane for lane in snap["lanes"] if lane["name"] == b)
        made = [row for row in rows if row["backend"] == b]
        finished = [rec for rec in ends if rec["be"] == b and rec["outcome"] in ("ok", "truncated")]
        statuses = Counter(row["status"] for row in made)
        for status in ("ok", "truncated"):
            assert page.values("regen_rows_total", backend=b, status=status) == [statuses[status]], (
                b,
                status,
            )
        assert page.total("regen_attempts_total", backend=b) == len([rec for rec in ends if rec["be"] == b])
        assert page.total("regen_errors_total", backend=b) == sum(lane["errors"].values())
        # Tokens: the rows' usage, the journal's, the snapshot's.
        assert (
            page.total("regen_output_tokens_total", backend=b)
            == sum(row["usage"]["completion_tokens"] for row in made)
            == lane["output_tokens"]
        )
        assert page.total("regen_prompt_tokens_total", backend=b) == sum(rec["ptok"] for rec in finished) > 0
        # Per route: requests as the journal names them; latency histograms hold every success.
        routes = Counter(rec["provider"] for rec in ends if rec["be"] == b and rec.get("provider"))
        assert {r: int(page.total("regen_requests_total", backend=b, route=r)) for r in routes} == dict(
            routes
        )
        for p in lane["providers"]:
            if p["requests"]:
                count = page.values("regen_request_duration_seconds_count", backend=b, route=p["name"])
                assert (
                    count
                    == [p["ok"]]
                    == page.values("regen_time_to_first_token_seconds_count", backend=b, route=p["name"])
                )
                assert page.values(
                    "regen_request_duration_seconds_bucket", backend=b, route=p["name"], le="+Inf"
                ) == [p["ok"]]
            # Fidelity (on by default, warn): the route's fingerprint as the providers pane has it.
            fidelity = p.get("fidelity")
            if fidelity is not None:
                state = fidelity["state"]
                assert page.values("regen_fidelity_state", backend=b, route=p["name"], state=state) == [1.0]
                assert page.total("regen_fidelity_state", backend=b, route=p["name"]) == 1
                assert page.values("regen_fidelity_responses_total", backend=b, route=p["name"]) == [
                    fidelity["responses"]
                ]
    # Money, each ledger in its unit: what it spent is what the journal sums to.
    paid, gpus = job.dispatcher.lane("openrouter").ledger, job.dispatcher.lane("sglang").ledger
    assert page.values("regen_spent_dollars", backend="openrouter") == [float(paid.spent)]
    assert spent["openrouter"] == paid.spent > 0
    assert page.values("regen_spent_gpu_seconds", backend="sglang") == [float(gpus.spent)]
    assert spent["sglang"] == gpus.spent > 0
    assert (
        page.values("regen_spent_dollars", backend="sglang")
        == []
        == page.values("regen_spent_gpu_seconds", backend="openrouter")
    )
    assert page.total("regen_reserved_dollars") == 0 == page.total("regen_reserved_gpu_seconds")
    assert page.total("regen_in_flight") == 0
