"""Frontier conformance: the behaviour every Frontier backend must have.

A backend's test module subclasses :class:`FrontierConformance` and provides a ``frontier``
fixture that yields a fresh, empty frontier (and closes it afterwards). Nothing here may know
which backend it is talking to: only the :class:`collector.frontier.base.Frontier` protocol is
used. Every time is an explicit ``now`` (UNIX seconds); nothing sleeps.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import pairwise

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from collector.frontier.base import (
    Completed,
    DeadLettered,
    Frontier,
    Holder,
    Lease,
    Offer,
    OfferResult,
    PageHistory,
    RankFor,
    RetryLater,
    StateCounts,
    SweepResult,
)

Reopen = Callable[[], Frontier]
"""A new Frontier object on the same storage as the ``frontier`` fixture's (a restart)."""

SRC = "src"
T0 = 1_700_000_000.0
QUEUE_TTL = 10_000.0
LEASE = 60.0
FRESH = 3_600.0


def url(n: int | str) -> str:
    return f"https://example.test/item/{n}"


def ranked(ranks: dict[str, float] | None = None, default: float = 1.0) -> RankFor:
    """A rank_for that looks URLs up in ``ranks`` (``default`` otherwise)."""
    table = ranks or {}

    def rank_for(u: str, age_s: float | None, fresh_s: float) -> float:
        return table.get(u, default)

    return rank_for


def offer(
    frontier: Frontier,
    urls: Iterable[str],
    *,
    now: float = T0,
    source: str = SRC,
    run_id: str = "run-1",
    queue_ttl_s: float = QUEUE_TTL,
    rank_for: RankFor | None = None,
    once: bool = False,
) -> OfferResult:
    return frontier.offer(
        source,
        [Offer(u, FRESH) for u in urls],
        now=now,
        queue_ttl_s=queue_ttl_s,
        rank_for=rank_for or ranked(),
        run_id=run_id,
        once_per_run=once,
    )


def _adopt(frontier: Frontier, run_id: str, *, now: float, source: str = SRC) -> OfferResult:
    return frontier.adopt(
        source,
        run_id,
        now=now,
        queue_ttl_s=QUEUE_TTL,
        rank_for=ranked(),
        fresh_for=lambda u: FRESH,
    )


def claim(
    frontier: Frontier,
    limit: int = 100,
    *,
    now: float = T0,
    source: str = SRC,
    lease_s: float = LEASE,
    holder: str = "",
) -> Lease:
    return frontier.claim(source, limit, now=now, lease_s=lease_s, holder=holder)


def urls_of(lease: Lease) -> list[str]:
    return [item.url for item in lease.items]


def done(u: str, now: float = T0, fresh_s: float = FRESH) -> Completed:
    return Completed(u, fresh_until=now + fresh_s, fetched_at=now)


def counts(**states: int) -> StateCounts:
    return StateCounts(**states)


def _result(**fields: int) -> OfferResult:
    return OfferResult(**fields)


