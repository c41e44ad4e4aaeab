"""The frontier: a persistent priority queue of URLs with leased claims.

Every URL of a source has one row and one state::

    queued ──claim──▶ leased ──ack: completed──▶ done ──(freshness passes, next plan)──▶ queued
      ▲  │ │            │ ├──ack: retry later──▶ queued (not before T, attempts + 1)
      │  │ │            │ └──ack: dead─────────▶ dead   (until triage re-enqueues it,
      │  │ │            │                                or revives it as done: record repaired)
      │  │ └─queue TTL──▶ expired ──(next plan)──▶ queued
      │  └─seed list no longer lists it, on_removed: retire──▶ retired ──(listed again)──▶ queued
      └──lease expired (holder died)──┘

Planning comes in three shapes. A plan of a *changed* seed list offers every seed
(:meth:`Frontier.offer` with ``once_per_run``, which needs no memory per URL: a URL already
tagged with the run is a duplicate) and then settles the items queued by earlier plans that the
new list no longer names (:meth:`Frontier.sweep`: retired, or carried into this run to be
collected). When only a template's range changed, a plan offers the URLs that joined the list,
:meth:`Frontier.unlist` settles the ones that left it the same way, and the rest is adopted as
below. A plan of an *unchanged* seed list (the seed mark kept by :meth:`Frontier.plan_mark` is
the same) offers nothing: :meth:`Frontier.adopt` takes the items that are due (queued, leased,
expired, or done whose freshness ran out: the last two through an index by due time) into the
run, so its cost is that of the due items, not of the seed list.

A claim takes the best-ranked due items as a *lease*: the items are invisible to other claims
until the lease expires or is acked, and the lease carries a *fencing token*, a number from a
store-wide counter that only grows. Acks and sink writes present the token; an ack whose token is
no longer the item's (the lease expired and someone else claimed it) is refused and reported as
stale, so a worker that paused past its lease cannot overwrite the new holder's outcome.

Backends implement :class:`Frontier`; the decision of what *planning* does with a URL is the
same for all of them (:func:`plan_decision`), so only storage differs. Every backend passes
``tests/frontier/conformance.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

__all__ = [
    "AckResult",
    "ClaimedItem",
    "Completed",
    "DeadLettered",
    "Frontier",
    "Holder",
    "ItemState",
    "Lease",
    "Offer",
    "OfferResult",
    "Outcome",
    "PageHistory",
    "RetryLater",
    "StateCounts",
    "StoredRow",
    "SweepResult",
    "plan_decision",
]

ItemState = Literal["queued", "leased", "done", "dead", "expired", "retired"]
STATES: tuple[ItemState, ...] = ("queued", "leased", "done", "dead", "expired", "retired")


class Offer(NamedTuple):
    """A URL the planner wants collected (a named tuple: a plan makes one per seed, and a tuple
    is made three times faster than a frozen dataclass)."""

    url: str
    fresh_s: float  # freshness TTL that applies to this URL (used for its urgency)


class StoredRow(NamedTuple):
    """What planning needs to know about a URL already in the frontier (a named tuple: a plan
    that lists known URLs again makes one per URL)."""

    state: ItemState
    fresh_until: float | None
    last_fetched_at: float | None


PlanAction = Literal["enqueue", "requeue", "fresh", "already_queued", "already_dead"]


def plan_decision(row: StoredRow | None, now: float) -> PlanAction:
    """What planning does with one URL, given its stored row (the same for every backend)."""
    if row is None:
        return "enqueue"
    if row.state in ("queued", "leased"):
        return "already_queued"
    if row.state == "dead":
        return "already_dead"
    if row.state == "done" and row.fresh_until is not None and row.fresh_until > now:
        return "fresh"
    return "requeue"  # done but stale, expired, or retired and listed again


@dataclass(slots=True)
class OfferResult:
    """Counts of what planning did with the offered URLs (they sum to the number offered)."""

    enqueued: int = 0  # new, stale or previously expired: queued now
    already_queued: int = 0  # queued or leased before this plan (not queued twice)
    fresh_skipped: int = 0
    already_dead: int = 0  # in the dead letters, waiting for triage
    # offered again in the same run (``once_per_run``): already counted, nothing done
    duplicates: int = 0

    @property
    def total(self) -> int:
        return (
            self.enqueued
            + self.already_queued
            + self.fresh_skipped
            + self.already_dead
            + self.duplicates
        )


@dataclass(slots=True)
class SweepResult:
    """What :meth:`Frontier.sweep` did with items an earlier plan queued and the list dropped."""

    carried: int = 0  # tagged with this run, to be collected by it (or leased by a helper)
    retired: int = 0  # queued ones moved to ``retired`` (tagged with this run)

    def __add__(self, other: SweepResult) -> SweepResult:
        return SweepResult(self.carried + other.carried, self.retired + other.retired)


@dataclass(frozen=True, slots=True)
class PageHistory:
    """What a page's fetches saw, as the change-rate estimator needs it
    (collector.policy.revisit_budget): kept with the item by every frontier, handed back by its
    claim, replaced by its ``Completed`` ack.

    ``fetches`` counts every settled fetch (stored, unchanged or 304); an *observation* is the
    interval between two of them, ``changes`` those that ended in a changed page, ``observed_s``
    and ``changed_s`` their lengths (all and changed ones). The last ``HISTORY_WINDOW``
    observations weigh most: past it the four sums are scaled down together (so they may hold
    fractions), and a page whose rate moves (a burst) is followed. ``rate`` is the estimate
    made from them when the history was last written (changes per second; 0.0: none yet).
    """

    fetches: int = 0
    changes: float = 0.0
    observed: float = 0.0
    observed_s: float = 0.0
    changed_s: float = 0.0
    last_fetched_at: float | None = None
    last_changed_at: float | None = None
    rate: float = 0.0

    def encode(self) -> str:
        """The stored text (every backend keeps this string): fields comma-separated, numbers
        exact (``repr``), '' for None."""
        return ",".join("" if v is None else repr(v) for v in _history_fields(self))

    @classmethod
    def decode(cls, text: str | bytes | None) -> PageHistory | None:
        """The history kept as ``text``; None for none (or a text of another layout)."""
        if not text:
            return None
        if isinstance(text, bytes):
            text = text.decode()
        parts = text.split(",")
        if len(parts) != 8:
            return None
        fetches, changes, observed, observed_s, changed_s, last, last_changed, rate = parts
        return cls(
            int(fetches),
            float(changes),
            float(observed),
            float(observed_s),
            float(changed_s),
            float(last) if last else None,
            float(last_changed) if last_changed else None,
            float(rate),
        )


def _history_fields(h: PageHistory) -> tuple[object, ...]:
    return (
        h.fetches,
        h.changes,
        h.observed,
        h.observed_s,
        h.changed_s,
        h.last_fetched_at,
        h.last_changed_at,
        h.rate,
    )


@dataclass(frozen=True, slots=True)
class ClaimedItem:
    url: str
    attempts: int  # attempts made before this claim (across batches and runs)
    first_attempt_at: float | None
    enqueued_at: float
    # The validators of the page the sink holds (its last ``Completed`` ack), sent back as
    # If-None-Match / If-Modified-Since (collector.fetch.conditional); None: none known
    etag: str | None = None
    last_modified: str | None = None
    history: PageHistory | None = None  # what its fetches saw so far; None: never settled


@dataclass(frozen=True, slots=True)
class Lease:
    """A claim on a batch of items, valid until ``expires_at`` unless renewed."""

    source: str
    token: int
    expires_at: float
    items: tuple[ClaimedItem, ...]
    expired: int = 0  # items this claim found past their queue TTL and marked expired
    reclaimed: int = 0  # items whose previous lease had expired and that went back to the queue
    holder: str = ""  # who claimed it (a run or helper id); see Frontier.holders / revoke


@dataclass(frozen=True, slots=True)
class Completed:
    """A page fetched (or found not modified) and settled: done until ``fresh_until``.

    ``etag`` / ``last_modified`` are the response's validators, kept with the item and handed
    back by the next claim of it; None forgets what was kept (a page without them).
    ``history`` replaces the page's kept :class:`PageHistory` (the ack is fenced, so it was
    computed from the one the claim handed out); None leaves the kept one as it is.
    """

    url: str
    fresh_until: float
    fetched_at: float
    cost: float = 0.0
    etag: str | None = None
    last_modified: str | None = None
    history: PageHistory | None = None


@dataclass(frozen=True, slots=True)
class RetryLater:
    url: str
    not_before: float
    rank: float
    attempts: int
    first_attempt_at: float
    error: str


@dataclass(frozen=True, slots=True)
class DeadLettered:
    url: str
    attempts: int
    error: str


Outcome = Completed | RetryLater | DeadLettered


@dataclass(slots=True)
class AckResult:
    accepted: int = 0
    stale: list[str] = field(default_factory=list)  # URLs whose lease was no longer ours


@dataclass(slots=True)
class StateCounts:
    queued: int = 0
    leased: int = 0
    done: int = 0
    dead: int = 0
    expired: int = 0
    retired: int = 0

    @property
    def total(self) -> int:
        return self.queued + self.leased + self.done + self.dead + self.expired + self.retired


@dataclass(frozen=True, slots=True)
class Holder:
    """Someone holding leased items of a source, and when it last said it was alive.

    ``beat_at`` is None for leases taken without a heartbeat (an anonymous claim): those are
    only recovered when their lease expires.
    """

    holder: str
    leased: int
    beat_at: float | None


RankFor = Callable[[str, float | None, float], float]
"""``rank_for(url, age_s, fresh_s) -> rank`` from the planner (see collector.policy.priority)."""

FreshFor = Callable[[str], float]
"""``fresh_for(url) -> seconds`` from the planner (see collector.policy.ttl)."""


@runtime_checkable
class Frontier(Protocol):
    """A persistent priority queue with leases. All times are UNIX seconds (``time.time()``)."""

    def offer(
        self,
        source: str,
        offers: Iterable[Offer],
        *,
        now: float,
        queue_ttl_s: float,
        rank_for: RankFor,
        run_id: str,
        once_per_run: bool = False,
    ) -> OfferResult:
        """Plan URLs: queue new and stale ones, skip fresh ones, never queue one twice.

        Every offered URL is tagged with ``run_id`` so :meth:`run_counts` can say where this
        run's items ended up. With ``once_per_run`` a URL already tagged with ``run_id`` (offered
        earlier in the same run, by this call or another) counts as a duplicate and is left as
        it is, so a plan in several calls needs no memory per URL; without it only repeats
        within this call are duplicates (counted as ``already_queued``).
        """
        ...

    def sweep(self, source: str, run_id: str, *, retire: bool) -> SweepResult:
        """After a full plan: settle the queued and leased items not tagged with ``run_id``.

        Those are items an earlier plan queued that the current seed list no longer names.
        With ``retire`` queued ones become ``retired``; otherwise they stay queued. Either way
        they (and leased ones, whose holder may still ack them) are tagged with ``run_id`` and
        marked *unlisted*, so :meth:`adopt` never queues them again once settled; offering the
        URL again makes it listed. Done and expired items not tagged with ``run_id`` are marked
        unlisted too, for the same reason (they are not counted: not the run's business).
        Returns the counts; every queued or leased item is tagged, none dropped.
        """
        ...

    def unlist(self, source: str, urls: Iterable[str], run_id: str, *, retire: bool) -> SweepResult:
        """Settle the given URLs as :meth:`sweep` settles the items a list no longer names.

        For a plan of a seed list that changed in a known way (a template's range shrank): the
        URLs that left the list are named, so nothing else is read. Queued and leased items not
        tagged with ``run_id`` are tagged and marked unlisted (queued ones retired with
        ``retire``); done and expired ones are marked unlisted (not counted); unknown URLs, dead
        and retired items are left alone. Streamed in chunks: constant memory.
        """
        ...

    def renew_queue_ttl(self, source: str, *, now: float, queue_ttl_s: float) -> int:
        """Give queued items past their queue TTL a new one (``now + queue_ttl_s``); how many.

        A plan does this first. An item an earlier run left queued (stopped by ``--max-items``,
        or a schedule longer than ``queue_ttl_s``) is still listed and still due: the new plan
        asks for it again, so it is a new request, not one for the run's first claim to expire
        (and the plan after to queue again, a whole schedule later). Rank, attempts and
        ``enqueued_at`` are kept: aging goes on counting from the first request.
        """
        ...

    def adopt(
        self,
        source: str,
        run_id: str,
        *,
        now: float,
        queue_ttl_s: float,
        rank_for: RankFor,
        fresh_for: FreshFor,
    ) -> OfferResult:
        """Plan an unchanged seed list without offering it: the due items join the run.

        Queued and leased items are tagged with ``run_id`` (``already_queued``); listed items
        that are expired, or done with their freshness passed, are queued again (``enqueued``),
        found through an index by due time. Fresh, dead and retired items are left alone and
        not counted. Cost: the due items, not the seed list.
        """
        ...

    def plan_mark(self, source: str) -> str | None:
        """The seed mark stored by the last plan that finished (None: none, or one cut short)."""
        ...

    def set_plan_mark(self, source: str, mark: str | None) -> None:
        """Store (or clear, with None) the source's seed mark."""
        ...

    def claim(
        self, source: str, limit: int, *, now: float, lease_s: float, holder: str = ""
    ) -> Lease:
        """Lease up to ``limit`` due items, best rank first, in one atomic step.

        The same step returns items whose lease expired to the queue and expires items queued
        longer than their queue TTL. ``holder`` names the claimant, so that its leases can be
        revoked at once when it is known to be dead (:meth:`revoke`).
        """
        ...

    def beat(self, source: str, holder: str, *, now: float) -> None:
        """Record that ``holder`` is alive (a heartbeat, every few seconds while it works)."""
        ...

    def holders(self, source: str) -> list[Holder]:
        """Everyone holding leased items of ``source`` now, with their last heartbeat."""
        ...

    def revoke(self, source: str, holder: str, *, now: float) -> int:
        """Return every item ``holder`` leases to the queue unchanged (no attempt counted) and
        forget its heartbeat; returns how many items. The items' next claim takes a new fencing
        token, so a holder that was only paused cannot ack or write them any more."""
        ...

    def renew(self, lease: Lease, *, now: float, lease_s: float) -> int:
        """Extend the lease of the items still held under ``lease.token``; returns how many."""
        ...

    def ack(self, lease: Lease, outcomes: Sequence[Outcome], *, now: float) -> AckResult:
        """Record outcomes atomically; outcomes for items no longer held are refused as stale."""
        ...

    def release(self, lease: Lease, *, now: float) -> int:
        """Put every item still held under ``lease`` back in the queue, unchanged."""
        ...

    def counts(self, source: str) -> StateCounts:
        """How many of the source's items are in each state: counts the backend keeps as items
        move, so no item is read (a plan that adopts asks for them every time)."""
        ...

    def run_counts(self, source: str, run_id: str) -> StateCounts:
        """How many of the items offered by ``run_id`` are in each state now."""
        ...

    def due_count(self, source: str, *, now: float) -> int:
        """How many items a plan at ``now`` would have due without any new seed: the queued
        ones, and the listed items that are expired or done with their freshness passed (what
        :meth:`adopt` takes in). Read from counts and the index by due time: no item is read.

        A forecast for scheduling (collector.fleet asks it for a run still on its way, before
        it planned), not a ledger: leased items are not counted, and a backend whose due index
        drops entries lazily (Redis) may count an item that left the seed list or was requeued
        by hand since it was indexed."""
        ...

    def next_event_at(self, source: str, *, now: float) -> float | None:
        """Earliest time something may become claimable (a not-before or a lease expiry), or
        None when nothing is queued or leased."""
        ...

    def requeue(self, source: str, urls: Sequence[str], *, now: float, queue_ttl_s: float) -> int:
        """Put dead or expired URLs back in the queue (triage, operator retry)."""
        ...

    def revive(self, source: str, pages: Sequence[Completed]) -> int:
        """Dead URLs become done as if acked ``Completed`` (fresh until ``fresh_until``):
        triage repaired and stored their record, so the page lives on like any other, fetched
        again when its freshness passes. Returns how many were dead; other states are left.
        Their kept validators are forgotten (the sink holds a repaired record, not the page a
        304 would vouch for), so the next fetch is a plain one. Their history is kept."""
        ...

    def make_stale(self, source: str, urls: Sequence[str]) -> int:
        """Done URLs lose their freshness, so the next plan queues them again (compensation
        removed their records); returns how many were done. Other states are left as they are.
        Their validators are forgotten too: a 304 must not stand for records no longer stored.
        Their history is kept (what the page did is still true)."""
        ...

    def histories(self, source: str) -> Iterator[tuple[str, PageHistory]]:
        """Every item of ``source`` that has a kept history, with it (streamed, any order):
        what a learned revisit schedule reads once per run (collector.policy.revisit_budget)."""
        ...

    def location(self) -> str:
        """Where the frontier lives (a file, or a Redis URL without password, and prefix)."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc_info: object) -> None: ...
