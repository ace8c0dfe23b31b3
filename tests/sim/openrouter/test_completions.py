"""Success shapes: non-stream body (§3.1), SSE framing (§4.1-4.3), usage shapes (§4.2)."""

from __future__ import annotations

import re
from decimal import Decimal

from regen.sim.openrouter.server import OpenRouterSim
from tests.support.openrouter_http import PROMPT, Api, endpoint

GEN_ID = re.compile(r"^gen-\d{10}-[A-Za-z0-9]{20}$")
ONLY_FIREWORKS = {"only": ["fireworks"]}


def expected_cost(sim: OpenRouterSim, provider: str, prompt: int, completion: int) -> float:
    ep = endpoint(sim, provider)
    return float(Decimal(ep.pricing.prompt) * prompt + Decimal(ep.pricing.completion) * completion)


async def test_non_stream_success_shape_and_headers(api: Api, osim: OpenRouterSim) -> None:
    r = await api.chat(max_tokens=1000)
    assert r.status == 200
    body = r.json
    assert GEN_ID.match(body["id"])
    assert r.headers["X-Generation-Id"] == body["id"]
    assert r.headers["server"] == "cloudflare"
    assert r.headers["access-control-expose-headers"] == "X-Generation-Id,cf-ray"
    assert r.headers["content-type"].startswith("application/json")
    assert body["object"] == "chat.completion"
    assert body["model"] == "moonshotai/kimi-k2.5-0127"  # canonical, not the requested slug
    names = {e.provider_name for e in osim.config.models[0].endpoints}
    assert body["provider"] in names  # display name, not the slug
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["native_finish_reason"] == "stop"
    msg = choice["message"]
    assert msg["role"] == "assistant" and msg["content"]
    assert msg["reasoning"] and msg["reasoning_details"][0]["type"] == "reasoning.text"
    u = body["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert u["is_byok"] is False
    assert u["cost"] == expected_cost(osim, body["provider"], u["prompt_tokens"], u["completion_tokens"])
    assert u["cost_details"]["upstream_inference_cost"] == u["cost"]
    assert 0 < u["completion_tokens_details"]["reasoning_tokens"] < u["completion_tokens"]
    assert isinstance(u["cost"], float)


async def test_stream_framing(api: Api) -> None:
    s = await api.stream(provider=ONLY_FIREWORKS, max_tokens=1000)
    assert s.status == 200
    assert s.headers["content-type"].startswith("text/event-stream")
    assert GEN_ID.match(s.headers["X-Generation-Id"])
    assert s.events[0] == ("comment", ": OPENROUTER PROCESSING")
    assert s.done and s.events.count(("done", None)) == 1
    chunks = s.chunks
    for c in chunks:
        assert c["id"] == s.headers["X-Generation-Id"]
        assert c["provider"] == "Fireworks"
        assert c["model"] == "moonshotai/kimi-k2.5-0127"
        assert c["object"] == "chat.completion.chunk"
        assert isinstance(c["created"], int)
        assert list(c)[:5] == ["id", "provider", "model", "object", "created"]
    first = chunks[0]["choices"][0]
    assert first["delta"] == {"role": "assistant", "content": ""}
    assert first["finish_reason"] is None
    # reasoning deltas first, then content deltas
    kinds = []
    for c in chunks[1:-2]:
        d = c["choices"][0]["delta"]
        kinds.append("r" if d.get("reasoning") else "c")
        if d.get("reasoning"):
            assert d["reasoning_details"][0]["text"] == d["reasoning"]
    assert kinds and kinds == sorted(kinds, key=lambda k: k == "c")
    assert "r" in kinds and "c" in kinds
    finish = chunks[-2]["choices"][0]
    assert finish["finish_reason"] == "stop" and finish["native_finish_reason"] == "stop"
    last = chunks[-1]
    assert last["choices"] == [] and "cost" in last["usage"]  # shape A


async def test_stream_and_non_stream_agree(api: Api) -> None:
    s = await api.stream(provider=ONLY_FIREWORKS, max_tokens=1000)
    r = await api.chat(provider=ONLY_FIREWORKS, max_tokens=1000)
    msg = r.json["choices"][0]["message"]
    assert s.content() == msg["content"]
    assert s.reasoning() == msg["reasoning"]
    assert s.usage() == r.json["usage"]


async def test_deterministic_per_prompt_and_seed(api: Api, osim: OpenRouterSim) -> None:
    a = await api.chat(provider=ONLY_FIREWORKS)
    b = await api.chat(provider=ONLY_FIREWORKS)
    other = await api.chat(
        provider=ONLY_FIREWORKS, messages=[{"role": "user", "content": "Something else entirely"}]
    )
    assert a.json["choices"][0]["message"] == b.json["choices"][0]["message"]
    assert a.json["choices"][0]["message"] != other.json["choices"][0]["message"]
    osim.config.seed = 99
    c = await api.chat(provider=ONLY_FIREWORKS)
    assert c.json["choices"][0]["message"] != a.json["choices"][0]["message"]


async def test_keepalive_comments_before_first_token(api: Api, osim: OpenRouterSim) -> None:
    osim.config.time_scale = 1.0
    osim.config.endpoint_overrides = {"fireworks": {"ttft_s": 0.15, "ttft_jitter": 0.0, "tokens_per_s": 5000}}
    s = await api.stream(provider=ONLY_FIREWORKS)
    first_data = next(i for i, (kind, _) in enumerate(s.events) if kind == "data")
    assert first_data >= 4  # one at once, then every 20 ms until 150 ms
    assert all(kind == "comment" for kind, _ in s.events[:first_data])
    assert s.done


async def test_max_tokens_caps_with_length(api: Api) -> None:
    r = await api.chat(max_tokens=7, provider=ONLY_FIREWORKS)
    choice = r.json["choices"][0]
    assert choice["finish_reason"] == "length"
    assert r.json["usage"]["completion_tokens"] == 7
    s = await api.stream(max_completion_tokens=7, provider=ONLY_FIREWORKS)
    assert s.required_usage()["completion_tokens"] == 7
    assert s.chunks[-2]["choices"][0]["finish_reason"] == "length"


async def test_usage_shape_b_and_c(api: Api, osim: OpenRouterSim) -> None:
    osim.config.usage_shape = "B"
    s = await api.stream()
    last = s.chunks[-1]
    assert len(last["choices"]) == 1 and last["choices"][0]["finish_reason"] is None
    assert "cost" not in last["usage"] and last["usage"]["completion_tokens"] > 0
    assert s.chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert s.done
    r = await api.chat()
    assert "cost" not in r.json["usage"]

    osim.config.usage_shape = "C"
    s = await api.stream()
    assert s.usage() is None and s.done
    assert s.chunks[-1]["choices"][0]["finish_reason"] == "stop"
    r = await api.chat()
    assert "usage" not in r.json
    # Billing happens regardless of what was reported.
    assert osim.billing.records[-1].cost > 0


async def test_reasoning_switches(api: Api) -> None:
    hidden = await api.stream(reasoning={"exclude": True}, provider=ONLY_FIREWORKS)
    assert hidden.reasoning() == "" and hidden.content()
    assert hidden.required_usage()["completion_tokens_details"]["reasoning_tokens"] > 0
    off = await api.chat(reasoning={"effort": "none"}, provider=ONLY_FIREWORKS)
    assert off.json["choices"][0]["message"]["reasoning"] is None
    assert off.json["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    legacy = await api.chat(include_reasoning=False, provider=ONLY_FIREWORKS)
    assert legacy.json["choices"][0]["message"]["reasoning"] is None
    assert legacy.json["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0


async def test_unknown_top_level_keys_ignored_and_metadata_opt_in(api: Api) -> None:
    r = await api.chat(
        usage={"include": True}, transforms=["middle-out"], stream_options={"include_usage": True}, whatever=1
    )
    assert r.status == 200 and "openrouter_metadata" not in r.json
    r = await api.chat(headers={"X-OpenRouter-Metadata": "enabled"})
    meta = r.json["openrouter_metadata"]
    assert meta["requested"] == "moonshotai/kimi-k2.5"
    assert (
        next(e for e in meta["endpoints"]["available"] if e["selected"])["provider"] == (r.json["provider"])
    )
    s = await api.stream(headers={"X-OpenRouter-Metadata": "enabled"})
    assert "openrouter_metadata" in s.chunks[-1]


async def test_default_model_and_prompt_estimate(api: Api) -> None:
    r = await api.chat(model=None)
    assert r.status == 200 and r.json["model"] == "moonshotai/kimi-k2.5-0127"
    text = PROMPT[0]["content"]
    assert r.json["usage"]["prompt_tokens"] == len(text.encode()) // 4 + 4


async def test_tokens_per_event_fixes_the_events_whatever_the_timing(api: Api, osim: OpenRouterSim) -> None:
    plain = await api.stream(provider=ONLY_FIREWORKS, max_tokens=1000)
    osim.config.tokens_per_event = 8
    shapes = []
    for interval in (0.001, 0.5):  # many small flushes, then one flush holding everything
        osim.config.chunk_interval_s = interval
        before = osim.state()["counters"]["token_events"]
        s = await api.stream(provider=ONLY_FIREWORKS, max_tokens=1000)
        assert s.content() == plain.content() and s.reasoning() == plain.reasoning()
        token_chunks = s.chunks[1:-2]  # role first; finish and usage last
        assert osim.state()["counters"]["token_events"] - before == len(token_chunks)
        shapes.append([(bool(c["choices"][0]["delta"].get("reasoning")), c) for c in token_chunks])
    usage = plain.usage()
    assert usage is not None
    n, r = usage["completion_tokens"], usage["completion_tokens_details"]["reasoning_tokens"]
    cuts = set(range(8, n, 8)) | ({r} if 0 < r < n else set())
    assert len(shapes[0]) == len(shapes[1]) == len(cuts) + 1
    assert [kind for kind, _ in shapes[0]] == [kind for kind, _ in shapes[1]]
