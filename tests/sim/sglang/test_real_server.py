"""What the real 0.5.23 server does that regen must meet, staged by the simulator over loopback HTTP:
request errors inside a stream, the finish order, /server_info as the command line left it,
data-parallel ranks' metrics, "NaN happened", incremental streaming, the idle keep-alive close, a
full queue, the soft watchdog, log levels and a speculative server's capture lines."""

from __future__ import annotations

import asyncio

import orjson
from prometheus_client.parser import text_string_to_metric_families

from regen.sim.sglang.logs import SimLog
from regen.sim.sglang.tokens import SimTokenizer
from tests.support.sglang_http import SGApi, parse_sse
from tests.support.sglang_sim import fast_config, running_sim


async def test_a_request_error_in_a_stream_is_an_error_event_inside_a_200(api: SGApi) -> None:
    too_long = {"max_new_tokens": api.sim.context_len}  # prompt + max_new_tokens past the context
    s = await api.stream(sampling=too_long)
    assert s.status == 200
    [event, done] = s.events
    assert done == "[DONE]"
    error = event["error"]
    assert error["code"] == 400 and error["retryable"] is False and error["type"] == "invalid_request_error"
    assert error["message"].startswith("Requested token count exceeds the model's maximum context length")
    # The same request unstreamed is a plain 400 with the same message.
    plain = await api.generate(sampling=too_long)
    assert plain.status == 400 and plain.json == {"error": {"message": error["message"]}}
    assert api.sim.log.contains("[http_server] Error: Requested token count exceeds")


async def test_bad_sampling_values_in_a_stream_are_an_error_event_too(api: SGApi) -> None:
    s = await api.stream(sampling={"top_p": 0})
    assert s.status == 200 and s.events[-1] == "[DONE]"
    assert s.events[0]["error"]["message"] == "top_p must be in (0, 1], got 0.0."


async def test_the_json_contract_refuses_before_any_stream_begins(api: SGApi) -> None:
    r = await api.post("/generate", api.body(stream=True, sampling={"max_tokens": 5}))
    assert r.status == 400
    assert r.json["error"].startswith("unknown field `max_tokens`, expected one of `max_new_tokens`, `stop`")


async def test_an_end_of_turn_on_the_last_allowed_id_is_a_stop(api: SGApi) -> None:
    # 0.5.23 checks stop strings, then stop ids, then the length limit (0.5.9 checked length first).
    await api.config({"output_len_min": 20, "output_len_max": 20})
    prompt = api.prompt(thinking=False)  # no reasoning: 20 content ids, then <|im_end|>
    r = await api.generate(input_ids=prompt, sampling={"max_new_tokens": 21})
    body = r.json
    assert body["output_ids"][-1] == api.tok.eot_id and len(body["output_ids"]) == 21
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": api.tok.eot_id}
    assert "<|im_end|>" not in body["text"]  # a matched stop id is trimmed from the text


async def test_server_info_says_the_command_line_and_v1_models_the_models_context(
    kimi_tok: SimTokenizer,
) -> None:
    import aiohttp

    async with (
        running_sim(fast_config(model_context_length=4096), kimi_tok) as sim,
        aiohttp.ClientSession() as http,
    ):
        async with http.get(sim.base_url + "/server_info") as r:
            info = await r.json()
        async with http.get(sim.base_url + "/v1/models") as r:
            card = (await r.json())["data"][0]
        async with http.post(sim.base_url + "/generate", json={"input_ids": [1, 2], "sampling_params": {
            "max_new_tokens": 5000}}) as r:  # fmt: skip
            refused = await r.json()
    # Neither --context-length nor --max-running-requests was passed: /server_info says so.
    assert info["context_length"] is None and info["max_running_requests"] is None
    assert info["incremental_streaming_output"] is False and info["log_level"] == "info"
    assert card["max_model_len"] == 4096  # the limit the server enforces
    assert "maximum context length of 4096 tokens" in refused["error"]["message"]


async def test_with_dp_attention_every_rank_exports_its_own_scheduler_series(kimi_tok: SimTokenizer) -> None:
    config = fast_config(dp_size=4, enable_dp_attention=True, tp_size=8, decode_tokens_per_s=5.0, time_scale=1.0,
                         output_len_min=200, output_len_max=200, max_running_requests=6)  # fmt: skip
    async with running_sim(config, kimi_tok) as sim:
        import aiohttp

        async with aiohttp.ClientSession() as http:
            api = SGApi(http, sim, kimi_tok)
            tasks = [asyncio.create_task(api.generate(rid=f"r{i}")) for i in range(10)]
            while len(sim.scheduler.running) < 6 or len(sim.scheduler.waiting) < 4:
                await asyncio.sleep(0.01)
            text = (await api.get("/metrics")).raw.decode()
            info = (await api.get("/server_info")).json
            await api.post("/abort_request", {"abort_all": True})
            await asyncio.gather(*tasks)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    running = families["sglang:num_running_reqs"].samples
    assert [(s.labels["tp_rank"], s.labels["dp_rank"]) for s in running] == [
        ("0", "0"),
        ("2", "1"),
        ("4", "2"),
        ("6", "3"),
    ]
    assert sum(s.value for s in running) == 6
    assert sum(s.value for s in families["sglang:num_queue_reqs"].samples) == 4
    assert info["enable_dp_attention"] is True and info["dp_size"] == 4


