"""Per-host request rate limits.

A :class:`RateLimiter` is anything with ``async acquire(key)`` that returns once one more request
to ``key`` fits the rate. :func:`rate_limiter` picks one by storage URI: ``memory://`` (one
process) gets :class:`LocalMovingWindow`; ``redis://...`` (the rate shared by every worker) gets
:class:`LimitsRateLimiter`, the well-kept ``limits`` library's moving window on Redis. Both
enforce the same thing: at most N requests to a key in any window of the rate's length.

Why not ``limits``' memory storage in one process: it keeps a key's requests in a list it
prepends to (O(requests in the window) per request), behind an asyncio lock, and expires them
through a thread; py-spy put it at ~9 % of the fetch engine's CPU at ~2,500 requests/s under a
high limit. A deque of send times per key does the same check in O(1).
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Protocol

__all__ = ["LimitsRateLimiter", "LocalMovingWindow", "RateLimiter", "rate_limiter"]


class RateLimiter(Protocol):
    async def acquire(self, key: str) -> None:
        """Wait until one more request to ``key`` is allowed, and count it."""
        ...


def rate_limiter(rate: str, *, storage_uri: str = "memory://") -> RateLimiter:
    """The limiter for ``rate`` (``"10/second"``) on ``storage_uri``: in-process or shared."""
    if storage_uri.removeprefix("async+").startswith("memory://"):
        return LocalMovingWindow(rate)
    return LimitsRateLimiter(rate, storage_uri=storage_uri)


class LocalMovingWindow:
    """A moving-window limit per key, in this process: the send times inside the window.

    A request is allowed when fewer than N were sent in the last ``window_s``; otherwise it
    waits until the oldest of them leaves the window. The
    rate is parsed by ``limits``, so it accepts exactly what :class:`LimitsRateLimiter` does.
    """

    def __init__(self, rate: str) -> None:
        from limits import parse

        item = parse(rate)
        self.rate = rate
        self.amount = item.amount
        self.window_s = float(item.get_expiry())
        self._sent: dict[str, collections.deque[float]] = {}

    async def acquire(self, key: str) -> None:
        sent = self._sent.get(key)
        if sent is None:
            sent = self._sent[key] = collections.deque()
        while True:
            now = time.monotonic()
            while sent and sent[0] <= now - self.window_s:
                sent.popleft()  # out of the window: memory stays at the requests inside it
            if len(sent) < self.amount:
                sent.append(now)
                return
            await asyncio.sleep(max(0.001, sent[0] + self.window_s - now))


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
