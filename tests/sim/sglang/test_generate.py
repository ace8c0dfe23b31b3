"""/generate without streaming: the 0.5.x response shape, ids that decode to the text, finish reasons."""

from __future__ import annotations

import orjson
import pytest

from regen.sim.sglang.server import SGLangSim
from regen.sim.sglang.tokens import SimTokenizer
from tests.support.sglang_http import SGApi
from tests.support.sglang_sim import fast_config, running_sim

META_KEYS = [
    "id",
    "finish_reason",
    "prompt_tokens",
    "weight_version",
    "num_retractions",
    "reasoning_tokens",
    "completion_tokens",
    "cached_tokens",
    "e2e_latency",
]


async def test_response_shape_and_ids_decode_to_the_text(api: SGApi) -> None:
    prompt = api.prompt()
    r = await api.generate(rid="B3-00000001#0", sampling={"max_new_tokens": 200})
    assert r.status == 200
    assert r.headers["Content-Type"].startswith("application/json")
    body = r.json
    assert list(body) == ["text", "output_ids", "meta_info"]
    meta = body["meta_info"]
    assert list(meta) == META_KEYS
    assert meta["id"] == "B3-00000001#0"
    assert meta["prompt_tokens"] == len(prompt)
    assert meta["completion_tokens"] == len(body["output_ids"])
    assert meta["weight_version"] == "default"
    assert meta["num_retractions"] == 0
    assert meta["e2e_latency"] > 0
    eot = api.tok.eot_id
    # Stopped on the end-of-turn id: it is the last output id, and the text does not hold it.
    assert meta["finish_reason"] == {"type": "stop", "matched": eot}
    assert body["output_ids"][-1] == eot
    assert api.tok.decode(body["output_ids"][:-1], skip_special_tokens=False) == body["text"]
    assert "<|im_end|>" not in body["text"]


async def test_thinking_prompt_gets_reasoning_then_think_close_then_content(api: SGApi) -> None:
    r = await api.generate(sampling={"max_new_tokens": 500})
    body = r.json
    close = api.tok.think_close_id
    assert close in body["output_ids"]
    reasoning, sep, content = body["text"].partition("</think>")
    assert sep and reasoning.strip() and content.strip()
    # Instant mode (the template closes <think></think>): no reasoning at all.
    r = await api.generate(input_ids=api.prompt(thinking=False), sampling={"max_new_tokens": 500})
    assert close not in r.json["output_ids"]
    assert "</think>" not in r.json["text"]


async def test_skip_special_tokens_drops_special_pieces_from_the_text(api: SGApi) -> None:
    keep = (await api.generate(sampling={"max_new_tokens": 500})).json
    skip = (await api.generate(sampling={"max_new_tokens": 500, "skip_special_tokens": True})).json
    assert keep["output_ids"] == skip["output_ids"]  # same prompt, same seed: same ids
    assert "</think>" in keep["text"] and "</think>" not in skip["text"]
    assert skip["text"] == api.tok.decode(skip["output_ids"][:-1], skip_special_tokens=True)
    # SGLang's default is skip_special_tokens=true.
    body = api.body()
    del body["sampling_params"]["skip_special_tokens"]
    async with api.session.post(api.url("/generate"), data=orjson.dumps(body)) as resp:
        default = await resp.json()
    assert "</think>" not in default["text"]


async def test_length_finish(api: SGApi) -> None:
    r = await api.generate(sampling={"max_new_tokens": 5})
    body = r.json
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert len(body["output_ids"]) == 5
    assert api.tok.decode(body["output_ids"], skip_special_tokens=False) == body["text"]


async def test_without_stop_token_ids_the_end_of_turn_does_not_stop_it(api: SGApi) -> None:
    # The model's eos is [EOS], not <|im_end|>: a client that forgets stop_token_ids runs to length.
    r = await api.generate(sampling={"max_new_tokens": 300, "stop_token_ids": []})
    body = r.json
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 300}
    assert api.tok.eot_id in body["output_ids"]
    assert "<|im_end|>" in body["text"]


async def test_ignore_eos_also_ignores_stop_token_ids(api: SGApi) -> None:
    r = await api.generate(sampling={"max_new_tokens": 300, "ignore_eos": True})
    assert r.json["meta_info"]["finish_reason"] == {"type": "length", "length": 300}


