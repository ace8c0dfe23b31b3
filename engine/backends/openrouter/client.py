"""The OpenRouter chat-completions client: one shared aiohttp pool, orjson, SSE parsed by hand.

It reads every shape of docs/openrouter.md §3–§5: keep-alive comments, usage after the finish
chunk or in a chunk with empty choices, mid-stream error chunks, streams closed without [DONE],
HTTP 200 bodies with an error and no choices, content null beside reasoning, missing usage or cost.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from engine.backends.base import Disposition
from engine.backends.openrouter.errors import (
    AttemptError,
    ErrorClass,
    classify_error_in_ok_response,
    classify_status,
)
from engine.net.deadlines import Deadlines, Watch
from engine.settings import OpenRouterSettings, ProviderSettings

FAILED_NATIVE_FINISH = frozenset({"error", "network_error"})


@dataclass(slots=True)
class AttemptResult:
    """What one HTTP attempt produced; `error` is None only for an accepted response."""

    generation_id: str | None = None
    provider: str | None = None
    served_model: str | None = None
    finish_reason: str | None = None
    native_finish_reason: str | None = None
    content: str = ""
    reasoning: str = ""
    usage: dict[str, Any] | None = None
    cost: float | None = None
    is_byok: bool = False
    ttft_s: float | None = None
    e2e_s: float = 0.0
    http_status: int | None = None
    error: AttemptError | None = None
    received_bytes: int = 0

    @property
    def completion_tokens(self) -> int:
        if self.usage and isinstance(self.usage.get("completion_tokens"), int):
            return int(self.usage["completion_tokens"])
        return 0


def _usage_cost(usage: Mapping[str, Any] | None) -> float | None:
    if not usage:
        return None
    cost = usage.get("cost")
    if isinstance(cost, int | float) and not isinstance(cost, bool):
        return float(cost)
    return None


def _reasoning_from_details(details: Any) -> str:
    if not isinstance(details, list):
        return ""
    return "".join(
        str(d.get("text") or d.get("summary") or "")
        for d in details
        if isinstance(d, dict) and d.get("type") in ("reasoning.text", "reasoning.summary")
    )


class _StreamParse:
    """Folds SSE lines of one chat-completions stream into an AttemptResult."""

    __slots__ = ("content", "done", "error_chunk", "on_provider", "reasoning", "result", "started")

    def __init__(
        self, result: AttemptResult, started: float, on_provider: Callable[[str], None] | None
    ) -> None:
        self.result = result
        self.started = started
        self.on_provider = on_provider
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.done = False
        self.error_chunk: dict[str, Any] | None = None

    def line(self, line: bytes) -> bool:
        """Take one line; True when the stream is over ([DONE] or a malformed chunk)."""
        # SSE comments (": OPENROUTER PROCESSING") and blank separators carry no data.
        if len(line) < 6 or line[0] == 58 or not line.startswith(b"data:"):
            return False
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return True
        result = self.result
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            result.error = AttemptError(ErrorClass.NETWORK, Disposition.RETRY, "malformed stream chunk", 200)
            return True
        if result.provider is None:
            result.provider = chunk.get("provider")
            result.served_model = chunk.get("model")
            result.generation_id = result.generation_id or chunk.get("id")
            if result.provider and self.on_provider is not None:
                self.on_provider(result.provider)
        usage = chunk.get("usage")
        if usage:
            result.usage = usage
        if chunk.get("error") is not None:
            self.error_chunk = chunk
        choices = chunk.get("choices")
        if not choices:
            return False
        choice = choices[0]
        delta = choice.get("delta")
        if delta:
            text = delta.get("content")
            if text:
                self.content.append(text)
                if result.ttft_s is None:
                    result.ttft_s = time.monotonic() - self.started
            thought = delta.get("reasoning")
            if not thought and delta.get("reasoning_details"):
                thought = _reasoning_from_details(delta["reasoning_details"])
            if thought:
                self.reasoning.append(thought)
                if result.ttft_s is None:
                    result.ttft_s = time.monotonic() - self.started
        finish = choice.get("finish_reason")
        if finish:
            result.finish_reason = finish
            result.native_finish_reason = choice.get("native_finish_reason")
        if choice.get("error") is not None and self.error_chunk is None:
            self.error_chunk = {"error": choice["error"]}
        return False

    def finish(self) -> None:
        result = self.result
        result.content = "".join(self.content)
        result.reasoning = "".join(self.reasoning)
        if result.error is not None:
            return
        if self.error_chunk is not None:
            result.error = classify_error_in_ok_response(self.error_chunk, streamed=True)
        elif not self.done and result.usage is None:
            result.error = AttemptError(
                ErrorClass.NETWORK, Disposition.RETRY, "stream closed before [DONE]", 200
            )


class OpenRouterClient:
    """Sends chat completions and reads the account endpoints; safe to share across tasks."""

    def __init__(
        self, settings: OpenRouterSettings, *, pool_size: int, routing: ProviderSettings | None = None
    ) -> None:
        self.settings = settings
        self.routing = routing if routing is not None else settings.provider
        self.pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None
        self._chat_url = settings.base_url.rstrip("/") + "/chat/completions"
        key = settings.api_key.get_secret_value() if settings.api_key is not None else ""
        self._headers = {
            "Authorization": f"Bearer {key}",
            "Content-Type": "application/json",
            "X-Title": settings.app_title,
            "HTTP-Referer": "https://github.com/regen",
        }
        self._static_body = self._build_static_body()
        self._body_for: tuple[tuple[str, ...] | None, dict[str, Any]] = (None, {})
        self._deadlines = Deadlines(settings.read_timeout_s, settings.request_timeout_s)
        self._connect_timeout = aiohttp.ClientTimeout(sock_connect=settings.connect_timeout_s)
        self._account_timeout = aiohttp.ClientTimeout(
            total=settings.request_timeout_s, sock_connect=settings.connect_timeout_s
        )

    def _build_static_body(self) -> dict[str, Any]:
        s = self.settings
        body: dict[str, Any] = {"model": s.model, "max_tokens": s.max_tokens, "stream": s.stream}
        if s.temperature is not None:
            body["temperature"] = s.temperature
        if s.top_p is not None:
            body["top_p"] = s.top_p
        if s.stream:
            body["stream_options"] = {"include_usage": True}
        body["usage"] = {"include": True}
        if s.reasoning is not None:
            body["reasoning"] = s.reasoning
        return body

    def provider_object(self, ignore: Sequence[str]) -> dict[str, Any]:
        """The `provider` routing object: settings plus the slugs excluded at run time."""
        p = self.routing
        obj: dict[str, Any] = {"allow_fallbacks": p.allow_fallbacks}
        if ignore:
            obj["ignore"] = list(ignore)
        if p.only is not None:
            obj["only"] = p.only
        if p.order is not None:
            obj["order"] = p.order
        elif p.sort is not None:
            obj["sort"] = p.sort
        if p.quantizations is not None:
            obj["quantizations"] = list(p.quantizations)
        if p.require_parameters:
            obj["require_parameters"] = True
        if p.data_collection is not None:
            obj["data_collection"] = p.data_collection
        if p.max_price is not None:
            obj["max_price"] = p.max_price
        return obj

    def request_body(self, messages: list[dict[str, Any]], ignore: Sequence[str]) -> bytes:
        # The ignore list changes only when an operator or the guard excludes a provider, so the
        # body without its messages is rebuilt only then.
        key = tuple(ignore)
        if key != self._body_for[0]:
            body = dict(self._static_body)
            body["provider"] = self.provider_object(key)
            self._body_for = (key, body)
        body = dict(self._body_for[1])
        body["messages"] = messages
        return orjson.dumps(body)

    async def __aenter__(self) -> OpenRouterClient:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self.pool_size, limit_per_host=0, ttl_dns_cache=300, keepalive_timeout=60
        )
        # Only the connect limit is aiohttp's: its total and sock_read limits arm a loop timer per
        # request (or per read). Chat completions get theirs from one sweeper (see deadlines.py).
        self._session = aiohttp.ClientSession(
            connector=connector,
            # Session-wide, so a request does not merge its own copy into the defaults.
            headers=self._headers,
            timeout=self._connect_timeout,
            json_serialize=lambda obj: orjson.dumps(obj).decode(),
            auto_decompress=True,
            read_bufsize=2**16,
        )

    async def close(self) -> None:
        await self._deadlines.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("client is not open")
        return self._session

    async def get_json(self, path: str, params: Mapping[str, str] | None = None) -> tuple[int, Any]:
        """GET an account or catalog endpoint; returns (status, parsed body or None)."""
        url = self.settings.base_url.rstrip("/") + path
        async with self.session.get(url, params=params, timeout=self._account_timeout) as resp:
            raw = await resp.read()
            try:
                return resp.status, orjson.loads(raw)
            except orjson.JSONDecodeError:
                return resp.status, None

    async def complete(
        self,
        messages: list[dict[str, Any]],
        ignore: Sequence[str],
        on_headers: Callable[[str | None], None] | None = None,
        on_provider: Callable[[str], None] | None = None,
    ) -> AttemptResult:
        """Run one attempt; never raises for server or network trouble (it is in `.error`)."""
        result = AttemptResult()
        started = time.monotonic()
        # The idle limit covers the wait for headers and the gaps in a stream; a non-stream body is
        # legitimately silent until the whole completion is done (the total limit only).
        deadlines = self._deadlines
        watch = deadlines.watch()
        try:
            async with self.session.post(self._chat_url, data=self.request_body(messages, ignore)) as resp:
                result.http_status = resp.status
                result.generation_id = resp.headers.get("X-Generation-Id")
                if on_headers is not None:
                    on_headers(result.generation_id)
                if resp.status != 200:
                    raw = await resp.read()
                    try:
                        body = orjson.loads(raw)
                    except orjson.JSONDecodeError:
                        body = None
                    result.error = classify_status(resp.status, body, resp.headers)
                    # The upstream that refused, where the body names it: its stats count the error.
                    result.provider = result.error.provider
                elif self.settings.stream and resp.content_type == "text/event-stream":
                    await self._read_stream(resp, result, started, on_provider, watch)
                else:
                    watch.idle_exempt = True
                    await self._read_body(resp, result, started)
        except asyncio.CancelledError:
            if not deadlines.absorb(watch):
                raise
            result.error = AttemptError(ErrorClass.NETWORK, Disposition.RETRY, deadlines.reason(watch))
        except TimeoutError as exc:  # aiohttp's connect limit
            result.error = AttemptError(
                ErrorClass.NETWORK, Disposition.RETRY, (str(exc) or "connect timed out")[:300]
            )
        except (aiohttp.ClientError, OSError) as exc:
            what = type(exc).__name__ if not str(exc) else f"{type(exc).__name__}: {exc}"
            result.error = AttemptError(ErrorClass.NETWORK, Disposition.RETRY, what[:300])
        finally:
            deadlines.unwatch(watch)
        result.e2e_s = time.monotonic() - started
        if result.error is None:
            self._check_accepted(result)
        result.cost = _usage_cost(result.usage)
        if result.usage is not None:
            result.is_byok = bool(result.usage.get("is_byok", False))
        return result

    async def _read_body(self, resp: aiohttp.ClientResponse, result: AttemptResult, started: float) -> None:
        raw = await resp.read()
        result.received_bytes = len(raw)
        result.ttft_s = time.monotonic() - started
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            result.error = AttemptError(
                ErrorClass.NETWORK, Disposition.RETRY, "response body cut or not JSON", 200
            )
            return
        if not isinstance(body, dict):
            result.error = AttemptError(
                ErrorClass.ERROR_BODY, Disposition.RETRY, "response is not an object", 200
            )
            return
        result.generation_id = result.generation_id or body.get("id")
        result.provider = body.get("provider")
        result.served_model = body.get("model")
        usage = body.get("usage")
        result.usage = usage if isinstance(usage, dict) else None
        if body.get("error") is not None:
            result.error = classify_error_in_ok_response(body, streamed=False)
            return
        choices = body.get("choices")
        if not isinstance(choices, list) or not choices:
            result.error = AttemptError(
                ErrorClass.ERROR_BODY, Disposition.RETRY, "response has no choices", 200
            )
            return
        choice = choices[0]
        message = choice.get("message") or {}
        result.content = message.get("content") or ""
        reasoning = message.get("reasoning")
        result.reasoning = (
            reasoning
            if isinstance(reasoning, str)
            else _reasoning_from_details(message.get("reasoning_details"))
        )
        result.finish_reason = choice.get("finish_reason")
        result.native_finish_reason = choice.get("native_finish_reason")
        if choice.get("error") is not None:
            result.error = classify_error_in_ok_response({"error": choice["error"]}, streamed=False)

    async def _read_stream(
        self,
        resp: aiohttp.ClientResponse,
        result: AttemptResult,
        started: float,
        on_provider: Callable[[str], None] | None,
        watch: Watch,
    ) -> None:
        parse = _StreamParse(result, started, on_provider)
        pending = b""
        stopped = False
        # Whole network reads split by hand: aiohttp's readline costs more per line than the parse.
        async for block in resp.content.iter_any():
            watch.received += len(block)
            lines = (pending + block).split(b"\n") if pending else block.split(b"\n")
            pending = lines.pop()
            for line in lines:
                if not line:  # the blank line that ends each event
                    continue
                if parse.line(line):
                    stopped = True
                    break
            if stopped:
                break
        if not stopped and pending:
            parse.line(pending)
        result.received_bytes = watch.received
        parse.finish()

    def _check_accepted(self, result: AttemptResult) -> None:
        """Apply docs/openrouter.md §5: which 200 responses count as a finished prompt."""
        native = result.native_finish_reason
        if isinstance(native, str) and native in FAILED_NATIVE_FINISH:
            result.error = AttemptError(
                ErrorClass.EMPTY, Disposition.RETRY, f"provider failed (native_finish_reason {native})", 200
            )
        elif result.finish_reason is None:
            result.error = AttemptError(ErrorClass.EMPTY, Disposition.RETRY, "no finish reason", 200)
        elif not result.content and not result.reasoning:
            result.error = AttemptError(
                ErrorClass.EMPTY,
                Disposition.RETRY,
                f"empty response (finish_reason {result.finish_reason})",
                200,
            )
