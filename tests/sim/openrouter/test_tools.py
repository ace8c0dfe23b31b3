"""Tool-call answers (§3.2, §4.1, §13.13): indexed `delta.tool_calls` fragments on streams,
`message.tool_calls` on plain bodies, finish reason "tool_calls"."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pytest

from regen.sim.openrouter.server import OpenRouterSim
from tests.support.openrouter_http import Api, StreamReply

WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Get weather information for a location",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string", "description": "the city"}},
            "required": ["location"],
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
NO_REASONING = {"enabled": False}


def prompt(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"What is the weather in city number {i}?"}]


def tool_calls_of(reply: StreamReply) -> dict[int, dict[str, Any]]:
    """Reassemble streamed calls by index, the way an OpenAI-style client does."""
    calls: dict[int, dict[str, Any]] = defaultdict(lambda: {"arguments": "", "fragments": 0})
    for chunk in reply.chunks:
        for choice in chunk.get("choices") or []:
            for entry in choice["delta"].get("tool_calls") or []:
                assert choice["delta"]["content"] is None
                assert entry["type"] == "function"
                call = calls[entry["index"]]
                if "id" in entry:
                    assert "id" not in call  # the header comes once per call
                    call["id"] = entry["id"]
                    call["name"] = entry["function"]["name"]
                call["arguments"] += entry["function"]["arguments"]
                call["fragments"] += 1
    return dict(calls)


async def test_streamed_tool_calls(api: Api, osim: OpenRouterSim) -> None:
    osim.config.tool_call_share = 1.0
    osim.config.tokens_per_event = 2  # small events: arguments spread over several chunks
    s = await api.stream(messages=prompt(1), tools=[WEATHER], reasoning=NO_REASONING)
    assert s.status == 200 and s.done
    calls = tool_calls_of(s)
    assert list(calls) == [0]
    call = calls[0]
    assert call["id"] == "weather:0" and call["name"] == "weather"
    assert call["fragments"] > 2
    args = json.loads(call["arguments"])
    assert set(args) == {"location"} and isinstance(args["location"], str)
    # The header precedes every fragment of its call, with empty or partial arguments.
    first = next(c for c in s.chunks if c.get("choices") and c["choices"][0]["delta"].get("tool_calls"))
    assert first["choices"][0]["delta"]["tool_calls"][0]["id"] == "weather:0"
    finish = s.chunks[-2]["choices"][0]
    assert finish["finish_reason"] == "tool_calls" and finish["native_finish_reason"] == "tool_calls"
    usage = s.usage()
    assert usage is not None and usage["cost"] > 0 and usage["completion_tokens"] > 0
    assert osim.billing.records[-1].finish_reason == "tool_calls"


async def test_non_stream_tool_calls_match_the_stream(api: Api, osim: OpenRouterSim) -> None:
    osim.config.tool_call_share = 1.0
    for i in range(6):
        fields: dict[str, Any] = {"messages": prompt(i), "tools": [WEATHER, ADD], "reasoning": NO_REASONING}
        r = await api.chat(**fields)
        s = await api.stream(**fields)
        choice = r.json["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        message = choice["message"]
        whole = message["tool_calls"]
        assert [c["index"] for c in whole] == list(range(len(whole)))
        streamed = tool_calls_of(s)
        assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in whole] == [
            (c["id"], c["name"], c["arguments"]) for c in streamed.values()
        ]
        assert all(c["type"] == "function" for c in whole)
        # A short preamble may come first, as Kimi writes "I'll check the weather for you."
        assert message["content"] == (s.content() or None)
        assert r.json["usage"]["completion_tokens"] == s.required_usage()["completion_tokens"]
        for c in whole:
            args = json.loads(c["function"]["arguments"])
            if c["function"]["name"] == "add":
                assert isinstance(args["a"], int) and isinstance(args["b"], int)


async def test_parallel_calls_get_distinct_indexes(api: Api, osim: OpenRouterSim) -> None:
    osim.config.tool_call_share = 1.0
    counts: set[int] = set()
    for i in range(12):
        s = await api.stream(messages=prompt(i), tools=[WEATHER, ADD], reasoning=NO_REASONING)
        calls = tool_calls_of(s)
        counts.add(len(calls))
        assert sorted(calls) == list(range(len(calls)))
        assert len({c["id"] for c in calls.values()}) == len(calls)
        single = await api.stream(
            messages=prompt(i), tools=[WEATHER, ADD], parallel_tool_calls=False, reasoning=NO_REASONING
        )
        assert len(tool_calls_of(single)) == 1
    assert counts == {1, 2}


async def test_preamble_then_calls(api: Api, osim: OpenRouterSim) -> None:
    osim.config.tool_call_share = 1.0
    seen_preamble = seen_bare = False
    for i in range(12):
        s = await api.stream(messages=prompt(i), tools=[WEATHER], reasoning=NO_REASONING)
        kinds = [
            "tool" if c["choices"][0]["delta"].get("tool_calls") else "text"
            for c in s.chunks
            if c.get("choices")
            and (c["choices"][0]["delta"].get("content") or c["choices"][0]["delta"].get("tool_calls"))
        ]
        assert "tool" in kinds and kinds == sorted(kinds, key=lambda k: k == "tool")  # text first
        seen_preamble |= "text" in kinds
        seen_bare |= "text" not in kinds
    assert seen_preamble and seen_bare


@pytest.mark.parametrize(
    ("share", "choice", "calls"),
    [
        (0.0, None, False),
        (1.0, "none", False),
        (0.0, "required", True),
        (0.0, "auto", False),
        (0.0, {"type": "function", "function": {"name": "add"}}, True),
    ],
)
async def test_share_and_tool_choice(
    api: Api, osim: OpenRouterSim, share: float, choice: Any, calls: bool
) -> None:
    osim.config.tool_call_share = share
    fields: dict[str, Any] = {"tools": [WEATHER, ADD], "reasoning": NO_REASONING}
    if choice is not None:
        fields["tool_choice"] = choice
    for i in range(4):
        r = await api.chat(messages=prompt(i), **fields)
        choice_out = r.json["choices"][0]
        assert ("tool_calls" in choice_out["message"]) is calls
        assert choice_out["finish_reason"] == ("tool_calls" if calls else "stop")
        if isinstance(choice, dict):
            assert [c["function"]["name"] for c in choice_out["message"]["tool_calls"]] == ["add"]


async def test_share_is_a_share_and_deterministic(api: Api, osim: OpenRouterSim) -> None:
    osim.config.tool_call_share = 0.5
    first = [
        "tool_calls" in (await api.chat(messages=prompt(i), tools=[WEATHER])).json["choices"][0]["message"]
        for i in range(40)
    ]
    assert 8 <= sum(first) <= 32
    again = [
        "tool_calls" in (await api.chat(messages=prompt(i), tools=[WEATHER])).json["choices"][0]["message"]
        for i in range(40)
    ]
    assert again == first


async def test_reasoning_then_tool_calls(api: Api, osim: OpenRouterSim) -> None:
    osim.config.tool_call_share = 1.0
    s = await api.stream(messages=prompt(3), tools=[WEATHER])
    assert s.reasoning() and tool_calls_of(s)
    r = await api.chat(messages=prompt(3), tools=[WEATHER])
    message = r.json["choices"][0]["message"]
    assert message["reasoning"] == s.reasoning() and message["tool_calls"]


async def test_calls_that_do_not_fit_max_tokens_become_text(api: Api, osim: OpenRouterSim) -> None:
    osim.config.tool_call_share = 1.0
    r = await api.chat(messages=prompt(1), tools=[WEATHER], reasoning=NO_REASONING, max_tokens=2)
    choice = r.json["choices"][0]
    assert choice["finish_reason"] == "length" and "tool_calls" not in choice["message"]
