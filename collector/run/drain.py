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
fetched (at most ``SETTLE_BACKLOG + 1`` batches are claimed and not yet settled, as when one batch
was fetched at a time). Each keeps its lease alive until it is acked.

**Fetching ahead** (``DrainPolicy.fetch_ahead``, ``defaults.FETCH_AHEAD`` = 2): the next batch is
claimed and its fetch started once no item of the batch being fetched still waits for a request
slot (each has sent its first request or ended: the engine's
:data:`~collector.fetch.engine.BATCH_STARTED`), with at most ``fetch_ahead`` batches fetching.
So the tail of a batch (its last requests, one slow page among 200) no longer leaves the other
slots idle. ``fetch_ahead=1`` is the plain reference: one batch fetched at a time.

Why no batch can miss its deadline for it: the slots, the rate, robots and the breakers are the
engine's, per host, shared by both batches, so fetching ahead never sends more than they let
through. The new batch's items queue behind what is already in flight: the older batch's
requests, each cut at ``request_deadline_s``, and its inline retries. The engine starts an
attempt no later than ``max(0.85 batch_timeout_s - request_deadline_s, batch_timeout_s / 2)``
after its batch began, and the load-time order ``request_deadline_s <= batch_timeout_s <
lease_s`` (collector.policy.ttl) leaves that time at least half the batch timeout: the older
batch's requests hold the new batch's first items back by at most one request deadline, as a
batch's own first wave always held back its later items (a fetched-ahead batch is, for the
slots, what a longer batch was). The batch still returns by 95 % of its timeout (before
Prefect's ``timeout_seconds``, counted per task from its own start), whatever waits; an item
that could not start in time goes back to the queue unchanged (``skipped``), never lost; each
lease is renewed from its claim until its ack.
Under shared domain limits (``limits.shared_domain_concurrency``) each batch still takes its own
``domain:<host>`` slots before its fetch and holds them until the fetch ends: a batch fetching
ahead waits for slots the older one holds (taken in sorted host order by a batch that waits for
nothing else, so no cycle), and the two batches' grants together stay within the limit.

Interruptions with two batches in flight: a stop (or lost footing) halts the engine, which cuts
both batches' requests after its grace; both are settled in claim order, the cut-off items going
back unchanged. A fetch that raises gives its lease back, the loop cancels the other batch still
being fetched (its lease given back too; a batch fetched after the failing one is given back
instead of settled) and raises the error once the batches before are settled. A SIGKILL loses
nothing: every lease expires unrenewed.

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
from typing import TYPE_CHECKING, Any, Literal

from collector import defaults
from collector.fetch.engine import BATCH_STARTED, FetchResult
from collector.frontier import Lease
from collector.run.collection import BatchReport, Run
from collector.run.heartbeat import judge_holders
from collector.run.stop import LostFooting, StopRequest, process_footing

if TYPE_CHECKING:
    from collector.settle.validation_worker import ValidationWorker

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
    fetch_ahead: int = defaults.FETCH_AHEAD  # batches fetching at once; 1: one at a time

    def __post_init__(self) -> None:
        if self.fetch_ahead < 1:
            raise ValueError(f"DrainPolicy.fetch_ahead must be at least 1, not {self.fetch_ahead}")


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
                    # The loop's own time and this process's CPU over it (every thread), less the
                    # wait for GX (start-up): the run's throughput, a figure the load hardly moves.
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
                    run.drain_seconds += time.monotonic() - began - loop.warm_s
                    run.drain_cpu_seconds += time.process_time() - cpu - loop.warm_cpu_s
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
        self.warm = False  # the GX worker was waited for (see warm_up)
        self.warm_s = self.warm_cpu_s = 0.0  # what that wait took (not the loop's throughput)
        self.stopped = asyncio.Event()
        self.lost = StopRequest()  # a lease or the heartbeat lost: the first loss, said once
        # every batch claimed and not yet settled, in claim order (None: given back unsettled)
        self.backlog: collections.deque[asyncio.Task[BatchReport | None]] = collections.deque()
        self.fetching: list[_Batch] = []  # the batches being fetched (at most fetch_ahead)
        self.changed = asyncio.Event()  # a fetch started all its requests, or ended, or a stop

    def halt(self) -> None:
        """The stop request's callback, on the loop: no more claims, cut fetches short."""
        self.stopped.set()
        self.changed.set()
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
        """Wait for the run's GX worker to be ready (or a stop) before the first claim that
        can take something, once.

        GX's import is start-up (~3 s of CPU, several times that on a loaded box): batches
        fetched meanwhile could only wait for it, holding their leases, while the import took
        CPU from the fetching on a small box. A suite GX rejects (a ConfigError from the worker)
        ends the run here, before anything is claimed or fetched.

        Only when an item is claimable now (the frontier's next event is due): a run with
        nothing to fetch (every item fresh, the everyday rerun; a helper before its run
        planned) neither waits for the import nor spends a greeting on it, and the worker,
        never greeted, is given back still starting (killed at exit, collector.settle.
        worker_pool). An item that turns claimable between the look and the claim is validated
        as ever: every validation waits for the worker's ready frame first.
        """
        validator = self.run.validator
        if validator is None:
            self.warm = True  # nothing to wait for, ever
            return
        if await self.run.seconds_until_claimable() != 0.0:
            return  # nothing to take now (none pending, or only later): no wait for GX yet
        began, cpu = time.monotonic(), time.process_time()
        try:
            await self._ready(validator)
        finally:
            self.warm = True
            self.warm_s += time.monotonic() - began
            self.warm_cpu_s += time.process_time() - cpu

    async def _ready(self, validator: ValidationWorker) -> None:
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
        except BaseException:
            self._give_up_fetching()  # the loop fails: no batch goes on being fetched for it
            raise
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
            if not await self._room_to_fetch():
                continue  # stopped meanwhile
            while self.backlog and self.backlog[0].done():
                self.backlog.popleft().result()
            while len(self.backlog) > defaults.SETTLE_BACKLOG:
                await run.wait_settled(self.backlog.popleft())
            limit = policy.batch_size
            if policy.max_items is not None:
                limit = min(limit, policy.max_items - self.claimed)
            if not self.warm:  # until it is, a look at the frontier before each claim
                await self.warm_up()
                if self.stopped.is_set():
                    continue  # stopped while GX imported: said at the top of the loop
            lease = await run.claim(limit)
            if lease.items:
                self._start(lease)
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

    async def _room_to_fetch(self) -> bool:
        """Wait until another batch may be fetched: fewer than ``fetch_ahead`` are, and each of
        them has started all its requests. False when a stop came first; raises the error of a
        fetch that failed."""
        while True:
            self.changed.clear()
            for batch in self.fetching:
                fetching = batch.fetching
                if fetching.done() and not fetching.cancelled() and fetching.exception():
                    raise fetching.exception()  # type: ignore[misc]
            self.fetching = [b for b in self.fetching if not b.fetching.done()]
            if self.stopped.is_set():
                return False
            if len(self.fetching) < self.policy.fetch_ahead and all(
                b.started.is_set() for b in self.fetching
            ):
                return True
            await self.changed.wait()

    def _start(self, lease: Lease) -> None:
        """Start fetching a claimed batch, and queue its settle behind the previous batch's."""
        self.claimed += len(lease.items)
        batch = _Batch(lease, self.run.keep_alive(lease, on_lost=self.lost.request))
        batch.fetching = asyncio.create_task(self._fetch(batch), name=f"fetch-{lease.token}")
        batch.fetching.add_done_callback(lambda _: self.changed.set())
        previous = self.backlog[-1] if self.backlog else None
        self.backlog.append(asyncio.create_task(self._fetch_then_settle(batch, previous)))
        self.fetching.append(batch)

    async def _fetch(self, batch: _Batch) -> list[FetchResult]:
        """The fetch step, telling the loop when no item of the batch waits for a slot any more
        (through the engine's BATCH_STARTED, set in this task's own context)."""

        def started() -> None:
            if not batch.started.is_set():
                batch.started.set()
                self.changed.set()

        BATCH_STARTED.set(started)
        try:
            return await self.fetch(batch.lease)
        finally:
            started()

    def _give_up_fetching(self) -> None:
        """Cancel the fetches still running: their batches are given back unsettled."""
        for batch in self.fetching:
            batch.fetching.cancel()

    async def _fetch_then_settle(
        self, batch: _Batch, before: asyncio.Task[BatchReport | None] | None
    ) -> BatchReport | None:
        """The batch's whole way: its fetch, then its settle after the previous batch's.

        Returns None when the batch was given back unsettled: its fetch was cancelled by the
        loop (another fetch failed), or the batch before it failed (nothing of this one was
        written then: a settle writes only once the previous one ended well)."""
        run, lease = self.run, batch.lease
        try:
            await asyncio.wait([batch.fetching])
        except asyncio.CancelledError:  # this task itself is cancelled: its fetch too, and the
            batch.fetching.cancel()  # batch is given back before the cancellation goes on
            await asyncio.wait([batch.fetching])
            await _stop_renewing(batch.renewer)
            await run.release(lease)
            raise
        if _failed(batch.fetching):
            await _stop_renewing(batch.renewer)
            await run.release(lease)
            if not batch.fetching.cancelled():
                raise batch.fetching.exception()  # type: ignore[misc]
            return None
        try:
            return await self._settle(lease, batch.fetching.result(), batch.renewer, before)
        except Exception:
            if before is not None and before.done() and _failed(before):
                await run.release(lease)  # stopped before its writes: given back as it was
                return None
            raise

    async def _settle(
        self,
        lease: Lease,
        results: list[FetchResult],
        renewer: asyncio.Task[None],
        before: asyncio.Task[BatchReport | None] | None,
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


class _Batch:
    """A claimed batch on its way: its lease's renewal, its fetch and when that fetch has no
    item waiting for a request slot any more."""

    __slots__ = ("fetching", "lease", "renewer", "started")

    def __init__(self, lease: Lease, renewer: asyncio.Task[None]) -> None:
        self.lease = lease
        self.renewer = renewer
        self.started = asyncio.Event()
        self.fetching: asyncio.Task[list[FetchResult]]


def _failed(task: asyncio.Task[Any]) -> bool:
    """An ended task that raised (a cancelled one included)."""
    return task.cancelled() or task.exception() is not None


async def _stop_renewing(renewer: asyncio.Task[None]) -> None:
    """Cancel a lease's renewal and wait for it to end (a renewal in flight is not left to
    finish after its batch was acked); an error it ended with is raised here, not lost."""
    renewer.cancel()
    await asyncio.wait([renewer])
    if not renewer.cancelled() and renewer.exception() is not None:
        raise renewer.exception()  # type: ignore[misc]
