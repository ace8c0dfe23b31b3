"""Routing engine (§2.2-§2.3) and the 404/400 bodies it answers with (§6.4)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from regen.sim.openrouter.server import OpenRouterSim
from tests.support.openrouter_http import Api

NATIVE_OR_BETTER = ["int4", "fp8", "bf16", "unknown"]


async def served(api: Api, n: int = 1, **fields: Any) -> list[str]:
    replies = await asyncio.gather(*(api.chat(**fields) for _ in range(n)))
    assert all(r.status == 200 for r in replies), [r.json for r in replies]
    return [r.json["provider"] for r in replies]


@pytest.mark.parametrize("name", ["parasail", "Parasail", "PARASAIL", "parasail/fp8"])
async def test_only_matches_slug_display_name_and_tag(api: Api, name: str) -> None:
    assert set(await served(api, 5, provider={"only": [name]})) == {"Parasail"}


async def test_display_name_with_space(api: Api) -> None:
    assert set(await served(api, 3, provider={"only": ["Moonshot AI"]})) == {"Moonshot AI"}


async def test_ignore_never_serves_ignored(api: Api) -> None:
    ignore = ["deepinfra", "gmicloud", "parasail", "fireworks", "baseten", "together"]
    got = set(await served(api, 40, provider={"ignore": ignore}))
    assert got and got.isdisjoint({"DeepInfra", "GMICloud", "Parasail", "Fireworks", "BaseTen", "Together"})


async def test_order_without_fallbacks(api: Api) -> None:
    got = await served(api, 5, provider={"order": ["novita", "fireworks"], "allow_fallbacks": False})
    assert set(got) == {"Novita"}


async def test_sort_price_with_quantization_filter(api: Api) -> None:
    # The story: ignore the below-native fp4/nvfp4 endpoints, cheapest left is $2.20/M.
    got = await served(api, 3, provider={"sort": "price", "quantizations": NATIVE_OR_BETTER})
    assert set(got) == {"Parasail"}
    got = await served(api, 3, provider={"sort": "price", "ignore": ["deepinfra", "gmicloud"]})
    assert set(got) == {"Parasail"}
    got = await served(api, 1, provider={"sort": "price"})
    assert got == ["DeepInfra"]  # same $2.20/M completion, cheaper prompt
    assert await served(api, 1, provider={"sort": {"by": "price", "partition": "none"}}) == ["DeepInfra"]


async def test_sort_throughput_and_latency(api: Api) -> None:
    assert await served(api, 1, provider={"sort": "throughput"}) == ["GMICloud"]
    assert await served(api, 1, provider={"sort": "latency"}) == ["GMICloud"]
    q = {"quantizations": NATIVE_OR_BETTER}
    assert await served(api, 1, provider={"sort": "throughput", **q}) == ["Fireworks"]
    assert await served(api, 1, model="moonshotai/kimi-k2.5:nitro") == ["GMICloud"]
    assert await served(api, 1, model="moonshotai/kimi-k2.5:floor") == ["DeepInfra"]


async def test_quantization_families(api: Api) -> None:
    got = set(await served(api, 30, provider={"quantizations": ["fp4"]}))
    assert got <= {"DeepInfra", "GMICloud"} and got
    got = set(await served(api, 10, provider={"quantizations": ["nvfp4"]}))
    assert got == {"GMICloud"}
    got = set(await served(api, 10, provider={"quantizations": ["int4"]}))
    assert got == {"Moonshot AI"}


@pytest.mark.parametrize("limit", [2.2, "2.2", 2.20, "2.20"])
async def test_max_price_per_million_numbers_or_strings(api: Api, limit: object) -> None:
    got = set(await served(api, 20, provider={"max_price": {"completion": limit}}))
    assert got <= {"Parasail", "DeepInfra"} and got


async def test_max_price_nothing_qualifies(api: Api) -> None:
    r = await api.chat(provider={"max_price": {"completion": 2.19, "prompt": 1}})
    assert r.status == 404
    assert r.json["error"]["code"] == 404
    assert r.json["error"]["message"].startswith("No endpoints found")
    assert "max_price" in r.json["error"]["availability"]["excluded_by"]
    assert "X-Generation-Id" not in r.headers


async def test_max_tokens_over_endpoint_limit(api: Api) -> None:
    r = await api.chat(max_tokens=20000, provider={"only": ["deepinfra"]})
    assert r.status == 404 and r.json["error"]["message"].startswith("No endpoints found")
    got = set(await served(api, 30, max_tokens=20000))
    assert got.isdisjoint({"DeepInfra", "SiliconFlow"})


async def test_only_unknown_provider_404_body(api: Api, osim: OpenRouterSim) -> None:
    r = await api.chat(provider={"only": ["this-provider-does-not-exist"]})
    assert r.status == 404
    err = r.json["error"]
    assert err["message"] == "No allowed providers are available for the selected model."
    assert err["metadata"]["requested_providers"] == ["this-provider-does-not-exist"]
    available = err["metadata"]["available_providers"]
    assert "parasail" in available and "deepinfra" in available and len(available) == 11
    assert "X-Generation-Id" not in r.headers
    assert osim.requests[-1]["error"] == "no_endpoints"


async def test_order_no_fallback_filtered_out(api: Api) -> None:
    r = await api.chat(provider={"order": ["deepinfra"], "allow_fallbacks": False, "quantizations": ["int4"]})
    assert r.status == 404
    assert r.json["error"]["message"].startswith("No endpoints found")


async def test_require_parameters_and_tools(api: Api) -> None:
    r = await api.chat(top_k=5, provider={"require_parameters": True})
    assert r.status == 404
    assert r.json["error"]["message"] == "No endpoints found that can handle the requested parameters."
    # Without require_parameters an unsupported parameter is dropped silently.
    assert (await api.chat(top_k=5)).status == 200
    assert (await api.chat(temperature=1.0, provider={"require_parameters": True})).status == 200


async def test_data_policy_filters(api: Api) -> None:
    got = set(await served(api, 30, provider={"data_collection": "deny"}))
    assert got.isdisjoint({"Chutes", "Atlas Cloud"})
    r = await api.chat(provider={"zdr": True, "only": ["chutes"]})
    assert r.status == 404 and "Zero data retention" in r.json["error"]["message"]


async def test_default_routing_is_weighted_and_skips_degraded(api: Api) -> None:
    counts = Counter(await served(api, 200))
    assert len(counts) >= 4
    assert counts["Chutes"] == 0 and counts["SiliconFlow"] == 0  # status -2: fallbacks only
    assert counts["Novita"] < counts["DeepInfra"]  # $1.20+$3.00 vs $0.45+$2.20


async def test_sticky_session(api: Api) -> None:
    got = await served(api, 1, session_id="conv-1")
    for _ in range(10):
        assert await served(api, 1, session_id="conv-1") == got


async def test_fallback_on_provider_fault_shows_in_generation(api: Api, osim: OpenRouterSim) -> None:
    osim.config.provider_faults = {"parasail": {"http_502": 1.0}}
    prefs = {"sort": "price", "quantizations": NATIVE_OR_BETTER}
    r = await api.chat(provider=prefs)
    assert r.status == 200 and r.json["provider"] != "Parasail"
    await asyncio.sleep(osim.config.generation_lookup_delay_s + 0.05)
    g = await api.get("/generation", params={"id": r.json["id"]})
    responses = g.json["data"]["provider_responses"]
    assert [p["status"] for p in responses] == [502, 200]
    assert responses[0]["provider_name"] == "Parasail"
    assert responses[1]["provider_name"] == r.json["provider"]

    # Without fallbacks the provider's error comes back as is.
    r = await api.chat(provider={**prefs, "allow_fallbacks": False})
    assert r.status == 502
    assert r.json["error"]["message"] == "Provider returned error"
    assert r.json["error"]["metadata"]["provider_name"] == "Parasail"
    assert isinstance(r.json["error"]["metadata"]["raw"], str)


async def test_every_provider_failing_returns_last_error(api: Api, osim: OpenRouterSim) -> None:
    osim.config.provider_faults = {name: {"http_503": 1.0} for name in ("parasail", "fireworks")}
    r = await api.chat(provider={"only": ["parasail", "fireworks"]})
    assert r.status == 503 and r.headers["Retry-After"] == "3"


async def test_rogue_provider_ignores_quantization_filter(api: Api, osim: OpenRouterSim) -> None:
    prefs = {"only": ["deepinfra"], "quantizations": ["int4", "fp8"]}
    assert (await api.chat(provider=prefs)).status == 404
    osim.config.rogue_providers = ["deepinfra"]
    assert await served(api, 2, provider=prefs) == ["DeepInfra", "DeepInfra"]


async def test_model_fallback_list(api: Api) -> None:
    r = await api.chat(
        model="moonshotai/kimi-k2-thinking", models=["moonshotai/kimi-k2.5"], provider={"only": ["parasail"]}
    )
    assert r.status == 200
    assert r.json["model"] == "moonshotai/kimi-k2.5-0127" and r.json["provider"] == "Parasail"
    r = await api.chat(model="moonshotai/kimi-k2-thinking")
    assert r.json["model"] == "moonshotai/kimi-k2-thinking-20251106"


@pytest.mark.parametrize(
    "provider",
    [
        {"onlyy": ["parasail"]},
        {"only": "parasail"},
        {"sort": "cheapest"},
        {"max_price": {"completion": "lots"}},
        {"quantizations": ["int3"]},
        {"allow_fallbacks": "no"},
        "parasail",
    ],
)
async def test_bad_provider_object_is_400(api: Api, provider: object) -> None:
    r = await api.chat(provider=provider)
    assert r.status == 400 and r.json["error"]["code"] == 400
    assert "X-Generation-Id" not in r.headers


async def test_unknown_model_is_400_model_not_found(api: Api) -> None:
    r = await api.chat(model="moonshotai/kimi-k9")
    assert r.status == 400
    assert r.json["error"]["availability"]["code"] == "model_not_found"
    assert r.json["error"]["availability"]["retryable"] is False
    r = await api.chat(model="moonshotai/kimi-k2.5:bogus")
    assert r.status == 400
