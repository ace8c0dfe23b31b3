"""The HTTP envelope every route shares: JSON bodies, Cloudflare's headers, error objects and the
bearer-key check (docs/openrouter.md §4)."""

from __future__ import annotations

import os
from typing import Any

import orjson
from aiohttp import web

from regen.sim.openrouter.config import SimConfig

_METADATA_HEADERS = ("X-OpenRouter-Metadata", "X-OpenRouter-Experimental-Metadata")


def json_response(status: int, body: dict[str, Any], headers: dict[str, str]) -> web.Response:
    headers["Content-Type"] = "application/json"
    return web.Response(status=status, body=orjson.dumps(body), headers=headers)


def cf_headers(gen_id: str | None = None) -> dict[str, str]:
    """The headers every answer carries (Cloudflare's, and the generation id once there is one)."""
    h = {
        "server": "cloudflare",
        "access-control-allow-origin": "*",
        "access-control-expose-headers": "X-Generation-Id,cf-ray",
        "cf-ray": os.urandom(8).hex() + "-DFW",
    }
    if gen_id is not None:
        h["X-Generation-Id"] = gen_id
    return h


def error_response(status: int, message: str, *, gen_id: str | None = None, **extra: Any) -> web.Response:
    err: dict[str, Any] = {"message": message, "code": status, **extra}
    return json_response(status, {"error": err}, cf_headers(gen_id))


def authorize(config: SimConfig, request: web.Request) -> str | web.Response:
    """The caller's key, or the 401 that refuses it."""
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        return error_response(401, "No auth credentials found")
    if key not in config.api_keys and key != config.management_key:
        return error_response(401, "User not found.")
    return key


def wants_metadata(request: web.Request) -> bool:
    return any(request.headers.get(h, "").lower() == "enabled" for h in _METADATA_HEADERS)
