"""Every fault class produces its documented shape (§3.5, §4.4, §6, §13.10-19)."""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp
import orjson
import pytest

from regen.sim.openrouter.config import FAULT_CLASSES, HTTP_FAULTS
from regen.sim.openrouter.server import OpenRouterSim
from tests.support.openrouter_http import KEY, Api, Reply, parse_sse

FIREWORKS = {"only": ["fireworks"]}
HTTP_EXPECT: dict[str, tuple[int, str | None]] = {
    "http_429": (429, None),
    "http_429_retry_after": (429, "3"),
    "http_429_ratelimit_reset": (429, None),
    "http_500": (500, None),
    "http_502": (502, None),
    "http_503": (503, "3"),
    "http_408": (408, None),
    "http_524": (524, None),
    "http_529": (529, None),
    "http_402_in_flight": (402, "3"),
}


def with_fault(sim: OpenRouterSim, fault: str) -> None:
    sim.config.faults = {fault: 1.0}


async def raw_post(api: Api, stream: bool) -> tuple[int, Any, bytes, BaseException | None]:
    """POST and read whatever arrives, keeping the partial body when the connection is cut."""
    body = orjson.dumps(api.body(stream=stream, provider=FIREWORKS))
    got = bytearray()
    try:
        async with api.session.post(
            api.url("/chat/completions"), data=body, headers={"Authorization": f"Bearer {KEY}"}
        ) as r:
            try:
                async for piece in r.content.iter_any():
                    got.extend(piece)
            except aiohttp.ClientPayloadError as exc:
                return r.status, r.headers, bytes(got), exc
            return r.status, r.headers, bytes(got), None
    except aiohttp.ClientError as exc:
        return 0, None, bytes(got), exc


def test_fault_class_names_are_the_documented_set() -> None:
    assert set(FAULT_CLASSES) == {
        *HTTP_EXPECT,
        "error_body_200",
        "error_choice_200",
        "mid_stream_error",
        "silent_failure",
        "reset_before_headers",
        "cut_mid_stream",
        "cut_nonstream_body",
        "reasoning_exhaustion",
        "degenerate",
        "empty_stop",
        "missing_usage",
        "missing_cost",
        "slow_first_token",
    }


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("fault", sorted(HTTP_EXPECT))
async def test_http_faults(api: Api, osim: OpenRouterSim, fault: str, stream: bool) -> None:
    with_fault(osim, fault)
    r = await (api.stream if stream else api.chat)(provider=FIREWORKS)
    status, retry_after = HTTP_EXPECT[fault]
    body = r.json if isinstance(r, Reply) else r.events[0][1]
    assert r.status == status
    assert r.headers["content-type"].startswith("application/json")  # plain JSON, not SSE
    assert body["error"]["code"] == status
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert r.headers.get("Retry-After") == retry_after
    assert osim.billing.records == []  # nothing billed before the first byte
    assert osim.faults_injected[fault] == 1
    err = body["error"]
    if fault == "http_429_ratelimit_reset":
        reset = int(r.headers["X-RateLimit-Reset"])
        assert abs(reset - (time.time() + 3) * 1000) < 10_000  # epoch milliseconds
        assert r.headers["X-RateLimit-Remaining"] == "0"
        assert err["metadata"]["headers"]["X-RateLimit-Reset"] == str(reset)
    if fault == "http_429_retry_after":
        assert err["availability"] == {
            **err["availability"],
            "code": "capacity_exhausted",
            "retryable": True,
            "retry_after": 3,
        }
    if fault == "http_502":
        assert err["message"] == "Provider returned error"
        assert err["metadata"]["provider_name"] == "Fireworks"
        assert json.loads(err["metadata"]["raw"])["error"]["code"] == 502
    if fault == "http_500":
        assert err["metadata"]["error_type"] == "server"
    if fault == "http_402_in_flight":
        assert err["metadata"]["limit_source"] == "openrouter_in_flight_budget"
        assert err["metadata"]["reason"] == "in_flight_budget_exhausted"
    else:
        assert "X-Generation-Id" in r.headers  # routed, then failed


