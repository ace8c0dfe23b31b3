"""Answers past the edge (config.EDGE_FAULTS): the pieces the server uses to send them.

Each one is survivable only by the client's own limits: a body that trickles in at a byte a second
keeps every idle limit happy, one that never ends must be cut by size, and a megabyte of headers
must be refused by the HTTP parser (docs/faults.md, "Responses past the edge").
"""

from __future__ import annotations

import asyncio

from aiohttp import web


def padding_headers(total: int, count: int) -> dict[str, str]:
    """`count` headers holding `total` bytes of value between them."""
    size = max(1, total // count)
    return {f"X-Sim-Padding-{i}": "p" * size for i in range(count)}


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def trickle(request: web.Request, resp: web.StreamResponse, data: bytes, bytes_per_s: float) -> int:
    """Write `data` at `bytes_per_s` (a few writes a second at most); returns the bytes that went
    out before the client left."""
    step = max(1, int(bytes_per_s / 20))
    delay = step / bytes_per_s
    sent = 0
    try:
        while sent < len(data):
            await resp.write(data[sent : sent + step])
            sent = min(len(data), sent + step)
            if sent < len(data):
                await asyncio.sleep(delay)
                if _gone(request):
                    break
    except ConnectionError:
        pass
    return sent


async def endless(request: web.Request, resp: web.StreamResponse, piece: bytes, interval_s: float) -> int:
    """Write `piece` every `interval_s` until the client leaves; returns how many were written."""
    written = 0
    try:
        while not _gone(request):
            await resp.write(piece)
            written += 1
            await asyncio.sleep(interval_s)
    except ConnectionError:
        pass
    return written