class FrontierConformance:
    """Mixin: subclasses provide the ``frontier`` fixture (a fresh, empty Frontier)."""

    # --- helpers that build an item in a given state ------------------------------------------
    @staticmethod
    def _make_done(frontier: Frontier, u: str, *, now: float = T0, fresh_s: float = FRESH) -> None:
        offer(frontier, [u], now=now)
        lease = claim(frontier, now=now)
        assert urls_of(lease) == [u]
        assert frontier.ack(lease, [done(u, now, fresh_s)], now=now).accepted == 1

    @staticmethod
    def _make_dead(frontier: Frontier, u: str, *, now: float = T0) -> None:
        offer(frontier, [u], now=now)
        lease = claim(frontier, now=now)
        assert urls_of(lease) == [u]
        assert frontier.ack(lease, [DeadLettered(u, 3, "http_404")], now=now).accepted == 1

    # --- basics -------------------------------------------------------------------------------
    def test_implements_protocol(self, frontier: Frontier) -> None:
        assert isinstance(frontier, Frontier)
        assert isinstance(frontier.location(), str) and frontier.location()

    def test_is_a_context_manager(self, frontier: Frontier) -> None:
        with frontier as same:
            assert same is frontier
            assert same.counts(SRC) == counts()

    def test_empty_frontier(self, frontier: Frontier) -> None:
        assert frontier.counts(SRC) == StateCounts()
        assert frontier.counts(SRC).total == 0
        lease = claim(frontier)
        assert lease.items == ()
        assert lease.source == SRC
        assert (lease.expired, lease.reclaimed) == (0, 0)
        assert frontier.next_event_at(SRC, now=T0) is None
        assert frontier.run_counts(SRC, "nope") == StateCounts()

    # --- offer / planning ---------------------------------------------------------------------
    def test_offer_new_urls_are_enqueued(self, frontier: Frontier) -> None:
        result = offer(frontier, [url(1), url(2), url(3)])
        assert result == _result(enqueued=3)
        assert result.total == 3
        assert frontier.counts(SRC) == counts(queued=3)

    def test_offer_twice_is_not_queued_twice(self, frontier: Frontier) -> None:
        offer(frontier, [url(1), url(2)])
        again = offer(frontier, [url(1), url(2), url(3)], now=T0 + 1)
        assert again == _result(enqueued=1, already_queued=2)
        assert again.total == 3
        assert frontier.counts(SRC) == counts(queued=3)
        assert sorted(urls_of(claim(frontier, now=T0 + 2))) == [url(1), url(2), url(3)]

    def test_offer_while_leased_is_not_queued_again(self, frontier: Frontier) -> None:
        offer(frontier, [url(1)])
        lease = claim(frontier)
        assert urls_of(lease) == [url(1)]
        again = offer(frontier, [url(1)], now=T0 + 1)
        assert again == _result(already_queued=1)
        assert frontier.counts(SRC) == counts(leased=1)
        assert claim(frontier, now=T0 + 2).items == ()

    def test_offer_same_url_twice_in_one_call(self, frontier: Frontier) -> None:
        result = offer(frontier, [url(1), url(1), url(2)])
        assert result.total == 3
        assert result == _result(enqueued=2, already_queued=1)
        assert frontier.counts(SRC) == counts(queued=2)

    def test_offer_same_stale_url_twice_in_one_call(self, frontier: Frontier) -> None:
        self._make_done(frontier, url(1), fresh_s=10)
        result = offer(frontier, [url(1), url(1)], now=T0 + 100)
        assert result.total == 2
        assert frontier.counts(SRC) == counts(queued=1)
        assert urls_of(claim(frontier, now=T0 + 100)) == [url(1)]
        assert result == _result(enqueued=1, already_queued=1)

    def test_offer_result_counts_sum_to_offered(self, frontier: Frontier) -> None:
        self._make_done(frontier, url("fresh"), fresh_s=1_000)
        self._make_done(frontier, url("stale"), fresh_s=10)
        self._make_dead(frontier, url("dead"))
        offer(frontier, [url("leased")])
        assert urls_of(claim(frontier, 1)) == [url("leased")]
        offer(frontier, [url("queued")])
        offered = [url(x) for x in ("new", "fresh", "stale", "dead", "leased", "queued")]
        result = offer(frontier, offered, now=T0 + 100)
        assert result == _result(enqueued=2, already_queued=2, fresh_skipped=1, already_dead=1)
        assert result.total == len(offered)
        assert frontier.counts(SRC) == counts(queued=3, leased=1, done=1, dead=1)

    def test_fresh_done_is_skipped_until_freshness_passes(self, frontier: Frontier) -> None:
        self._make_done(frontier, url(1), fresh_s=100)  # fresh until T0 + 100
        assert offer(frontier, [url(1)], now=T0 + 50) == _result(fresh_skipped=1)
        assert frontier.counts(SRC) == counts(done=1)
        assert claim(frontier, now=T0 + 50).items == ()
        assert offer(frontier, [url(1)], now=T0 + 150) == _result(enqueued=1)
        assert frontier.counts(SRC) == counts(queued=1)
        lease = claim(frontier, now=T0 + 150)
        assert urls_of(lease) == [url(1)]
        assert lease.items[0].attempts == 0

    def test_dead_stays_dead_on_reoffer_until_requeued(self, frontier: Frontier) -> None:
        self._make_dead(frontier, url(1))
        for later in (T0 + 1, T0 + 1_000_000):
            assert offer(frontier, [url(1)], now=later) == _result(already_dead=1)
            assert frontier.counts(SRC) == counts(dead=1)
            assert claim(frontier, now=later).items == ()
        now = T0 + 1_000_001
        assert frontier.requeue(SRC, [url(1)], now=now, queue_ttl_s=QUEUE_TTL) == 1
        assert frontier.counts(SRC) == counts(queued=1)
        lease = claim(frontier, now=now)
        assert urls_of(lease) == [url(1)]
        assert lease.items[0].attempts == 0

    def test_requeue_touches_only_dead_or_expired(self, frontier: Frontier) -> None:
        self._make_done(frontier, url("done"))
        self._make_dead(frontier, url("dead"))
        offer(frontier, [url("leased")])
        claim(frontier, 1)
        offer(frontier, [url("queued")])
        requeued = frontier.requeue(
            SRC,
            [url(x) for x in ("done", "dead", "leased", "queued", "unknown")],
            now=T0 + 1,
            queue_ttl_s=QUEUE_TTL,
        )
        assert requeued == 1
        assert frontier.counts(SRC) == counts(queued=2, leased=1, done=1)

    def test_make_stale_requeues_done_urls_at_the_next_plan(self, frontier: Frontier) -> None:
        self._make_done(frontier, url("a"))
        self._make_done(frontier, url("b"))
        self._make_dead(frontier, url("dead"))
        offer(frontier, [url("queued")])
        assert offer(frontier, [url("a"), url("b")], now=T0 + 1) == _result(fresh_skipped=2)
        names = [url(x) for x in ("a", "dead", "queued", "unknown")]
        assert frontier.make_stale(SRC, names) == 1
        assert frontier.make_stale(SRC, []) == 0
        assert frontier.counts(SRC) == counts(queued=1, done=2, dead=1)  # states unchanged
        assert offer(frontier, [url("a"), url("b")], now=T0 + 2) == _result(
            enqueued=1, fresh_skipped=1
        )
        assert url("a") in urls_of(claim(frontier, 10, now=T0 + 3))

    def test_revive_makes_a_dead_page_done_until_its_freshness_passes(
        self, frontier: Frontier
    ) -> None:
        self._make_done(frontier, url("done"))
        self._make_dead(frontier, url("dead"))
        offer(frontier, [url("queued")])
        pages = [Completed(url(x), T0 + 100, T0 + 5) for x in ("dead", "done", "queued", "nope")]
        assert frontier.revive(SRC, pages) == 1
        assert frontier.revive(SRC, pages) == 0  # done now: once
        assert frontier.revive(SRC, []) == 0
        assert frontier.counts(SRC) == counts(queued=1, done=2)
        assert offer(frontier, [url("dead")], now=T0 + 99) == _result(fresh_skipped=1)
        assert offer(frontier, [url("dead")], now=T0 + 101) == _result(enqueued=1)
        lease = claim(frontier, 10, now=T0 + 102)
        assert url("dead") in urls_of(lease)
        assert next(i for i in lease.items if i.url == url("dead")).attempts == 0

    def test_expired_reoffered_is_enqueued(self, frontier: Frontier) -> None:
        offer(frontier, [url(1)], queue_ttl_s=100)
        assert claim(frontier, now=T0 + 200).expired == 1
        assert frontier.counts(SRC) == counts(expired=1)
        assert offer(frontier, [url(1)], now=T0 + 300) == _result(enqueued=1)
        assert urls_of(claim(frontier, now=T0 + 301)) == [url(1)]

    def test_requeue_expired(self, frontier: Frontier) -> None:
        offer(frontier, [url(1)], queue_ttl_s=100)
        claim(frontier, now=T0 + 200)
        assert frontier.requeue(SRC, [url(1)], now=T0 + 300, queue_ttl_s=100) == 1
        assert frontier.counts(SRC) == counts(queued=1)
        # the requeue gave it a new queue TTL counted from the requeue
        assert urls_of(claim(frontier, now=T0 + 350)) == [url(1)]

    # --- validators (conditional requests) -----------------------------------------------------
    @staticmethod
    def _refetch(frontier: Frontier, u: str, now: float) -> Lease:
        """Offer a done page again once its freshness passed, and claim it."""
        assert offer(frontier, [u], now=now) == _result(enqueued=1)
        lease = claim(frontier, now=now + 1)
        assert urls_of(lease) == [u]
        return lease

    def test_a_completed_page_s_validators_come_back_with_its_next_claim(
        self, frontier: Frontier
    ) -> None:
        offer(frontier, [url(1)])
        lease = claim(frontier)
        assert (lease.items[0].etag, lease.items[0].last_modified) == (None, None)  # none yet
        weak, modified = 'W/"5f8e-1a2b"', "Tue, 01 Dec 2026 10:00:00 GMT"
        page = Completed(url(1), T0 + 100, T0 + 70, etag=weak, last_modified=modified)
        assert frontier.ack(lease, [page], now=T0 + 70).accepted == 1
        (item,) = self._refetch(frontier, url(1), T0 + 200).items
        assert (item.etag, item.last_modified) == (weak, modified)  # as given, weak or not

    def test_validators_survive_retries_and_plans_and_go_with_a_plain_completion(
        self, frontier: Frontier
    ) -> None:
        offer(frontier, [url(1)])
        lease = claim(frontier)
        page = Completed(url(1), T0 + 10, T0, etag='"v1"', last_modified="ünïcode date")
        frontier.ack(lease, [page], now=T0)
        lease = self._refetch(frontier, url(1), T0 + 20)
        retry = RetryLater(url(1), T0 + 30, 1.0, 1, T0 + 21, "http_503")
        assert frontier.ack(lease, [retry], now=T0 + 21).accepted == 1
        (item,) = claim(frontier, now=T0 + 31).items
        assert (item.etag, item.last_modified) == ('"v1"', "ünïcode date")
        lease = claim(frontier, now=T0 + 31 + LEASE + 1)  # the lease expired: reclaimed
        (item,) = lease.items
        assert item.etag == '"v1"'
        only_etag = Completed(url(1), T0 + 200, T0 + 100, etag='"v2"')
        frontier.ack(lease, [only_etag], now=T0 + 100)
        lease = self._refetch(frontier, url(1), T0 + 300)
        assert (lease.items[0].etag, lease.items[0].last_modified) == ('"v2"', None)
        frontier.ack(lease, [Completed(url(1), T0 + 400, T0 + 301)], now=T0 + 301)
        (item,) = self._refetch(frontier, url(1), T0 + 500).items
        assert (item.etag, item.last_modified) == (None, None)  # the page sent none: forgotten

    def test_make_stale_and_revive_forget_validators(self, frontier: Frontier) -> None:
        for name in ("stale", "dead"):
            offer(frontier, [url(name)])
        lease = claim(frontier)
        etag, modified = '"x"', "Mon, 30 Nov 2026 00:00:00 GMT"
        frontier.ack(
            lease,
            [
                Completed(url("stale"), T0 + 1_000, T0, etag=etag, last_modified=modified),
                DeadLettered(url("dead"), 1, "validation"),
            ],
            now=T0,
        )
        # a dead page keeps what it had (none here); revive forgets even given ones
        assert frontier.make_stale(SRC, [url("stale")]) == 1
        assert (
            frontier.revive(
                SRC, [Completed(url("dead"), T0 + 5, T0 + 1, etag=etag, last_modified=modified)]
            )
            == 1
        )
        assert offer(frontier, [url("stale"), url("dead")], now=T0 + 10) == _result(enqueued=2)
        lease = claim(frontier, now=T0 + 11)
        assert sorted(urls_of(lease)) == sorted([url("stale"), url("dead")])
        assert {(i.etag, i.last_modified) for i in lease.items} == {(None, None)}

    # --- page history (what a learned revisit schedule reads) ----------------------------------
    def test_a_page_s_history_comes_back_with_its_next_claim_and_in_histories(
        self, frontier: Frontier
    ) -> None:
        offer(frontier, [url(1), url(2)])
        lease = claim(frontier)
        assert {item.history for item in lease.items} == {None}  # none yet
        assert list(frontier.histories(SRC)) == []
        # odd floats (fractions from the window's scaling, 17 digits) read back exactly
        seen = PageHistory(3, 1.25, 2.0 / 3.0, 7_200.123456789, 0.1, T0 + 70, T0 + 0.1, 1e-300)
        first = PageHistory(1, 0.0, 0.0, 0.0, 0.0, T0 + 70, None, 0.0)
        pages = [
            Completed(url(1), T0 + 100, T0 + 70, history=seen),
            Completed(url(2), T0 + 100, T0 + 70, history=first),
        ]
        assert frontier.ack(lease, pages, now=T0 + 70).accepted == 2
        assert dict(frontier.histories(SRC)) == {url(1): seen, url(2): first}
        assert dict(frontier.histories("other")) == {}
        assert offer(frontier, [url(1), url(2)], now=T0 + 200) == _result(enqueued=2)
        lease = claim(frontier, now=T0 + 201)
        assert {i.url: i.history for i in lease.items} == {url(1): seen, url(2): first}

    def test_history_survives_retries_lease_expiry_stale_and_revive(
        self, frontier: Frontier
    ) -> None:
        h1 = PageHistory(2, 1.0, 1.0, 50.0, 50.0, T0, T0, 0.02)
        offer(frontier, [url(1)])
        frontier.ack(claim(frontier), [Completed(url(1), T0 + 10, T0, history=h1)], now=T0)
        lease = self._refetch(frontier, url(1), T0 + 20)
        retry = RetryLater(url(1), T0 + 30, 1.0, 1, T0 + 21, "http_503")
        assert frontier.ack(lease, [retry], now=T0 + 21).accepted == 1
        assert claim(frontier, now=T0 + 31).items[0].history == h1
        lease = claim(frontier, now=T0 + 31 + LEASE + 1)  # the lease expired: reclaimed
        assert lease.items[0].history == h1
        # a completion without a history keeps the kept one
        frontier.ack(lease, [Completed(url(1), T0 + 200, T0 + 100)], now=T0 + 100)
        assert dict(frontier.histories(SRC)) == {url(1): h1}
        assert frontier.make_stale(SRC, [url(1)]) == 1
        assert dict(frontier.histories(SRC)) == {url(1): h1}
        lease = self._refetch(frontier, url(1), T0 + 150)
        assert lease.items[0].history == h1
        frontier.ack(lease, [DeadLettered(url(1), 1, "validation")], now=T0 + 151)
        assert frontier.revive(SRC, [Completed(url(1), T0 + 300, T0 + 160)]) == 1
        h2 = PageHistory(3, 1.0, 2.0, 400.0, 50.0, T0 + 400, T0, 0.004)
        lease = self._refetch(frontier, url(1), T0 + 400)
        assert lease.items[0].history == h1
        frontier.ack(lease, [Completed(url(1), T0 + 500, T0 + 400, history=h2)], now=T0 + 400)
        assert dict(frontier.histories(SRC)) == {url(1): h2}

    def test_a_stale_ack_does_not_write_its_history(self, frontier: Frontier) -> None:
        h1 = PageHistory(1, 0.0, 0.0, 0.0, 0.0, T0, None, 0.0)
        offer(frontier, [url(1)])
        old = claim(frontier)
        new = claim(frontier, now=T0 + LEASE + 1)  # the first lease expired: taken over
        late = Completed(url(1), T0 + 100, T0 + 90, history=h1)
        assert frontier.ack(old, [late], now=T0 + 90).stale == [url(1)]
        assert list(frontier.histories(SRC)) == []
        assert frontier.ack(new, [late], now=T0 + 90).accepted == 1
        assert dict(frontier.histories(SRC)) == {url(1): h1}

    def test_history_is_kept_across_a_reopen(self, frontier: Frontier, reopen: Reopen) -> None:
        h1 = PageHistory(4, 2.0, 3.0, 9_000.0, 4_000.0, T0 + 5, T0 + 1, 3e-4)
        offer(frontier, [url(1)])
        frontier.ack(claim(frontier), [Completed(url(1), T0 + 10, T0 + 5, history=h1)], now=T0)
        again = reopen()
        try:
            assert dict(again.histories(SRC)) == {url(1): h1}
            assert offer(again, [url(1)], now=T0 + 20) == _result(enqueued=1)
            assert claim(again, now=T0 + 21).items[0].history == h1
        finally:
            if again is not frontier:
                again.close()

    # --- claim --------------------------------------------------------------------------------
    def test_claim_order_is_rank_descending(self, frontier: Frontier) -> None:
        ranks = {url("a"): 1.0, url("b"): 5.0, url("c"): 3.0, url("d"): 4.0, url("e"): 0.5}
        offer(frontier, ranks, rank_for=ranked(ranks))
        assert urls_of(claim(frontier, 2)) == [url("b"), url("d")]
        assert urls_of(claim(frontier, 10)) == [url("c"), url("a"), url("e")]

    def test_claim_limit(self, frontier: Frontier) -> None:
        offer(frontier, [url(i) for i in range(5)])
        assert len(claim(frontier, 2).items) == 2
        assert frontier.counts(SRC) == counts(queued=3, leased=2)
        assert claim(frontier, 0).items == ()
        assert len(claim(frontier, 10).items) == 3
        assert frontier.counts(SRC) == counts(leased=5)

    def test_claimed_item_fields(self, frontier: Frontier) -> None:
        offer(frontier, [url(1)], now=T0 - 5)
        lease = claim(frontier, now=T0, lease_s=30)
        assert lease.source == SRC
        assert lease.expires_at == T0 + 30
        (item,) = lease.items
        assert (item.url, item.attempts, item.first_attempt_at) == (url(1), 0, None)
        assert item.enqueued_at == T0 - 5

    def test_leased_items_are_invisible_to_other_claims(self, frontier: Frontier) -> None:
        offer(frontier, [url(i) for i in range(3)])
        first = claim(frontier, 2)
        second = claim(frontier, 2, now=T0 + 1)
        third = claim(frontier, 2, now=T0 + 2)
        assert len(first.items) == 2
        assert len(second.items) == 1
        assert third.items == ()
        assert set(urls_of(first)).isdisjoint(urls_of(second))
        assert set(urls_of(first)) | set(urls_of(second)) == {url(i) for i in range(3)}

    def test_expired_lease_is_reclaimed_with_a_new_larger_token(self, frontier: Frontier) -> None:
        offer(frontier, [url(1), url(2)])
        first = claim(frontier, now=T0, lease_s=60)
        before = claim(frontier, now=T0 + 59)
        assert before.items == ()
        assert before.reclaimed == 0
        assert frontier.counts(SRC) == counts(leased=2)
        after = claim(frontier, now=T0 + 61)
        assert after.reclaimed == 2
        assert sorted(urls_of(after)) == [url(1), url(2)]
        assert after.token > before.token > first.token
        assert frontier.counts(SRC) == counts(leased=2)

    def test_reclaimed_items_keep_attempts(self, frontier: Frontier) -> None:
        offer(frontier, [url(1)])
        lease = claim(frontier)
        retry = RetryLater(url(1), T0 + 10, 1.0, attempts=2, first_attempt_at=T0, error="t/o")
        frontier.ack(lease, [retry], now=T0)
        held = claim(frontier, now=T0 + 10, lease_s=5)
        taken = claim(frontier, now=T0 + 20)
        assert taken.reclaimed == 1
        assert taken.items == held.items
        assert (taken.items[0].attempts, taken.items[0].first_attempt_at) == (2, T0)

    def test_fencing_tokens_strictly_increase(self, frontier: Frontier) -> None:
        offer(frontier, [url(i) for i in range(4)])
        offer(frontier, [url(i) for i in range(4)], source="other")
        tokens = []
        for step in range(8):
            source = SRC if step % 2 else "other"
            tokens.append(claim(frontier, 1, now=T0 + step, source=source).token)
        tokens.append(claim(frontier, 1, now=T0 + 9).token)  # an empty claim too
        assert all(a < b for a, b in pairwise(tokens)), tokens

    # --- ack ----------------------------------------------------------------------------------
    def test_ack_with_current_token_is_accepted(self, frontier: Frontier) -> None:
        offer(frontier, [url(1), url(2)])
        lease = claim(frontier)
        result = frontier.ack(lease, [done(url(1)), done(url(2))], now=T0 + 1)
        assert result.accepted == 2
        assert result.stale == []
        assert frontier.counts(SRC) == counts(done=2)

    def test_ack_after_takeover_is_stale(self, frontier: Frontier) -> None:
        ranks = {url(1): 2.0, url(2): 1.0}
        offer(frontier, ranks, rank_for=ranked(ranks))
        old = claim(frontier, 2, now=T0, lease_s=60)
        new = claim(frontier, 1, now=T0 + 100)  # both leases expired; url(1) taken over
        assert urls_of(new) == [url(1)]
        assert new.reclaimed == 2
        result = frontier.ack(old, [done(url(1)), done(url(2))], now=T0 + 101)
        assert result.accepted == 0
        assert sorted(result.stale) == [url(1), url(2)]
        assert frontier.counts(SRC) == counts(queued=1, leased=1)
        accepted = frontier.ack(new, [done(url(1), T0 + 102)], now=T0 + 102)
        assert accepted.accepted == 1
        assert accepted.stale == []
        assert frontier.counts(SRC) == counts(queued=1, done=1)

    def test_ack_of_url_not_in_lease_is_stale(self, frontier: Frontier) -> None:
        offer(frontier, [url(1), url(2)])
        lease = claim(frontier, 1)
        (mine,) = urls_of(lease)
        other = ({url(1), url(2)} - {mine}).pop()
        result = frontier.ack(lease, [done(other), done(url("unknown"))], now=T0)
        assert result.accepted == 0
        assert sorted(result.stale) == sorted([other, url("unknown")])
        assert frontier.counts(SRC) == counts(queued=1, leased=1)

    def test_ack_twice_second_is_stale(self, frontier: Frontier) -> None:
        offer(frontier, [url(1)])
        lease = claim(frontier)
        assert frontier.ack(lease, [done(url(1))], now=T0).accepted == 1
        second = frontier.ack(lease, [DeadLettered(url(1), 1, "late")], now=T0 + 1)
        assert (second.accepted, second.stale) == (0, [url(1)])
        assert frontier.counts(SRC) == counts(done=1)

    def test_completed_goes_to_done(self, frontier: Frontier) -> None:
        offer(frontier, [url(1)])
        lease = claim(frontier)
        frontier.ack(lease, [Completed(url(1), T0 + 50, T0, cost=2.5)], now=T0)
        assert frontier.counts(SRC) == counts(done=1)
        assert claim(frontier, now=T0 + 1).items == ()
        assert frontier.next_event_at(SRC, now=T0 + 1) is None

    def test_dead_lettered_goes_to_dead(self, frontier: Frontier) -> None:
        offer(frontier, [url(1)])
        lease = claim(frontier)
        assert frontier.ack(lease, [DeadLettered(url(1), 4, "http_404")], now=T0).accepted == 1
        assert frontier.counts(SRC) == counts(dead=1)
        assert claim(frontier, now=T0 + 1_000_000).items == ()

    # --- renew --------------------------------------------------------------------------------
    def test_renew_extends_the_lease(self, frontier: Frontier) -> None:
        offer(frontier, [url(1), url(2)])
        lease = claim(frontier, now=T0, lease_s=60)
        assert frontier.renew(lease, now=T0 + 50, lease_s=60) == 2  # now held until T0 + 110
        between = claim(frontier, now=T0 + 80)
        assert between.items == ()
        assert between.reclaimed == 0
        assert frontier.counts(SRC) == counts(leased=2)
        assert frontier.ack(lease, [done(url(1), T0 + 90)], now=T0 + 90).accepted == 1
        later = claim(frontier, now=T0 + 120)
        assert later.reclaimed == 1
        assert urls_of(later) == [url(2)]

    def test_renew_with_stale_token_renews_nothing(self, frontier: Frontier) -> None:
        offer(frontier, [url(1)])
        old = claim(frontier, now=T0, lease_s=60)
        new = claim(frontier, now=T0 + 100, lease_s=60)  # held until T0 + 160
        assert urls_of(new) == [url(1)]
        assert frontier.renew(old, now=T0 + 110, lease_s=1_000) == 0
        # the stale renew did not extend the new holder's lease either
        taken = claim(frontier, now=T0 + 170)
        assert taken.reclaimed == 1
        assert urls_of(taken) == [url(1)]

    def test_renew_after_ack_renews_nothing(self, frontier: Frontier) -> None:
        offer(frontier, [url(1)])
        lease = claim(frontier)
        frontier.ack(lease, [done(url(1))], now=T0)
        assert frontier.renew(lease, now=T0 + 1, lease_s=60) == 0
        assert frontier.counts(SRC) == counts(done=1)

    # --- retry later --------------------------------------------------------------------------
    def test_retry_later_waits_for_not_before(self, frontier: Frontier) -> None:
        offer(frontier, [url(1)])
        lease = claim(frontier)
        retry = RetryLater(url(1), T0 + 100, 1.0, attempts=1, first_attempt_at=T0, error="503")
        assert frontier.ack(lease, [retry], now=T0 + 1).accepted == 1
        assert frontier.counts(SRC) == counts(queued=1)
        assert frontier.next_event_at(SRC, now=T0 + 1) == T0 + 100
        assert claim(frontier, now=T0 + 50).items == ()
        assert claim(frontier, now=T0 + 99.5).items == ()
        again = claim(frontier, now=T0 + 100)
        (item,) = again.items
        assert (item.url, item.attempts, item.first_attempt_at) == (url(1), 1, T0)

    def test_retry_later_attempts_accumulate(self, frontier: Frontier) -> None:
        offer(frontier, [url(1)])
        now = T0
        for attempt in range(1, 4):
            lease = claim(frontier, now=now)
            (item,) = lease.items
            assert item.attempts == attempt - 1
            first = item.first_attempt_at if item.first_attempt_at is not None else now
            assert first == T0
            retry = RetryLater(url(1), now + 10, 1.0, attempt, first, "timeout")
            assert frontier.ack(lease, [retry], now=now).accepted == 1
            now += 10
        final = claim(frontier, now=now)
        assert (final.items[0].attempts, final.items[0].first_attempt_at) == (3, T0)

    def test_retry_later_uses_the_new_rank(self, frontier: Frontier) -> None:
        ranks = {url(1): 10.0, url(2): 5.0, url(3): 1.0}
        offer(frontier, ranks, rank_for=ranked(ranks))
        lease = claim(frontier, 3)
        retries = [
            RetryLater(url(1), T0 + 10, 0.1, 1, T0, "x"),
            RetryLater(url(2), T0 + 10, 0.2, 1, T0, "x"),
            RetryLater(url(3), T0 + 10, 9.0, 1, T0, "x"),
        ]
        assert frontier.ack(lease, retries, now=T0).accepted == 3
        assert urls_of(claim(frontier, 3, now=T0 + 10)) == [url(3), url(2), url(1)]

    def test_completed_after_retries_resets_attempts(self, frontier: Frontier) -> None:
        offer(frontier, [url(1)])
        lease = claim(frontier)
        frontier.ack(lease, [RetryLater(url(1), T0, 1.0, 2, T0, "x")], now=T0)
        lease = claim(frontier, now=T0 + 1)
        frontier.ack(lease, [done(url(1), T0 + 1, fresh_s=10)], now=T0 + 1)
        offer(frontier, [url(1)], now=T0 + 100)
        (item,) = claim(frontier, now=T0 + 100).items
        assert (item.attempts, item.first_attempt_at) == (0, None)

    # --- release ------------------------------------------------------------------------------
    def test_release_returns_items_unchanged(self, frontier: Frontier) -> None:
        offer(frontier, [url(1), url(2)], now=T0 - 10)
        lease = claim(frontier)
        retries = [RetryLater(u, T0 + 5, 1.0, 2, T0 - 1, "x") for u in (url(1), url(2))]
        frontier.ack(lease, retries, now=T0)
        held = claim(frontier, now=T0 + 5)
        assert frontier.release(held, now=T0 + 6) == 2
        assert frontier.counts(SRC) == counts(queued=2)
        again = claim(frontier, now=T0 + 7)
        assert again.reclaimed == 0
        assert sorted(again.items, key=lambda i: i.url) == sorted(held.items, key=lambda i: i.url)
        assert {(i.attempts, i.first_attempt_at) for i in again.items} == {(2, T0 - 1)}
        assert again.token > held.token

    def test_release_of_stale_or_acked_lease_releases_nothing(self, frontier: Frontier) -> None:
        offer(frontier, [url(1), url(2)])
        old = claim(frontier, 1, now=T0, lease_s=10)
        new = claim(frontier, 2, now=T0 + 20)
        assert new.reclaimed == 1
        assert frontier.release(old, now=T0 + 21) == 0
        assert frontier.counts(SRC) == counts(leased=2)
        frontier.ack(new, [done(url(1)), done(url(2))], now=T0 + 22)
        assert frontier.release(new, now=T0 + 23) == 0
        assert frontier.counts(SRC) == counts(done=2)

    # --- holders and revocation ---------------------------------------------------------------
    def test_holders_lists_who_leases_what_with_heartbeats(self, frontier: Frontier) -> None:
        offer(frontier, [url(n) for n in range(5)])
        assert frontier.holders(SRC) == []
        frontier.beat(SRC, "run-a", now=T0)
        claim(frontier, 2, holder="run-a")
        claim(frontier, 1, holder="helper-b")
        claim(frontier, 1)  # anonymous: no holder, recovered only by lease expiry
        found = sorted(frontier.holders(SRC), key=lambda h: h.holder)
        assert found == [Holder("", 1, None), Holder("helper-b", 1, None), Holder("run-a", 2, T0)]
        frontier.beat(SRC, "run-a", now=T0 + 5)
        assert {h.holder: h.beat_at for h in frontier.holders(SRC)}["run-a"] == T0 + 5
        assert frontier.holders("other-source") == []

    def test_revoke_returns_one_holders_items_unchanged(self, frontier: Frontier) -> None:
        offer(frontier, [url(n) for n in range(4)], now=T0 - 10)
        frontier.beat(SRC, "dead", now=T0)
        dead = claim(frontier, 2, holder="dead")
        alive = claim(frontier, 1, holder="alive")
        assert frontier.revoke(SRC, "dead", now=T0 + 1) == 2
        assert frontier.counts(SRC) == counts(queued=3, leased=1)
        assert [h.holder for h in frontier.holders(SRC)] == ["alive"]
        # the revoked holder can no longer ack, renew or release what it held
        assert frontier.ack(dead, [done(u) for u in urls_of(dead)], now=T0 + 2).stale
        assert frontier.renew(dead, now=T0 + 2, lease_s=LEASE) == 0
        retaken = claim(frontier, 10, now=T0 + 3, holder="next")
        assert sorted(urls_of(retaken)) == sorted([*urls_of(dead), url(3)])
        assert retaken.token > alive.token > dead.token
        assert {i.attempts for i in retaken.items} == {0}  # not counted as an attempt
        assert frontier.revoke(SRC, "dead", now=T0 + 4) == 0  # idempotent
        assert frontier.revoke(SRC, "nobody", now=T0 + 4) == 0

    def test_revoke_forgets_the_heartbeat(self, frontier: Frontier) -> None:
        offer(frontier, [url(1), url(2)])
        frontier.beat(SRC, "run-a", now=T0)
        claim(frontier, 1, holder="run-a")
        frontier.revoke(SRC, "run-a", now=T0 + 1)
        claim(frontier, 1, holder="run-a", now=T0 + 2)
        assert frontier.holders(SRC) == [Holder("run-a", 1, None)]

    # --- queue TTL ----------------------------------------------------------------------------
    def test_queue_ttl_expires_items_at_next_claim(self, frontier: Frontier) -> None:
        offer(frontier, [url(1), url(2), url(3)], queue_ttl_s=100)
        first = claim(frontier, 1, now=T0 + 50, lease_s=1_000)
        assert (len(first.items), first.expired) == (1, 0)
        late = claim(frontier, 10, now=T0 + 150)
        assert late.items == ()
        assert late.expired == 2
        assert frontier.counts(SRC) == counts(leased=1, expired=2)

    def test_queue_ttl_does_not_expire_fresh_offers(self, frontier: Frontier) -> None:
        offer(frontier, [url(1)], queue_ttl_s=100)
        offer(frontier, [url(2)], now=T0 + 80, queue_ttl_s=100)
        lease = claim(frontier, now=T0 + 150)
        assert lease.expired == 1
        assert urls_of(lease) == [url(2)]
        assert frontier.counts(SRC) == counts(leased=1, expired=1)

    def test_renew_queue_ttl_gives_queued_items_past_it_a_new_one(self, frontier: Frontier) -> None:
        offer(frontier, [url(1), url(2)], queue_ttl_s=100)  # expire at T0 + 100
        offer(frontier, [url(3)], now=T0 + 80, queue_ttl_s=100)  # at T0 + 180
        assert frontier.renew_queue_ttl(SRC, now=T0 + 150, queue_ttl_s=100) == 2
        assert frontier.renew_queue_ttl(SRC, now=T0 + 150, queue_ttl_s=100) == 0  # done once
        lease = claim(frontier, 10, now=T0 + 200)
        assert (lease.expired, sorted(urls_of(lease))) == (1, [url(1), url(2)])  # url(3) not
        assert {i.enqueued_at for i in lease.items} == {T0}  # aging counts from the first request
        frontier.release(lease, now=T0 + 200)
        assert claim(frontier, 0, now=T0 + 249).expired == 0
        assert claim(frontier, 0, now=T0 + 250).expired == 2  # the renewed TTL ran out
        assert frontier.counts(SRC) == counts(expired=3)

    def test_renew_queue_ttl_pages_through_many_items(self, frontier: Frontier) -> None:
        many = [url(n) for n in range(5_000)]
        offer(frontier, many[:2_500], queue_ttl_s=10)
        offer(frontier, many[2_500:], now=T0 + 1, queue_ttl_s=10)  # two expiry buckets
        assert frontier.renew_queue_ttl(SRC, now=T0 + 20, queue_ttl_s=100) == 5_000
        assert claim(frontier, 0, now=T0 + 100).expired == 0
        assert claim(frontier, 0, now=T0 + 121).expired == 5_000

    # --- counts -------------------------------------------------------------------------------
    def test_counts_per_state(self, frontier: Frontier) -> None:
        self._make_done(frontier, url("done"))
        self._make_dead(frontier, url("dead"))
        offer(frontier, [url("expired")], queue_ttl_s=10)
        claim(frontier, now=T0 + 20)
        offer(frontier, [url("leased")], now=T0 + 20)
        claim(frontier, now=T0 + 20)
        offer(frontier, [url("queued")], now=T0 + 20)
        got = frontier.counts(SRC)
        assert got == counts(queued=1, leased=1, done=1, dead=1, expired=1)
        assert got.total == 5

    def test_run_counts_track_the_runs_offers(self, frontier: Frontier) -> None:
        offer(frontier, [url("a"), url("b"), url("c")], run_id="r1")
        lease = claim(frontier, 1)
        (first,) = urls_of(lease)
        frontier.ack(lease, [done(first)], now=T0)
        assert frontier.run_counts(SRC, "r1") == counts(queued=2, done=1)
        rest = sorted({url("a"), url("b"), url("c")} - {first})
        # run 2 offers: the done (fresh) one, one already queued, a new one
        result = offer(frontier, [first, rest[0], url("d")], now=T0 + 1, run_id="r2")
        assert result == _result(enqueued=1, already_queued=1, fresh_skipped=1)
        assert frontier.run_counts(SRC, "r2") == counts(queued=2, done=1)
        assert frontier.run_counts(SRC, "r2").total == 3
        assert frontier.run_counts(SRC, "r3") == StateCounts()
        assert frontier.counts(SRC) == counts(queued=3, done=1)

    def test_run_counts_include_dead_and_leased(self, frontier: Frontier) -> None:
        self._make_dead(frontier, url("dead"))
        offer(frontier, [url("leased")])
        claim(frontier)
        result = offer(frontier, [url("dead"), url("leased")], now=T0 + 1, run_id="r2")
        assert result == _result(already_dead=1, already_queued=1)
        assert frontier.run_counts(SRC, "r2") == counts(leased=1, dead=1)

    def test_run_counts_follow_the_items(self, frontier: Frontier) -> None:
        offer(frontier, [url(1), url(2)], run_id="r1", queue_ttl_s=100)
        lease = claim(frontier, 1)
        frontier.ack(lease, [DeadLettered(lease.items[0].url, 1, "x")], now=T0)
        claim(frontier, now=T0 + 200)
        assert frontier.run_counts(SRC, "r1") == counts(dead=1, expired=1)

    # --- next_event_at ------------------------------------------------------------------------
    def test_next_event_at(self, frontier: Frontier) -> None:
        assert frontier.next_event_at(SRC, now=T0) is None
        offer(frontier, [url(1)])
        ready = frontier.next_event_at(SRC, now=T0)
        assert ready is not None
        assert ready <= T0  # claimable now
        lease = claim(frontier, now=T0, lease_s=60)
        assert frontier.next_event_at(SRC, now=T0) == T0 + 60
        frontier.ack(lease, [RetryLater(url(1), T0 + 30, 1.0, 1, T0, "x")], now=T0)
        assert frontier.next_event_at(SRC, now=T0) == T0 + 30
        offer(frontier, [url(2)])
        other = claim(frontier, now=T0, lease_s=10)  # url(2) leased until T0 + 10
        assert urls_of(other) == [url(2)]
        assert frontier.next_event_at(SRC, now=T0) == T0 + 10
        frontier.ack(other, [done(url(2))], now=T0)
        assert frontier.next_event_at(SRC, now=T0) == T0 + 30
        lease = claim(frontier, now=T0 + 30)
        frontier.ack(lease, [DeadLettered(url(1), 2, "x")], now=T0 + 30)
        assert frontier.next_event_at(SRC, now=T0 + 30) is None  # only done and dead remain

    def test_next_event_at_ignores_expired(self, frontier: Frontier) -> None:
        offer(frontier, [url(1)], queue_ttl_s=10)
        claim(frontier, now=T0 + 20)
        assert frontier.next_event_at(SRC, now=T0 + 20) is None

    # --- sources ------------------------------------------------------------------------------
    def test_sources_are_isolated(self, frontier: Frontier) -> None:
        assert offer(frontier, [url(1)], source="a") == _result(enqueued=1)
        assert offer(frontier, [url(1)], source="b") == _result(enqueued=1)
        assert frontier.counts("a") == counts(queued=1)
        assert frontier.counts("b") == counts(queued=1)
        lease_a = claim(frontier, source="a")
        assert urls_of(lease_a) == [url(1)]
        assert lease_a.source == "a"
        assert frontier.counts("b") == counts(queued=1)
        assert frontier.ack(lease_a, [done(url(1))], now=T0).accepted == 1
        assert frontier.counts("a") == counts(done=1)
        assert frontier.counts("b") == counts(queued=1)
        lease_b = claim(frontier, source="b")
        assert urls_of(lease_b) == [url(1)]
        assert frontier.next_event_at("a", now=T0) is None
        assert frontier.next_event_at("b", now=T0) == T0 + LEASE
        assert frontier.run_counts("a", "run-1") == counts(done=1)
        assert frontier.run_counts("b", "run-1") == counts(leased=1)

    def test_lease_of_one_source_cannot_ack_another(self, frontier: Frontier) -> None:
        offer(frontier, [url(1)], source="a")
        offer(frontier, [url(1)], source="b")
        lease_a = claim(frontier, source="a")
        claim(frontier, source="b")
        assert frontier.release(lease_a, now=T0) == 1
        assert frontier.counts("a") == counts(queued=1)
        assert frontier.counts("b") == counts(leased=1)

    # --- plans in several calls, seed lists that change, unchanged seed lists -----------------
    def test_once_per_run_counts_a_url_of_the_run_as_duplicate(self, frontier: Frontier) -> None:
        first = offer(frontier, [url(1), url(2), url(1)], run_id="r1", once=True)
        assert first == _result(enqueued=2, duplicates=1)
        second = offer(frontier, [url(2), url(3)], run_id="r1", once=True)
        assert second == _result(enqueued=1, duplicates=1)
        assert second.total == 2
        assert frontier.run_counts(SRC, "r1") == counts(queued=3)
        # another run's offer is no duplicate
        assert offer(frontier, [url(2)], run_id="r2", once=True) == _result(already_queued=1)

    def _unlisted(self, frontier: Frontier) -> None:
        """a leased, b queued (run r1); r2 lists c (queued) and d (new) only."""
        offer(frontier, [url("a"), url("b"), url("c")], run_id="r1")
        assert urls_of(claim(frontier, 1)) == [url("a")]
        result = offer(frontier, [url("c"), url("d")], now=T0 + 1, run_id="r2", once=True)
        assert result == _result(enqueued=1, already_queued=1)

    def test_sweep_retires_unlisted_queued_items(self, frontier: Frontier) -> None:
        self._unlisted(frontier)
        swept = frontier.sweep(SRC, "r2", retire=True)
        assert (swept.carried, swept.retired) == (1, 1)
        assert frontier.run_counts(SRC, "r2") == counts(queued=2, leased=1, retired=1)
        assert frontier.run_counts(SRC, "r1") == StateCounts()
        assert frontier.counts(SRC) == counts(queued=2, leased=1, retired=1)
        assert sorted(urls_of(claim(frontier, 10, now=T0 + 2))) == [url("c"), url("d")]
        # sweeping again finds nothing new; a retired URL listed again is queued again
        again = frontier.sweep(SRC, "r2", retire=True)
        assert (again.carried, again.retired) == (0, 0)
        assert offer(frontier, [url("b")], now=T0 + 3, run_id="r3") == _result(enqueued=1)
        assert urls_of(claim(frontier, 10, now=T0 + 3)) == [url("b")]

    def test_sweep_collect_carries_unlisted_items_into_the_run(self, frontier: Frontier) -> None:
        self._unlisted(frontier)
        swept = frontier.sweep(SRC, "r2", retire=False)
        assert (swept.carried, swept.retired) == (2, 0)
        assert frontier.run_counts(SRC, "r2") == counts(queued=3, leased=1)
        lease = claim(frontier, 10, now=T0 + 2)
        assert sorted(urls_of(lease)) == [url("b"), url("c"), url("d")]
        frontier.ack(lease, [done(u, T0 + 2, 10) for u in urls_of(lease)], now=T0 + 2)
        # an unchanged plan later requeues the listed ones whose freshness passed, never b
        adopted = _adopt(frontier, "r3", now=T0 + 100)
        assert adopted == _result(enqueued=2, already_queued=1)  # c, d; a still leased
        # a's lease (taken at T0) has run out: it is back in the queue, still this run's
        got = sorted(urls_of(claim(frontier, 10, now=T0 + 100)))
        assert got == [url("a"), url("c"), url("d")]

    def test_sweep_keeps_unlisted_done_items_out_of_later_adoptions(
        self, frontier: Frontier
    ) -> None:
        self._make_done(frontier, url("old"), fresh_s=10)
        offer(frontier, [url("x")], queue_ttl_s=5, run_id="r0")
        claim(frontier, 0, now=T0 + 6)  # x expires
        offer(frontier, [url("new")], now=T0 + 7, run_id="r2", once=True)
        assert frontier.sweep(SRC, "r2", retire=True) == SweepResult()  # nothing queued
        self._make_done(frontier, url("new"), now=T0 + 8, fresh_s=10)
        # much later, an unchanged plan: only the listed item is due again
        assert _adopt(frontier, "r3", now=T0 + 1_000) == _result(enqueued=1)
        assert urls_of(claim(frontier, 10, now=T0 + 1_000)) == [url("new")]
        # listing "old" again brings it back
        assert offer(frontier, [url("old")], now=T0 + 1_001, run_id="r4") == _result(enqueued=1)

    def test_unlist_settles_the_named_urls_as_sweep_does(self, frontier: Frontier) -> None:
        self._make_done(frontier, url("e"), fresh_s=10)
        self._make_dead(frontier, url("z"))
        offer(frontier, [url("x")], queue_ttl_s=5, run_id="r0")
        claim(frontier, 0, now=T0 + 6)  # x expires
        self._unlisted(frontier)  # a leased, b queued by r1; c, d the run r2's
        named = [url(n) for n in ("a", "b", "c", "e", "x", "z", "unknown", "b")]
        swept = frontier.unlist(SRC, iter(named), "r2", retire=True)
        # a carried (leased), b retired; c is the run's already; e, x marked; z, unknown left
        assert (swept.carried, swept.retired) == (1, 1)
        assert frontier.run_counts(SRC, "r2") == counts(queued=2, leased=1, retired=1)
        assert frontier.unlist(SRC, named, "r2", retire=True) == SweepResult()  # settled once
        assert frontier.counts(SRC).dead == 1
        # e and x are left out of later adoptions; c and d, listed, are adopted when due
        lease = claim(frontier, 10, now=T0 + 7)
        assert sorted(urls_of(lease)) == [url("c"), url("d")]
        frontier.ack(lease, [done(u, T0 + 7, 10) for u in urls_of(lease)], now=T0 + 7)
        assert _adopt(frontier, "r3", now=T0 + 1_000) == _result(enqueued=2, already_queued=1)
        got = sorted(urls_of(claim(frontier, 10, now=T0 + 1_000)))
        assert got == [url("a"), url("c"), url("d")]

    def test_unlist_collect_carries_queued_items(self, frontier: Frontier) -> None:
        self._unlisted(frontier)
        swept = frontier.unlist(SRC, [url("a"), url("b")], "r2", retire=False)
        assert (swept.carried, swept.retired) == (2, 0)
        assert frontier.run_counts(SRC, "r2") == counts(queued=3, leased=1)

    def _adoption_scene(self, frontier: Frontier) -> None:
        """One item in every state an adoption tells apart: fresh, stale from T0 + 10,
        compensated (stale at once), dead, expired, leased (until T0 + 90 + LEASE), queued."""
        self._make_done(frontier, url("fresh"), fresh_s=1_000)
        self._make_done(frontier, url("stale"), fresh_s=10)
        self._make_done(frontier, url("compensated"), fresh_s=1_000)
        assert frontier.make_stale(SRC, [url("compensated")]) == 1  # due at once
        self._make_dead(frontier, url("dead"))
        offer(frontier, [url("exp")], queue_ttl_s=5)
        claim(frontier, 0, now=T0 + 6)  # expires it
        offer(frontier, [url("leased")])
        assert urls_of(claim(frontier, 1, now=T0 + 90)) == [url("leased")]
        offer(frontier, [url("queued")], run_id="r0")

    def test_adopt_takes_only_due_items(self, frontier: Frontier) -> None:
        self._adoption_scene(frontier)
        adopted = _adopt(frontier, "r2", now=T0 + 100)
        assert adopted == _result(enqueued=3, already_queued=2)
        assert adopted.total == 5
        assert frontier.run_counts(SRC, "r2") == counts(queued=4, leased=1)
        got = sorted(urls_of(claim(frontier, 10, now=T0 + 100)))
        assert got == sorted([url("stale"), url("exp"), url("queued"), url("compensated")])
        # nothing more is due: a second adoption by the same run changes nothing
        assert _adopt(frontier, "r2", now=T0 + 100) == _result()

    def test_due_count_is_what_an_adopting_plan_would_have_due(self, frontier: Frontier) -> None:
        assert frontier.due_count(SRC, now=T0) == 0  # a source never planned
        self._adoption_scene(frontier)
        # before "stale" goes stale: queued, expired, compensated
        assert frontier.due_count(SRC, now=T0 + 9) == 3
        # queued, expired, compensated, stale: what adopt then queues or keeps queued (not
        # the leased item, held by its claimant; not fresh, dead or another source's)
        assert frontier.due_count(SRC, now=T0 + 100) == 4
        assert frontier.due_count("other", now=T0 + 100) == 0
        _adopt(frontier, "r2", now=T0 + 100)
        assert frontier.due_count(SRC, now=T0 + 100) == 4  # queued now, all four
        assert len(claim(frontier, 10, now=T0 + 100).items) == 4
        assert frontier.due_count(SRC, now=T0 + 100) == 0

    def test_adopt_ranks_requeued_items_with_the_planner(self, frontier: Frontier) -> None:
        self._make_done(frontier, url("x"), fresh_s=10)
        self._make_done(frontier, url("y"), fresh_s=10)
        seen: list[tuple[str, float | None, float]] = []

        def rank_for(u: str, age: float | None, fresh_s: float) -> float:
            seen.append((u, age, fresh_s))
            return 5.0 if u == url("y") else 1.0

        frontier.adopt(
            SRC,
            "r2",
            now=T0 + 50,
            queue_ttl_s=QUEUE_TTL,
            rank_for=rank_for,
            fresh_for=lambda u: 7.0,
        )
        assert sorted(seen) == [(url("x"), 50.0, 7.0), (url("y"), 50.0, 7.0)]
        assert urls_of(claim(frontier, 10, now=T0 + 50)) == [url("y"), url("x")]

    def test_plan_mark(self, frontier: Frontier) -> None:
        assert frontier.plan_mark(SRC) is None
        frontier.set_plan_mark(SRC, "seeds-1")
        assert frontier.plan_mark(SRC) == "seeds-1"
        assert frontier.plan_mark("other") is None
        frontier.set_plan_mark(SRC, "seeds-2")
        assert frontier.plan_mark(SRC) == "seeds-2"
        frontier.set_plan_mark(SRC, None)
        assert frontier.plan_mark(SRC) is None

    # --- state machine ------------------------------------------------------------------------
    def test_state_machine(self, frontier: Frontier) -> None:
        machine = _frontier_machine(frontier)
        run_state_machine_as_test(
            machine,
            settings=settings(max_examples=50, stateful_step_count=30, deadline=None),
        )