async def test_no_stop_trim_keeps_the_stop_piece(api: SGApi) -> None:
    r = await api.generate(sampling={"max_new_tokens": 300, "no_stop_trim": True})
    body = r.json
    assert body["meta_info"]["finish_reason"]["type"] == "stop"
    assert body["text"].endswith("<|im_end|>")
    assert api.tok.decode(body["output_ids"], skip_special_tokens=False) == body["text"]


async def test_min_new_tokens_masks_the_stop_id(api: SGApi) -> None:
    natural = (await api.generate(sampling={"max_new_tokens": 400})).json
    n = len(natural["output_ids"])
    r = (await api.generate(sampling={"max_new_tokens": 400, "min_new_tokens": n + 5})).json
    assert len(r["output_ids"]) >= n + 5
    assert api.tok.eot_id not in r["output_ids"][: n + 4]


async def test_stop_string_matches_and_trims(api: SGApi) -> None:
    await api.config({"output_len_min": 150, "output_len_max": 200})
    full = (await api.generate(sampling={"max_new_tokens": 400})).json["text"]
    word = full.split("</think>")[-1].split()[3]
    r = (await api.generate(sampling={"max_new_tokens": 400, "stop": [word]})).json
    assert r["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}
    assert word not in r["text"].split("</think>")[-1]
    assert full.startswith(r["text"])


async def test_text_prompt_is_encoded_by_the_served_tokenizer(api: SGApi) -> None:
    text = "<|im_user|>user<|im_middle|>hello<|im_end|><|im_assistant|>assistant<|im_middle|><think>"
    body = {"text": text, "sampling_params": {"max_new_tokens": 300}, "return_prompt_token_ids": True}
    r = await api.post("/generate", body)
    assert r.status == 200
    out = r.json
    assert out["prompt_token_ids"] == api.tok.encode(text)
    assert out["meta_info"]["prompt_tokens"] == len(api.tok.encode(text))
    assert out["prompt_token_ids"][-1] == api.tok.think_open_id


async def test_same_prompt_same_ids_across_attempts(api: SGApi) -> None:
    a = (await api.generate(rid="x#0")).json
    b = (await api.generate(rid="x#1")).json
    assert a["output_ids"] == b["output_ids"]
    c = (await api.generate(rid="x#2", sampling={"sampling_seed": 99})).json
    assert c["output_ids"] != a["output_ids"]


async def test_put_works_like_post(api: SGApi) -> None:
    async with api.session.put(api.url("/generate"), data=orjson.dumps(api.body())) as r:
        assert r.status == 200
        assert (await r.json())["meta_info"]["finish_reason"]["type"] in ("stop", "length")


async def test_radix_cache_reports_cached_prompt_tokens_and_flush_clears_it(api: SGApi) -> None:
    first = (await api.generate()).json["meta_info"]
    second = (await api.generate()).json["meta_info"]
    assert first["cached_tokens"] == 0
    assert second["cached_tokens"] > 0
    flushed = await api.post("/flush_cache")
    assert flushed.status == 200 and flushed.raw.startswith(b"Cache flushed.")
    third = (await api.generate()).json["meta_info"]
    assert third["cached_tokens"] == 0


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"sampling_params": {}}, 400, "Either text, input_ids or input_embeds"),
        ({"text": "a", "input_ids": [1], "sampling_params": {}}, 400, "Either text, input_ids"),
        ({"text": ["a", "b"]}, 400, "one prompt per /generate request"),
        ({"input_ids": [[1, 2], [3]]}, 400, "one prompt per /generate request"),
        ({"input_ids": [1], "rid": ["a", "b"]}, 400, "one prompt per /generate request"),
        ({"input_ids": [1], "sampling_params": [{}, {}]}, 400, "one prompt per /generate request"),
        # 0.5.23's JSON contract: {"error": "<serde's text>"} (api/v1/api_types.py).
        (
            {"input_ids": [1], "sampling_params": {"max_tokens": 5}},
            400,
            '{"error":"unknown field `max_tokens`, expected one of `max_new_tokens`, `stop`,',
        ),
        ({"input_ids": [1], "sampling_params": {"top_p": 0}}, 400, "top_p must be in (0, 1]"),
        (
            {"input_ids": [1], "sampling_params": {"temperature": -1}},
            400,
            "temperature must be a non-negative finite number, got -1.0.",
        ),
        ({"input_ids": [1], "sampling_params": {"top_k": 0}}, 400, "top_k must be -1"),
        (
            {"input_ids": [1], "sampling_params": {"max_new_tokens": "9"}},
            400,
            '{"error":"invalid type: string \\"9\\", expected i64"}',
        ),
        ({"input_ids": [1], "sampling_params": {"regex": "a+"}}, 400, "not simulated"),
        ({"input_ids": [1], "return_logprob": True}, 400, "return_logprob is not simulated"),
        ({"input_ids": [1], "return_hidden_states": True}, 400, "not configured to return hidden states"),
        ({"input_ids": [10**9]}, 400, "out of the vocabulary"),
        ({"input_ids": []}, 400, "input_ids cannot be empty."),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": 10**7}}, 400, "maximum context length"),
        ([1, 2], 400, "valid dictionary"),
    ],
)
async def test_refusals(api: SGApi, body: object, status: int, needle: str) -> None:
    r = await api.post("/generate", body)
    assert r.status == status
    assert needle in r.raw.decode(), r.raw


