"""Store calls off the event loop: each backend behind a thread of its own.

The run's event loop carries every request in flight, and request deadlines are wall-clock: a
store call made on the loop (a sink write to a slow Postgres, an ack to a Redis across the
world) stops every fetch for as long as it takes, and a page that would have answered in time
is counted as a timeout. So the run loop never calls a store directly: it awaits the
:class:`AsyncStores` facades, whose methods have the stores' names and arguments and run the
real call on the store's own :class:`Lane`, a single-thread executor.

Why a thread per store, and not ``redis.asyncio`` or psycopg's async connection: the frontier's
and the dead-letter store's Lua scripts, replay rules and reconnect waits
(:mod:`collector._redis`), the SQLite transactions (:mod:`collector.sqlite_tx`) and the
Postgres fencing are shared with the CLI, the sweep and the recovery tools, which are
synchronous; two implementations of each would drift. Every store is already safe to call from
another thread (the heartbeat beats from one, :mod:`collector.run.heartbeat`).

What a lane keeps:

* **Order.** One thread per store runs its calls one at a time, in the order they were awaited,
  as the loop made them before: a write is done before the ack that follows it is sent, a claim
  never overtakes the release before it. A SQLite connection is used by its lane's thread (and
  the heartbeat's), never by the loop.
* **Independence.** A slow store delays its own calls only: the sink's lane writes while the
  frontier's waits for Redis, and the fetches go on meanwhile.
* **Every call that was made.** A call, once awaited, runs to its end even if its awaiter is
  cancelled (the awaiter sees the cancellation; the store sees the whole call, never half an
  ack), and :meth:`AsyncStores.close` waits for every call made before the stores are closed.
  A SIGKILL loses only what it always lost: leases return their items.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
from collections.abc import Callable, Sequence
from typing import ParamSpec, TypeVar

from collector.deadletter.base import DeadLetter, DeadLetterStore
from collector.frontier.base import (
    AckResult,
    Frontier,
    Holder,
    Lease,
    Outcome,
    StateCounts,
)
from collector.sinks.base import Sink, SinkRecord, WriteResult

__all__ = ["AsyncDeadLetters", "AsyncFrontier", "AsyncSink", "AsyncStores", "Lane"]

_P = ParamSpec("_P")
_T = TypeVar("_T")


class Lane:
    """One thread that runs one store's calls in order (a single-thread executor)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"store-{name}"
        )

    async def run(self, call: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``call(*args, **kwargs)`` on the lane's thread; the loop runs on meanwhile.

        Shielded: cancelling the awaiter does not take the call back (see the module). The call
        sees the awaiter's context variables (its trace span, as ``asyncio.to_thread`` does).
        """
        context = contextvars.copy_context()
        done = asyncio.wrap_future(
            self._pool.submit(context.run, functools.partial(call, *args, **kwargs))
        )
        done.add_done_callback(_seen)  # an awaiter cancelled meanwhile: no "never retrieved"
        return await asyncio.shield(done)

    def close(self) -> None:
        """Wait for every call made so far, then stop the thread."""
        self._pool.shutdown(wait=True)


def _seen(done: asyncio.Future[_T]) -> None:
    if not done.cancelled():
        done.exception()


class AsyncFrontier:
    """The frontier's calls the run makes while it fetches, each run on the frontier's lane."""

    def __init__(self, frontier: Frontier, lane: Lane) -> None:
        self._sync = frontier
        self.lane = lane

    async def claim(
        self, source: str, limit: int, *, now: float, lease_s: float, holder: str = ""
    ) -> Lease:
        return await self.lane.run(
            self._sync.claim, source, limit, now=now, lease_s=lease_s, holder=holder
        )

    async def renew(self, lease: Lease, *, now: float, lease_s: float) -> int:
        return await self.lane.run(self._sync.renew, lease, now=now, lease_s=lease_s)

    async def ack(self, lease: Lease, outcomes: Sequence[Outcome], *, now: float) -> AckResult:
        return await self.lane.run(self._sync.ack, lease, outcomes, now=now)

    async def release(self, lease: Lease, *, now: float) -> int:
        return await self.lane.run(self._sync.release, lease, now=now)

    async def holders(self, source: str) -> list[Holder]:
        return await self.lane.run(self._sync.holders, source)

    async def revoke(self, source: str, holder: str, *, now: float) -> int:
        return await self.lane.run(self._sync.revoke, source, holder, now=now)

    async def counts(self, source: str) -> StateCounts:
        return await self.lane.run(self._sync.counts, source)

    async def next_event_at(self, source: str, *, now: float) -> float | None:
        return await self.lane.run(self._sync.next_event_at, source, now=now)


class AsyncSink:
    """The sink's calls the run makes while it fetches, each run on the sink's lane."""

    def __init__(self, sink: Sink, lane: Lane) -> None:
        self._sync = sink
        self.lane = lane

    async def write(
        self, records: Sequence[SinkRecord], *, token: int, batch_id: str
    ) -> WriteResult:
        return await self.lane.run(self._sync.write, records, token=token, batch_id=batch_id)


class AsyncDeadLetters:
    """The dead-letter store's calls the run makes while it fetches, on its own lane."""

    def __init__(self, store: DeadLetterStore, lane: Lane) -> None:
        self._sync = store
        self.lane = lane

    async def put(self, entries: Sequence[DeadLetter]) -> int:
        if not entries:  # nothing to store: no hop to the lane
            return 0
        return await self.lane.run(self._sync.put, entries)


class AsyncStores:
    """A run's three stores as awaitables, one lane each (see the module docstring)."""

    def __init__(self, frontier: Frontier, sink: Sink, deadletters: DeadLetterStore) -> None:
        self.frontier = AsyncFrontier(frontier, Lane("frontier"))
        self.sink = AsyncSink(sink, Lane("sink"))
        self.deadletters = AsyncDeadLetters(deadletters, Lane("deadletters"))

    def close(self) -> None:
        """Wait for every call made to any store (in flight or queued); the stores stay open."""
        for lane in (self.frontier.lane, self.sink.lane, self.deadletters.lane):
            lane.close()
