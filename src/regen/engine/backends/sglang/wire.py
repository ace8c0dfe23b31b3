"""SGLang's `/generate` as the backend uses it: the request body, the stream, the final answer.

docs/sglang.md §4 and §11: regen sends `input_ids` it rendered itself, with `stop_token_ids` the
end-of-turn id and `skip_special_tokens: false`, and streams. SGLang streams *cumulatively*: every
chunk carries the whole text and `output_ids` so far, so the last chunk is the answer and the ones
before it are only progress. Parsing every chunk would cost the client time quadratic in the output
length; `StreamTail` keeps only the newest complete event and the answer is parsed once, at the end.
The bytes of a cumulative stream grow with the square of the answer's length when a chunk goes out
every id (the server's default), so each request asks for a chunk every `stream_interval` ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

from regen.engine.data.row import Usage
from regen.engine.net.sglang_server import stream_interval

_SEP = b"\n\n"
_DONE_EVENT = b"data: [DONE]"
# What an out-of-vocabulary id ends a request with (finish_reason.matched): a numerical failure.
NAN_MATCHED = "NaN happened"


def sampling_params(
    max_new_tokens: int, temperature: float | None, top_p: float | None, end_of_turn_id: int
) -> dict[str, Any]:
    """The `sampling_params` every request carries; unset ones are left to the server's defaults."""
    params: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    if temperature is not None:
        params["temperature"] = temperature
    if top_p is not None:
        params["top_p"] = top_p
    # Kimi's eos is not its end-of-turn token: without the stop id a finished answer would run on to
    # max_new_tokens. </think> is a special token, so special tokens must stay in the text.
    params["stop_token_ids"] = [end_of_turn_id]
    params["skip_special_tokens"] = False
    params["stream_interval"] = stream_interval(max_new_tokens)
    return params


def request_body(input_ids: list[int], sampling: dict[str, Any], rid: str) -> bytes:
    return orjson.dumps({"input_ids": input_ids, "sampling_params": sampling, "rid": rid, "stream": True})


def worker_name(url: str) -> str:
    """A worker's name in rows and panes: its host:port."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    host = parts.hostname or url
    if ":" in host:
        host = f"[{host}]"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{host}:{port}"


class StreamTail:
    """The newest complete `data:` event of an SSE stream, and whether `[DONE]` came.

    Blocks arrive as the network delivers them; events end with a blank line. Only the bytes after
    the newest complete event are kept, so memory is one chunk whatever the output's length. Most
    blocks hold whole events, and those are read in place, without a copy into the buffer."""

    __slots__ = ("_pending", "done", "last")

    def __init__(self) -> None:
        self._pending = bytearray()
        self.last: bytes | None = None  # the payload of the newest data event that is not [DONE]
        self.done = False

    def feed(self, block: bytes) -> None:
        pending = self._pending
        buf: bytes | bytearray
        if pending:
            pending += block
            buf = pending
        else:
            buf = block
        end = buf.rfind(_SEP)
        if end < 0:
            if buf is block:
                pending += block
            return
        stop = end
        while True:
            start = buf.rfind(_SEP, 0, stop)
            begin = start + 2 if start >= 0 else 0
            if buf.startswith(_DONE_EVENT, begin):
                self.done = True
            elif buf.startswith(b"data:", begin):
                self.last = bytes(buf[begin + 5 : stop])
                break
            if start < 0:
                break
            stop = start
        if buf is block:
            if end + 2 < len(block):
                pending += block[end + 2 :]
        else:
            del pending[: end + 2]

    def finish(self) -> None:
        """The stream closed: a last event whose line ended, but without the blank line after it,
        still counts; bytes cut inside a line do not."""
        if self._pending.endswith(b"\n") and self._pending.strip():
            self.feed(_SEP)
        self._pending.clear()


@dataclass(slots=True)
class Answer:
    """The final chunk, read: what a row needs from the server."""

    text: str
    output_ids: list[int]
    meta: dict[str, Any]
    finish: Any  # meta_info.finish_reason as sent: a dict, or None for an unfinished stream
    error: dict[str, Any] | None = None  # an error event instead of a chunk


def read_answer(payload: bytes) -> Answer:
    """Parse the last event; raises ValueError when it is not an SGLang chunk at all."""
    try:
        chunk = orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise ValueError("the last stream event is not JSON") from None
    if not isinstance(chunk, dict):
        raise ValueError("the last stream event is not an object")
    if "error" in chunk and "meta_info" not in chunk:
        return Answer("", [], {}, None, error=chunk)
    meta = chunk.get("meta_info")
    ids = chunk.get("output_ids")
    if not isinstance(meta, dict) or not isinstance(ids, list):
        raise ValueError("the last stream event has no meta_info or output_ids")
    text = chunk.get("text")
    return Answer(text if isinstance(text, str) else "", ids, meta, meta.get("finish_reason"))


def finish_type(finish: Any) -> str | None:
    """`stop`, `length`, `abort`, ... from SGLang's finish_reason object (or a bare string)."""
    if isinstance(finish, dict):
        kind = finish.get("type")
        return str(kind) if kind is not None else None
    if isinstance(finish, str):
        return finish
    return None


def usage_of(meta: dict[str, Any]) -> Usage:
    def count(key: str) -> int | None:
        value = meta.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    return {
        "prompt_tokens": count("prompt_tokens"),
        "completion_tokens": count("completion_tokens"),
        "reasoning_tokens": count("reasoning_tokens"),
        "cached_tokens": count("cached_tokens"),
    }
