"""Client aborts (§1.4, §13.22): streams bill tokens so far only where the provider supports
cancellation; everything else, and every non-stream request, is billed in full."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import aiohttp
import orjson
import pytest

from regen.sim.openrouter.billing import GenerationRecord
from regen.sim.openrouter.server import OpenRouterSim
from tests.support.openrouter_http import KEY, Api, endpoint

TOKENS = 200


def slow(sim: OpenRouterSim) -> None:
    cfg = sim.config
    cfg.time_scale = 1.0
    cfg.min_completion_tokens = cfg.max_completion_tokens = TOKENS
    cfg.reasoning_share = 0.0
    cfg.endpoint_overrides = {
        name: {"ttft_s": 0.0, "ttft_jitter": 0.0, "tokens_per_s": 400.0} for name in ("fireworks", "parasail")
    }


async def abort_after_content(api: Api, provider: str) -> str:
    body = orjson.dumps(api.body(stream=True, provider={"only": [provider]}))
    async with api.session.post(
        api.url("/chat/completions"), data=body, headers={"Authorization": f"Bearer {KEY}"}
    ) as r:
        gen_id = r.headers["X-Generation-Id"]
        seen = 0
        async for line in r.content:
            if line.startswith(b"data: {") and b'"content":"' in line and b'"content":""' not in line:
                seen += 1
                if seen >= 2:
                    break
        r.close()  # drop the connection mid-stream
    return gen_id


async def wait_record(sim: OpenRouterSim, gen_id: str, timeout: float = 2.0) -> GenerationRecord:
    for _ in range(int(timeout / 0.01)):
        rec = sim.billing.get(gen_id)
        if rec is not None:
            return rec
        await asyncio.sleep(0.01)
    raise AssertionError(f"{gen_id} never billed")


@pytest.mark.parametrize(
    ("provider", "name", "supports"), [("fireworks", "Fireworks", True), ("parasail", "Parasail", False)]
)
async def test_stream_abort_billing(
    api: Api, osim: OpenRouterSim, provider: str, name: str, supports: bool
) -> None:
    slow(osim)
    assert endpoint(osim, name).supports_cancellation is supports
    gen_id = await abort_after_content(api, provider)
    rec = await wait_record(osim, gen_id)
    assert rec.cancelled is True
    if supports:
        assert 0 < rec.completion_tokens < TOKENS
    else:
        assert rec.completion_tokens == TOKENS
    ep = endpoint(osim, name)
    exact = (
        Decimal(ep.pricing.prompt) * rec.prompt_tokens
        + Decimal(ep.pricing.completion) * rec.completion_tokens
    )
    assert rec.cost == float(exact)
    assert osim.requests[-1].get("cancelled") is True
    await asyncio.sleep(osim.config.generation_lookup_delay_s + 0.05)
    g = await api.get("/generation", params={"id": gen_id})
    assert g.json["data"]["cancelled"] is True
    assert g.json["data"]["total_cost"] == rec.cost


async def test_non_stream_abort_billed_in_full(api: Api, osim: OpenRouterSim) -> None:
    slow(osim)
    body = orjson.dumps(api.body(provider={"only": ["fireworks"]}))
    with pytest.raises(asyncio.TimeoutError):
        await api.session.post(
            api.url("/chat/completions"),
            data=body,
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=aiohttp.ClientTimeout(total=0.1),
        )
    for _ in range(200):
        if osim.billing.records:
            break
        await asyncio.sleep(0.01)
    [rec] = osim.billing.records
    assert rec.completion_tokens == TOKENS and not rec.cancelled and rec.cost > 0


async def test_generation_after_abort_waits_for_the_lookup_delay(api: Api, osim: OpenRouterSim) -> None:
    """§13.21/22: an aborted stream's record is billed at once but, like any other, is only
    visible on /generation after the lookup delay."""
    slow(osim)
    osim.config.generation_lookup_delay_s = 0.5
    gen_id = await abort_after_content(api, "fireworks")
    rec = await wait_record(osim, gen_id)
    assert rec.cancelled
    early = await api.get("/generation", params={"id": gen_id})
    assert early.status == 404 and early.json["error"]["message"] == f"Generation {gen_id} not found"
    await asyncio.sleep(0.55)
    g = await api.get("/generation", params={"id": gen_id})
    assert g.status == 200 and g.json["data"]["cancelled"] is True
    assert g.json["data"]["total_cost"] == rec.cost
