"""One collect run of one source, step by step, without Prefect.

:class:`Run` owns the run's backends (frontier, sink, dead letters, validator) and its
ledger, and exposes the pipeline as steps the Prefect flow calls in order::

    async with Run.open(source, run_id=...) as run:
        plan (on the frontier's lane) -> claim() -> fetch() -> settle() -> ... -> await run.end()

``Run.open`` opens the stores, and closes them (the JSONL sink's compaction included), on
threads, never on the event loop; while the run is open, its store calls go through
``run.stores`` (:mod:`collector.offloop`: each store on a thread of its own), and
:meth:`Run.end` reads the end counts on those lanes too. Opening a run with ``Run(...)`` in a
``with`` block is the synchronous way tools and tests use.

Keeping the steps here, in plain Python, lets the engine be tested without a Prefect server and
keeps ``flows/collect.py`` down to orchestration (tasks, timeouts, retries, artifacts).

The run coordinates parts it does not implement: planning is :mod:`collector.run.plan` (by
kind) over :mod:`collector.run.offer`; the account is :class:`~collector.run.ledger.Ledger`,
changed only through its steps. Settling a batch keeps the order of writes here: outcomes are
decided (:mod:`collector.settle.outcomes`), records keyed and validated
(:mod:`collector.settle.records`), the good ones written to the sink under the lease's fencing
token *before* the frontier is told (so a crash between the two only causes a refetch, and the
idempotent sink writes nothing twice); failures are put in the dead letters
(:mod:`collector.settle.letters`) before their items are marked dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from collector._text import one_line
from collector.backends import open_deadletters, open_frontier, open_sink
from collector.config import Source
from collector.deadletter import DeadLetter, DeadLetterStore
from collector.errors import BackendError
from collector.fetch.engine import FetchEngine, FetchResult
from collector.frontier import Frontier, Lease
from collector.offloop import AsyncStores
from collector.ops import metrics, observability, tracing
from collector.ops.scrub import Scrubber
from collector.policy.retry import RetryBudget
from collector.policy.revisit_budget import RevisitSchedule
from collector.run.heartbeat import Heartbeat
from collector.run.ledger import Ledger
from collector.run.offer import SeedOffer
from collector.run.plan import Plan
from collector.run.robots_replan import reexamine as reexamine_robots
from collector.run.summary import BatchReport, Role, RunSummary
from collector.settle.letters import Letters
from collector.settle.outcomes import complete, count_acks, decide, scheduled
from collector.settle.parse import RecordParser
from collector.settle.records import Checked, key_and_validate
from collector.sinks import Sink, SinkRecord

if TYPE_CHECKING:
    from collector.fetch.circuit import CircuitListener
    from collector.settle.validation_worker import ValidationWorker

__all__ = ["BatchReport", "Collection", "Run"]

_T = TypeVar("_T")
_log = logging.getLogger(__name__)
# Record keys a run remembers to count key collisions (~80 bytes each): a run of millions of
# records stays in bounded memory; later keys are still checked against the remembered ones.
KEYS_REMEMBERED = 1_000_000
_ANSWERED = frozenset({"ok", "not_modified"})  # fetch statuses a page counts in pages/s
RENEW_RETRY_S = 2.0  # a lease renewal the store refused is tried again this often


class Run:
    """The state of one run. Open with ``async with Run.open(source, run_id=...) as run``."""

    def __init__(
        self,
        source: Source,
        *,
        run_id: str,
        frontier: Frontier | None = None,
        sink: Sink | None = None,
        deadletters: DeadLetterStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.source = source
        self.run_id = run_id
        # The tag of this run's items in the frontier: the run id plus a part of its own, so a
        # second execution of the same flow run (a Prefect retry) is a run of its own there too
        # (its items are not mistaken for repeats of its own seeds).
        self.frontier_tag = f"{run_id}#{uuid.uuid4().hex[:8]}"
        self.clock = clock
        secrets = source.secret_values()
        self.scrub = Scrubber(secrets)
        observability.register_secrets(secrets)  # before anything can fail and be reported
        self._frontier = frontier or open_frontier(source)
        self._sink = sink or open_sink(source)
        self._deadletters = deadletters or open_deadletters(source)
        # what the run loop awaits instead: each store on its own thread (collector.offloop)
        self.stores = AsyncStores(self._frontier, self._sink, self._deadletters)
        self._async_only = False  # opened by Run.open: the stores only through self.stores
        self.ledger = Ledger()
        self.errors = observability.DeadLetterReporter(source.name, run_id)
        self.letters = Letters(source.name, run_id, self.scrub, clock)
        self.traces = tracing.BatchTraces(source.name)  # a span per batch (collector.ops.tracing)
        self.parser = RecordParser(
            parser=source.record.parser, records_path=source.record.records_path
        )
        self.budget = RetryBudget(
            ratio=source.retry.budget_ratio, min_retries=source.retry.budget_min
        )
        # when each settled page is due again, and its history (collector.policy.revisit_budget)
        self.revisit = RevisitSchedule(source.ttl, source.priority)
        self._revisit_loaded = False
        self._validator: ValidationWorker | None = None
        self._engines: list[FetchEngine] = []
        self.halted = False
        self.started_at = clock()
        self.fetch_seconds = 0.0  # wall time with at least one batch fetching (they overlap)
        self._fetching = 0
        self._fetching_since = 0.0
        self.settle_seconds = 0.0
        self.validation_seconds = 0.0
        self.drain_seconds = 0.0  # the run loop's (collector.run.drain), and its process CPU
        self.drain_cpu_seconds = 0.0
        self.records_validated = 0
        self.pages_ok = 0  # pages answered with a body (parsed)
        self.pages_answered = 0  # those and pages answered 304 (pages/s)
        self.robots_requeued = 0  # robots dead letters queued again (collector.run.robots_replan)
        self.hosts: dict[str, Any] = {}  # the engine's view of hosts after the last fetch
        # dead letters this run wrote, by reason (deadletter_reasons is the source's open ones)
        self.new_reasons: Counter[str] = Counter()
        # hash(record key) -> URL of the page whose record of that key this run stored last:
        # a later record with the same key from another page is a key collision. One entry per
        # distinct key of the run (~80 bytes measured; the URL string is the page's own).
        self._run_keys: dict[int, str] = {}
        self.key_collision: tuple[str, str, str] | None = None  # (key, first URL, later URL)
        self.keys_forgotten = False  # more distinct keys than KEYS_REMEMBERED: counted among those

    def _sync(self, what: str, store: _T) -> _T:
        if self._async_only:
            self._refuse(what)
        return store

    def _refuse(self, what: str) -> None:
        raise RuntimeError(
            f"{self.source.name}: a run opened with Run.open reaches its {what} through "
            "run.stores (off the event loop), not directly"
        )

    @property
    def frontier(self) -> Frontier:
        """The frontier itself, for a run opened synchronously (``with Run(...)``: tools and
        tests); a run opened with :meth:`open` has only ``run.stores``."""
        return self._sync("frontier", self._frontier)

    @property
    def sink(self) -> Sink:
        """The sink itself (see :attr:`frontier`)."""
        return self._sync("sink", self._sink)

    @property
    def deadletters(self) -> DeadLetterStore:
        """The dead-letter store itself (see :attr:`frontier`)."""
        return self._sync("dead letters", self._deadletters)

    def heartbeat(
        self, *, every_s: float, dead_after_s: float, on_lost: Callable[[str], None]
    ) -> Heartbeat:
        """The run's heartbeat: it beats into the frontier from a thread of its own."""
        return Heartbeat(
            self._frontier, self.source.name, self.run_id, every_s=every_s,
            dead_after_s=dead_after_s, on_lost=on_lost,
        )  # fmt: skip

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls, source: Source, *, run_id: str, clock: Callable[[], float] = time.time
    ) -> AsyncIterator[Run]:
        """The run, its stores opened off the event loop (the three at once, each on a thread:
        a Redis, a Postgres or a SQLite file may take seconds), and on the way out its
        validation worker stopped and its stores closed off the loop too (waiting for every
        call made, the JSONL sink's compaction included).

        A store that cannot be opened closes those that did and raises its one-line error.
        """
        observability.register_secrets(source.secret_values())  # before anything can fail
        opened = await asyncio.gather(
            asyncio.to_thread(open_frontier, source),
            asyncio.to_thread(open_sink, source),
            asyncio.to_thread(open_deadletters, source),
            return_exceptions=True,
        )
        failed = [o for o in opened if isinstance(o, BaseException)]
        if failed:
            await asyncio.to_thread(_close_all, [o for o in opened if hasattr(o, "close")])
            raise failed[0]
        frontier, sink, deadletters = opened
        run = cls(
            source, run_id=run_id, clock=clock,
            frontier=frontier, sink=sink, deadletters=deadletters,  # type: ignore[arg-type]
        )  # fmt: skip
        run._async_only = True
        try:
            yield run
        except BaseException as exc:
            try:
                await run.aclose()
            finally:  # the run's own error goes on, a closing error noted beside it
                await asyncio.to_thread(run.__exit__, type(exc), exc, exc.__traceback__)
            raise
        try:
            await run.aclose()
        finally:
            await asyncio.to_thread(run.close)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except BackendError as failure:  # the run's own error goes on, this one beside it
            _log.error("%s", failure)
            exc.add_note(str(failure))

    async def aclose(self) -> None:
        """Stop the validation worker (the backends close with :meth:`close`)."""
        if self._validator is not None:
            await self._validator.aclose()

    def close(self) -> None:
        """Close the sink, the frontier and the dead-letter store, each even when another
        failed, then raise one BackendError line naming every one that failed.

        Closing can still do work that matters (the JSONL sink compacts its segments then): a
        run whose sink could not finish says so instead of ending as if it had.
        """
        self.stores.close()  # every call the loop made is done before its store closes
        if self._validator is not None:  # a run closed without aclose (``with Run(...)``)
            self._validator.close()  # back to the pool, or closed (validation_worker)
        failed: list[tuple[str, Exception]] = []
        stores = (
            ("sink", self._sink),
            ("frontier", self._frontier),
            ("dead letters", self._deadletters),
        )
        for what, backend in stores:
            try:
                backend.close()
            except Exception as exc:
                failed.append((what, exc))
        if failed:
            said = "; ".join(
                f"{what}: {type(exc).__name__}: {one_line(exc)}" for what, exc in failed
            )
            raise BackendError(
                f"{self.source.name}: closing the run's stores failed: {said}"
            ) from failed[0][1]

    def engine(
        self,
        *,
        on_item: Callable[[FetchResult], None] | None = None,
        circuit_listeners: Sequence[CircuitListener] = (),
    ) -> FetchEngine:
        """The run's engine for its source, every setting given at construction
        (:meth:`FetchEngine.for_source`): ``on_item`` hears each item's result, and
        ``circuit_listeners`` each breaker that opens or closes."""
        storage = self.source.resolve_env(
            self.source.limits.rate_storage, field="limits.rate_storage"
        )
        engine = FetchEngine.for_source(
            self.source,
            rate_storage_uri=storage,
            circuit_storage_uri=self._shared_redis(storage),
            on_item=on_item,
            circuit_listeners=circuit_listeners,
        )
        self._engines.append(engine)
        if self.halted:
            engine.halt()
        return engine

    def halt(self) -> None:
        """A stop was requested: the run's engines start no attempt and cut what is in flight
        (see FetchEngine.halt); the run loop stops claiming (collector.run.drain)."""
        self.halted = True
        for engine in self._engines:
            engine.halt()

    def _shared_redis(self, rate_storage: str) -> str | None:
        """Where circuit breakers are shared: the rate storage's or the frontier's Redis."""
        if rate_storage.startswith(("redis://", "rediss://", "unix://")):
            return rate_storage
        if self.source.frontier.type == "redis":
            from collector.backends import _redis_url

            return _redis_url(self.source, self.source.frontier, field="frontier")
        return None

    @property
    def validator(self) -> ValidationWorker | None:
        """The source's suite in a worker process, started on first use: an idle one of this
        process for the same suite content when there is one (see validation_worker)."""
        if self._validator is None and self.source.suite_path is not None:
            from collector.settle.validation_worker import ValidationWorker

            self._validator = ValidationWorker(self.source.suite_path)
        return self._validator

    # --- plan ----------------------------------------------------------------------------------
    def plan(self) -> Ledger:
        """Take the run's items into its account (collector.run.plan says how, by kind;
        collector.run.ledger what each term means)."""
        if self.validator is not None:
            self.validator.start()  # GX imports in the worker while we plan
        seeds = SeedOffer(
            self.source, self._frontier, self._deadletters,
            tag=self.frontier_tag, letters=self.letters, file_letters=self.file_letters,
        )  # fmt: skip
        now = self.clock()
        # pages robots.txt refused long enough ago are queued to be asked about again (before
        # the plan, which then adopts them as due)
        self.robots_requeued = reexamine_robots(
            self._deadletters, self._frontier, self.source, now=now
        )
        plan = Plan(self.source, self._frontier, seeds, tag=self.frontier_tag, now=now)
        self.ledger.planned(**plan.take().for_ledger())
        self._load_revisit()
        return self.ledger

    def _load_revisit(self) -> None:
        """A learned schedule counts the source's pages by class, from their kept histories
        (once a run: at its plan, or a helper's first settle; on the frontier's lane)."""
        if self.revisit.adaptive and not self._revisit_loaded:
            self.revisit.load(self._frontier.histories(self.source.name))
        self._revisit_loaded = True

    def file_letters(self, letters: list[DeadLetter]) -> None:
        """Put dead letters in the store, then count and report them (the plan: it runs on
        the frontier's lane, off the loop, before anything is fetched)."""
        self._deadletters.put(letters)
        self._count_letters(letters)

    async def put_letters(self, letters: list[DeadLetter]) -> None:
        """:meth:`file_letters` for a batch: the put runs on the dead letters' lane."""
        await self.stores.deadletters.put(letters)
        self._count_letters(letters)

    def _count_letters(self, letters: list[DeadLetter]) -> None:
        self.new_reasons.update(letter.reason for letter in letters)
        self.errors.report(letters)
        metrics.count_dead_letters(self.source.name, letters)

    # --- claim and fetch -----------------------------------------------------------------------
    async def claim(self, limit: int) -> Lease:
        began, began_ns = time.monotonic(), time.time_ns()
        lease = await self.stores.frontier.claim(
            self.source.name,
            limit,
            now=self.clock(),
            lease_s=self.source.ttl.lease_s,
            holder=self.run_id,
        )
        waited = time.monotonic() - began  # the claim wait; URL sizes feed the backlog bytes
        metrics.claimed(self.source.name, waited, lease.reclaimed, (i.url for i in lease.items))
        self.traces.claimed(lease, began_ns)
        await self.stores.frontier.lane.run(self.sample_frontier)  # reads the frontier's counts
        self.ledger.took(len(lease.items), reclaimed=lease.reclaimed)
        return lease

    def keep_alive(
        self, lease: Lease, on_lost: Callable[[str], None] | None = None
    ) -> asyncio.Task[None]:
        """Renew ``lease`` every ``lease_s / 3`` until the returned task is cancelled.

        Held from claim to ack, so a batch whose settling waits behind the next fetch keeps
        its items. A store error is retried every few seconds while the lease still runs; when
        the store renewed none of its items (another holder took them back) or the lease ran
        out unrenewed, ``on_lost`` is told in one phrase and the renewal ends.
        """
        ttl = self.source.ttl
        retry_s = min(RENEW_RETRY_S, ttl.renew_every_s)

        def lost(what: str) -> None:
            _log.error("%s: lost %s", self.source.name, what)
            if on_lost is not None:
                on_lost(what)

        async def keep_renewing() -> None:
            renewed = time.monotonic()  # a wall-clock jump does not shorten or stretch this
            pause = ttl.renew_every_s
            while True:
                await asyncio.sleep(pause)
                try:
                    held = await self.stores.frontier.renew(
                        lease, now=self.clock(), lease_s=ttl.lease_s
                    )
                except BackendError as exc:
                    left = renewed + ttl.lease_s - time.monotonic()
                    if left > retry_s:  # transient, perhaps: try again while the lease runs
                        _log.warning("lease %s not renewed (retrying): %s", lease.token, exc)
                        pause = retry_s
                        continue
                    lost(f"the lease of batch {lease.token}: not renewed for {ttl.lease_s:g}s "
                         f"({one_line(exc)})")  # fmt: skip
                    return
                if lease.items and held == 0:
                    lost(f"the lease of batch {lease.token}: another holder took its "
                         f"{len(lease.items)} items back")  # fmt: skip
                    return
                renewed, pause = time.monotonic(), ttl.renew_every_s
                metrics.lease_renewed(self.source.name)

        return asyncio.create_task(keep_renewing(), name=f"renew-lease-{lease.token}")

    async def fetch(
        self, engine: FetchEngine, lease: Lease, host_slots: dict[str, int] | None = None
    ) -> list[FetchResult]:
        """Fetch a leased batch (the caller holds the lease with :meth:`keep_alive`).

        ``host_slots`` caps the batch's requests in flight per host (shared domain limits).
        """
        if not self._fetching:
            self._fetching_since = time.monotonic()
        self._fetching += 1
        try:
            with self.traces.fetching(lease) as span:
                results = await engine.fetch_batch(
                    lease.items,
                    budget=self.budget,
                    batch_timeout_s=self.source.ttl.batch_timeout_s,
                    host_slots=host_slots,
                )
                tracing.fetched(span, results)
            return results
        finally:
            # Two batches fetch at once (collector.run.drain fetches ahead): count the time
            # any was fetching, not each batch's, so it never exceeds the run's wall time.
            self._fetching -= 1
            if not self._fetching:
                self.fetch_seconds += time.monotonic() - self._fetching_since
            if engine.tally is not None:
                engine.tally.flush(self.source.name, hosts=self.source.metrics.hosts)
            self.hosts = engine.host_report()

    async def release(self, lease: Lease) -> int:
        """Give a batch back unchanged (its task failed for good)."""
        self.ledger.gave_back(len(lease.items))  # given back, or already taken by another
        self.traces.released(lease)
        return await self.stores.frontier.release(lease, now=self.clock())

    # --- settle --------------------------------------------------------------------------------
    async def settle(
        self,
        lease: Lease,
        results: list[FetchResult],
        *,
        after: asyncio.Future[Any] | None = None,
    ) -> BatchReport:
        """Decide, store and acknowledge every item of a fetched batch.

        ``settle_seconds`` counts this process's own work only (parse, key, sink, dead letters,
        ack), not the waits for the validation worker or the previous batch.

        ``after`` (the previous batch's settle) is awaited once the batch is parsed and
        validated, before anything is written: batches are stored and acked in claim order,
        while their validations may run together (see collector.settle.validation_worker).
        """
        began = time.monotonic()
        try:
            with self.traces.settling(lease):
                report = await self._settle(lease, results, after)
            metrics.settled(self.source.name, seconds=time.monotonic() - began, report=report)
            return report
        finally:
            self.settle_seconds += time.monotonic() - began

    async def wait_settled(self, settling: Awaitable[_T]) -> _T:
        """Await a settle (or several): validations waiting to be batched go out at once."""
        validator = self._validator
        if validator is None:
            return await settling
        with validator.urgent():
            return await settling

    async def _settle(
        self, lease: Lease, results: list[FetchResult], after: asyncio.Future[Any] | None
    ) -> BatchReport:
        """Decide each item, check the records, store, put dead letters, ack, count."""
        now = self.clock()
        self.pages_ok += sum(1 for result in results if result.status == "ok")
        # pages/s counts pages answered, a 304 too (a page answered, with nothing to parse)
        self.pages_answered += sum(1 for result in results if result.status in _ANSWERED)
        decided = decide(
            results, lease, now=now, source=self.source, parser=self.parser,
            letters=self.letters,
        )  # fmt: skip
        checked = await key_and_validate(
            decided.parsed, key_path=self.source.record.key, validator=self.validator,
            letters=self.letters, bad=decided.letters, traces=self.traces,
        )  # fmt: skip
        self._count_validation(checked)
        if after is not None:
            waiting = time.monotonic()
            await asyncio.shield(after)
            self.settle_seconds -= time.monotonic() - waiting  # not this batch's work
        complete(decided, checked.failed_items, source=self.source, now=now)
        batch_id = f"{self.run_id}:{lease.token}"
        with self.traces.step("store"):
            written = await self.stores.sink.write(
                checked.good, token=lease.token, batch_id=batch_id
            )
        if self.revisit.adaptive and not self._revisit_loaded:
            await self.stores.frontier.lane.run(self._load_revisit)
        budget = self.revisit.budget
        if budget is not None and budget.stale:  # ~0.3 s for 600 classes: off the loop's turn
            await asyncio.to_thread(budget.solve)  # (settles reach here one at a time)
        scheduled(decided, lease, written.written_urls, self.revisit, now=now)
        collisions = self._count_key_collisions(checked.good, written.stale_keys)
        await self.put_letters(decided.letters)
        with self.traces.step("ack"):
            acked = await self.stores.frontier.ack(
                lease, list(decided.outcomes.values()), now=self.clock()
            )
        ended = count_acks(decided.outcomes, acked.stale, decided.not_modified)
        part = replace(
            ended.account,
            records_written=written.written,
            records_unchanged=written.unchanged,
            records_quarantined=checked.quarantined,
            stale_writes=written.stale,
            key_collisions=collisions,
            batches=1,
        )
        report = BatchReport(
            **part.values(),
            token=lease.token,
            items=len(lease.items),
            skipped=ended.skipped,
            validation_s=checked.validation_s,
            reasons=ended.reasons,
            windows=dict(self.hosts.get("windows", {})),
            slowed=dict(self.hosts.get("slowed", {})),
        )
        self.ledger.settled(len(decided.outcomes), report)
        return report

    def _count_validation(self, checked: Checked) -> None:
        """The suite's time and records into the run."""
        self.settle_seconds -= checked.waited_s  # the worker's time, not ours
        self.validation_seconds += checked.validation_s
        self.records_validated += checked.validated

    def _count_key_collisions(self, good: list[SinkRecord], refused: list[str]) -> int:
        """Count the records that replaced, in the sink, an earlier record of this run.

        The sink keeps one record per key (an idempotent upsert), so two pages yielding the
        same key in one run leave only the later one. Counted: a key seen earlier in this batch
        (from any page, the same one included), or in an earlier batch from another page (the
        same page stored again, after its lease passed to a new claim, is no collision).
        Records the fence refused replaced nothing. Returns how many (for the ledger's batch).
        """
        collisions = 0
        if not good:
            return collisions
        stale = set(refused)
        seen = self._run_keys
        batch: dict[str, str] = {}
        for record in good:
            key, url = record.key, record.url
            if stale and key in stale:
                continue
            earlier = batch.get(key)
            if earlier is None and (before := seen.get(hash(key))) is not None and before != url:
                earlier = before
            if earlier is not None:
                collisions += 1
                if self.key_collision is None:
                    self.key_collision = (key, earlier, url)
            batch[key] = url
        for key, url in batch.items():
            if len(seen) < KEYS_REMEMBERED or hash(key) in seen:
                seen[hash(key)] = url
            else:  # bounded memory: keys after the first KEYS_REMEMBERED are checked, not kept
                self.keys_forgotten = True
        return collisions

    def _warn_key_collisions(self) -> None:
        """One warning line per run: how many records replaced another, and one example."""
        if not self.ledger.key_collisions or self.key_collision is None:
            return
        key, first, later = self.key_collision
        _log.warning(
            "%s: %d records replaced an earlier record of this run with the same key (e.g. key "
            "%r from %s, then from %s): the sink keeps one record per key; check record.key%s",
            self.source.name, self.ledger.key_collisions, key,
            self.scrub.url(first), self.scrub.url(later),
            f" (counted against the first {KEYS_REMEMBERED:,} keys of the run)"
            if self.keys_forgotten else "",
        )  # fmt: skip

    # --- finish --------------------------------------------------------------------------------
    def sample_frontier(self, *, force: bool = False) -> None:
        """Frontier depth and backlog gauges, at most every METRICS_SAMPLE_S (metrics on)."""
        metrics.sample_frontier(
            self.source.name, self._frontier, self.source.backlog, now=self.clock(), force=force
        )

    async def seconds_until_claimable(self) -> float | None:
        """How long until something may be claimable; None when nothing is pending."""
        now = self.clock()
        at = await self.stores.frontier.next_event_at(self.source.name, now=now)
        return None if at is None else max(0.0, at - now)

    def finish(self, *, planned: bool = True) -> Ledger:
        """Close the books: read the end state and check conservation (see collector.run.ledger).

        A drain-only worker (``planned=False``) checks only what it claimed.
        """
        self.sample_frontier(force=True)
        if planned:
            self.ledger.close(self._frontier.run_counts(self.source.name, self.frontier_tag))
        else:
            self.ledger.close_claims()
        self.errors.finish()
        self._warn_key_collisions()
        return self.ledger

    def _validation_summary(self) -> dict[str, Any]:
        """GX time per batch and per record (the worker's own clock), and GX calls made."""
        batches = self.ledger.batches
        return {
            "records": self.records_validated,
            "batches": batches,
            "gx_calls": self._validator.calls if self._validator is not None else 0,
            "ms_per_batch": _per(self.validation_seconds, batches, 1e3),
            "us_per_record": _per(self.validation_seconds, self.records_validated, 1e6),
        }

    async def end(self, *, planned: bool = True, role: Role = "run", **how: Any) -> RunSummary:
        """Close the books (:meth:`finish`) and read what the summary says of the stores, each
        on its store's lane, then the :class:`RunSummary` (``how``: how the run ended)."""
        await self.stores.frontier.lane.run(self.finish, planned=planned)
        return await self.summarize(role=role, **how)

    async def summarize(self, *, role: Role = "run", **how: Any) -> RunSummary:
        """The :class:`RunSummary` of the run as it stands, the stores read on their lanes
        (a run that lost its footing says what it settled without closing the books)."""
        in_sink, reasons = await asyncio.gather(
            self.stores.sink.lane.run(self._sink.count),
            self.stores.deadletters.lane.run(self._deadletters.reasons, self.source.name),
        )
        return self.summary(role=role, records_in_sink=in_sink, deadletter_reasons=reasons, **how)

    def summary(
        self,
        *,
        role: Role = "run",
        records_in_sink: int | None = None,
        deadletter_reasons: dict[str, int] | None = None,
        **how: Any,
    ) -> RunSummary:
        """The run's :class:`RunSummary`; ``how`` adds how it ended (ending, interrupted...).

        The sink's count and the open dead letters are read here unless given (the
        synchronous way; :meth:`end` reads them off the loop)."""
        if self._async_only and (records_in_sink is None or deadletter_reasons is None):
            self._refuse("sink and dead letters (Run.end reads them)")
        if records_in_sink is None:
            records_in_sink = self._sink.count()
        if deadletter_reasons is None:
            deadletter_reasons = self._deadletters.reasons(self.source.name)
        elapsed = max(self.clock() - self.started_at, 1e-9)
        ledger = self.ledger
        return RunSummary(
            source=self.source.name,
            run_id=self.run_id,
            role=role,
            **ledger.values(),
            balanced=ledger.balanced,
            requests=self.budget.requests,
            retries=self.budget.retries,
            retry_budget_refused=self.budget.refused,
            # per-host politeness: adaptive windows, breaker openings (docs/politeness.md)
            hosts=self.hosts,
            # sink writes and frontier acks refused by a fencing token (a newer lease holds them)
            fence_refused=ledger.stale_writes + ledger.stale_acks,
            seconds=round(elapsed, 3),
            pages_per_second=round(self.pages_answered / elapsed, 1),
            timings_s={
                "fetch": round(self.fetch_seconds, 3),
                "settle": round(self.settle_seconds, 3),
                "validation": round(self.validation_seconds, 3),
                "drain": round(self.drain_seconds, 3),
                "drain_cpu": round(self.drain_cpu_seconds, 3),
            },
            validation=self._validation_summary(),
            sink=self._sink.location(),
            records_in_sink=records_in_sink,
            frontier=self._frontier.location(),
            deadletters=self._deadletters.location(),
            deadletter_archive=str(self.source.deadletter_archive_path),
            deadletter_reasons=deadletter_reasons,
            deadletter_reasons_this_run=dict(self.new_reasons),
            key_collision=self._key_collision_example(),
            **how,
        )

    def _key_collision_example(self) -> dict[str, str]:
        if self.key_collision is None:
            return {}
        key, first, later = self.key_collision
        return {"key": key, "first_url": self.scrub.url(first), "later_url": self.scrub.url(later)}


def _per(total: float, count: int, scale: float) -> float | None:
    return round(total * scale / count, 3) if count else None


def _close_all(stores: list[Any]) -> None:
    """Close the stores that opened when another could not (their errors beside the first)."""
    for store in stores:
        with contextlib.suppress(Exception):
            store.close()


Collection = Run
"""The run's former name, kept for the tools and tests that open a run synchronously."""
