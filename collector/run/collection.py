"""One collect run of one source, step by step, without Prefect.

:class:`Collection` owns the run's backends (frontier, sink, dead letters, validator) and its
ledger, and exposes the pipeline as steps the Prefect flow calls in order::

    plan() -> claim() -> fetch() -> settle() -> ... -> finish()

Keeping the steps here, in plain Python, lets the engine be tested without a Prefect server and
keeps ``flows/collect.py`` down to orchestration (tasks, timeouts, retries, artifacts).

Where an item's outcome is decided (``settle``): records are parsed, keyed and validated; the
good ones are written to the sink under the lease's fencing token *before* the frontier is told
(so a crash between the two only causes a refetch, and the idempotent sink writes nothing
twice); failures are put in the dead letters before their items are marked dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any, TypeVar

from collector.backends import open_deadletters, open_frontier, open_sink
from collector.config import Source
from collector.deadletter import DeadLetter, DeadLetterStore
from collector.deadletter.base import url_digest, without_userinfo
from collector.errors import FetchError, PermanentFetchError, RecoverableFetchError
from collector.fetch.engine import FetchEngine, FetchResult
from collector.frontier import (
    Completed,
    DeadLettered,
    Frontier,
    Lease,
    Offer,
    OfferResult,
    Outcome,
    RetryLater,
    SweepResult,
)
from collector.ops import metrics, observability, tracing
from collector.ops.scrub import Scrubber
from collector.policy.retry import RetryBudget
from collector.policy.urls import HostPolicy
from collector.run.ledger import Ledger
from collector.run.replan import LiftedRefusals
from collector.run.seedlist import (
    ListChange,
    ListCopies,
    ListCopy,
    list_change,
    listed_digest,
    named_in,
)
from collector.run.seeds import SeedCheck, range_change
from collector.run.summary import Role, RunSummary
from collector.settle.parse import RecordParser, dotted_get
from collector.sinks import Sink, SinkRecord

if TYPE_CHECKING:
    from collector.settle.validation_worker import ValidationWorker

__all__ = ["BatchReport", "Collection"]

_T = TypeVar("_T")
_log = logging.getLogger(__name__)
# Record keys a run remembers to count key collisions (~80 bytes each): a run of millions of
# records stays in bounded memory; later keys are still checked against the remembered ones.
KEYS_REMEMBERED = 1_000_000
_BODY_EXCERPT = 2048  # bytes of a failing body kept in its dead letter
_REFUSED_CHUNK = 500  # refused seeds written to the dead letters at a time (bounded memory)


@dataclass(slots=True)
class BatchReport:
    """What one batch did, for progress displays and artifacts."""

    token: int
    items: int
    stored: int = 0
    dead_lettered: int = 0
    retry_later: int = 0
    skipped: int = 0
    deferred_by_circuit: int = 0  # sent back unsent: the host's circuit breaker was open
    stale: int = 0
    records_written: int = 0
    records_unchanged: int = 0
    records_quarantined: int = 0
    stale_writes: int = 0
    validation_s: float = 0.0
    reasons: dict[str, int] = field(default_factory=dict)
    windows: dict[str, int] = field(default_factory=dict)  # host -> adaptive window, at fetch


class Collection:
    """The state of one run. Open with ``with Collection(source, run_id=...) as run``."""

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
        self.frontier = frontier or open_frontier(source)
        self.sink = sink or open_sink(source)
        self.deadletters = deadletters or open_deadletters(source)
        self.ledger = Ledger()
        self.errors = observability.DeadLetterReporter(source.name, run_id)
        self.traces = tracing.BatchTraces(source.name)  # a span per batch (collector.ops.tracing)
        self.parser = RecordParser(
            parser=source.record.parser, records_path=source.record.records_path
        )
        self.budget = RetryBudget(
            ratio=source.retry.budget_ratio, min_retries=source.retry.budget_min
        )
        self._validator: ValidationWorker | None = None
        self._engines: list[FetchEngine] = []
        self.halted = False
        self.started_at = clock()
        self.fetch_seconds = 0.0
        self.settle_seconds = 0.0
        self.validation_seconds = 0.0
        self.drain_seconds = 0.0  # the run loop's (collector.run.drain), and its process CPU
        self.drain_cpu_seconds = 0.0
        self.records_validated = 0
        self.pages_ok = 0
        self.replanned = 0  # open plan refusals closed because the policy allows them now
        self.renewed = 0  # queued items past their queue TTL that the plan asked for again
        self.hosts: dict[str, Any] = {}  # the engine's view of hosts after the last fetch
        # hash(record key) -> URL of the page whose record of that key this run stored last:
        # a later record with the same key from another page is a key collision. One entry per
        # distinct key of the run (~80 bytes measured; the URL string is the page's own).
        self._run_keys: dict[int, str] = {}
        self.key_collision: tuple[str, str, str] | None = None  # (key, first URL, later URL)
        self.keys_forgotten = False  # more distinct keys than KEYS_REMEMBERED: counted among those

    def __enter__(self) -> Collection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def aclose(self) -> None:
        """Stop the validation worker (the backends close with :meth:`close`)."""
        if self._validator is not None:
            await self._validator.aclose()

    def close(self) -> None:
        for backend in (self.sink, self.frontier, self.deadletters):
            with contextlib.suppress(Exception):
                backend.close()

    def engine(self) -> FetchEngine:
        storage = self.source.resolve_env(
            self.source.limits.rate_storage, field="limits.rate_storage"
        )
        engine = FetchEngine.for_source(
            self.source, rate_storage_uri=storage, circuit_storage_uri=self._shared_redis(storage)
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
        """The source's suite in a worker process, started on first use (see validation_worker)."""
        if self._validator is None and self.source.suite_path is not None:
            from collector.settle.validation_worker import ValidationWorker

            self._validator = ValidationWorker(self.source.suite_path)
        return self._validator

    # --- plan ----------------------------------------------------------------------------------
    def plan(self) -> Ledger:
        """Take the run's items into its account (see collector.run.ledger for the terms).

        An unchanged seed list (its :meth:`~collector.config.Source.seed_mark` is the one the
        frontier kept from the last finished plan) is not offered again: only the items that
        are due join the run (:meth:`Frontier.adopt`). A template whose range alone changed
        offers only the numbers the range gained, settles the URLs of the numbers it lost
        (:meth:`Frontier.unlist`) and adopts the rest (a ``difference`` plan). Otherwise every
        seed is streamed to the frontier in chunks (constant memory: repeats are told apart by
        the run's tag), and items queued by earlier plans that the list no longer names are
        retired or carried over (``seeds.on_removed``). Malformed or forbidden seeds go to the
        dead letters in chunks. The mark is cleared first and stored last, so a plan cut short
        is done in full next time.
        """
        if self.validator is not None:
            self.validator.start()  # GX imports in the worker while we plan
        now = self.clock()
        source, name, ledger = self.source, self.source.name, self.ledger
        ttl, priority = source.ttl, source.priority

        new_ranks: dict[float, float] = {}  # without rules, a new URL's rank is fresh_s's

        def rank_for(url: str, age_s: float | None, fresh_s: float) -> float:
            if age_s is None and not priority.rules:
                known = new_ranks.get(fresh_s)
                if known is None:
                    known = new_ranks[fresh_s] = priority.rank_for(
                        url, enqueued_at=now, age_s=None, fresh_s=fresh_s
                    )
                return known
            return priority.rank_for(url, enqueued_at=now, age_s=age_s, fresh_s=fresh_s)

        def adopt() -> OfferResult:
            return self.frontier.adopt(
                name,
                self.frontier_tag,
                now=now,
                queue_ttl_s=ttl.queue_ttl_s,
                rank_for=rank_for,
                fresh_for=ttl.fresh_for,
            )

        # leftovers of an earlier run are asked for again, not expired by this run's first claim
        self.renewed = self.frontier.renew_queue_ttl(name, now=now, queue_ttl_s=ttl.queue_ttl_s)
        mark = source.seed_mark()
        stored = self.frontier.plan_mark(name)
        if stored == mark:
            ledger.plan = "incremental"
            ledger.discovered = adopt().total
            return ledger

        self.frontier.set_plan_mark(name, None)
        retire = source.seeds.on_removed == "retire"
        copies, listed = None, None
        head = source.seed_list_head()
        if head is not None:  # the plan reads a copy of the list, kept for the next difference
            copies = ListCopies(source.state_path / "seedlists" / name)
            listed = copies.write(source.seed_list_blocks(head))
            mark = source.seed_mark(list_digest=listed.digest)
        swept = SweepResult()
        if (range_diff := range_change(stored, mark)) is not None:
            # settle the URLs that left first: then the adopt below leaves them alone
            for gone in range_diff.removed:
                swept += self.frontier.unlist(
                    name, source.template_urls(gone.start, gone.stop), self.frontier_tag,
                    retire=retire,
                )  # fmt: skip
            added = (source.template_urls(r.start, r.stop) for r in range_diff.added)
            # the policy is unchanged and every refused number is still listed: nothing lifts
            result = self._offer_seeds(chain.from_iterable(added), now, rank_for, left=set())
            ledger.discovered += adopt().total  # the unchanged part, as an unchanged plan takes it
            ledger.plan = "difference"
        elif (list_diff := self._list_change(copies, listed, stored, mark)) is not None:
            assert listed is not None
            # a refusal lifts only when its refused form left the list (the shared lines are
            # not offered, so a form still listed there would not be refused again)
            dropped = list_diff.removed
            left = {url_digest(u) for u in dropped} | {without_userinfo(u) for u in dropped}
            result = self._offer_seeds(
                listed.urls(*list_diff.added), now, rank_for, left=left, listed=listed
            )
            # after the offer: a URL that moved within the list is the run's now, and unlist
            # leaves the run's items alone
            swept = self.frontier.unlist(
                name, iter(list_diff.removed), self.frontier_tag, retire=retire
            )
            ledger.discovered += adopt().total
            ledger.plan = "difference"
        else:
            result = self._offer_seeds(
                listed.urls() if listed else source.seed_urls(), now, rank_for
            )
            swept = self.frontier.sweep(name, self.frontier_tag, retire=retire)
            ledger.plan = "full"
        if copies is not None and listed is not None:
            copies.keep(listed)
        self.frontier.set_plan_mark(name, mark)
        ledger.duplicates = result.duplicates
        ledger.discovered -= result.duplicates
        ledger.fresh_skipped = result.fresh_skipped
        ledger.already_dead = result.already_dead
        ledger.dead_lettered += result.already_dead
        ledger.unlisted = swept.carried + swept.retired
        ledger.carried_over = swept.carried
        ledger.retired = swept.retired
        return ledger

    @staticmethod
    def _list_change(
        copies: ListCopies | None, listed: ListCopy | None, stored: str | None, mark: str
    ) -> ListChange | None:
        """What an edit of the listed seeds changed, when the last plan's copy is here."""
        kept_digest = listed_digest(stored, mark)
        if copies is None or listed is None or kept_digest is None:
            return None
        kept = copies.kept(kept_digest)
        return None if kept is None else list_change(kept, listed)

    def _offer_seeds(
        self,
        seeds: Iterable[str],
        now: float,
        rank_for: Callable[[str, float | None, float], float],
        *,
        left: set[str] | None = None,
        listed: ListCopy | None = None,
    ) -> OfferResult:
        """Check and offer ``seeds`` (streamed), counting each in ``discovered``; refused ones
        go to the dead letters, 500 at a time.

        A difference plan offers part of the list: ``left`` are the keys of the URLs that left
        it (collector.run.replan.LiftedRefusals), ``listed`` the whole new list, read for the
        lifted refusals' URLs when some are pending."""
        source, name, ledger = self.source, self.source.name, self.ledger
        ttl = source.ttl
        check = SeedCheck(
            HostPolicy(
                allow_private_networks=source.allow_private_networks,
                allowed_hosts=source.limits.allowed_hosts,
            )
        )
        fresh_for = ttl.fresh_for if (ttl.rules or ttl.hook) else None
        default_fresh = ttl.default_fresh_s
        refused: list[DeadLetter] = []
        lifted = LiftedRefusals(self.deadletters, name, check.refusal, left=left)

        def put_refused() -> None:
            self.deadletters.put(refused)
            self.errors.report(refused)
            metrics.count_dead_letters(name, refused)
            ledger.refused_at_plan += len(refused)
            ledger.dead_lettered += len(refused)
            refused.clear()

        def offers() -> Iterator[Offer]:
            refusal, lifting = check.refusal, bool(lifted.pending)  # per-URL work kept short
            for url in seeds:
                ledger.discovered += 1
                try:
                    reason = refusal(url)
                except RecoverableFetchError:
                    reason = None  # DNS may recover: let the fetch step retry it
                if reason is not None:
                    refused.append(self._dead_letter(url, "plan", "refused_url", reason, 0))
                    if len(refused) >= _REFUSED_CHUNK:
                        put_refused()
                    continue
                if lifting:
                    lifted.offered(url)
                yield Offer(url, fresh_for(url) if fresh_for else default_fresh)

        result = self.frontier.offer(
            name,
            offers(),
            now=now,
            queue_ttl_s=ttl.queue_ttl_s,
            rank_for=rank_for,
            run_id=self.frontier_tag,
            once_per_run=True,
        )
        put_refused()
        if listed is not None and lifted.pending:  # a difference plan: unchanged lines count
            plain = {without_userinfo(entry.url) for entry in lifted.pending.values()}
            for url in named_in(listed, plain):
                lifted.offered(url)
        self.replanned = lifted.resolve()  # old refusals of URLs allowed now (collector.run.replan)
        return result

    # --- claim and fetch -----------------------------------------------------------------------
    def claim(self, limit: int) -> Lease:
        began, began_ns = time.monotonic(), time.time_ns()
        lease = self.frontier.claim(
            self.source.name,
            limit,
            now=self.clock(),
            lease_s=self.source.ttl.lease_s,
            holder=self.run_id,
        )
        metrics.claimed(self.source.name, time.monotonic() - began, lease.reclaimed)
        self.traces.claimed(lease, began_ns)
        self.sample_frontier()
        self.ledger.leases_reclaimed += lease.reclaimed
        self.ledger.claimed += len(lease.items)
        return lease

    def keep_alive(self, lease: Lease) -> asyncio.Task[None]:
        """Renew ``lease`` every ``lease_s / 3`` until the returned task is cancelled.

        Held from claim to ack, so a batch whose settling waits behind the next fetch keeps
        its items.
        """
        ttl = self.source.ttl

        async def keep_renewing() -> None:
            while True:
                await asyncio.sleep(ttl.renew_every_s)
                self.frontier.renew(lease, now=self.clock(), lease_s=ttl.lease_s)
                metrics.lease_renewed(self.source.name)

        return asyncio.create_task(keep_renewing(), name=f"renew-lease-{lease.token}")

    async def fetch(
        self, engine: FetchEngine, lease: Lease, host_slots: dict[str, int] | None = None
    ) -> list[FetchResult]:
        """Fetch a leased batch (the caller holds the lease with :meth:`keep_alive`).

        ``host_slots`` caps the batch's requests in flight per host (shared domain limits).
        """
        began = time.monotonic()
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
            self.fetch_seconds += time.monotonic() - began
            if engine.tally is not None:
                engine.tally.flush(self.source.name)
            self.hosts = engine.host_report()

    def release(self, lease: Lease) -> int:
        """Give a batch back unchanged (its task failed for good)."""
        self.ledger.released += len(lease.items)  # given back, or already taken by another
        self.traces.released(lease)
        return self.frontier.release(lease, now=self.clock())

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
        now = self.clock()
        report = BatchReport(token=lease.token, items=len(lease.items))
        outcomes: dict[str, Outcome] = {}
        letters: list[DeadLetter] = []
        parsed: list[tuple[FetchResult, list[dict[str, Any]]]] = []
        claimed = {item.url: item for item in lease.items}

        for result in results:
            if result.status == "ok":
                self.pages_ok += 1
                try:
                    parsed.append((result, self.parser.parse(result.url, result.body)))
                except PermanentFetchError as error:
                    letters.append(self._fetch_letter(result, error, body=result.body))
                    outcomes[result.url] = DeadLettered(result.url, result.attempts, "parse_error")
            elif result.status == "failed":
                assert result.error is not None and result.decision is not None
                if result.decision.action == "dead":
                    letters.append(self._fetch_letter(result, result.error))
                    outcomes[result.url] = DeadLettered(
                        result.url, result.attempts, result.decision.reason
                    )
                else:
                    outcomes[result.url] = self._retry_later(
                        result, claimed[result.url].enqueued_at, now + result.decision.delay_s
                    )
            elif result.status == "deferred":  # the host's breaker is open: not an attempt
                report.deferred_by_circuit += 1
                outcomes[result.url] = self._retry_later(
                    result, claimed[result.url].enqueued_at, result.not_before,
                    count_attempt=False, reason="circuit_open",
                )  # fmt: skip
            else:  # skipped: the batch ran out of time before trying it
                report.skipped += 1
                outcomes[result.url] = self._retry_later(
                    result, claimed[result.url].enqueued_at, now, count_attempt=False
                )

        good, failed_items = await self._key_and_validate(parsed, letters, report)
        if after is not None:
            waiting = time.monotonic()
            await asyncio.shield(after)
            self.settle_seconds -= time.monotonic() - waiting  # not this batch's work
        for result, _ in parsed:
            if result.url in failed_items:
                outcomes[result.url] = DeadLettered(result.url, result.attempts, "validation")
            else:
                fresh_s = self.source.ttl.fresh_for(result.url)
                outcomes[result.url] = Completed(
                    result.url, now + fresh_s, now, cost=len(result.body) / 1024
                )

        batch_id = f"{self.run_id}:{lease.token}"
        with self.traces.step("store"):
            written = self.sink.write(good, token=lease.token, batch_id=batch_id)
        report.records_written = written.written
        report.records_unchanged = written.unchanged
        report.stale_writes = written.stale
        self.ledger.records_written += written.written
        self.ledger.records_unchanged += written.unchanged
        self.ledger.stale_writes += written.stale
        self._count_key_collisions(good, written.stale_keys)
        self.deadletters.put(letters)
        self.errors.report(letters)
        metrics.count_dead_letters(self.source.name, letters)

        with self.traces.step("ack"):
            acked = self.frontier.ack(lease, list(outcomes.values()), now=self.clock())
        stale = set(acked.stale)
        report.stale = len(stale)
        self.ledger.stale_acks += len(stale)
        for url, outcome in outcomes.items():
            if url in stale:
                continue
            if isinstance(outcome, Completed):
                report.stored += 1
            elif isinstance(outcome, DeadLettered):
                report.dead_lettered += 1
                report.reasons[outcome.error] = report.reasons.get(outcome.error, 0) + 1
            elif outcome.error == "circuit_open":
                self.ledger.deferred_by_circuit += 1
            else:
                self.ledger.returned += 1
                if outcome.error != "batch_time":
                    report.retry_later += 1
        self.ledger.stored += report.stored
        self.ledger.dead_lettered += report.dead_lettered
        self.ledger.retried += report.retry_later
        self.ledger.records_quarantined += report.records_quarantined
        self.ledger.batches += 1
        report.windows = dict(self.hosts.get("windows", {}))
        return report

    async def _key_and_validate(
        self,
        parsed: list[tuple[FetchResult, list[dict[str, Any]]]],
        letters: list[DeadLetter],
        report: BatchReport,
    ) -> tuple[list[SinkRecord], set[str]]:
        """Key every record, run the suite over the batch, and split good from bad.

        Returns the good sink records and the URLs of items all of whose records failed (those
        items are dead-lettered; the others are stored).
        """
        key_path = self.source.record.key
        candidates: list[tuple[FetchResult, str, dict[str, Any]]] = []
        bad_per_item: dict[str, int] = {}
        total_per_item: dict[str, int] = {}
        for result, records in parsed:
            total_per_item[result.url] = len(records)
            for record in records:
                key = dotted_get(record, key_path, None)
                if key is None or isinstance(key, (dict, list)) or key == "":
                    letters.append(
                        self._record_letter(
                            result,
                            record,
                            "missing_key",
                            f"record has no usable key at {key_path!r}",
                        )
                    )
                    bad_per_item[result.url] = bad_per_item.get(result.url, 0) + 1
                    continue
                candidates.append((result, str(key), record))

        keep = [True] * len(candidates)
        validator = self.validator
        if validator is not None and candidates:
            waiting = time.monotonic()
            with self.traces.step("validate"):
                outcome = await validator.validate([record for _, _, record in candidates])
            self.settle_seconds -= time.monotonic() - waiting  # the worker's time, not ours
            report.validation_s = outcome.seconds
            self.validation_seconds += outcome.seconds
            self.records_validated += len(candidates)
            if outcome.table_failures:
                failed = [_expectation_dict(f) for f in outcome.table_failures]
                names = ", ".join(f.expectation for f in outcome.table_failures)
                for index, (result, key, record) in enumerate(candidates):
                    keep[index] = False
                    letters.append(
                        self._record_letter(
                            result,
                            record,
                            "table_expectation",
                            f"batch failed {names}",
                            key=key,
                            failed=failed,
                        )
                    )
            for row in outcome.bad:
                if not keep[row.index]:
                    continue
                keep[row.index] = False
                result, key, record = candidates[row.index]
                failed = [_expectation_dict(f) for f in row.failed]
                message = "; ".join(f.message for f in row.failed)[:500]
                letters.append(
                    self._record_letter(result, record, "schema", message, key=key, failed=failed)
                )
        good: list[SinkRecord] = []
        for index, (result, key, record) in enumerate(candidates):
            if keep[index]:
                good.append(SinkRecord(key, record, result.url))
            else:
                bad_per_item[result.url] = bad_per_item.get(result.url, 0) + 1
        report.records_quarantined = sum(bad_per_item.values())
        failed_items = {
            url for url, bad in bad_per_item.items() if bad and bad == total_per_item[url]
        }
        return good, failed_items

    def _count_key_collisions(self, good: list[SinkRecord], refused: list[str]) -> None:
        """Count the records that replaced, in the sink, an earlier record of this run.

        The sink keeps one record per key (an idempotent upsert), so two pages yielding the
        same key in one run leave only the later one. Counted: a key seen earlier in this batch
        (from any page, the same one included), or in an earlier batch from another page (the
        same page stored again, after its lease passed to a new claim, is no collision).
        Records the fence refused replaced nothing.
        """
        if not good:
            return
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
                self.ledger.key_collisions += 1
                if self.key_collision is None:
                    self.key_collision = (key, earlier, url)
            batch[key] = url
        for key, url in batch.items():
            if len(seen) < KEYS_REMEMBERED or hash(key) in seen:
                seen[hash(key)] = url
            else:  # bounded memory: keys after the first KEYS_REMEMBERED are checked, not kept
                self.keys_forgotten = True

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

    # --- helpers -------------------------------------------------------------------------------
    def _retry_later(
        self,
        result: FetchResult,
        enqueued_at: float,
        not_before: float,
        *,
        count_attempt: bool = True,
        reason: str | None = None,
    ) -> RetryLater:
        fresh_s = self.source.ttl.fresh_for(result.url)
        rank = self.source.priority.rank_for(
            result.url,
            enqueued_at=enqueued_at,
            age_s=None,
            fresh_s=fresh_s,
            retries=result.attempts,
        )
        error = result.decision.reason if (result.decision and count_attempt) else "batch_time"
        error = reason or error
        return RetryLater(
            result.url, not_before, rank, result.attempts, result.first_attempt_at, error
        )

    def _dead_letter(
        self,
        url: str,
        stage: str,
        error_class: str,
        message: str,
        attempts: int,
        *,
        key: str = "",
        payload: Any = None,
        failed: list[dict[str, Any]] | None = None,
        cause: str = "",
    ) -> DeadLetter:
        now = self.clock()
        letter = DeadLetter(
            source=self.source.name,
            url=self.scrub.url(url),
            stage=stage,  # type: ignore[arg-type]
            error_class=error_class,
            message=self.scrub.text(message),
            attempts=attempts,
            first_seen=now,
            last_seen=now,
            record_key=key,
            payload=self.scrub(payload),
            failed_expectations=failed or [],
            flow_run_id=self.run_id,
            cause=cause,
            trace_id=tracing.trace_id_of_current(),  # the batch's trace (the plan's at plan)
            url_digest=url_digest(url),  # the real URL, matchable once scrubbed (run/replan.py)
        )
        tracing.dead_letter_event(letter)
        return letter

    def _fetch_letter(
        self, result: FetchResult, error: FetchError, *, body: bytes = b""
    ) -> DeadLetter:
        payload: dict[str, Any] = {"http_status": result.http_status}
        if body:
            payload["body_excerpt"] = body[:_BODY_EXCERPT].decode("utf-8", "replace")
            payload["body_bytes"] = len(body)
        return self._dead_letter(
            result.url,
            error.stage,
            error.error_class,
            str(error),
            result.attempts,
            payload=payload,
            cause=result.decision.cause if result.decision else "",
        )

    def _record_letter(
        self,
        result: FetchResult,
        record: dict[str, Any],
        error_class: str,
        message: str,
        *,
        key: str = "",
        failed: list[dict[str, Any]] | None = None,
    ) -> DeadLetter:
        return self._dead_letter(
            result.url,
            "validate",
            error_class,
            message,
            result.attempts,
            key=key,
            payload=record,
            failed=failed,
        )

    # --- finish --------------------------------------------------------------------------------
    def sample_frontier(self, *, force: bool = False) -> None:
        """Frontier depth and backlog gauges, at most every METRICS_SAMPLE_S (metrics on)."""
        metrics.sample_frontier(
            self.source.name, self.frontier, self.source.backlog, now=self.clock(), force=force
        )

    def seconds_until_claimable(self) -> float | None:
        """How long until something may be claimable; None when nothing is pending."""
        now = self.clock()
        at = self.frontier.next_event_at(self.source.name, now=now)
        return None if at is None else max(0.0, at - now)

    def finish(self, *, planned: bool = True) -> Ledger:
        """Close the books: read the end state and check conservation (see collector.run.ledger).

        A drain-only worker (``planned=False``) checks only what it claimed.
        """
        self.sample_frontier(force=True)
        if planned:
            self.ledger.close(self.frontier.run_counts(self.source.name, self.frontier_tag))
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

    def summary(self, *, role: Role = "run", **how: Any) -> RunSummary:
        """The run's :class:`RunSummary`; ``how`` adds how it ended (ending, interrupted...)."""
        elapsed = max(self.clock() - self.started_at, 1e-9)
        ledger = self.ledger
        counts = {
            name: getattr(ledger, name)
            for name in RunSummary.__dataclass_fields__
            if name in Ledger.__dataclass_fields__ and name not in ("problems", "requests")
        }
        return RunSummary(
            source=self.source.name,
            run_id=self.run_id,
            role=role,
            **counts,
            balanced=ledger.balanced,
            problems=tuple(ledger.problems),
            requests=self.budget.requests,
            retries=self.budget.retries,
            retry_budget_refused=self.budget.refused,
            # per-host politeness: adaptive windows, breaker openings (docs/politeness.md)
            hosts=self.hosts,
            # sink writes and frontier acks refused by a fencing token (a newer lease holds them)
            fence_refused=ledger.stale_writes + ledger.stale_acks,
            seconds=round(elapsed, 3),
            pages_per_second=round(self.pages_ok / elapsed, 1),
            timings_s={
                "fetch": round(self.fetch_seconds, 3),
                "settle": round(self.settle_seconds, 3),
                "validation": round(self.validation_seconds, 3),
                "drain": round(self.drain_seconds, 3),
                "drain_cpu": round(self.drain_cpu_seconds, 3),
            },
            validation=self._validation_summary(),
            sink=self.sink.location(),
            records_in_sink=self.sink.count(),
            frontier=self.frontier.location(),
            deadletters=self.deadletters.location(),
            deadletter_archive=str(self.source.deadletter_archive_path),
            deadletter_reasons=self.deadletters.reasons(self.source.name),
            replanned=self.replanned,
            renewed=self.renewed,
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


def _expectation_dict(failed: Any) -> dict[str, Any]:
    return {
        "expectation": failed.expectation,
        "column": failed.column,
        "kwargs": failed.kwargs,
        "message": failed.message,
    }
