"""Auth, validation, /key, /credits, /generation, catalog routes, ledger and the 402 pre-flight."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from decimal import Decimal

import pytest

from regen.sim.openrouter.server import OpenRouterSim
from tests.support.openrouter_http import MGMT, Api, Reply, StreamReply


async def test_auth_401_bodies(api: Api, osim: OpenRouterSim) -> None:
    r = await api.chat(key=None)
    assert r.status == 401
    assert r.json == {"error": {"message": "No auth credentials found", "code": 401}}
    r = await api.chat(key="sk-or-v1-notakey")
    assert r.status == 401 and r.json["error"]["message"] == "User not found."
    assert "X-Generation-Id" not in r.headers
    for path in ("/key", "/auth/key", "/credits", "/generation"):
        assert (await api.get(path, key="nope")).status == 401
    assert osim.requests[-2]["error"] == "unauthorized"


@pytest.mark.parametrize(
    "data",
    [
        b"{not json",
        b"[]",
        b'{"model": "moonshotai/kimi-k2.5"}',
        b'{"messages": []}',
        b'{"messages": [{"content": "no role"}]}',
        b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}',
        b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": "10"}',
    ],
)
async def test_malformed_requests_400(api: Api, data: bytes) -> None:
    r = await api.post_raw(data)
    assert r.status == 400 and r.json["error"]["code"] == 400
    assert "X-Generation-Id" not in r.headers


async def test_key_reflects_ledger(api: Api, osim: OpenRouterSim) -> None:
    osim.config.key_limit = 50.0
    osim.config.key_limit_reset = "monthly"
    before = (await api.get("/key")).json["data"]
    assert before["usage"] == 0 and before["limit"] == 50.0 and before["limit_remaining"] == 50.0
    assert before["is_management_key"] is False and before["limit_reset"] == "monthly"
    r = await api.chat()
    after = (await api.get("/auth/key")).json["data"]
    assert after["usage"] == r.json["usage"]["cost"]
    assert after["limit_remaining"] == pytest.approx(50.0 - r.json["usage"]["cost"])
    assert (await api.get("/key", key=MGMT)).json["data"]["is_management_key"] is True


async def test_credits_management_gate(api: Api, osim: OpenRouterSim) -> None:
    r = await api.get("/credits")
    assert r.status == 403
    assert r.json["error"]["message"] == "Only management keys can perform this operation"
    await api.chat()
    r = await api.get("/credits", key=MGMT)
    assert r.status == 200
    assert r.json["data"]["total_credits"] == 1000.0
    assert r.json["data"]["total_usage"] == osim.billing.usage > 0
    osim.config.credits_require_management_key = False
    assert (await api.get("/credits")).status == 200


async def test_generation_lag_then_record(api: Api, osim: OpenRouterSim) -> None:
    osim.config.generation_lookup_delay_s = 0.3
    r = await api.chat()
    gen_id = r.json["id"]
    early = await api.get("/generation", params={"id": gen_id})
    assert early.status == 404
    assert early.json["error"]["message"] == f"Generation {gen_id} not found"
    assert early.headers["cache-control"] == "private, no-store"
    await asyncio.sleep(0.35)
    g = await api.get("/generation", params={"id": gen_id})
    assert g.status == 200
    d = g.json["data"]
    assert d["id"] == gen_id and d["total_cost"] == r.json["usage"]["cost"] == d["usage"]
    assert d["provider_name"] == r.json["provider"] and d["model"] == r.json["model"]
    assert d["native_tokens_prompt"] == r.json["usage"]["prompt_tokens"]
    assert d["native_tokens_completion"] == r.json["usage"]["completion_tokens"]
    assert d["tokens_prompt"] != d["native_tokens_prompt"]
    assert d["streamed"] is True and d["cancelled"] is False  # streamed:true even non-stream
    assert d["upstream_inference_cost"] == 0 and d["finish_reason"] == "stop"
    assert d["request_id"].startswith("req-")
    assert (await api.get("/generation")).status == 400
    assert (await api.get("/generation", params={"id": "gen-0-x"})).status == 404


async def test_models_paging(api: Api) -> None:
    r = await api.get("/models", key=None)
    assert r.status == 200
    assert r.json["total_count"] == 2 and len(r.json["data"]) == 2
    k25 = next(m for m in r.json["data"] if m["id"] == "moonshotai/kimi-k2.5")
    assert k25["canonical_slug"] == "moonshotai/kimi-k2.5-0127"
    assert k25["context_length"] == 262144
    assert k25["pricing"]["completion"] == "0.0000022" and k25["pricing"]["prompt"] == "0.00000045"
    assert k25["top_provider"]["max_completion_tokens"] is None or isinstance(
        k25["top_provider"]["max_completion_tokens"], int
    )
    page = await api.get("/models", params={"offset": "0", "limit": "1"})
    assert len(page.json["data"]) == 1
    assert page.json["links"]["next"] == "/api/v1/models?offset=1&limit=1"
    last = await api.get("/models", params={"offset": "1", "limit": "1"})
    assert last.json["links"]["next"] is None and last.json["total_count"] == 2


async def test_endpoints_listing(api: Api) -> None:
    r = await api.get("/models/moonshotai/kimi-k2.5/endpoints", key=None)
    assert r.status == 200
    eps = r.json["data"]["endpoints"]
    assert len(eps) == 11
    quants = [e["quantization"] for e in eps]
    assert quants.count("fp8") >= 4
    for q in ("int4", "fp4", "nvfp4", "bf16", "unknown", None):
        assert q in quants
    for e in eps:
        assert isinstance(e["pricing"]["prompt"], str) and isinstance(e["pricing"]["completion"], str)
        per_m = Decimal(1_000_000)
        assert Decimal("0.45") <= Decimal(e["pricing"]["prompt"]) * per_m <= Decimal("1.20")
        assert Decimal("2.20") <= Decimal(e["pricing"]["completion"]) * per_m <= Decimal("3.00")
        assert e["latency_last_30m"] is None and e["throughput_last_30m"] is None
        for field in (
            "name",
            "model_id",
            "model_name",
            "context_length",
            "provider_name",
            "tag",
            "max_completion_tokens",
            "max_prompt_tokens",
            "supported_parameters",
            "uptime_last_30m",
            "uptime_last_5m",
            "uptime_last_1d",
            "supports_implicit_caching",
            "status",
        ):
            assert field in e
    assert sum(1 for e in eps if e["status"] == -2) == 2
    moonshot = next(e for e in eps if e["tag"].startswith("moonshotai"))
    assert moonshot["provider_name"] == "Moonshot AI" and moonshot["quantization"] == "int4"
    assert next(e for e in eps if e["tag"] == "deepinfra/fp4")["quantization"] == "fp4"
    authed = await api.get("/models/moonshotai/kimi-k2.5/endpoints")
    assert authed.json["data"]["endpoints"][0]["throughput_last_30m"]["p50"] > 0
    assert (await api.get("/models/nobody/nothing/endpoints")).status == 404


async def test_billed_total_equals_sum_of_reported_costs(api: Api, osim: OpenRouterSim) -> None:
    calls: list[Awaitable[Reply | StreamReply]] = [
        *(api.chat(messages=[{"role": "user", "content": f"q {i}"}]) for i in range(25)),
        *(api.stream(messages=[{"role": "user", "content": f"s {i}"}]) for i in range(25)),
    ]
    replies = await asyncio.gather(*calls)
    costs = [r.json["usage"]["cost"] if isinstance(r, Reply) else r.required_usage()["cost"] for r in replies]
    assert len(osim.billing.records) == 50
    assert osim.billing.billed_total == sum(Decimal(repr(c)) for c in costs)
    assert str(osim.billing.billed_total) == osim.state()["ledger"]["billed_total"]
    assert osim.billing.balance == pytest.approx(1000.0 - float(osim.billing.billed_total))


async def test_preflight_402_when_balance_short(api: Api, osim: OpenRouterSim) -> None:
    osim.config.credits = 0.01
    # 16384 x $2.40/M at Fireworks = $0.039 > $0.01
    r = await api.chat(max_tokens=16384, provider={"only": ["fireworks"]})
    assert r.status == 402
    msg = r.json["error"]["message"]
    assert msg.startswith("This request requires more credits, or fewer max_tokens.")
    assert "You requested up to 16384 tokens, but can only afford 41" in msg
    assert "settings/credits" in msg
    assert r.json["error"]["metadata"] == {"provider_name": None}
    assert "X-Generation-Id" not in r.headers
    assert (await api.chat(max_tokens=100, provider={"only": ["fireworks"]})).status == 200
    # No max_tokens: the endpoint's or model's maximum output is assumed.
    assert (await api.chat(provider={"only": ["fireworks"]})).status == 402


async def test_preflight_402_key_limit_variant(api: Api, osim: OpenRouterSim) -> None:
    osim.config.key_limit = 0.001
    r = await api.chat(max_tokens=4000, provider={"only": ["fireworks"]})
    assert r.status == 402 and "settings/keys" in r.json["error"]["message"]


async def test_debit_at_completion_allows_overshoot(api: Api, osim: OpenRouterSim) -> None:
    osim.config.credits = 0.002
    # Slow enough that every request passes the pre-flight check before the first one is debited,
    # however loaded the machine (at the quick() scale one can finish before the next arrives).
    osim.config.time_scale = 0.5
    replies = await asyncio.gather(*(api.chat(max_tokens=60) for _ in range(30)))
    assert all(r.status == 200 for r in replies)
    assert osim.billing.balance < 0  # concurrent requests overshoot, as at OpenRouter
    r = await api.chat(max_tokens=1)
    assert r.status == 402


async def test_byok_switch(api: Api, osim: OpenRouterSim) -> None:
    osim.config.byok = True
    r = await api.chat()
    u = r.json["usage"]
    assert u["is_byok"] is True and u["cost"] == 0
    assert u["cost_details"]["upstream_inference_cost"] > 0
    assert osim.billing.billed_total == 0


async def test_key_and_credits_lag_the_ledger(api: Api, osim: OpenRouterSim) -> None:
    osim.config.key_limit = 50.0
    osim.config.account_staleness_s = 0.4
    r = await api.chat()
    cost = r.json["usage"]["cost"]
    assert osim.billing.usage == cost  # the simulator's own truth is live
    key = (await api.get("/key")).json["data"]
    assert key["usage"] == 0 and key["usage_daily"] == 0 and key["limit_remaining"] == 50.0
    assert (await api.get("/credits", key=MGMT)).json["data"]["total_usage"] == 0
    await asyncio.sleep(0.45)
    key = (await api.get("/key")).json["data"]
    assert key["usage"] == cost and key["limit_remaining"] == pytest.approx(50.0 - cost)
    assert (await api.get("/credits", key=MGMT)).json["data"]["total_usage"] == cost
    # A second completion shows up only after its own lag, on top of the first.
    r2 = await api.chat(messages=[{"role": "user", "content": "another"}])
    assert (await api.get("/key")).json["data"]["usage"] == cost
    await asyncio.sleep(0.45)
    both = float(Decimal(repr(cost)) + Decimal(repr(r2.json["usage"]["cost"])))
    assert (await api.get("/key")).json["data"]["usage"] == both
    # The gates do not lag: with the credits all spent a moment ago, /key still shows money left
    # while the pre-flight check, reading the live ledger, refuses.
    osim.config.credits = float(osim.billing.billed_total) + 1e-4
    osim.config.time_scale = 0.5  # all three pass the pre-flight check before one is debited
    overshoot = await asyncio.gather(*(api.chat(max_tokens=20) for _ in range(3)))
    assert [r.status for r in overshoot] == [200] * 3 and osim.billing.balance < 0
    credits = (await api.get("/credits", key=MGMT)).json["data"]
    assert credits["total_usage"] == both and credits["total_credits"] > both
    r = await api.chat(max_tokens=10)
    assert r.status == 402 and osim.requests[-1]["error"] == "negative_balance"