async def test_error_body_200(api: Api, osim: OpenRouterSim) -> None:
    with_fault(osim, "error_body_200")
    r = await api.chat(provider=FIREWORKS)
    assert r.status == 200 and "choices" not in r.json
    assert r.json["error"]["metadata"]["provider_name"] == "Fireworks"
    assert r.json["user_id"].startswith("user_")
    s = await api.stream(provider=FIREWORKS)
    assert s.status == 200 and s.done
    [chunk] = s.chunks
    assert chunk["choices"] == [] and chunk["error"]["code"] == 429
    assert all(rec.cost == 0 for rec in osim.billing.records)


@pytest.mark.parametrize("fault", ["error_choice_200", "mid_stream_error"])
async def test_error_finish_non_stream(api: Api, osim: OpenRouterSim, fault: str) -> None:
    with_fault(osim, fault)
    r = await api.chat(provider=FIREWORKS, reasoning={"effort": "none"})
    choice = r.json["choices"][0]
    assert r.status == 200 and choice["finish_reason"] == "error"
    assert choice["error"]["code"] == 502
    assert choice["message"]["content"]  # partial content kept
    assert r.json["usage"]["cost"] == 0  # zero completion insurance on error finish
    assert osim.billing.records[-1].cost == 0


async def test_mid_stream_error(api: Api, osim: OpenRouterSim) -> None:
    with_fault(osim, "mid_stream_error")
    s = await api.stream(provider=FIREWORKS, reasoning={"effort": "none"})
    assert s.status == 200
    assert s.content()  # some chunks first
    err_chunk = s.chunks[-1]
    assert err_chunk["error"]["metadata"]["error_type"] == "provider_unavailable"
    assert err_chunk["choices"][0]["finish_reason"] == "error"
    assert err_chunk["id"] == s.headers["X-Generation-Id"]
    assert s.usage() is None and s.done
    osim.config.done_after_error = False
    s = await api.stream(provider=FIREWORKS)
    assert not s.done and "error" in s.chunks[-1]


async def test_error_choice_200_stream(api: Api, osim: OpenRouterSim) -> None:
    with_fault(osim, "error_choice_200")
    s = await api.stream(provider=FIREWORKS, reasoning={"effort": "none"})
    last = s.chunks[-1]["choices"][0]
    assert last["finish_reason"] == "error" and last["error"]["code"] == 502
    assert "error" not in s.chunks[-1] and s.content() and s.done


@pytest.mark.parametrize("stream", [False, True])
async def test_silent_failure(api: Api, osim: OpenRouterSim, stream: bool) -> None:
    with_fault(osim, "silent_failure")
    if stream:
        s = await api.stream(provider=FIREWORKS)
        finish = s.chunks[-2]["choices"][0]
        assert s.content() == "" and s.reasoning() == ""
        usage = s.usage()
    else:
        r = await api.chat(provider=FIREWORKS)
        finish = r.json["choices"][0]
        assert finish["message"]["content"] == ""
        usage = r.json["usage"]
    assert finish["finish_reason"] == "stop" and finish["native_finish_reason"] == "network_error"
    assert usage is not None and usage["completion_tokens"] == 0


@pytest.mark.parametrize("stream", [False, True])
async def test_reset_before_headers(api: Api, osim: OpenRouterSim, stream: bool) -> None:
    with_fault(osim, "reset_before_headers")
    status, _, got, exc = await raw_post(api, stream)
    assert status == 0 and got == b""
    assert isinstance(exc, aiohttp.ServerDisconnectedError)
    assert osim.billing.records == []
    assert osim.requests[-1]["error"] == "reset_before_headers"


async def test_cut_mid_stream(api: Api, osim: OpenRouterSim) -> None:
    with_fault(osim, "cut_mid_stream")
    status, headers, got, exc = await raw_post(api, stream=True)
    assert status == 200 and isinstance(exc, aiohttp.ClientPayloadError)
    events = parse_sse(got)
    assert any(kind == "data" for kind, _ in events)
    assert ("done", None) not in events
    assert not any("error" in e or "usage" in e for kind, e in events if kind == "data")
    rec = osim.billing.records[-1]
    assert rec.cancelled and rec.id == headers["X-Generation-Id"]


