"""What a server says about itself: version, model, GPUs (docs/sglang.md §3, §11.2).

0.5.x serves `/server_info` and `/model_info`; older releases only `/get_server_info` and
`/get_model_info`, which 0.5.23 still answers. A router in front of several servers may answer
neither, but lists its model at `/v1/models`. The context a server enforces is `/v1/models`'
`max_model_len`: `/server_info`'s `context_length` is the command line's, None unless passed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from regen.engine.errors import RegenError
from regen.engine.net.sglang_server import streaming_problem


class ServerError(RegenError, RuntimeError):
    """A server that cannot be used; the message names its URL and what it said."""


@dataclass(slots=True)
class ServerFacts:
    version: str | None = None
    served_model_name: str | None = None
    model_path: str | None = None
    weight_version: str | None = None
    gpus: int | None = None  # None: the server did not say (a router)
    max_running_requests: int | None = None
    # The requests it runs at once: the scheduler's effective limit where it says (§3), else the
    # command line's; None when neither is known (a router, an old release without the flag).
    running_slots: int | None = None
    context_length: int | None = None


async def get_json(
    session: aiohttp.ClientSession, url: str, timeout: aiohttp.ClientTimeout
) -> tuple[int, Any]:
    async with session.get(url, timeout=timeout) as resp:
        raw = await resp.read()
        try:
            return resp.status, orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            return resp.status, None


async def _first(
    session: aiohttp.ClientSession, base: str, paths: tuple[str, ...], timeout: aiohttp.ClientTimeout
) -> dict[str, Any] | None:
    for path in paths:
        status, body = await get_json(session, base + path, timeout)
        if status == 200 and isinstance(body, dict):
            return body
        if status in (401, 403):
            raise ServerError(
                f"{base}{path} answered {status}: the server wants an API key, which regen does not send"
            )
    return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def running_slots(info: dict[str, Any]) -> int | None:
    """The requests a server runs at once: `internal_states`' effective limit per data-parallel rank
    (one entry per rank, each counted; one entry for several ranks counts for each), else the
    command line's `max_running_requests`."""
    states = info.get("internal_states")
    per_rank = (
        [_int(s.get("effective_max_running_requests_per_dp")) for s in states if isinstance(s, dict)]
        if isinstance(states, list)
        else []
    )
    known = [n for n in per_rank if n is not None]
    if known:
        ranks = _int(info.get("dp_size")) or 1
        return sum(known) * max(1, ranks // len(known))
    return _int(info.get("max_running_requests"))


def gpus_of(info: dict[str, Any]) -> int | None:
    """GPUs one server occupies: tp x pp, times dp unless data-parallel attention shares them."""
    tp = _int(info.get("tp_size"))
    if tp is None:
        return None
    pp = _int(info.get("pp_size")) or 1
    dp = _int(info.get("dp_size")) or 1
    return tp * pp * (1 if info.get("enable_dp_attention") else dp)


async def read_facts(
    session: aiohttp.ClientSession, base: str, timeout: aiohttp.ClientTimeout
) -> ServerFacts:
    """Ask `base` who it is; raises ServerError when it is not a ready SGLang server (or router)."""
    try:
        status, _ = await get_json(session, base + "/health", timeout)
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise ServerError(f"cannot reach {base}: {type(exc).__name__}: {exc}") from None
    if status != 200:
        raise ServerError(f"{base} is not ready: GET /health answered {status}")
    try:
        server = await _first(session, base, ("/server_info", "/get_server_info"), timeout) or {}
        model = await _first(session, base, ("/model_info", "/get_model_info"), timeout) or {}
        listed = await _first(session, base, ("/v1/models",), timeout) or {}
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise ServerError(f"{base} stopped answering: {type(exc).__name__}: {exc}") from None
    problem = streaming_problem(server)
    if problem is not None:
        raise ServerError(f"{base} cannot be used: {problem}")
    cards = listed.get("data")
    card = cards[0] if isinstance(cards, list) and cards and isinstance(cards[0], dict) else {}
    served = model.get("served_model_name") or server.get("served_model_name") or card.get("id")
    version = server.get("version")
    return ServerFacts(
        version=str(version) if version else None,
        served_model_name=str(served) if served else None,
        model_path=str(model.get("model_path") or server.get("model_path") or "") or None,
        weight_version=str(model.get("weight_version") or server.get("weight_version") or "") or None,
        gpus=gpus_of(server),
        max_running_requests=_int(server.get("max_running_requests")),
        running_slots=running_slots(server),
        context_length=_int(card.get("max_model_len")) or _int(server.get("context_length")),
    )
