"""Streaming /generate: cumulative chunks, the final chunk, [DONE]; aborts while streaming and queued."""

from __future__ import annotations

import asyncio
import itertools

import aiohttp
import orjson

from tests.support.sglang_http import SGApi, parse_sse


async def test_chunks_are_cumulative_and_end_with_done(api: SGApi) -> None:
    # Slow enough that the output comes in many forwards.
    await api.config({"decode_tokens_per_s": 2.0, "output_len_min": 30, "output_len_max": 30})
    s = await api.stream(rid="s#0", sampling={"max_new_tokens": 100})
    assert s.status == 200 and s.done
    chunks = s.chunks
    assert len(chunks) >= 5
    for a, b in itertools.pairwise(chunks):
        assert b["text"].startswith(a["text"])
        assert b["output_ids"][: len(a["output_ids"])] == a["output_ids"]
        assert b["meta_info"]["completion_tokens"] >= a["meta_info"]["completion_tokens"]
    for c in chunks[:-1]:
        assert c["meta_info"]["finish_reason"] is None
        assert "e2e_latency" not in c["meta_info"]
        assert c["meta_info"]["completion_tokens"] == len(c["output_ids"])
        assert api.tok.decode(c["output_ids"], skip_special_tokens=False) == c["text"]
    last = chunks[-1]
    assert last["meta_info"]["finish_reason"] == {"type": "stop", "matched": api.tok.eot_id}
    assert last["meta_info"]["id"] == "s#0"
    assert "e2e_latency" in last["meta_info"]
    assert api.tok.decode(last["output_ids"][:-1], skip_special_tokens=False) == last["text"]
    # Every line on the wire is `data: ...` followed by a blank line.
    assert s.raw.endswith(b"data: [DONE]\n\n")


async def test_stream_interval_sends_the_first_id_at_once_then_a_chunk_every_n_ids(api: SGApi) -> None:
    # 0.5.23's output streamer: the first id at once, then whenever at least the interval is unsent.
    await api.config(
        {"decode_tokens_per_s": 2.0, "stream_interval": 4, "output_len_min": 30, "output_len_max": 30}
    )
    s = await api.stream(sampling={"max_new_tokens": 100})
    counts = [c["meta_info"]["completion_tokens"] for c in s.chunks[:-1]]
    assert counts[0] == 1
    assert len(counts) >= 3 and all(b - a >= 4 for a, b in itertools.pairwise(counts))


async def test_a_requests_stream_interval_wins_over_the_servers(api: SGApi) -> None:
    await api.config({"decode_tokens_per_s": 4.0, "output_len_min": 40, "output_len_max": 40})
    s = await api.stream(sampling={"max_new_tokens": 100, "stream_interval": 10})
    counts = [c["meta_info"]["completion_tokens"] for c in s.chunks[:-1]]
    assert counts[0] == 1 and len(counts) >= 3
    assert all(b - a >= 10 for a, b in itertools.pairwise(counts))
    assert s.chunks[-1]["meta_info"]["finish_reason"]["type"] == "stop"


async def _open_stream(api: SGApi, rid: str, max_new: int = 400) -> aiohttp.ClientResponse:
    body = api.body(stream=True, rid=rid, sampling={"max_new_tokens": max_new, "ignore_eos": True})
    return await api.session.post(api.url("/generate"), data=orjson.dumps(body))


async def test_abort_while_streaming_ends_with_finish_reason_abort(api: SGApi) -> None:
    await api.config({"decode_tokens_per_s": 5.0})
    resp = await _open_stream(api, "B1-7#0")
    first = await resp.content.readuntil(b"\n\n")
    assert orjson.loads(first[6:])["meta_info"]["finish_reason"] is None
    r = await api.post("/abort_request", {"rid": "B1-7#0"})
    assert r.status == 200 and r.raw == b""
    events = parse_sse(first + await resp.read())
    resp.release()
    assert events[-1] == "[DONE]"
    last = events[-2]
    assert last["meta_info"]["finish_reason"] == {
        "type": "abort",
        "message": "Aborted",
        "status_code": None,
        "err_type": None,
    }
    assert last["meta_info"]["completion_tokens"] == len(last["output_ids"]) > 0
    state = await api.state()
    assert "B1-7#0" in state["aborted_rids"]


async def test_abort_while_queued_says_abort_in_waiting_queue(api: SGApi) -> None:
    await api.config({"max_running_requests": 1, "decode_tokens_per_s": 5.0})
    running = await _open_stream(api, "run#0")
    await running.content.readuntil(b"\n\n")
    queued = asyncio.create_task(api.generate(rid="wait#0"))
    for _ in range(300):
        if (await api.state())["queued"] == 1:
            break
        await asyncio.sleep(0.01)
    await api.post("/abort_request", {"rid": "wait#0"})
    body = (await queued).json
    assert body["text"] == "" and body["output_ids"] == []
    # The front end answers it (0.5.23 tokenizer manager): its e2e latency, no prompt or cache counts.
    meta = body["meta_info"]
    assert list(meta) == ["id", "finish_reason", "weight_version", "e2e_latency", "completion_tokens"]
    assert meta["id"] == "wait#0" and meta["completion_tokens"] == 0 and meta["e2e_latency"] > 0
    assert meta["finish_reason"] == {"type": "abort", "message": "Abort in waiting queue"}
    await api.post("/abort_request", {"abort_all": True})
    events = parse_sse(await running.read())
    running.release()
    assert events[-2]["meta_info"]["finish_reason"]["type"] == "abort"


async def test_abort_matches_rid_prefixes_and_ignores_unknown_rids(api: SGApi) -> None:
    await api.config({"decode_tokens_per_s": 5.0})
    a = await _open_stream(api, "B2-1#1")
    b = await _open_stream(api, "B2-1#10")
    c = await _open_stream(api, "B2-2#1")
    for resp in (a, b, c):
        await resp.content.readuntil(b"\n\n")
    assert (await api.post("/abort_request", {"rid": "B2-1#9"})).status == 200  # unknown: nothing
    assert (await api.state())["running"] >= 3
    await api.post("/abort_request", {"rid": "B2-1#1"})  # SGLang matches live rids by prefix
    for resp in (a, b):
        events = parse_sse(await resp.read())
        resp.release()
        assert events[-2]["meta_info"]["finish_reason"]["type"] == "abort"
    assert "B2-2#1" in (await api.state())["live_rids"]
    await api.post("/abort_request", {"abort_all": True})
    await c.read()
    c.release()


async def test_client_disconnect_aborts_the_request(api: SGApi) -> None:
    await api.config({"decode_tokens_per_s": 5.0})
    resp = await _open_stream(api, "gone#0")
    await resp.content.readuntil(b"\n\n")
    resp.close()  # the client goes away mid-stream
    for _ in range(300):
        state = await api.state()
        if "gone#0" in state["aborted_rids"]:
            break
        await asyncio.sleep(0.02)
    assert "gone#0" in state["aborted_rids"]
    assert "gone#0" not in state["live_rids"]
    assert state["running"] == 0 and state["kv_used_tokens"] == 0