@pytest.mark.parametrize("fault", ["cut_nonstream_body", "cut_mid_stream"])
async def test_cut_nonstream_body(api: Api, osim: OpenRouterSim, fault: str) -> None:
    with_fault(osim, fault)
    status, headers, got, exc = await raw_post(api, stream=False)
    assert status == 200 and isinstance(exc, aiohttp.ClientPayloadError)
    assert 0 < len(got) < int(headers["Content-Length"])
    rec = osim.billing.records[-1]
    assert rec.cost > 0 and not rec.cancelled  # non-stream is billed in full


async def test_reasoning_exhaustion(api: Api, osim: OpenRouterSim) -> None:
    with_fault(osim, "reasoning_exhaustion")
    r = await api.chat(provider=FIREWORKS, max_tokens=16)
    choice = r.json["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] is None and choice["message"]["reasoning"]
    u = r.json["usage"]
    assert u["completion_tokens"] == 16 and u["cost"] > 0
    assert u["completion_tokens_details"]["reasoning_tokens"] > u["completion_tokens"]
    s = await api.stream(provider=FIREWORKS, max_tokens=16)
    assert s.content() == "" and s.reasoning()
    assert s.chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert s.required_usage()["cost"] > 0


async def test_degenerate_and_empty_stop(api: Api, osim: OpenRouterSim) -> None:
    with_fault(osim, "degenerate")
    r = await api.chat(provider=FIREWORKS)
    content = r.json["choices"][0]["message"]["content"]
    assert len(content) > 20 and set(content) == {"!"}
    assert r.json["choices"][0]["finish_reason"] == "stop"
    s = await api.stream(provider=FIREWORKS)
    assert set(s.content()) == {"!"}
    with_fault(osim, "empty_stop")
    r = await api.chat(provider=FIREWORKS)
    assert r.json["choices"][0]["message"]["content"] == ""
    assert r.json["choices"][0]["finish_reason"] == "stop"
    s = await api.stream(provider=FIREWORKS)
    assert s.content() == "" and s.chunks[-2]["choices"][0]["finish_reason"] == "stop"


async def test_missing_usage_and_cost(api: Api, osim: OpenRouterSim) -> None:
    with_fault(osim, "missing_usage")
    s = await api.stream(provider=FIREWORKS)
    assert s.usage() is None and s.done
    assert "usage" not in (await api.chat(provider=FIREWORKS)).json
    with_fault(osim, "missing_cost")
    s = await api.stream(provider=FIREWORKS)
    assert "cost" not in s.required_usage() and s.done
    assert "cost" not in (await api.chat(provider=FIREWORKS)).json["usage"]
    assert all(rec.cost > 0 for rec in osim.billing.records)  # billed all the same


async def test_slow_first_token(api: Api, osim: OpenRouterSim) -> None:
    osim.config.time_scale = 1.0
    osim.config.slow_first_token_factor = 25
    osim.config.endpoint_overrides = {
        "fireworks": {"ttft_s": 0.01, "ttft_jitter": 0.0, "tokens_per_s": 10000}
    }
    t0 = time.monotonic()
    await api.stream(provider=FIREWORKS)
    fast_s = time.monotonic() - t0
    with_fault(osim, "slow_first_token")
    t0 = time.monotonic()
    slow = await api.stream(provider=FIREWORKS)
    slow_s = time.monotonic() - t0
    assert slow_s >= 0.25 > fast_s
    comments = [e for e in slow.events if e[0] == "comment"]
    assert len(comments) >= 5 and slow.done


async def test_provider_override_fails_one_provider(api: Api, osim: OpenRouterSim) -> None:
    osim.config.provider_faults = {"Fireworks": {"mid_stream_error": 1.0}}
    s = await api.stream(provider=FIREWORKS)
    assert "error" in s.chunks[-1]
    s = await api.stream(provider={"only": ["parasail"]})
    assert "error" not in s.chunks[-1] and s.required_usage()["cost"] > 0


async def test_fault_rates_are_drawn_per_request(api: Api, osim: OpenRouterSim) -> None:
    osim.config.faults = {"http_502": 0.3, "missing_cost": 0.3}
    statuses = [(await api.chat()).status for _ in range(60)]
    assert 5 < statuses.count(502) < 35
    assert 5 < osim.faults_injected["missing_cost"] < 35
    assert osim.faults_injected["http_502"] == statuses.count(502)


def test_http_fault_tuple_matches() -> None:
    assert set(HTTP_FAULTS) | {"http_402_in_flight"} == set(HTTP_EXPECT)
