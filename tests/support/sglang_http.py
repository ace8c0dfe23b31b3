"""Raw HTTP against the SGLang simulator, for its own tests (tests/sim/sglang/): bodies as sent on
the wire, streams parsed event by event, prompts rendered with the served tokenizer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from regen.sim.sglang.server import SGLangSim
from regen.sim.sglang.tokens import SimTokenizer

USER = [{"role": "user", "content": "Explain MoE routing in two sentences."}]


@dataclass
class Reply:
    status: int
    headers: Any
    raw: bytes

    @property
    def json(self) -> Any:
        return orjson.loads(self.raw)


@dataclass
class StreamReply:
    status: int
    raw: bytes
    events: list[Any] = field(default_factory=list)  # dicts, then "[DONE]"

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return [e for e in self.events if isinstance(e, dict)]

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1] == "[DONE]"


def parse_sse(raw: bytes) -> list[Any]:
    events: list[Any] = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: ") :]
        events.append("[DONE]" if payload == "[DONE]" else orjson.loads(payload))
    return events


class SGApi:
    """Raw HTTP against a simulator: bodies as sent on the wire."""

    def __init__(self, session: aiohttp.ClientSession, sim: SGLangSim, tok: SimTokenizer) -> None:
        self.session = session
        self.sim = sim
        self.tok = tok

    def url(self, path: str) -> str:
        return self.sim.base_url + path

    def prompt(self, messages: list[dict[str, Any]] | None = None, thinking: bool = True) -> list[int]:
        ids: list[int] = self.tok.hf.apply_chat_template(
            messages or USER, add_generation_prompt=True, tokenize=True, thinking=thinking
        )
        return ids

    def body(self, **fields: Any) -> dict[str, Any]:
        sampling = {
            "max_new_tokens": 64,
            "temperature": 1.0,
            "top_p": 0.95,
            "min_p": 0.01,
            "stop_token_ids": [self.tok.eot_id],
            "skip_special_tokens": False,
        }
        sampling.update(fields.pop("sampling", {}))
        body: dict[str, Any] = {"input_ids": self.prompt(), "sampling_params": sampling}
        body.update(fields)
        return body

    async def generate(self, **fields: Any) -> Reply:
        async with self.session.post(self.url("/generate"), data=orjson.dumps(self.body(**fields))) as r:
            return Reply(r.status, r.headers, await r.read())

    async def post(self, path: str, body: Any = None, raw: bytes | None = None) -> Reply:
        data = raw if raw is not None else orjson.dumps(body if body is not None else {})
        async with self.session.post(self.url(path), data=data) as r:
            return Reply(r.status, r.headers, await r.read())

    async def stream(self, **fields: Any) -> StreamReply:
        async with self.session.post(
            self.url("/generate"), data=orjson.dumps(self.body(stream=True, **fields))
        ) as r:
            raw = await r.read()
            if r.status != 200:
                return StreamReply(r.status, raw)
            return StreamReply(r.status, raw, parse_sse(raw))

    async def get(self, path: str, headers: dict[str, str] | None = None) -> Reply:
        async with self.session.get(self.url(path), headers=headers) as r:
            return Reply(r.status, r.headers, await r.read())

    async def config(self, patch: dict[str, Any]) -> Reply:
        return await self.post("/_sim/config", patch)

    async def state(self) -> dict[str, Any]:
        reply = await self.get("/_sim/state")
        assert reply.status == 200
        state: dict[str, Any] = reply.json
        return state
