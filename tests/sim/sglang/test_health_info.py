"""Health (503 until ready, a real probe through the scheduler), info endpoints, auth, admin."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from regen.sim.sglang.logs import SimLog
from regen.sim.sglang.tokens import SimTokenizer
from tests.support.sglang_http import SGApi
from tests.support.sglang_sim import fast_config, running_sim


async def _status(session: aiohttp.ClientSession, url: str) -> int | None:
    try:
        async with session.get(url) as r:
            return r.status
    except aiohttp.ClientConnectionError:
        return None  # nothing listening yet


async def test_connection_refused_then_503_until_ready_then_200(
    kimi_tok: SimTokenizer, http: aiohttp.ClientSession
) -> None:
    cfg = fast_config(
        time_scale=1.0,
        startup_weights_s=0.6,
        startup_kv_pool_s=0.0,
        startup_cuda_graph_s=0.0,
        startup_http_s=0.0,
        startup_warmup_s=0.6,
    )
    log = SimLog()
    async with running_sim(cfg, kimi_tok, ready=False, log=log) as sim:
        url = sim.base_url
        assert await _status(http, url + "/health") is None  # weights still loading: not listening
        seen: list[int | None] = []
        while not sim.ready.is_set():
            seen.append(await _status(http, url + "/health_generate"))
            await asyncio.sleep(0.05)
        assert 503 in seen  # uvicorn up, warmup running: "Starting"
        assert await _status(http, url + "/ready") == 200
        assert await _status(http, url + "/health") == 200
        assert await _status(http, url + "/health_generate") == 200
        lines = list(log.lines)
    order = [
        "Load weight begin.",
        "Load weight end.",
        "Memory pool end.",
        "Capture target decode CUDA graph begin.",
        "Capture target decode CUDA graph end.",
        "max_total_num_tokens=",
        "Uvicorn running on http://127.0.0.1:",
        "The server is fired up and ready to roll!",
    ]
    at = [next(i for i, line in enumerate(lines) if needle in line) for needle in order]
    assert at == sorted(at)
    assert lines[at[0]].split("] ")[0].endswith("TP0")  # scheduler lines carry the TP rank


async def test_health_probe_runs_through_the_scheduler(api: SGApi) -> None:
    before = (await api.state())["forward_ct"]
    assert (await api.get("/health_generate")).status == 200
    after = await api.state()
    assert after["forward_ct"] > before  # a one-token generation really ran
    assert after["counters"]["requests"] == 0  # probes are not counted as requests
    assert after["live_rids"] == []


async def test_stalled_scheduler_fails_the_health_check(
    kimi_tok: SimTokenizer, http: aiohttp.ClientSession
) -> None:
    log = SimLog()
    async with running_sim(fast_config(health_check_timeout_s=20.0), kimi_tok, log=log) as sim:
        async with http.post(sim.base_url + "/_sim/config", json={"faults": {"stall": True}}) as r:
            assert r.status == 200
        assert await _status(http, sim.base_url + "/health") == 503
        assert log.contains(
            "Health check failed. Server couldn't get a response from detokenizer for last 20 seconds"
        )
        async with http.post(sim.base_url + "/_sim/config", json={"faults": {"stall": False}}) as r:
            assert r.status == 200
        assert await _status(http, sim.base_url + "/health") == 200


async def test_model_info_new_and_old_paths(api: SGApi) -> None:
    new = (await api.get("/model_info")).json
    assert list(new) == [
        "model_path",
        "served_model_name",
        "tokenizer_path",
        "is_generation",
        "preferred_sampling_params",
        "weight_version",
        "load_format",
        "reasoning_parser",
        "tool_call_parser",
        "disaggregation_mode",
        "has_image_understanding",
        "has_audio_understanding",
        "model_type",
        "architectures",
    ]
    assert new["is_generation"] is True
    old = (await api.get("/get_model_info")).json
    assert old == new
    assert api.sim.log.contains("The endpoint /get_model_info is deprecated")


async def test_legacy_server_has_only_the_get_paths(api: SGApi) -> None:
    await api.config({"info_paths": "legacy"})
    assert (await api.get("/model_info")).status == 404
    assert (await api.get("/server_info")).status == 404
    old = (await api.get("/get_model_info")).json
    assert set(old) == {
        "model_path",
        "is_generation",
        "tokenizer_path",
        "preferred_sampling_params",
        "weight_version",
        "has_image_understanding",
        "has_audio_understanding",
    }
    info = (await api.get("/get_server_info")).json
    assert info["version"] == "0.5.23"


async def test_server_info(api: SGApi) -> None:
    info = (await api.get("/server_info")).json
    assert info["version"] == "0.5.23"
    assert info["frontend"] == "python"
    assert info["max_running_requests"] == api.sim.config.max_running_requests
    assert info["max_total_num_tokens"] == api.sim.config.max_total_tokens
    assert info["tp_size"] == 8
    state = info["internal_states"][0]
    assert set(state) >= {"last_gen_throughput", "memory_usage", "effective_max_running_requests_per_dp"}
    assert state["memory_usage"]["token_capacity"] == api.sim.config.max_total_tokens
    assert (await api.get("/get_server_info")).json["version"] == "0.5.23"


async def test_v1_models(api: SGApi) -> None:
    body = (await api.get("/v1/models")).json
    assert body["object"] == "list"
    (card,) = body["data"]
    name = api.sim.config.served_name
    assert card["id"] == name and card["root"] == name and card["owned_by"] == "sglang"
    assert card["object"] == "model" and card["max_model_len"] == api.sim.context_len
    assert (await api.get(f"/v1/models/{name}")).json["id"] == name
    missing = await api.get("/v1/models/other")
    assert missing.status == 404 and missing.json["error"]["code"] == "model_not_found"


async def test_unknown_path_is_fastapis_404(api: SGApi) -> None:
    r = await api.get("/nope")
    assert r.status == 404 and r.json == {"detail": "Not Found"}


async def test_api_key_guards_all_but_health_and_metrics(
    kimi_tok: SimTokenizer, http: aiohttp.ClientSession
) -> None:
    async with running_sim(fast_config(api_key="sk-gpu-secret"), kimi_tok) as sim:
        url = sim.base_url
        async with http.post(url + "/generate", json={"input_ids": [1, 2]}) as r:
            assert r.status == 401
            assert await r.json() == {"error": "Unauthorized"}
        headers = {"Authorization": "Bearer sk-gpu-secret"}
        async with http.post(url + "/generate", json={"input_ids": [1, 2]}, headers=headers) as r:
            assert r.status == 200
        for path in ("/health", "/health_generate", "/metrics"):
            assert await _status(http, url + path) == 200
        async with http.get(url + "/server_info", headers=headers) as r:
            info = await r.json()
        assert info["api_key"] is None  # never echoed
        assert "sk-gpu-secret" not in "\n".join(sim.log.lines)


async def test_pause_and_continue(api: SGApi) -> None:
    await api.config({"decode_tokens_per_s": 5.0})
    assert (await api.post("/pause_generation")).json["status"] == "ok"
    task = asyncio.create_task(api.generate(sampling={"max_new_tokens": 5}))
    await asyncio.sleep(0.2)
    assert not task.done()
    assert (await api.state())["queued"] == 1
    assert (await api.post("/continue_generation")).json["status"] == "ok"
    assert (await task).status == 200


async def test_admin_config_patch_and_errors(api: SGApi) -> None:
    r = await api.config({"speed": 0.5, "faults": {"abort_rate": 0.1}})
    assert r.status == 200 and r.json["config"]["speed"] == 0.5
    assert api.sim.config.faults.abort_rate == 0.1
    bad = await api.config({"speed": -1})
    assert bad.status == 400 and "speed" in bad.json["error"]
    bad = await api.config({"faults": {"no_such": 1}})
    assert bad.status == 400 and "faults.no_such" in bad.json["error"]
    assert (await api.get("/_sim/config")).json["speed"] == 0.5


@pytest.mark.parametrize("path", ["/metrics"])
async def test_metrics_absent_without_enable_metrics(
    kimi_tok: SimTokenizer, http: aiohttp.ClientSession, path: str
) -> None:
    async with running_sim(fast_config(enable_metrics=False), kimi_tok) as sim:
        assert await _status(http, sim.base_url + path) == 404