# --- the model for the state machine ---------------------------------------------------------
URLS = [url(f"m{i}") for i in range(6)]
RANKS = {u: float(i) for i, u in enumerate(URLS)}  # distinct ranks: claim order is determined


@dataclass
class _Item:
    state: str = "queued"
    not_before: float = 0.0
    token: int | None = None
    lease_expires: float | None = None
    fresh_until: float | None = None
    attempts: int = 0
    first_attempt_at: float | None = None
    enqueued_at: float = 0.0
    validators: tuple[str | None, str | None] = (None, None)  # (etag, last_modified) kept


def _frontier_machine(frontier: Frontier) -> type[RuleBasedStateMachine]:
    """A state machine over one frontier; every run uses its own (new) source."""

    class FrontierMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.source = f"sm-{uuid.uuid4().hex}"
            self.now = T0
            self.items: dict[str, _Item] = {}
            self.leases: list[Lease] = []
            self.last_token: int | None = None

        @initialize(picks=st.lists(st.sampled_from(URLS), unique=True, min_size=1))
        def start(self, picks: list[str]) -> None:
            assert frontier.counts(self.source) == StateCounts()
            self.offer(picks)

        # -- helpers
        def _ambiguous(self, lease: Lease) -> bool:
            """A lease that expired but was not taken over: backends may differ, skip it."""
            return any(
                (it := self.items[i.url]).state == "leased"
                and it.token == lease.token
                and it.lease_expires is not None
                and it.lease_expires <= self.now
                for i in lease.items
            )

        def _pick_lease(self, data: st.DataObject) -> Lease | None:
            """Mostly a lease that still holds something (else acks are all stale), sometimes
            any lease ever taken; never one whose expiry makes backends differ."""
            usable = [lease for lease in self.leases if not self._ambiguous(lease)]
            live = [lease for lease in usable if any(self._held(lease, i.url) for i in lease.items)]
            prefer_live = bool(live) and data.draw(st.integers(0, 3), label="live?") != 0
            pool = live if prefer_live else usable
            return data.draw(st.sampled_from(pool), label="lease") if pool else None

        def _held(self, lease: Lease, u: str) -> bool:
            it = self.items.get(u)
            return it is not None and it.state == "leased" and it.token == lease.token

        # -- rules
        @rule(picks=st.lists(st.sampled_from(URLS), unique=True, max_size=4))
        def offer(self, picks: list[str]) -> None:
            expected = OfferResult()
            for u in picks:
                it = self.items.get(u)
                if (
                    it is None
                    or it.state == "expired"
                    or (
                        it.state == "done"
                        and (it.fresh_until is None or it.fresh_until <= self.now)
                    )
                ):
                    expected.enqueued += 1
                    kept = it.validators if it is not None else (None, None)
                    self.items[u] = _Item(enqueued_at=self.now, validators=kept)
                elif it.state in ("queued", "leased"):
                    expected.already_queued += 1
                elif it.state == "dead":
                    expected.already_dead += 1
                else:
                    expected.fresh_skipped += 1
            got = frontier.offer(
                self.source,
                [Offer(u, FRESH) for u in picks],
                now=self.now,
                queue_ttl_s=1e9,
                rank_for=ranked(RANKS),
                run_id="sm",
            )
            assert got == expected

        @rule(limit=st.integers(0, 4), lease_s=st.sampled_from([10.0, 30.0, 60.0]))
        def claim(self, limit: int, lease_s: float) -> None:
            reclaimed = 0
            for it in self.items.values():
                expired = it.lease_expires is not None and it.lease_expires <= self.now
                if it.state == "leased" and expired:
                    it.state, it.token, it.lease_expires = "queued", None, None
                    reclaimed += 1
            due = [
                u
                for u, it in self.items.items()
                if it.state == "queued" and it.not_before <= self.now
            ]
            due.sort(key=lambda u: -RANKS[u])
            expected = due[:limit]
            lease = frontier.claim(self.source, limit, now=self.now, lease_s=lease_s)
            assert urls_of(lease) == expected
            assert lease.reclaimed == reclaimed
            assert lease.expired == 0
            assert lease.expires_at == self.now + lease_s
            if self.last_token is not None:
                assert lease.token > self.last_token
            self.last_token = lease.token
            for item in lease.items:
                it = self.items[item.url]
                assert (item.attempts, item.first_attempt_at) == (
                    it.attempts,
                    it.first_attempt_at,
                )
                assert item.enqueued_at == it.enqueued_at
                assert (item.etag, item.last_modified) == it.validators
                it.state, it.token, it.lease_expires = "leased", lease.token, self.now + lease_s
            if lease.items:
                self.leases.append(lease)

        @precondition(lambda self: self.leases)
        @rule(data=st.data())
        def ack(self, data: st.DataObject) -> None:
            lease = self._pick_lease(data)
            if lease is None:
                return
            picks = data.draw(
                st.lists(st.sampled_from(urls_of(lease)), unique=True, min_size=1), label="urls"
            )
            outcomes = []
            accepted, stale = 0, []
            for u in picks:
                it = self.items[u]
                kind = data.draw(st.sampled_from(["completed", "retry", "dead"]), label=u)
                if kind == "completed":
                    fresh_s = data.draw(st.sampled_from([0.0, 20.0, 100.0]), label="fresh")
                    etag = data.draw(st.sampled_from([None, '"a"', 'W/"b"']), label="etag")
                    modified = data.draw(st.sampled_from([None, "Mon, 30 Nov"]), label="lm")
                    outcome: Completed | RetryLater | DeadLettered = Completed(
                        u, self.now + fresh_s, self.now, etag=etag, last_modified=modified
                    )
                elif kind == "retry":
                    delay = data.draw(st.sampled_from([0.0, 15.0, 50.0]), label="delay")
                    first = it.first_attempt_at if it.first_attempt_at is not None else self.now
                    outcome = RetryLater(u, self.now + delay, RANKS[u], it.attempts + 1, first, "e")
                else:
                    outcome = DeadLettered(u, it.attempts + 1, "e")
                outcomes.append(outcome)
                if not self._held(lease, u):
                    stale.append(u)
                    continue
                accepted += 1
                it.token, it.lease_expires = None, None
                if isinstance(outcome, Completed):
                    it.state, it.fresh_until = "done", outcome.fresh_until
                    it.attempts, it.first_attempt_at = 0, None
                    it.validators = (outcome.etag, outcome.last_modified)
                elif isinstance(outcome, RetryLater):
                    it.state, it.not_before = "queued", outcome.not_before
                    it.attempts, it.first_attempt_at = outcome.attempts, outcome.first_attempt_at
                else:
                    it.state, it.attempts = "dead", outcome.attempts
            got = frontier.ack(lease, outcomes, now=self.now)
            assert got.accepted == accepted
            assert sorted(got.stale) == sorted(stale)

        @precondition(lambda self: self.leases)
        @rule(data=st.data(), lease_s=st.sampled_from([10.0, 60.0]))
        def renew(self, data: st.DataObject, lease_s: float) -> None:
            lease = self._pick_lease(data)
            if lease is None:
                return
            held = [self.items[u] for u in urls_of(lease) if self._held(lease, u)]
            assert frontier.renew(lease, now=self.now, lease_s=lease_s) == len(held)
            for it in held:
                it.lease_expires = self.now + lease_s

        @precondition(lambda self: self.leases)
        @rule(data=st.data())
        def release(self, data: st.DataObject) -> None:
            lease = self._pick_lease(data)
            if lease is None:
                return
            held = [self.items[u] for u in urls_of(lease) if self._held(lease, u)]
            assert frontier.release(lease, now=self.now) == len(held)
            for it in held:
                it.state, it.token, it.lease_expires = "queued", None, None

        @precondition(lambda self: any(it.state == "dead" for it in self.items.values()))
        @rule(picks=st.lists(st.sampled_from(URLS), unique=True, min_size=1, max_size=3))
        def requeue(self, picks: list[str]) -> None:
            expected = 0
            for u in picks:
                it = self.items.get(u)
                if it is not None and it.state in ("dead", "expired"):
                    expected += 1
                    self.items[u] = _Item(enqueued_at=self.now, validators=it.validators)
            got = frontier.requeue(self.source, picks, now=self.now, queue_ttl_s=1e9)
            assert got == expected

        @rule(dt=st.sampled_from([0.5, 5.0, 10.0, 25.0, 70.0]))
        def advance_time(self, dt: float) -> None:
            self.now += dt

        # -- invariants
        @invariant()
        def counts_match_the_model(self) -> None:
            expected = StateCounts()
            for it in self.items.values():
                setattr(expected, it.state, getattr(expected, it.state) + 1)
            got = frontier.counts(self.source)
            assert got == expected
            assert got.total == len(self.items)  # every offered URL is in exactly one state
            assert frontier.run_counts(self.source, "sm").total <= len(self.items)

        @invariant()
        def no_url_in_two_live_leases(self) -> None:
            live: dict[str, int] = {}
            for lease in self.leases:
                for u in urls_of(lease):
                    it = self.items[u]
                    if it.token == lease.token and it.state == "leased":
                        assert u not in live, (u, live[u], lease.token)
                        live[u] = lease.token

        @invariant()
        def next_event_matches_the_model(self) -> None:
            times = [it.not_before for it in self.items.values() if it.state == "queued"]
            times += [
                it.lease_expires
                for it in self.items.values()
                if it.state == "leased" and it.lease_expires is not None
            ]
            got = frontier.next_event_at(self.source, now=self.now)
            if not times:
                assert got is None
            elif min(times) <= self.now:
                assert got is not None
                assert got <= self.now
            else:
                assert got == min(times)

    return FrontierMachine
