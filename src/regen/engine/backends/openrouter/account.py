"""The OpenRouter account as the job sees it: credit left (/key, /credits) and billed costs (/generation)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from decimal import Decimal

from regen.engine.backends.openrouter.client import OpenRouterClient
from regen.engine.backends.openrouter.errors import EDGE_STATUSES
from regen.engine.money.ledger import to_dollars
from regen.engine.schema import OpenRouterCredits

# A lookup that found no answer at all tries again within this long (or at the end of the outage,
# when one began meanwhile): short, so bills are looked up within seconds of the network's return.
UNREACHED_RETRY_MAX_S = 2.0


async def generation_cost(
    client: OpenRouterClient,
    generation_id: str,
    timeout_s: float,
    reachable: Callable[[], Awaitable[None]],
) -> Decimal | None:
    """What OpenRouter billed for a generation; None if it is not known within `timeout_s` of
    OpenRouter answering.

    /generation answers 404 for a while after completion (docs/openrouter.md §8), so 404s are
    retried with backoff; an auth failure ends the search at once. A lookup that gets no answer
    (no connection, a gateway status from OpenRouter's edge) is not one that timed out: it waits
    for `reachable` (the end of the lane's outage, docs/money.md) and goes on, and only the time
    OpenRouter was answering counts against `timeout_s`.
    """
    left = timeout_s
    delay = unreached = 0.5
    while True:
        asked = time.monotonic()
        try:
            status, body = await client.get_json("/generation", {"id": generation_id})
        except Exception:
            status, body = 0, None
        if status == 0 or status in EDGE_STATUSES:
            await asyncio.sleep(unreached)
            unreached = min(unreached * 2, UNREACHED_RETRY_MAX_S)
            await reachable()  # at once unless the lane is out
            continue
        unreached = 0.5
        if status == 200 and isinstance(body, dict):
            data = body.get("data") or {}
            total = data.get("total_cost", data.get("usage"))
            if isinstance(total, int | float) and not isinstance(total, bool):
                return to_dollars(total)
        if status in (401, 403):
            return None
        left -= time.monotonic() - asked
        if left <= 0:
            return None
        wait = min(delay, left)
        await asyncio.sleep(wait)
        left -= wait
        delay = min(delay * 2, 10.0)


async def answers(client: OpenRouterClient) -> bool:
    """Whether OpenRouter answers now: an authenticated GET /key, free and immediate (the job's
    outage probe, docs/faults.md); any status but a gateway failure of its edge is an answer."""
    try:
        status, _ = await client.get_json("/key")
    except Exception:
        return False
    return status not in EDGE_STATUSES


async def read_usage(client: OpenRouterClient) -> Decimal | None:
    """The key's lifetime usage in dollars as /key reports it now; None when it cannot be read."""
    try:
        status, body = await client.get_json("/key")
    except Exception:
        return None
    if status != 200 or not isinstance(body, dict):
        return None
    usage = (body.get("data") or {}).get("usage")
    if isinstance(usage, int | float) and not isinstance(usage, bool) and usage >= 0:
        return to_dollars(usage)
    return None


async def settled_usage(
    client: OpenRouterClient, settle_s: float, max_wait_s: float
) -> tuple[Decimal | None, bool, float]:
    """The key's usage once it has not changed for `settle_s`: (usage, settled, seconds waited).

    Bills reach /key late and OpenRouter does not say how late (docs/money.md, "Bounded by the key's
    usage"), so a reading counts only once it has held still for `settle_s`. Past `max_wait_s` the
    last reading comes back with `settled` false; usage None: /key could not be read at all.
    """
    started = time.monotonic()
    poll_s = min(1.0, max(0.05, settle_s / 5))
    last = await read_usage(client)
    since = time.monotonic()
    while True:
        now = time.monotonic()
        if last is not None and now - since >= settle_s:
            return last, True, now - started
        if now - started >= max_wait_s:
            return last, False, now - started
        await asyncio.sleep(min(poll_s, max(0.0, started + max_wait_s - now)))
        reading = await read_usage(client)
        if reading is None:
            continue  # a failed read proves nothing either way
        if reading != last:
            last, since = reading, time.monotonic()


def _amount(value: object) -> float | None:
    """A number /key said, or None for null (no limit) and anything that is not a number."""
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


async def read_credits(client: OpenRouterClient) -> OpenRouterCredits:
    """The key's limit and usage (/key), and the account balance when the key may read /credits."""
    view: OpenRouterCredits = {"checked_at": time.time()}
    status, body = await client.get_json("/key")
    if status == 200 and isinstance(body, dict):
        data = body.get("data") or {}
        view["limit"] = _amount(data.get("limit"))
        view["limit_remaining"] = _amount(data.get("limit_remaining"))
        view["usage"] = _amount(data.get("usage"))
        view["usage_daily"] = _amount(data.get("usage_daily"))
        free, reset = data.get("is_free_tier"), data.get("limit_reset")
        view["is_free_tier"] = free if isinstance(free, bool) else None
        view["limit_reset"] = reset if isinstance(reset, str) else None
    else:
        view["key_error"] = f"HTTP {status}"
    status, body = await client.get_json("/credits")
    if status == 200 and isinstance(body, dict):
        data = body.get("data") or {}
        total, used = data.get("total_credits"), data.get("total_usage")
        if isinstance(total, int | float) and isinstance(used, int | float):
            view["balance"] = float(to_dollars(total) - to_dollars(used))
    else:
        # Current OpenRouter lets only management keys read /credits; the key limit still tells.
        view["balance"] = None
    view["remaining"] = _remaining(view)
    return view


def _remaining(view: OpenRouterCredits) -> float | None:
    """The least of what the key may still spend and what the account holds, when either is known."""
    known = [v for v in (view.get("limit_remaining"), view.get("balance")) if v is not None]
    return min(known) if known else None
