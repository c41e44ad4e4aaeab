"""Per-host request rate limits.

A :class:`RateLimiter` is anything with ``async acquire(key)`` that returns once one more request
to ``key`` fits the rate. The default wraps the well-kept ``limits`` library's moving window;
its storage is chosen by URI (``memory://`` in one process; ``redis://...`` shares the rate across
every worker), so the fetch engine does not know where the counts live.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

__all__ = ["LimitsRateLimiter", "RateLimiter"]


class RateLimiter(Protocol):
    async def acquire(self, key: str) -> None:
        """Wait until one more request to ``key`` is allowed, and count it."""
        ...


class LimitsRateLimiter:
    """A moving-window limit such as ``"10/second"`` per key, on a ``limits`` storage."""

    def __init__(self, rate: str, *, storage_uri: str = "memory://") -> None:
        from limits import parse, storage
        from limits.aio.strategies import MovingWindowRateLimiter

        self.rate = rate
        self._item = parse(rate)
        uri = storage_uri if storage_uri.startswith("async+") else f"async+{storage_uri}"
        # redis-py is already a dependency; `limits` would otherwise want coredis for Redis.
        options = {"implementation": "redispy"} if "redis" in uri.split("://", 1)[0] else {}
        self._limiter = MovingWindowRateLimiter(storage.storage_from_string(uri, **options))

    async def acquire(self, key: str) -> None:
        while not await self._limiter.hit(self._item, "collector", key):
            stats = await self._limiter.get_window_stats(self._item, "collector", key)
            await asyncio.sleep(max(0.001, stats.reset_time - time.time()))
