"""The modelled in-flight spending budget (§6.5 item 2, §13.9) and the negative-balance 402 (§6.5 item 3)."""

from __future__ import annotations

import asyncio
import math
from decimal import Decimal

import aiohttp
import pytest

from regen.sim.openrouter.chat import estimate_prompt_tokens
from regen.sim.openrouter.server import OpenRouterSim
from tests.support.openrouter_http import PROMPT, Api, endpoint

FIREWORKS = {"only": ["fireworks"]}
MAX_TOKENS = 60_000  # 60000 x $2.40/M = $0.144 held per request at Fireworks


def approx(x: float) -> object:
    return pytest.approx(x, rel=1e-9, abs=1e-12)


def estimate(sim: OpenRouterSim, max_tokens: int) -> float:
    ep = endpoint(sim, "Fireworks")
    return float(ep.pricing.prompt) * estimate_prompt_tokens(PROMPT) + max_tokens * float(
        ep.pricing.completion
    )


def slow_fireworks(sim: OpenRouterSim, ttft_s: float = 0.4) -> None:
    """Requests that stay in flight for a while, then finish at once: holds are observable."""
    sim.config.time_scale = 1.0
    sim.config.endpoint_overrides = {"fireworks": {"ttft_s": ttft_s, "ttft_jitter": 0.0, "tokens_per_s": 1e6}}


async def wait_running(sim: OpenRouterSim, n: int) -> None:
    for _ in range(300):
        if sim.limits.budget.running == n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{sim.limits.budget.running} holds running, wanted {n}")


async def test_off_by_default_overcommits(api: Api, osim: OpenRouterSim) -> None:
    assert osim.config.in_flight_budget is False
    osim.config.credits = 1.0
    slow_fireworks(osim, 0.2)
    # Ten holds of $0.144 against a $1 balance: each passes the pre-flight check on its own.
    replies = await asyncio.gather(*(api.chat(max_tokens=MAX_TOKENS, provider=FIREWORKS) for _ in range(10)))
    assert [r.status for r in replies] == [200] * 10
    assert osim.limits.budget.running == 0 and osim.limits.budget.held == 0


async def test_holds_fill_the_budget_then_402_with_retry_after(api: Api, osim: OpenRouterSim) -> None:
    cfg = osim.config
    cfg.credits = 1.0
    cfg.in_flight_budget = True  # budget = min(0.5 x $1, $20) = $0.50
    slow_fireworks(osim)
    first = [asyncio.create_task(api.chat(max_tokens=MAX_TOKENS, provider=FIREWORKS)) for _ in range(3)]
    await wait_running(osim, 3)
    assert osim.limits.budget.held == approx(3 * estimate(osim, MAX_TOKENS))
    r = await api.stream(max_tokens=MAX_TOKENS, provider=FIREWORKS)  # a 4th would hold $0.576
    assert r.status == 402
    body = r.events[0][1]
    meta = body["error"]["metadata"]
    assert meta["reason"] == "in_flight_budget_exhausted"
    assert meta["limit_source"] == "openrouter_in_flight_budget"
    assert body["error"]["code"] == 402 and "in-flight requests" in body["error"]["message"]
    # Only running holds: nothing settles sooner than they end, so the configured wait.
    assert r.headers["Retry-After"] == "3"
    assert "X-Generation-Id" not in r.headers  # refused before routing commits
    assert osim.requests[-1]["error"] == "in_flight_budget_exhausted"
    # A smaller request still fits beside the three.
    assert (await api.chat(max_tokens=1000, provider=FIREWORKS)).status == 200
    assert [r.status for r in await asyncio.gather(*first)] == [200, 200, 200]
    assert osim.limits.budget.running == 0


async def test_settlement_window_keeps_real_costs_held(api: Api, osim: OpenRouterSim) -> None:
    cfg = osim.config
    cfg.credits = 1.0
    cfg.in_flight_budget = True
    cfg.in_flight_settlement_s = 0.6
    cfg.min_completion_tokens = cfg.max_completion_tokens = 2000  # ~$0.005 billed each
    slow_fireworks(osim, 0.0)
    done = await asyncio.gather(*(api.chat(max_tokens=4000, provider=FIREWORKS) for _ in range(3)))
    billed = sum(r.json["usage"]["cost"] for r in done)
    budget = osim.limits.budget
    assert budget.running == 0 and budget.settling == 3
    assert budget.held == approx(billed)  # the real costs, not the estimates
    # The largest request that fits an empty budget, but not one holding the settling costs.
    room = 0.5 * osim.billing.balance
    ep = endpoint(osim, "Fireworks")
    prompt_cost = float(ep.pricing.prompt) * estimate_prompt_tokens(PROMPT)
    fits_empty = math.floor((room - prompt_cost) / float(ep.pricing.completion))
    assert estimate(osim, fits_empty) > room - billed
    r = await api.chat(max_tokens=fits_empty, provider=FIREWORKS)
    assert r.status == 402 and r.json["error"]["metadata"]["reason"] == "in_flight_budget_exhausted"
    # Nothing is running: the wait is until the first settling hold expires.
    assert r.headers["Retry-After"] == "1"
    await asyncio.sleep(0.65)
    assert budget.held == 0 and budget.settling == 0
    # The balance is what the budget is a fraction of; recompute after the wait.
    fits_now = math.floor((0.5 * osim.billing.balance - prompt_cost) / float(ep.pricing.completion))
    assert (await api.chat(max_tokens=fits_now, provider=FIREWORKS)).status == 200


