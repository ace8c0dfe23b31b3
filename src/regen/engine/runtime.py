"""The event loop regen runs on: uvloop where available (the hot path is measured on it)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    # Thousands of in-flight requests keep a large young generation alive, and every young
    # collection walks all of it: with the default thresholds that was about a third of the job's
    # CPU, with 50,000 still 2-3%. The hot path makes next to no cyclic garbage (counted with
    # gc.DEBUG_SAVEALL over a real run), so collections can be rare without holding memory.
    gc.set_threshold(200_000, 20, 100)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)
