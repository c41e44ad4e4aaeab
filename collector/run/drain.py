"""The run loop: claim, fetch and settle until the source is done, or the run is told to stop.

This is the heart of a run, in plain Python: the Prefect flow passes its ``fetch-batch`` task as
the fetch step, tests and benchmarks pass :meth:`Run.fetch` directly. How the loop ends:

* **drained**: nothing is queued, leased or due any more;
* **waiting ran out**: what remains is retry-later items not due within ``drain_wait_s``, or
  leases of holders that never beat (they come back when their lease expires): counted
  ``queued`` / ``held_by_others`` by the ledger;
* **max items**: the run claimed its share; the rest stays queued (counted);
* **stopped**: a stop request (first SIGINT/SIGTERM, a cancellation) ends claiming at once, the
  engine cuts requests in flight after a short grace, everything fetched is settled and every
  other item goes back to the queue unchanged.
* **lost footing**: a lease another holder took back or that ran out unrenewed, a heartbeat
  that no longer goes through, or the source lock's lease lost (``process_footing``, said by
  flows/_locks.py) end the loop as a stop does, then :func:`drain` raises
  :class:`~collector.run.stop.LostFooting` naming what was lost: the run must not go on
  working items that may be someone else's, nor end as if it had done its work.

Items other *live* holders lease (``collector work`` helpers that keep beating) are waited for,
polling every ``poll_s``, however long they take: the drain wait bounds idle waiting, not the
time live helpers need. Holders whose heartbeat stopped are dead: their leases are revoked at
once and their items fetched by this run (see :mod:`collector.run.heartbeat`).

Settling (validation in the GX worker, sink write, ack) runs behind fetching: up to
``defaults.SETTLE_BACKLOG`` fetched batches wait to be settled, in order, while the next ones are
fetched. Each keeps its lease alive until it is acked.

Every store call of the loop (claim, renew, ack, release, holders, revoke, the sink write and
the dead letters) is awaited on the store's own thread (:mod:`collector.offloop`): a slow store
never holds up the requests in flight, whose deadlines are wall-clock.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from collector import defaults
from collector.fetch.engine import FetchResult
from collector.frontier import Lease
from collector.run.collection import BatchReport, Run
from collector.run.heartbeat import judge_holders
from collector.run.stop import LostFooting, StopRequest, process_footing

__all__ = ["DrainEnd", "DrainPolicy", "FetchStep", "Listener", "drain"]

FetchStep = Callable[[Lease], Awaitable[list[FetchResult]]]
"""Fetch one leased batch: the flow's Prefect task, or ``Run.fetch`` on an engine."""

Listener = Callable[[str, dict[str, Any]], Awaitable[None] | None]
"""``(event, data)`` for progress displays: planned, batch, waiting, reclaimed, stopping."""

Ending = Literal["drained", "waited", "max_items", "stopped"]


@dataclass(frozen=True, slots=True)
class DrainPolicy:
    """How long and how much one run drains (see the module docstring for each ending)."""

    batch_size: int = defaults.BATCH_SIZE
    max_items: int | None = None
    drain_wait_s: float = defaults.DRAIN_WAIT_S
    idle_wait_s: float = 0.0  # a helper waits this long for a run to plan something
    poll_s: float = defaults.DRAIN_POLL_S
    heartbeat_s: float = defaults.HEARTBEAT_S
    holder_dead_after_s: float = defaults.HOLDER_DEAD_AFTER_S


@dataclass(frozen=True, slots=True)
class DrainEnd:
    """Why the loop ended, and who still held items of the source then."""

    ending: Ending
    stop_reason: str | None = None
    held_by_others: int = 0


