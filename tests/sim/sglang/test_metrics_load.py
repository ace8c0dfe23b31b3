"""/metrics in Prometheus text, and the scheduler model under load: queue, KV usage, retraction, speed."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from regen.sim.sglang.tokens import SimTokenizer
from tests.support.sglang_http import SGApi
from tests.support.sglang_sim import fast_config, running_sim

SCHED_LABELS = {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"}
TOK_LABELS = {"model_name", "engine_type"}


async def scrape(api: SGApi) -> dict[str, Any]:
    r = await api.get("/metrics")
    assert r.status == 200
    assert r.headers["Content-Type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.raw.decode())}
    return families


def value(families: dict[str, Any], name: str, sample: str | None = None) -> float:
    fam = families[name]
    wanted = sample or name
    (s,) = [s for s in fam.samples if s.name == wanted]
    return float(s.value)


async def test_metric_names_types_and_labels(api: SGApi) -> None:
    await api.generate()
    fams = await scrape(api)
    gauges = [
        "num_running_reqs",
        "num_queue_reqs",
        "gen_throughput",
        "token_usage",
        "cache_hit_rate",
        "num_used_tokens",
        "kv_available_tokens",
        "kv_used_tokens",
        "num_retracted_reqs",
        "num_paused_reqs",
        "max_total_num_tokens",
        "context_len",
        "utilization",
        "spec_accept_length",
        "spec_accept_rate",
    ]
    for g in gauges:
        fam = fams[f"sglang:{g}"]
        assert fam.type == "gauge", g
        assert set(fam.samples[0].labels) == SCHED_LABELS
        assert fam.samples[0].labels["model_name"] == api.sim.config.served_name
        assert fam.samples[0].labels["tp_rank"] == "0"
    for c in ["prompt_tokens", "generation_tokens", "cached_tokens", "num_requests", "num_aborted_requests"]:
        fam = fams[f"sglang:{c}"]
        assert fam.type == "counter", c
        assert [s.name for s in fam.samples] == [f"sglang:{c}_total"]
        assert set(fam.samples[0].labels) == TOK_LABELS
    assert fams["sglang:num_retracted_requests"].type == "counter"
    for h in [
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "e2e_request_latency_seconds",
        "request_time_per_output_token_seconds",
        "queue_time_seconds",
    ]:
        fam = fams[f"sglang:{h}"]
        assert fam.type == "histogram", h
        assert any(s.name.endswith("_bucket") and s.labels["le"] == "+Inf" for s in fam.samples)
    phases = {s.labels["phase"] for s in fams["sglang:startup_time_seconds"].samples}
    assert {"load_weight", "kv_cache_allocation", "e2e"} <= phases
    assert value(fams, "sglang:max_total_num_tokens") == api.sim.config.max_total_tokens
    assert value(fams, "sglang:context_len") == api.sim.context_len


async def test_counters_add_up_to_the_responses(api: SGApi) -> None:
    replies = [(await api.generate(sampling={"max_new_tokens": 30})).json for _ in range(4)]
    fams = await scrape(api)
    assert value(fams, "sglang:num_requests", "sglang:num_requests_total") == 4
    assert value(fams, "sglang:prompt_tokens", "sglang:prompt_tokens_total") == sum(
        r["meta_info"]["prompt_tokens"] for r in replies
    )
    assert value(fams, "sglang:generation_tokens", "sglang:generation_tokens_total") == sum(
        r["meta_info"]["completion_tokens"] for r in replies
    )
    assert value(fams, "sglang:cached_tokens", "sglang:cached_tokens_total") == sum(
        r["meta_info"]["cached_tokens"] for r in replies
    )
    assert value(fams, "sglang:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds_count") == 4
    assert value(fams, "sglang:cache_hit_rate") > 0  # the same prompt four times


async def _flood(api: SGApi, n: int, max_new: int, prefix: str = "r") -> list[asyncio.Task[Any]]:
    async def one(i: int) -> dict[str, Any]:
        body = api.body(
            rid=f"{prefix}#{i}",
            input_ids=api.prompt([{"role": "user", "content": f"q {i}"}]),
            sampling={"max_new_tokens": max_new, "ignore_eos": True},
        )
        async with api.session.post(api.url("/generate"), data=orjson.dumps(body)) as r:
            assert r.status == 200
            out: dict[str, Any] = await r.json()
            return out

    return [asyncio.create_task(one(i)) for i in range(n)]


async def test_queue_depth_rises_past_capacity(api: SGApi) -> None:
    # The throughput gauge is set once per logged decode interval; a busy machine makes up late
    # forwards in fewer, larger steps, so the interval is one forward here.
    await api.config({"max_running_requests": 4, "decode_tokens_per_s": 10.0, "decode_log_interval": 1})
    tasks = await _flood(api, 12, 60)
    for _ in range(300):
        fams = await scrape(api)
        if value(fams, "sglang:num_queue_reqs") == 8:
            break
        await asyncio.sleep(0.01)
    assert value(fams, "sglang:num_running_reqs") == 4
    assert value(fams, "sglang:num_queue_reqs") == 8
    assert value(fams, "sglang:utilization") == 1.0
    used = value(fams, "sglang:num_used_tokens")
    assert used > 0
    assert value(fams, "sglang:token_usage") == used / api.sim.config.max_total_tokens
    results = await asyncio.gather(*tasks)
    assert all(r["meta_info"]["finish_reason"] == {"type": "length", "length": 60} for r in results)
    fams = await scrape(api)
    assert value(fams, "sglang:num_running_reqs") == 0 and value(fams, "sglang:num_used_tokens") == 0
    assert value(fams, "sglang:queue_time_seconds", "sglang:queue_time_seconds_count") == 12
    assert value(fams, "sglang:gen_throughput") > 0


async def test_small_kv_pool_retracts_and_still_finishes_everything(api: SGApi) -> None:
    prompt_len = len(api.prompt([{"role": "user", "content": "q 0"}]))
    # Room for the prompts and a little output: decoding 6 requests of 120 tokens must run out.
    # A bold scheduler (low conservativeness) admits them all, then runs out while decoding.
    await api.config(
        {
            "max_total_tokens": 6 * prompt_len + 200,
            "decode_tokens_per_s": 20.0,
            "radix_cache": False,
            "schedule_conservativeness": 0.1,
        }
    )
    tasks = await _flood(api, 6, 120)
    results = await asyncio.gather(*tasks)
    assert all(len(r["output_ids"]) == 120 for r in results)
    assert sum(r["meta_info"]["num_retractions"] for r in results) > 0
    fams = await scrape(api)
    assert value(fams, "sglang:num_retracted_requests", "sglang:num_retracted_requests_total") > 0
    assert api.sim.log.contains("KV cache pool is full. Retract requests. #retracted_reqs: ")
    # A retracted request keeps its ids: the same prompt alone gives exactly the same output.
    await api.config({"max_total_tokens": 1_000_000})
    again = (await asyncio.gather(*await _flood(api, 1, 120)))[0]
    assert again["output_ids"] == results[0]["output_ids"]


async def test_token_usage_stays_within_the_pool_under_load(api: SGApi) -> None:
    prompt_len = len(api.prompt([{"role": "user", "content": "q 0"}]))
    total = 10 * prompt_len + 300
    await api.config(
        {
            "max_total_tokens": total,
            "decode_tokens_per_s": 20.0,
            "radix_cache": False,
            "schedule_conservativeness": 0.1,
        }
    )
    tasks = await _flood(api, 10, 100)
    peak = 0.0
    while not all(t.done() for t in tasks):
        fams = await scrape(api)
        usage = value(fams, "sglang:token_usage")
        assert 0.0 <= usage <= 1.0
        peak = max(peak, usage)
        await asyncio.sleep(0.01)
    await asyncio.gather(*tasks)
    assert peak > 0.5


async def test_runtime_slow_down_and_speed_up(api: SGApi) -> None:
    await api.config({"decode_tokens_per_s": 10.0})
    body = api.body(stream=True, rid="slow#0", sampling={"max_new_tokens": 2000, "ignore_eos": True})

    async def progress(resp: aiohttp.ClientResponse, seconds: float) -> int:
        start = None
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        last = 0
        while loop.time() < end:
            line = await resp.content.readuntil(b"\n\n")
            n = orjson.loads(line[6:])["meta_info"]["completion_tokens"]
            start = n if start is None else start
            last = n
        return last - (start or 0)

    async with api.session.post(api.url("/generate"), data=orjson.dumps(body)) as resp:
        fast = await progress(resp, 0.4)
        await api.config({"speed": 0.05})
        await progress(resp, 0.1)
        slow = await progress(resp, 0.4)
        await api.config({"speed": 1.0})
        await progress(resp, 0.1)
        back = await progress(resp, 0.4)
        await api.post("/abort_request", {"rid": "slow#0"})
    assert fast > 4 * max(1, slow)
    assert back > 4 * max(1, slow)


async def test_slow_down_endpoint_adds_forward_sleep(api: SGApi) -> None:
    r = await api.post("/slow_down", {"forward_sleep_time": 0.05})
    assert r.status == 200
    assert api.sim.config.forward_sleep_s == 0.05
    await api.post("/slow_down", {"forward_sleep_time": None})
    assert api.sim.config.forward_sleep_s == 0.0


async def test_aggregate_cap_shares_throughput(kimi_tok: SimTokenizer, http: aiohttp.ClientSession) -> None:
    # One request alone decodes at its own rate; 20 at once share the aggregate cap.
    cfg = fast_config(
        time_scale=1.0,
        decode_tokens_per_s=500.0,
        max_gen_throughput=1000.0,
        min_step_s=0.01,
        startup_weights_s=0,
        startup_kv_pool_s=0,
        startup_cuda_graph_s=0,
        startup_http_s=0,
        startup_warmup_s=0,
    )
    async with running_sim(cfg, kimi_tok) as sim:
        api = SGApi(http, sim, kimi_tok)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.gather(*await _flood(api, 1, 100, "solo"))
        solo = loop.time() - t0
        t0 = loop.time()
        await asyncio.gather(*await _flood(api, 20, 100, "many"))
        many = loop.time() - t0
    # 100 tokens at 500/s is 0.2 s; 2000 tokens at 1000/s is 2 s: the batch takes ten times longer.
    assert many > 4 * solo
