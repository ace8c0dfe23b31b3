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

from regen.engine.backends.base import Disposition
from regen.engine.backends.openrouter.errors import (
    EDGE_STATUSES,
    AttemptError,
    ErrorClass,
    classify_error_in_ok_response,
    classify_status,
)
from regen.engine.config.settings import OpenRouterSettings, ProviderSettings
from regen.engine.net.deadlines import Deadlines, Watch

FAILED_NATIVE_FINISH = frozenset({"error", "network_error"})

# What one attempt may receive (docs/faults.md, "Responses past the edge"). A streamed token costs
# about 300-600 bytes on the wire (the chunk's id, provider and model repeat in every event, and
# reasoning comes twice); 2 KiB a token plus 1 MiB for usage, keep-alive comments and the odd
# verbose chunk is far above any honest response, and stops a provider that ignores max_tokens or
# a body that never ends before it costs more than the reservation allowed for.
RESPONSE_BASE_BYTES = 1 << 20
RESPONSE_BYTES_PER_TOKEN = 2048
# An error answer is a small JSON object; past this its body is not read.
ERROR_BODY_BYTES = 64 << 10
# Account and catalog answers (the model's endpoints list is the largest, some kilobytes).
ACCOUNT_BODY_BYTES = 16 << 20
# Response headers: aiohttp's default line and field sizes, and 100 headers (aiohttp allows 128),
# named here because they bound the memory one response's headers may take (at most MAX_HEADERS
# fields of MAX_FIELD_SIZE bytes); OpenRouter sends a few dozen short ones.
MAX_LINE_SIZE = 8190
MAX_FIELD_SIZE = 8190
MAX_HEADERS = 100


def max_response_bytes(max_tokens: int) -> int:
    """The most one attempt may receive for `max_tokens`, headers aside."""
    return RESPONSE_BASE_BYTES + RESPONSE_BYTES_PER_TOKEN * max_tokens


class _TooLarge(Exception):
    """A body passed its byte limit; the reader stops there."""