async def drain(
    run: Run,
    fetch: FetchStep,
    policy: DrainPolicy,
    *,
    stop: StopRequest | None = None,
    listener: Listener | None = None,
) -> DrainEnd:
    """Claim, fetch and settle until the source is done, the policy says enough, or a stop.

    Raises :class:`LostFooting` once everything is settled or given back, when the run lost a
    lease, its heartbeat or its source lock on the way.
    """
    loop = _Loop(run, fetch, policy, stop or StopRequest(), listener)
    began, cpu = time.monotonic(), time.process_time()
    heartbeat = run.heartbeat(
        every_s=policy.heartbeat_s, dead_after_s=policy.holder_dead_after_s,
        on_lost=loop.lost.request,
    )  # fmt: skip
    try:
        async with heartbeat:
            with (
                loop.stop.watch(loop.halt),
                loop.lost.watch(loop.halt),
                process_footing.watch(loop.lock_lost),
            ):
                try:
                    await loop.warm_up()
                    # The loop's own time and this process's CPU over it (every thread): the run's
                    # throughput without start-up and wind-down, a figure the load hardly moves.
                    began, cpu = time.monotonic(), time.process_time()
                    ending = await loop.go()
                finally:
                    # Our own leases are all acked or released by now; forget our heartbeat (a
                    # lease left behind by a bug would be returned and counted here, not lost).
                    run.ledger.gave_back(
                        await run.stores.frontier.revoke(
                            run.source.name, run.run_id, now=run.clock()
                        )
                    )
                    run.drain_seconds += time.monotonic() - began
                    run.drain_cpu_seconds += time.process_time() - cpu
    except Exception as exc:  # a store error on the way out of a run that lost its footing
        if loop.lost.reason is not None:  # (its store went away): the loss is what to say
            raise LostFooting(loop.lost.reason) from exc
        raise
    if loop.lost.reason is not None:
        raise LostFooting(loop.lost.reason)
    held = sum(h.leased for h in await run.stores.frontier.holders(run.source.name))
    return DrainEnd(ending, loop.stop.reason, held)


