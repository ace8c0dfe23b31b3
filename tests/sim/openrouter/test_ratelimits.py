"""Free-model platform limits (§7.3, §13.10) and per-provider rate buckets (§13.24)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from pydantic import ValidationError

from regen.sim.configs import patched
from regen.sim.openrouter.server import OpenRouterSim
from tests.support.openrouter_http import Api

FREE = "moonshotai/kimi-k2.5:free"


async def free_burst(api: Api, n: int) -> list[int]:
    replies = await asyncio.gather(*(api.chat(model=FREE) for _ in range(n)))
    return [r.status for r in replies]


async def test_free_variant_is_free_and_served_by_its_providers(api: Api, osim: OpenRouterSim) -> None:
    r = await api.chat(model=FREE)
    assert r.status == 200 and r.json["provider"] in ("Parasail", "Chutes")
    assert r.json["usage"]["cost"] == 0 and osim.billing.billed_total == 0
    listing = await api.get("/models/moonshotai/kimi-k2.5:free/endpoints")
    eps = listing.json["data"]["endpoints"]
    assert {e["provider_name"] for e in eps} == {"Parasail", "Chutes"}
    assert all(e["pricing"]["prompt"] == "0" and e["pricing"]["completion"] == "0" for e in eps)
    # A model without a free variant has no `:free` slug.
    bad = await api.chat(model="moonshotai/kimi-k2-thinking:free")
    assert bad.status == 400 and bad.json["error"]["availability"]["code"] == "model_not_found"
    # Limits are off by default: far more than 20 a minute go through.
    assert set(await free_burst(api, 30)) == {200}


async def test_free_per_minute_limit(api: Api, osim: OpenRouterSim) -> None:
    osim.config.free_model_limits = True
    assert set(await free_burst(api, 20)) == {200}
    before = time.time()
    r = await api.chat(model=FREE)
    assert r.status == 429
    err = r.json["error"]
    assert err["code"] == 429 and err["message"] == "Rate limit exceeded: free-models-per-min"
    assert r.json["user_id"].startswith("user_")
    assert r.headers["X-RateLimit-Limit"] == "20" and r.headers["X-RateLimit-Remaining"] == "0"
    reset_ms = int(r.headers["X-RateLimit-Reset"])
    assert before * 1000 < reset_ms <= (time.time() + 60) * 1000  # epoch milliseconds
    assert err["metadata"]["headers"] == {
        k: r.headers[k] for k in ("X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset")
    }
    assert "Retry-After" not in r.headers and "X-Generation-Id" not in r.headers
    assert osim.requests[-1]["error"] == "free_model_per_min"
    osim.config.free_model_retry_after = True
    r = await api.chat(model=FREE)
    assert r.status == 429 and 1 <= int(r.headers["Retry-After"]) <= 60
    # Paid variants have no platform limit.
    assert (await api.chat()).status == 200


async def test_free_per_minute_window_slides(api: Api, osim: OpenRouterSim) -> None:
    cfg = osim.config
    cfg.free_model_limits = True
    clock = [1_000_000.0]
    osim.limits.free._clock = lambda: clock[0]
    assert set(await free_burst(api, 20)) == {200}
    assert (await api.chat(model=FREE)).status == 429
    clock[0] += 59.0
    assert (await api.chat(model=FREE)).status == 429
    clock[0] += 1.0  # the first twenty are a minute old
    assert set(await free_burst(api, 20)) == {200}


@pytest.mark.parametrize(
    ("credits", "bought", "limit"),
    [(5.0, None, 50), (10.0, None, 1000), (5.0, True, 1000), (1000.0, False, 50)],
)
async def test_free_per_day_limit_depends_on_credits_bought(
    api: Api, osim: OpenRouterSim, credits: float, bought: bool | None, limit: int
) -> None:
    cfg = osim.config
    cfg.free_model_limits = True
    cfg.free_model_rpm = 100_000
    cfg.credits = credits
    cfg.free_model_credits_bought = bought
    osim.limits.free.day_count = limit - 3  # the day so far, without sending them all
    osim.limits.free._day = int(time.time() // 86400)
    assert set(await free_burst(api, 3)) == {200}
    key = (await api.get("/key")).json["data"]["free_model_daily_requests"]
    assert key == {"used": limit, "limit": limit, "remaining": 0}
    r = await api.chat(model=FREE)
    assert r.status == 429
    assert r.json["error"]["message"] == "Rate limit exceeded: free-models-per-day"
    assert r.headers["X-RateLimit-Limit"] == str(limit)
    midnight_ms = (int(time.time() // 86400) + 1) * 86400 * 1000
    assert int(r.headers["X-RateLimit-Reset"]) == midnight_ms  # the next UTC midnight


async def test_free_day_counter_is_real(api: Api, osim: OpenRouterSim) -> None:
    cfg = osim.config
    cfg.free_model_limits = True
    cfg.free_model_rpm = 100_000
    cfg.free_model_credits_bought = False
    assert set(await free_burst(api, 50)) == {200}
    assert (await api.chat(model=FREE)).status == 429
    cfg.free_model_credits_bought = True  # buying $10 of credits lifts the day to 1000
    assert (await api.chat(model=FREE)).status == 200
    assert osim.limits.free.used_today() == 51  # refused requests are not counted


async def test_provider_bucket_without_fallbacks_is_an_upstream_429(api: Api, osim: OpenRouterSim) -> None:
    osim.config.provider_rate_limits = {"parasail": 2.0}  # bucket depth: 1 s of rate = 2 requests
    only = {"only": ["parasail"]}
    assert [(await api.chat(provider=only)).status for _ in range(2)] == [200, 200]
    r = await api.chat(provider=only)
    assert r.status == 429
    err = r.json["error"]
    assert err["message"] == "Provider returned error" and err["metadata"]["provider_name"] == "Parasail"
    assert json.loads(err["metadata"]["raw"])["error"]["type"] == "rate_limit_error"
    assert r.headers["Retry-After"] == "1"  # half a second until a token, rounded up
    assert "X-Generation-Id" in r.headers  # routed, then refused upstream
    assert osim.requests[-1]["error"] == "upstream_rate_limited"
    assert osim.limits.buckets.refused == {"parasail/fp8": 1}
    osim.config.provider_rate_retry_after = False
    r = await api.chat(provider=only)
    assert r.status == 429 and "Retry-After" not in r.headers
    await asyncio.sleep(0.55)
    assert (await api.chat(provider=only)).status == 200
    # Other providers have no limit configured.
    assert {(await api.chat(provider={"only": ["fireworks"]})).status for _ in range(5)} == {200}


async def test_provider_bucket_falls_back_when_allowed(api: Api, osim: OpenRouterSim) -> None:
    cfg = osim.config
    cfg.provider_rate_limits = {"Parasail": 1.0}
    cfg.provider_rate_burst_s = 3.0  # depth 3
    order = {"order": ["parasail", "fireworks"]}
    got = [(await api.chat(provider=order)).json["provider"] for _ in range(5)]
    assert got == ["Parasail"] * 3 + ["Fireworks"] * 2
    rec = osim.billing.records[-1]
    assert [(a.provider_name, a.status) for a in rec.attempts] == [("Parasail", 429), ("Fireworks", 200)]
    # The same order without fallbacks: Parasail's 429 is returned as is.
    r = await api.chat(provider={**order, "allow_fallbacks": False})
    assert r.status == 429 and r.json["error"]["metadata"]["provider_name"] == "Parasail"


async def test_provider_bucket_mixed_failures_drop_retry_after(api: Api, osim: OpenRouterSim) -> None:
    cfg = osim.config
    cfg.provider_rate_limits = {"fireworks": 1.0}
    cfg.provider_faults = {"parasail": {"http_502": 1.0}}
    order = {"order": ["parasail", "fireworks"], "only": ["parasail", "fireworks"]}
    assert (await api.chat(provider=order)).status == 200  # Parasail fails, Fireworks serves
    r = await api.chat(provider=order)
    # The last provider was rate-limited, but the first gave no retry hint (§6.6).
    assert r.status == 429 and "Retry-After" not in r.headers


async def test_provider_rate_limits_validated(osim: OpenRouterSim) -> None:
    with pytest.raises(ValidationError):
        patched(osim.config, {"provider_rate_limits": {"parasail": 0}})
