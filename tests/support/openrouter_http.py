"""Raw HTTP against the OpenRouter simulator, for its own tests (tests/sim/openrouter/): bodies and headers
exactly as sent on the wire, streams parsed event by event, and quick simulator settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from regen.sim.openrouter.config import SimConfig
from regen.sim.openrouter.server import OpenRouterSim

KEY = "sk-sim-test"
MGMT = "sk-sim-management"
PROMPT = [{"role": "user", "content": "Explain MoE routing in two sentences."}]


def quick(**overrides: Any) -> SimConfig:
    """Millisecond-scale timing so behaviour tests stay fast."""
    base: dict[str, Any] = {
        "time_scale": 0.002,
        "min_completion_tokens": 20,
        "max_completion_tokens": 60,
        "chunk_interval_s": 0.005,
        "keepalive_interval_s": 0.02,
        "generation_lookup_delay_s": 0.05,
        "retry_after_s": 3,
        "seed": 5,
    }
    base.update(overrides)
    return SimConfig(**base)


@dataclass
class Reply:
    status: int
    headers: Any
    raw: bytes
    json: Any = None


@dataclass
class StreamReply:
    status: int
    headers: Any
    raw: bytes
    # ("comment", text) | ("data", dict) | ("done", None), in arrival order
    events: list[tuple[str, Any]] = field(default_factory=list)

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return [e for kind, e in self.events if kind == "data"]

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1][0] == "done"

    def content(self) -> str:
        return "".join(
            (c["choices"][0]["delta"].get("content") or "") for c in self.chunks if c.get("choices")
        )

    def reasoning(self) -> str:
        return "".join(
            (c["choices"][0]["delta"].get("reasoning") or "") for c in self.chunks if c.get("choices")
        )

    def usage(self) -> dict[str, Any] | None:
        found = [c["usage"] for c in self.chunks if "usage" in c]
        assert len(found) <= 1
        return found[0] if found else None

    def required_usage(self) -> dict[str, Any]:
        """The usage chunk, where the test expects one."""
        usage = self.usage()
        assert usage is not None, "the stream carried no usage chunk"
        return usage


def parse_sse(raw: bytes) -> list[tuple[str, Any]]:
    events: list[tuple[str, Any]] = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        for line in block.split("\n"):
            if line.startswith(":"):
                events.append(("comment", line))
            elif line.startswith("data: "):
                payload = line[len("data: ") :]
                if payload == "[DONE]":
                    events.append(("done", None))
                else:
                    events.append(("data", orjson.loads(payload)))
    return events


class Api:
    """Raw HTTP against the simulator: bodies and headers exactly as sent on the wire."""

    def __init__(self, session: aiohttp.ClientSession, sim: OpenRouterSim) -> None:
        self.session = session
        self.sim = sim

    def url(self, path: str) -> str:
        return self.sim.base_url + path

    @staticmethod
    def _headers(key: str | None, extra: dict[str, str] | None) -> dict[str, str]:
        h = {} if key is None else {"Authorization": f"Bearer {key}"}
        h.update(extra or {})
        return h

    @staticmethod
    def body(**fields: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"model": "moonshotai/kimi-k2.5", "messages": PROMPT}
        body.update(fields)
        return body

    async def chat(
        self, key: str | None = KEY, headers: dict[str, str] | None = None, **fields: Any
    ) -> Reply:
        body = self.body(**fields)
        async with self.session.post(
            self.url("/chat/completions"),
            data=orjson.dumps(body),
            headers={"Content-Type": "application/json", **self._headers(key, headers)},
        ) as r:
            raw = await r.read()
            return Reply(r.status, r.headers, raw, _maybe_json(raw))

    async def stream(
        self, key: str | None = KEY, headers: dict[str, str] | None = None, **fields: Any
    ) -> StreamReply:
        body = self.body(stream=True, **fields)
        async with self.session.post(
            self.url("/chat/completions"),
            data=orjson.dumps(body),
            headers={"Content-Type": "application/json", **self._headers(key, headers)},
        ) as r:
            raw = await r.read()
            if r.status != 200 or not r.content_type.startswith("text/event-stream"):
                return StreamReply(r.status, r.headers, raw, [("json", _maybe_json(raw))])
            return StreamReply(r.status, r.headers, raw, parse_sse(raw))

    async def post_raw(self, data: bytes, key: str | None = KEY) -> Reply:
        async with self.session.post(
            self.url("/chat/completions"),
            data=data,
            headers={"Content-Type": "application/json", **self._headers(key, None)},
        ) as r:
            raw = await r.read()
            return Reply(r.status, r.headers, raw, _maybe_json(raw))

    async def get(self, path: str, key: str | None = KEY, params: dict[str, str] | None = None) -> Reply:
        url = self.url(path) if not path.startswith("/_sim") else self.root(path)
        async with self.session.get(url, headers=self._headers(key, None), params=params) as r:
            raw = await r.read()
            return Reply(r.status, r.headers, raw, _maybe_json(raw))

    def root(self, path: str) -> str:
        return f"http://127.0.0.1:{self.sim.port}{path}"


def _maybe_json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def endpoint(sim: OpenRouterSim, provider_name: str, model: str = "moonshotai/kimi-k2.5") -> Any:
    for m in sim.config.models:
        if m.id == model:
            for e in m.endpoints:
                if e.provider_name == provider_name:
                    return e
    raise KeyError(provider_name)