class _Loop:
    def __init__(
        self,
        run: Run,
        fetch: FetchStep,
        policy: DrainPolicy,
        stop: StopRequest,
        listener: Listener | None,
    ) -> None:
        self.run = run
        self.fetch = fetch
        self.policy = policy
        self.stop = stop
        self.listener = listener
        self.claimed = 0
        self.waited_s = 0.0  # idle waiting for retry-later items and silent holders
        self.stopped = asyncio.Event()
        self.lost = StopRequest()  # a lease or the heartbeat lost: the first loss, said once
        self.backlog: collections.deque[asyncio.Task[BatchReport]] = collections.deque()

    def halt(self) -> None:
        """The stop request's callback, on the loop: no more claims, cut fetches short."""
        self.stopped.set()
        self.run.halt()

    def lock_lost(self) -> None:
        """``process_footing``'s callback: the source lock is lost, the run stops as for a
        lost lease."""
        self.lost.request(process_footing.reason or "its source lock")

    async def tell(self, event: str, **data: Any) -> None:
        if self.listener is not None:
            outcome = self.listener(event, data)
            if inspect.isawaitable(outcome):
                await outcome

    async def warm_up(self) -> None:
        """Wait for the run's GX worker to be ready (or a stop) before the first claim.

        GX's import is start-up (~7 s of CPU): batches fetched meanwhile could only wait for
        it, holding their leases, while the import took CPU from the fetching on a small box.
        A suite GX rejects (a ConfigError from the worker) ends the run here, before anything
        is claimed or fetched.
        """
        validator = self.run.validator
        if validator is None:
            return
        ready = asyncio.ensure_future(validator.ready())
        stopped = asyncio.ensure_future(self.stopped.wait())
        try:
            await asyncio.wait({ready, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if not ready.done():  # stopped: the loop ends at once; the worker is closed with the run
            ready.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ready
            return
        ready.result()  # raises the worker's ConfigError

    async def go(self) -> Ending:
        try:
            return await self._claim_until_done()
        finally:
            # Settle everything fetched, even when the loop is failing: those results are real.
            outcomes = await self.run.wait_settled(
                asyncio.gather(*self.backlog, return_exceptions=True)
            )
            errors = [o for o in outcomes if isinstance(o, BaseException)]
            if errors:
                raise errors[0]

    async def _claim_until_done(self) -> Ending:
        run, policy = self.run, self.policy
        idle_until = time.monotonic() + policy.idle_wait_s
        await self._look_at_holders()
        while True:
            if self.stopped.is_set():
                reason = self.stop.reason or (
                    f"lost {self.lost.reason}" if self.lost.reason else None
                )
                await self.tell("stopping", reason=reason)
                return "stopped"
            if policy.max_items is not None and self.claimed >= policy.max_items:
                return "max_items"
            while self.backlog and self.backlog[0].done():
                self.backlog.popleft().result()
            limit = policy.batch_size
            if policy.max_items is not None:
                limit = min(limit, policy.max_items - self.claimed)
            lease = await run.claim(limit)
            if lease.items:
                await self._fetch_and_queue_settle(lease)
                continue
            if self.backlog:  # settling may make retry-later items due: look again after it
                await run.wait_settled(self.backlog.popleft())
                continue
            revoked, live_leased = await self._look_at_holders()
            if revoked:
                continue
            if live_leased:
                await self._pause(policy.poll_s, reason="helpers")  # not idle: they work
                continue
            pause = await run.seconds_until_claimable()
            if pause is None and not self.claimed and time.monotonic() < idle_until:
                await self._pause(0.25, reason="plan")  # a helper started before the run planned
                continue
            if pause is None:
                return "drained"
            if self.waited_s + pause > policy.drain_wait_s:
                return "waited"
            # Look again at least every poll_s: a silent holder may be found dead meanwhile.
            pause = min(max(pause, 0.05), policy.poll_s)
            await self._pause(pause, reason="retries")
            self.waited_s += pause

    async def _fetch_and_queue_settle(self, lease: Lease) -> None:
        run = self.run
        self.claimed += len(lease.items)
        renewer = run.keep_alive(lease, on_lost=self.lost.request)
        try:
            results = await self.fetch(lease)
        except BaseException:
            await _stop_renewing(renewer)
            await run.release(lease)
            raise
        previous = self.backlog[-1] if self.backlog else None
        self.backlog.append(asyncio.create_task(self._settle(lease, results, renewer, previous)))
        if len(self.backlog) > defaults.SETTLE_BACKLOG:
            await run.wait_settled(self.backlog.popleft())

    async def _settle(
        self,
        lease: Lease,
        results: list[FetchResult],
        renewer: asyncio.Task[None],
        before: asyncio.Task[BatchReport] | None,
    ) -> BatchReport:
        try:
            # Validated at once (with other batches), stored and acked in claim order.
            report = await self.run.settle(lease, results, after=before)
        finally:
            await _stop_renewing(renewer)
        await self.tell("batch", report=report, ledger=self.run.ledger)
        return report

    async def _pause(self, seconds: float, *, reason: str) -> None:
        await self.tell("waiting", seconds=seconds, reason=reason)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopped.wait(), timeout=seconds)

    async def _look_at_holders(self) -> tuple[int, int]:
        """One read of the source's holders: revoke the dead ones' leases; returns (items
        revoked, items live holders lease)."""
        run = self.run
        now = run.clock()
        verdict = judge_holders(
            await run.stores.frontier.holders(run.source.name),
            now=now,
            me=run.run_id,
            dead_after_s=self.policy.holder_dead_after_s,
        )
        revoked = 0
        for dead in verdict.dead:
            revoked += await run.stores.frontier.revoke(run.source.name, dead, now=now)
        run.ledger.reclaimed(revoked)
        return revoked, verdict.live_leased


async def _stop_renewing(renewer: asyncio.Task[None]) -> None:
    """Cancel a lease's renewal and wait for it to end (a renewal in flight is not left to
    finish after its batch was acked); an error it ended with is raised here, not lost."""
    renewer.cancel()
    await asyncio.wait([renewer])
    if not renewer.cancelled() and renewer.exception() is not None:
        raise renewer.exception()  # type: ignore[misc]
