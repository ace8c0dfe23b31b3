"""Tool-call answers (docs/openrouter.md §3.2, §4.1, §13.13) for requests that carry `tools`.

Shapes follow OpenRouter captures of Kimi K2 (charmbracelet/fantasy provider test fixtures
`TestTool/openrouter-kimi-k2.yaml` and `TestStreamWithTools/openrouter-kimi-k2.yaml`): an optional
short content preamble, then per call a first delta carrying `index`, `id` ("<name>:<n>"), `type`
and `function.name` with empty arguments, then argument fragments `{index, function:{arguments},
type}`; the finish reason is "tool_calls". Non-stream bodies carry `message.tool_calls` whole.

A call's tokens are one for its header plus one per CHARS_PER_TOKEN characters of arguments, so a
call streams through the same token clock as text and a cut or abort lands mid-arguments.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from regen.sim.openrouter.text import CONTENT_CYCLE, span

CHARS_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the JSON text, as the model writes it

    @property
    def tokens(self) -> int:
        return 1 + math.ceil(len(self.arguments) / CHARS_PER_TOKEN)


@dataclass(frozen=True, slots=True)
class ToolAnswer:
    preamble: int  # content tokens before the first call
    calls: tuple[ToolCall, ...]

    @property
    def call_tokens(self) -> int:
        return sum(c.tokens for c in self.calls)


def _functions(body: dict[str, Any]) -> list[dict[str, Any]]:
    tools = body.get("tools")
    if not isinstance(tools, list):
        return []
    out: list[dict[str, Any]] = []
    for t in tools:
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]:
            out.append(fn)
    return out


def _value(schema: Any, seed: int) -> Any:
    """A plausible value for one JSON-schema property: enough for a client to parse, not to use."""
    if not isinstance(schema, dict):
        return span(CONTENT_CYCLE, seed, 0, 2).strip()
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[seed % len(enum)]
    kind = schema.get("type")
    if kind == "integer":
        return seed % 100
    if kind == "number":
        return round((seed % 1000) / 10, 1)
    if kind == "boolean":
        return bool(seed % 2)
    if kind == "array":
        return [_value(schema.get("items"), seed + 1)]
    if kind == "object":
        return _arguments(schema, seed + 1)
    return span(CONTENT_CYCLE, seed, 0, 2 + seed % 3).strip()


def _arguments(schema: Any, seed: int) -> dict[str, Any]:
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        return {}
    return {name: _value(sub, seed + i * 7919) for i, (name, sub) in enumerate(props.items())}


def plan_tool_answer(
    body: dict[str, Any], digest: bytes, share: float, max_parallel: int
) -> ToolAnswer | None:
    """Whether this completion calls tools, and which: deterministic from the prompt digest.

    tool_choice "none" never calls, "required" or a named function always does, "auto" (or absent)
    calls with probability `share`.
    """
    functions = _functions(body)
    if not functions:
        return None
    choice = body.get("tool_choice")
    h = hashlib.blake2b(digest, digest_size=16, person=b"regen-tools").digest()
    if choice == "none":
        return None
    if isinstance(choice, dict):
        wanted = (choice.get("function") or {}).get("name")
        functions = [f for f in functions if f["name"] == wanted] or functions
        forced = True  # a named function is called, once
    else:
        forced = choice == "required"
    if not forced and int.from_bytes(h[0:4], "little") / 2**32 >= share:
        return None
    single = body.get("parallel_tool_calls") is False or isinstance(choice, dict)
    limit = 1 if single else max_parallel
    n = 1 + h[4] % min(len(functions), limit)
    first = h[5] % len(functions)
    calls = []
    for i in range(n):
        fn = functions[(first + i) % len(functions)]
        # Separators as Kimi writes them: '{"location": "Florence"}'.
        args = json.dumps(_arguments(fn.get("parameters"), int.from_bytes(h[8:12], "little") + i))
        calls.append(ToolCall(id=f"{fn['name']}:{i}", name=fn["name"], arguments=args))
    preamble = (3 + h[6] % 6) if h[7] % 2 else 0
    return ToolAnswer(preamble=preamble, calls=tuple(calls))


def deltas(calls: tuple[ToolCall, ...], start: int, end: int) -> list[dict[str, Any]]:
    """The `delta.tool_calls` entries for call tokens [start, end), one entry per call touched."""
    out: list[dict[str, Any]] = []
    base = 0
    for index, call in enumerate(calls):
        n = call.tokens
        lo, hi = max(start, base), min(end, base + n)
        if lo < hi:
            j0, j1 = lo - base, hi - base
            # Token 0 is the header; token j >= 1 carries characters [(j-1)*4, j*4).
            args = call.arguments[max(j0 - 1, 0) * CHARS_PER_TOKEN : (j1 - 1) * CHARS_PER_TOKEN]
            if j0 == 0:
                out.append(
                    {
                        "index": index,
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": args},
                    }
                )
            else:
                out.append({"index": index, "function": {"arguments": args}, "type": "function"})
        base += n
    return out


def message_calls(calls: tuple[ToolCall, ...], upto: int) -> list[dict[str, Any]]:
    """`message.tool_calls` of a non-stream body holding the first `upto` call tokens."""
    return deltas(calls, 0, upto)