async def test_router_added_keys_are_accepted(api: SGApi) -> None:
    # smg re-serialises bodies and adds these (shared reference: router); a server must not refuse.
    body = api.body(
        model="unknown",
        log_metrics=True,
        background=False,
        no_logs=False,
        return_bytes=False,
        return_entropy=False,
        return_text_in_logprobs=False,
    )
    r = await api.post("/generate", body)
    assert r.status == 200


async def test_duplicate_live_rid_is_refused(api: SGApi) -> None:
    import asyncio

    await api.config({"decode_tokens_per_s": 5.0})
    first = asyncio.create_task(
        api.generate(rid="dup#0", sampling={"max_new_tokens": 50, "ignore_eos": True})
    )
    for _ in range(200):
        if "dup#0" in (await api.state())["live_rids"]:
            break
        await asyncio.sleep(0.01)
    r = await api.generate(rid="dup#0")
    assert r.status == 400 and "Duplicate request ID" in r.raw.decode()
    await api.post("/abort_request", {"rid": "dup#0"})
    assert (await first).json["meta_info"]["finish_reason"]["type"] == "abort"


async def test_input_longer_than_context_is_refused(kimi_tok: SimTokenizer, http: object) -> None:
    import aiohttp

    assert isinstance(http, aiohttp.ClientSession)
    async with (
        running_sim(fast_config(context_length=32), kimi_tok) as sim,
        http.post(sim.base_url + "/generate", json={"input_ids": list(range(40))}) as r,
    ):
        assert r.status == 400
        body = await r.json()
    assert body == {
        "error": {"message": "The input (40 tokens) is longer than the model's context length (32 tokens)."}
    }


async def test_a_drifting_worker_follows_the_reference_ids_for_a_prefix_then_leaves_them(
    api: SGApi, sglang_sim: SGLangSim
) -> None:
    sglang_sim.config.output_len_min, sglang_sim.config.output_len_max = 100, 300
    messages = [[{"role": "user", "content": f"Question {i}"}] for i in range(30)]
    honest = [
        (await api.generate(input_ids=api.prompt(m), sampling={"max_new_tokens": 2000})).json
        for m in messages
    ]
    sglang_sim.config.drift = 0.3
    sglang_sim.config.drift_after_tokens = 20
    drifted = [
        (await api.generate(input_ids=api.prompt(m), sampling={"max_new_tokens": 2000})).json
        for m in messages
    ]
    for a, b in zip(honest, drifted, strict=True):
        assert a["output_ids"][:20] == b["output_ids"][:20]
        assert a["output_ids"][20:40] != b["output_ids"][20:40]
    # Longer answers, and a share that never closes its thinking: max_new_tokens ends them.
    assert sum(len(b["output_ids"]) for b in drifted) > 1.2 * sum(len(a["output_ids"]) for a in honest)
    runaway = [b for b in drifted if b["meta_info"]["finish_reason"]["type"] == "length"]
    assert 2 <= len(runaway) <= 20
    assert all(api.tok.think_close_id not in b["output_ids"] for b in runaway)
    assert all(a["meta_info"]["finish_reason"]["type"] == "stop" for a in honest)
