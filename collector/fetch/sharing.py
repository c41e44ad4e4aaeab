"""The engine's clients shared fairly between hosts: a slow host cannot hold all of them.

The engine has ``concurrency`` clients (connections) for every host of a batch; each host's own
window (collector.fetch.adaptive) says how many of them it may use. Lent first come, first
served, a host whose pages take 200 ms ends up holding nearly all of them: its requests keep
the clients for 100 times longer than a fast host's, and every client that comes back is
taken again by whichever request queued first. Measured with the mix profile of
bench/politeness.py: a fast host fetched at 0.25x its rate alone beside a slow one.

So a client that comes back goes to the waiting host that holds the *fewest* clients (max-min
fairness, as a fair queue or Scrapy's per-slot downloader gives each domain its own share),
first come first served within a host. A host alone may still use every client; two busy
hosts end up with half each, whatever their latency. Nothing here knows about HTTP: it lends
any object.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from typing import Generic, TypeVar

__all__ = ["FairShares"]

T = TypeVar("T")


class FairShares(Generic[T]):
    """A pool of ``items`` lent per key (a host): a returned item goes to the waiting key that
    holds the fewest, the oldest waiter of that key first."""

    def __init__(self, items: Iterable[T]) -> None:
        self._idle: deque[T] = deque(items)
        self._held: dict[str, int] = {}  # key -> items lent to it now
        self._waiting: dict[str, deque[tuple[int, asyncio.Future[T]]]] = {}  # (arrival, waiter)
        self._arrivals = 0

    def held(self, key: str) -> int:
        return self._held.get(key, 0)

    @property
    def idle(self) -> int:
        return len(self._idle)

    async def get(self, key: str) -> T:
        """An item for ``key``: at once when one is idle and nobody waits, else in turn."""
        if self._idle and not self._waiting:
            self._held[key] = self.held(key) + 1
            return self._idle.popleft()
        waiter: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._arrivals += 1
        self._waiting.setdefault(key, deque()).append((self._arrivals, waiter))
        try:
            return await waiter  # _give counted it as held before waking us
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.put(key, waiter.result())  # given and cancelled at once: pass it on
            else:
                self._drop(key, waiter)
            raise

    def put(self, key: str, item: T) -> None:
        """``key`` gives ``item`` back: to the waiting key holding the fewest, or idle."""
        held = self.held(key) - 1
        if held > 0:
            self._held[key] = held
        else:
            self._held.pop(key, None)
        self._idle.append(item)
        self._give()

    def _give(self) -> None:
        while self._idle and self._waiting:
            # the fewest held; among equals, the one whose oldest request came first
            key = min(self._waiting, key=lambda k: (self.held(k), self._waiting[k][0][0]))
            queue = self._waiting[key]
            _, waiter = queue.popleft()
            if not queue:
                del self._waiting[key]
            if waiter.done():  # cancelled while queued, not yet dropped
                continue
            self._held[key] = self.held(key) + 1
            waiter.set_result(self._idle.popleft())

    def _drop(self, key: str, waiter: asyncio.Future[T]) -> None:
        queue = self._waiting.get(key)
        if queue is None:
            return
        for entry in queue:
            if entry[1] is waiter:
                queue.remove(entry)
                break
        else:
            return
        if not queue:
            del self._waiting[key]