async def test_weight_exceeds_budget_has_no_retry_after(api: Api, osim: OpenRouterSim) -> None:
    cfg = osim.config
    cfg.in_flight_budget = True
    cfg.in_flight_budget_ceiling = 0.1  # $1000 of credits, but the ceiling binds
    r = await api.chat(max_tokens=MAX_TOKENS, provider=FIREWORKS)
    assert r.status == 402
    meta = r.json["error"]["metadata"]
    assert meta["reason"] == "weight_exceeds_budget" and meta["limit_source"] == "openrouter_credits"
    assert "max_tokens" in meta["remedy_hint"]
    assert "Retry-After" not in r.headers
    assert osim.limits.budget.running == 0 and osim.billing.records == []
    # The fraction binds too: 5% of $1 is $0.05.
    cfg.in_flight_budget_ceiling = 20.0
    cfg.credits = 1.0
    cfg.in_flight_budget_fraction = 0.05
    assert (await api.chat(max_tokens=MAX_TOKENS, provider=FIREWORKS)).json["error"]["metadata"][
        "reason"
    ] == "weight_exceeds_budget"
    assert (await api.chat(max_tokens=10_000, provider=FIREWORKS)).status == 200  # $0.024


async def test_budget_exemptions(api: Api, osim: OpenRouterSim) -> None:
    cfg = osim.config
    cfg.in_flight_budget = True
    cfg.in_flight_budget_ceiling = 0.01
    assert (await api.chat(max_tokens=MAX_TOKENS, provider=FIREWORKS)).status == 402
    # Above the balance threshold the budget does not apply (low-balance accounts only).
    cfg.in_flight_balance_threshold = 500.0
    assert (await api.chat(max_tokens=MAX_TOKENS, provider=FIREWORKS)).status == 200
    cfg.in_flight_balance_threshold = None
    # Neither BYOK requests nor free models are covered.
    cfg.byok = True
    assert (await api.chat(max_tokens=MAX_TOKENS, provider=FIREWORKS)).status == 200
    cfg.byok = False
    assert (await api.chat(model="moonshotai/kimi-k2.5:free", max_tokens=MAX_TOKENS)).status == 200
    assert osim.limits.budget.held == 0


async def test_unbilled_failures_release_their_hold(api: Api, osim: OpenRouterSim) -> None:
    cfg = osim.config
    cfg.in_flight_budget = True
    cfg.credits = 1.0
    for fault in ("http_502", "reset_before_headers", "http_402_in_flight"):
        cfg.faults = {fault: 1.0}
        try:
            await api.chat(max_tokens=MAX_TOKENS, provider=FIREWORKS)
        except aiohttp.ServerDisconnectedError:
            assert fault == "reset_before_headers"
        assert osim.requests[-1]["error"] == fault
        assert osim.limits.budget.running == 0 and osim.limits.budget.held == 0
    cfg.faults = {}
    cfg.provider_faults = {"fireworks": {"http_503": 1.0}}
    assert (await api.chat(max_tokens=MAX_TOKENS, provider=FIREWORKS)).status == 503
    assert osim.limits.budget.held == 0


async def test_aborted_stream_settles_what_was_billed(api: Api, osim: OpenRouterSim) -> None:
    cfg = osim.config
    cfg.in_flight_budget = True
    cfg.credits = 1.0
    cfg.in_flight_settlement_s = 30.0
    cfg.time_scale = 1.0
    cfg.endpoint_overrides = {"parasail": {"ttft_s": 5.0, "ttft_jitter": 0.0}}
    task = asyncio.create_task(api.stream(max_tokens=MAX_TOKENS, provider={"only": ["parasail"]}))
    await wait_running(osim, 1)
    parasail = endpoint(osim, "Parasail").pricing  # the hold is the pre-flight estimate
    held = (
        Decimal(parasail.prompt) * estimate_prompt_tokens(PROMPT) + Decimal(parasail.completion) * MAX_TOKENS
    )
    assert osim.limits.budget.held == approx(float(held))
    task.cancel()
    for _ in range(300):
        if osim.billing.records:
            break
        await asyncio.sleep(0.01)
    [rec] = osim.billing.records
    assert rec.cancelled and osim.limits.budget.running == 0
    # Parasail cannot cancel, so the whole completion is billed, and that is what stays held.
    assert rec.cost > 0 and osim.limits.budget.held == approx(rec.cost)


async def test_negative_balance_refuses_free_models_too(api: Api, osim: OpenRouterSim) -> None:
    free = await api.chat(model="moonshotai/kimi-k2.5:free")
    assert free.status == 200 and free.json["usage"]["cost"] == 0
    osim.config.credits = 0.002
    osim.config.time_scale = 0.5  # every request passes the pre-flight check before one is debited
    replies = await asyncio.gather(*(api.chat(max_tokens=60) for _ in range(30)))
    assert all(r.status == 200 for r in replies)
    assert osim.billing.balance < 0
    for r in (await api.chat(model="moonshotai/kimi-k2.5:free"), await api.chat(max_tokens=1)):
        assert r.status == 402
        assert r.json["error"]["message"].startswith("Insufficient credits")
        assert r.json["error"]["metadata"]["limit_source"] == "openrouter_credits"
        assert "Retry-After" not in r.headers
    assert osim.requests[-1]["error"] == "negative_balance"
    # A balance of about nothing is not negative: the free model answers, a paid one fails pre-flight.
    osim.config.credits = float(osim.billing.billed_total) + 1e-9
    assert 0 <= osim.billing.balance < 1e-8
    assert (await api.chat(model="moonshotai/kimi-k2.5:free")).status == 200
    paid = await api.chat(max_tokens=10)
    assert paid.status == 402 and "can only afford" in paid.json["error"]["message"]
