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
import contextlib
import time
from typing import Any, Protocol

__all__ = ["LimitsRateLimiter", "LocalMovingWindow", "RateLimiter", "rate_limiter"]


class RateLimiter(Protocol):
    async def acquire(self, key: str) -> None:
        """Wait until one more request to ``key`` is allowed, and count it."""
        ...

    async def aclose(self) -> None:
        """Let go of connections (the engine calls it when it closes)."""
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
            # within a nanosecond counts as out: a sleep to the exact edge may round just short
            # of it, and would wait another millisecond for nothing
            now = time.monotonic()
            while sent and sent[0] <= now - self.window_s + 1e-9:
                sent.popleft()  # out of the window: memory stays at the requests inside it
            if len(sent) < self.amount:
                sent.append(now)
                return
            await asyncio.sleep(max(0.001, sent[0] + self.window_s - now))

    async def aclose(self) -> None:
        """Nothing to let go of: the window is memory."""


class LimitsRateLimiter:
    """A moving-window limit such as ``"10/second"`` per key, on a ``limits`` storage.

    On Redis, the client has Collector's settings (:mod:`collector.fetch.shared_redis`). While
    a server the limiter has reached is down or restarting, :meth:`acquire` waits for it, with
    the same backoff and up to the same ``COLLECTOR_REDIS_RECONNECT_S`` as the frontier, then
    raises a :class:`~collector.errors.BackendError` (one line), which fails the batch: its
    items go back to the queue unchanged and the run fails as on a frontier outage. Why wait
    rather than go on: a request the shared window has not counted could exceed the host's rate
    (every worker would send at the full rate at once); why not fail the items as recoverable:
    an attempt spent, and in the end a dead letter, for a fault of ours, not of the host. A hit
    whose reply was lost may have been counted and is sent again: the window then holds one
    request too many for its length, which only slows down (the safe side).
    """

    def __init__(
        self, rate: str, *, storage_uri: str = "memory://", reconnect_s: float | None = None
    ) -> None:
        from limits import parse, storage
        from limits.aio.strategies import MovingWindowRateLimiter

        from collector._redis import describe_url
        from collector._redis import reconnect_s as default_reconnect_s
        from collector.fetch.shared_redis import REDIS_DOWN, backoff, client_options

        self.rate = rate
        self._item = parse(rate)
        uri = storage_uri if storage_uri.startswith("async+") else f"async+{storage_uri}"
        options: dict[str, Any] = {}
        if "redis" in uri.split("://", 1)[0]:
            # redis-py is already a dependency; `limits` would otherwise want coredis for Redis.
            options = {"implementation": "redispy", **client_options()}
        # (limits annotates options as scalars; it hands them to redis-py as they are)
        self._limiter = MovingWindowRateLimiter(storage.storage_from_string(uri, **options))
        self.where = describe_url(storage_uri.removeprefix("async+"))
        self.reconnect_s = default_reconnect_s() if reconnect_s is None else reconnect_s
        self._down_errors = REDIS_DOWN
        self._backoff = backoff()
        self._reached = False  # a server never reached is a wrong URL: said at once

    async def acquire(self, key: str) -> None:
        deadline: float | None = None
        tries = 0
        while True:
            try:
                if await self._limiter.hit(self._item, "collector", key):
                    self._reached = True
                    return
                stats = await self._limiter.get_window_stats(self._item, "collector", key)
            except self._down_errors as exc:
                now = time.monotonic()
                if deadline is None:
                    deadline = now + (self.reconnect_s if self._reached else 0.0)
                if now >= deadline:
                    raise self._gave_up(exc) from exc
                tries += 1
                await asyncio.sleep(min(self._backoff.compute(tries), deadline - now))
                continue
            self._reached = True
            deadline, tries = None, 0
            await asyncio.sleep(max(0.001, stats.reset_time - time.time()))

    async def aclose(self) -> None:
        """Close the Redis client ``limits`` made for the storage (its pool's sockets).

        ``limits`` has no close of its own; its redis-py bridge keeps the client as
        ``storage.bridge.storage``. Looked up defensively: another storage (or another version
        of ``limits``) without it is left to the garbage collector, as before.
        """
        storage = getattr(self._limiter, "storage", None)
        client = getattr(getattr(storage, "bridge", None), "storage", None)
        close = getattr(client, "aclose", None)
        if close is not None:
            with contextlib.suppress(Exception):  # a client that never connected, a gone server
                await close()

    def _gave_up(self, exc: BaseException) -> Exception:
        from collector._redis import backend_error

        waited = f"for {self.reconnect_s:g} s" if self._reached else "(never reached)"
        return backend_error(f"rate limiter {self.where}: Redis unreachable {waited}", exc)