async def test_nan_happened_ends_a_request_as_a_stop_with_an_eos_in_its_place(api: SGApi) -> None:
    await api.config({"faults": {"nan_rate": 1.0, "fault_position": 0.5}})
    body = (await api.generate()).json
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": "NaN happened"}
    eos = api.tok.eos_ids[0]
    assert body["output_ids"][-1] == eos != api.tok.eot_id
    assert body["text"] == api.tok.decode(body["output_ids"], skip_special_tokens=False)  # nothing trimmed


async def test_incremental_streaming_sends_only_what_is_new(api: SGApi) -> None:
    await api.config({"decode_tokens_per_s": 2.0, "output_len_min": 30, "output_len_max": 30})
    whole = (await api.generate(rid="whole#0")).json
    await api.config({"incremental_streaming_output": True})
    s = await api.stream(rid="parts#0")
    chunks = s.chunks
    assert len(chunks) >= 3 and s.done
    assert [i for c in chunks for i in c["output_ids"]] == whole["output_ids"]
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert len(chunks[-1]["output_ids"]) < len(whole["output_ids"])  # the last chunk alone is a piece
    assert (await api.get("/server_info")).json["incremental_streaming_output"] is True


async def test_the_server_closes_a_keep_alive_connection_left_idle(kimi_tok: SimTokenizer) -> None:
    # uvicorn's timeout_keep_alive (SGLANG_TIMEOUT_KEEP_ALIVE, 5 s by default).
    async with running_sim(fast_config(timeout_keep_alive=0.3), kimi_tok) as sim:
        reader, writer = await asyncio.open_connection("127.0.0.1", sim.port)
        writer.write(b"GET /ready HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        started = asyncio.get_running_loop().time()
        rest = await asyncio.wait_for(reader.read(), 5.0)  # EOF: the server closed it
        idle = asyncio.get_running_loop().time() - started
        writer.close()
    assert rest == b"" and 0.2 < idle < 2.0
    assert sim.state()["connections"] == 1


async def test_a_full_queue_aborts_the_newcomer_with_a_503(api: SGApi) -> None:
    await api.config({"max_running_requests": 1, "max_queued_requests": 1, "decode_tokens_per_s": 5.0})
    body = api.body(stream=True, rid="run#0", sampling={"max_new_tokens": 300, "ignore_eos": True})
    running = await api.session.post(api.url("/generate"), data=orjson.dumps(body))
    await running.content.readuntil(b"\n\n")
    queued = asyncio.create_task(api.generate(rid="wait#0"))
    while (await api.state())["queued"] < 1:
        await asyncio.sleep(0.01)
    refused = await api.stream(rid="late#0")
    final = refused.chunks[-1]
    assert final["meta_info"]["finish_reason"] == {
        "type": "abort",
        "status_code": 503,
        "message": "The request queue is full.",
    }
    assert final["output_ids"] == [] and refused.done
    await api.post("/abort_request", {"abort_all": True})
    await queued
    parse_sse(await running.read())
    running.release()


async def test_the_soft_watchdog_logs_its_line_and_the_server_runs_on(kimi_tok: SimTokenizer) -> None:
    log = SimLog()
    config = fast_config(soft_watchdog_timeout=0.3, startup_weights_s=1.0)  # weights outlast it
    async with running_sim(config, kimi_tok, log=log) as sim:
        assert sim.ready.is_set()
    assert log.contains("Scheduler watchdog timeout (self.watchdog_timeout=0.3, self.soft=True)")
    assert log.contains("The server is fired up and ready to roll!")


async def test_log_level_warning_hides_the_phases_and_the_ready_line(kimi_tok: SimTokenizer) -> None:
    log = SimLog()
    async with running_sim(fast_config(log_level="warning"), kimi_tok, log=log) as sim:
        import aiohttp

        async with aiohttp.ClientSession() as http, http.get(sim.base_url + "/get_model_info") as r:
            assert r.status == 200
    lines = "\n".join(log.lines)
    for hidden in ("Load weight begin", "KV Cache is allocated", "max_total_num_tokens=", "Uvicorn running on",
                   "The server is fired up and ready to roll!"):  # fmt: skip
        assert hidden not in lines, hidden
    assert "The endpoint /get_model_info is deprecated" in lines  # a WARNING still shows


async def test_a_speculative_server_logs_its_verify_and_draft_captures(kimi_tok: SimTokenizer) -> None:
    log = SimLog()
    async with running_sim(fast_config(speculative_algorithm="EAGLE3"), kimi_tok, log=log):
        pass
    lines = "\n".join(log.lines)
    for role in ("target verify", "draft decode", "draft extend"):
        assert f"Capture {role} CUDA graph begin." in lines and f"Capture {role} CUDA graph end." in lines
    assert "Capture target decode" not in lines