async def _read_capped(resp: aiohttp.ClientResponse, limit: int, watch: Watch | None = None) -> bytes:
    """The body, or _TooLarge as soon as more than `limit` bytes arrived (never holds more)."""
    body = bytearray()
    async for block in resp.content.iter_any():
        if watch is not None:
            watch.received += len(block)
        if len(body) + len(block) > limit:
            raise _TooLarge(len(body) + len(block))
        body += block
    return bytes(body)


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
        self,
        settings: OpenRouterSettings,
        *,
        pool_size: int,
        routing: ProviderSettings | None = None,
        seed: int | None = None,
    ) -> None:
        self.settings = settings
        self.seed = seed  # sent as `seed` (the canary audit's, docs/fidelity.md); None: not sent
        self.routing = routing if routing is not None else settings.provider
        self.pool_size = pool_size
        # Told of every answer from OpenRouter (response headers with a status its edge did not
        # fail with): True for a chat completion's. The job's sign of life (JobContext.answered).
        self.on_answer: Callable[[bool], None] | None = None
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
        self.max_response_bytes = max_response_bytes(settings.max_tokens)
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
        if self.seed is not None:
            body["seed"] = self.seed
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
            max_line_size=MAX_LINE_SIZE,
            max_field_size=MAX_FIELD_SIZE,
            max_headers=MAX_HEADERS,
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
            self._answered(resp.status, generation=False)
            try:
                raw = await _read_capped(resp, ACCOUNT_BODY_BYTES)
            except _TooLarge:
                return resp.status, None
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
                self._answered(resp.status, generation=True)
                result.generation_id = resp.headers.get("X-Generation-Id")
                if on_headers is not None:
                    on_headers(result.generation_id)
                if resp.status != 200:
                    try:
                        body = orjson.loads(await _read_capped(resp, ERROR_BODY_BYTES, watch))
                    except (orjson.JSONDecodeError, _TooLarge):
                        body = None
                    result.error = classify_status(resp.status, body, resp.headers)
                    # The upstream that refused, where the body names it: its stats count the error.
                    result.provider = result.error.provider
                elif self.settings.stream and resp.content_type == "text/event-stream":
                    await self._read_stream(resp, result, started, on_provider, watch)
                else:
                    watch.idle_exempt = True
                    await self._read_body(resp, result, started, watch)
        except _TooLarge as exc:
            # Leaving the response unread closes its connection: the provider stops generating.
            result.received_bytes = int(exc.args[0])
            result.error = AttemptError(
                ErrorClass.SERVER,
                Disposition.RETRY,
                f"response larger than {self.max_response_bytes} bytes, the limit for max_tokens "
                f"{self.settings.max_tokens}: cut off",
                result.http_status,
            )
        except asyncio.CancelledError:
            if not deadlines.absorb(watch):
                raise
            result.error = AttemptError(ErrorClass.NETWORK, Disposition.RETRY, deadlines.reason(watch))
            result.error.unreachable = result.http_status is None  # not even headers in time
        except TimeoutError as exc:  # aiohttp's connect limit: the request never left
            result.error = AttemptError(
                ErrorClass.NETWORK, Disposition.RETRY, (str(exc) or "connect timed out")[:300]
            )
            result.error.unreachable, result.error.sent = True, False
        except aiohttp.ClientResponseError as exc:
            # Raised while reading the status line and headers: the answer could not be parsed.
            result.error = AttemptError(ErrorClass.NETWORK, Disposition.RETRY, _header_problem(exc))
        except (aiohttp.ClientError, OSError) as exc:
            result.error = AttemptError(ErrorClass.NETWORK, Disposition.RETRY, _transport_problem(exc)[:300])
            # No answer at all: OpenRouter is not reachable (docs/faults.md, outages). A connector
            # error (refused, DNS, TLS) means the request never left, so it cost nothing.
            result.error.unreachable = result.http_status is None
            result.error.sent = not isinstance(exc, aiohttp.ClientConnectorError)
        finally:
            deadlines.unwatch(watch)
        result.e2e_s = time.monotonic() - started
        if result.error is None:
            self._check_accepted(result)
        result.cost = _usage_cost(result.usage)
        if result.usage is not None:
            result.is_byok = bool(result.usage.get("is_byok", False))
        return result

    def _answered(self, status: int, *, generation: bool) -> None:
        if self.on_answer is not None and status not in EDGE_STATUSES:
            self.on_answer(generation)

    async def _read_body(
        self, resp: aiohttp.ClientResponse, result: AttemptResult, started: float, watch: Watch
    ) -> None:
        length = resp.content_length
        if (
            length is not None
            and length <= self.max_response_bytes
            and "Content-Encoding" not in resp.headers
        ):
            # Its length is known and allowed, and it is not compressed (a compressed body's length
            # says nothing of what it inflates to): aiohttp reads exactly that much, in one call;
            # the capped reader's per-block loop costs more than the parse at thousands a second.
            raw = await resp.read()
            watch.received += len(raw)
        else:
            raw = await _read_capped(resp, self.max_response_bytes, watch)
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
        pending: bytearray | None = None  # the start of a line whose end has not arrived
        stopped = False
        limit = self.max_response_bytes
        # Whole network reads split by hand: aiohttp's readline costs more per line than the parse.
        async for block in resp.content.iter_any():
            watch.received += len(block)
            if watch.received > limit:
                parse.finish()
                raise _TooLarge(watch.received)
            if pending is not None:
                # A line spread over many reads (a trickle, or one huge chunk) grows in one
                # buffer instead of being copied again with every read.
                pending += block
                if b"\n" not in block:
                    continue
                lines = bytes(pending).split(b"\n")
            else:
                lines = block.split(b"\n")
            tail = lines.pop()
            pending = bytearray(tail) if tail else None
            for line in lines:
                if not line:  # the blank line that ends each event
                    continue
                if parse.line(line):
                    stopped = True
                    break
            if stopped:
                break
        if not stopped and pending:
            parse.line(bytes(pending))
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


def _header_problem(exc: aiohttp.ClientResponseError) -> str:
    """One line for an answer aiohttp could not parse (headers too large, too many, malformed)."""
    said = str(exc.message or "")
    if said.startswith("Got more than"):
        return f"response headers rejected: a header line over {MAX_FIELD_SIZE} bytes"
    if "Too many headers" in said:
        return f"response headers rejected: more than {MAX_HEADERS} headers"
    return f"malformed response: {said[:120] or type(exc).__name__}"


def _transport_problem(exc: BaseException) -> str:
    """One line for a connection that failed; aiohttp's own words where they are already clear."""
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the server closed the connection before the answer was complete"
    if isinstance(exc, aiohttp.ClientPayloadError):
        how = "reset" if "reset by peer" in str(exc) else "closed"
        return f"answer cut short: the connection was {how} in the middle of the body"
    return type(exc).__name__ if not str(exc) else f"{type(exc).__name__}: {exc}"
