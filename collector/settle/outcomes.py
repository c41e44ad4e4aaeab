"""Each fetched item's outcome: stored, dead-lettered, or back to the queue (and when).

:func:`decide` turns a batch's fetch results into outcomes before any record is checked: a page
that failed for good or does not parse is dead-lettered, one that may succeed later goes back
(with its new rank and not-before time), one whose host's breaker was open goes back unsent
(not an attempt), one the batch had no time for goes back unchanged. The pages that parsed wait
for their records' check (:mod:`collector.settle.records`), then :func:`complete` decides them.
After the ack, :func:`count_acks` says how each outcome the frontier accepted ended.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field, replace
from typing import Any

from collector.config import Source
from collector.deadletter import DeadLetter
from collector.errors import PermanentFetchError
from collector.fetch.engine import FetchResult
from collector.frontier import Completed, DeadLettered, Lease, Outcome, RetryLater
from collector.policy.revisit_budget import RevisitSchedule
from collector.run.account import Account
from collector.settle.letters import Letters
from collector.settle.parse import RecordParser

__all__ = [
    "AckCount",
    "Decided",
    "complete",
    "completed",
    "count_acks",
    "decide",
    "retry_later",
    "scheduled",
]

Parsed = list[tuple[FetchResult, list[dict[str, Any]]]]

# handed back unsent, not an attempt (the ledger's ``deferred_by_circuit``): the host's breaker
# was open, or its 429 degrade did not sample the request (collector.fetch.pacing)
_DEFERRED = frozenset({"circuit_open", "rate_degraded"})


@dataclass(slots=True)
class Decided:
    """A batch's outcomes so far, the dead letters they need, and the pages that parsed."""

    outcomes: dict[str, Outcome] = field(default_factory=dict)
    letters: list[DeadLetter] = field(default_factory=list)
    parsed: Parsed = field(default_factory=list)
    not_modified: set[str] = field(default_factory=set)  # answered 304: nothing to write


def decide(
    results: Iterable[FetchResult],
    lease: Lease,
    *,
    now: float,
    source: Source,
    parser: RecordParser,
    letters: Letters,
) -> Decided:
    """Every result's outcome but those of parsed pages (see the module docstring)."""
    decided = Decided()
    outcomes = decided.outcomes
    enqueued = {item.url: item.enqueued_at for item in lease.items}
    for result in results:
        url = result.url
        if result.status == "not_modified":  # a 304 to its validators: fresh again, no write
            decided.not_modified.add(url)
            outcomes[url] = completed(result, source=source, now=now)
        elif result.status == "ok":
            try:
                decided.parsed.append((result, parser.parse(url, result.body, result.content_type)))
            except PermanentFetchError as error:
                decided.letters.append(letters.fetch(result, error, body=result.body))
                outcomes[url] = DeadLettered(url, result.attempts, "parse_error")
        elif result.status == "failed":
            assert result.error is not None and result.decision is not None
            if result.decision.action == "dead":
                decided.letters.append(letters.fetch(result, result.error))
                outcomes[url] = DeadLettered(url, result.attempts, result.decision.reason)
            else:
                later = now + result.decision.delay_s
                outcomes[url] = retry_later(source, result, enqueued[url], later)
        elif result.status == "deferred":  # breaker open, or 429 degrade: not an attempt
            outcomes[url] = retry_later(
                source, result, enqueued[url], result.not_before,
                count_attempt=False, reason=result.deferred_why,
            )  # fmt: skip
        else:  # skipped: the batch ran out of time before trying it
            outcomes[url] = retry_later(source, result, enqueued[url], now, count_attempt=False)
    return decided


def complete(decided: Decided, failed_items: set[str], *, source: Source, now: float) -> None:
    """The parsed pages' outcomes: dead when every record failed, else stored (fresh_s on)."""
    for result, _ in decided.parsed:
        url = result.url
        if url in failed_items:
            decided.outcomes[url] = DeadLettered(url, result.attempts, "validation")
        else:
            decided.outcomes[url] = completed(result, source=source, now=now)


def completed(result: FetchResult, *, source: Source, now: float) -> Completed:
    """A page settled done: fresh for its TTL, its validators kept for the next fetch."""
    return Completed(
        result.url,
        now + source.ttl.fresh_for(result.url),
        now,
        cost=len(result.body) / 1024,
        etag=result.etag,
        last_modified=result.last_modified,
    )


def scheduled(
    decided: Decided,
    lease: Lease,
    written_urls: Set[str],
    schedule: RevisitSchedule,
    *,
    now: float,
) -> None:
    """Every page settled done gets its next due time and its history (the settle step, after
    the sink write): a page changed when the sink wrote a record of it, not when every record
    was unchanged or the server answered 304. ``schedule`` decides (collector.policy.
    revisit_budget): the fixed TTL rules, or the learned intervals of ``ttl.revisit:
    adaptive``."""
    before = {item.url: item.history for item in lease.items}
    for url, outcome in decided.outcomes.items():
        if not isinstance(outcome, Completed):
            continue
        changed = url not in decided.not_modified and url in written_urls
        fresh_s, history = schedule.settled(url, before.get(url), at=now, changed=changed)
        decided.outcomes[url] = replace(outcome, fresh_until=now + fresh_s, history=history)


def retry_later(
    source: Source,
    result: FetchResult,
    enqueued_at: float,
    not_before: float,
    *,
    count_attempt: bool = True,
    reason: str | None = None,
) -> RetryLater:
    """Back to the queue at ``not_before``, ranked as the source's priority says."""
    fresh_s = source.ttl.fresh_for(result.url)
    rank = source.priority.rank_for(
        result.url, enqueued_at=enqueued_at, age_s=None, fresh_s=fresh_s, retries=result.attempts
    )
    error = result.decision.reason if (result.decision and count_attempt) else "batch_time"
    error = reason or error
    return RetryLater(result.url, not_before, rank, result.attempts, result.first_attempt_at, error)


@dataclass(frozen=True, slots=True)
class AckCount:
    """How the outcomes the frontier accepted ended: the batch's part of the account (items
    stored, not modified, dead, returned, deferred, stale; attempts retried), dead letters by
    reason, and the returned items the batch had no time to try."""

    account: Account
    reasons: dict[str, int]
    skipped: int = 0


def count_acks(
    outcomes: Mapping[str, Outcome],
    stale: Iterable[str],
    not_modified: Set[str] = frozenset(),
) -> AckCount:
    """Count each outcome once, by how it ended; outcomes refused as stale count nowhere
    else."""
    refused = set(stale)
    stored = fresh_again = dead = returned = deferred = retried = skipped = 0
    reasons: dict[str, int] = {}
    for url, outcome in outcomes.items():
        if url in refused:
            continue
        if isinstance(outcome, Completed) and url in not_modified:
            fresh_again += 1
        elif isinstance(outcome, Completed):
            stored += 1
        elif isinstance(outcome, DeadLettered):
            dead += 1
            reasons[outcome.error] = reasons.get(outcome.error, 0) + 1
        elif outcome.error in _DEFERRED:
            deferred += 1
        else:
            returned += 1
            if outcome.error == "batch_time":
                skipped += 1
            else:
                retried += 1
    part = Account(
        stored=stored, not_modified=fresh_again, dead_lettered=dead, returned=returned,
        deferred_by_circuit=deferred, stale_acks=len(refused), retried=retried,
    )  # fmt: skip
    return AckCount(part, reasons, skipped)
