"""A run's plan: which items join its account, by one of three kinds (``Ledger.plan``).

* **incremental**: the seed list is the one the last finished plan offered (its
  :meth:`~collector.config.Source.seed_mark` is the one the frontier kept): nothing is offered,
  the items that are due join the run (:meth:`Frontier.adopt`); the fresh ones are not read,
  only counted (``fresh_uncounted``: the frontier's done items after the plan).
* **difference**: only a template's range changed, or a listed seed list was edited and the last
  plan's copy is here: the numbers (lines) it gained are offered, those it lost are settled
  (:meth:`Frontier.unlist`: retired or carried over, ``seeds.on_removed``), the rest adopted.
* **full**: every seed is offered (streamed, :class:`~collector.run.offer.SeedOffer`), and items
  earlier plans queued that the list no longer names are swept (retired or carried over).

The mark is cleared first and stored last, so a plan cut short is done in full next time.
:class:`Plan` only decides and counts; the ledger takes the count (:meth:`Ledger.planned`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from collector.config import Source
from collector.deadletter.base import url_digest, without_userinfo
from collector.frontier import Frontier, OfferResult, SweepResult
from collector.run.offer import Offered, SeedOffer
from collector.run.seedlist import ListChange, ListCopies, ListCopy, list_change, listed_digest
from collector.run.seeds import RangeChange, range_change

__all__ = ["Plan", "PlanCount"]


@dataclass(slots=True)
class PlanCount:
    """What one plan took in, as :meth:`Ledger.planned` takes it."""

    kind: str
    result: OfferResult = field(default_factory=OfferResult)
    offered: Offered = field(default_factory=Offered)
    adopted: int = 0
    swept: SweepResult = field(default_factory=SweepResult)
    renewed: int = 0
    fresh_uncounted: int = 0  # fresh items an incremental or difference plan left unread

    def for_ledger(self) -> dict[str, Any]:
        """The keyword arguments of :meth:`Ledger.planned` (the kind first)."""
        return {
            "plan": self.kind,
            "discovered": self.offered.seen + self.adopted,
            "duplicates": self.result.duplicates,
            "fresh_skipped": self.result.fresh_skipped,
            "already_dead": self.result.already_dead,
            "refused": self.offered.refused,
            "carried_over": self.swept.carried,
            "retired": self.swept.retired,
            "replanned": self.offered.replanned,
            "renewed": self.renewed,
            "fresh_uncounted": self.fresh_uncounted,
        }


class Plan:
    """One plan of one run (see the module docstring for the kinds)."""

    def __init__(
        self, source: Source, frontier: Frontier, offer: SeedOffer, *, tag: str, now: float
    ) -> None:
        self.source = source
        self.name = source.name
        self.frontier = frontier
        self.seeds = offer
        self.tag = tag
        self.now = now
        self.retire = source.seeds.on_removed == "retire"
        self._new_ranks: dict[float, float] = {}  # without rules, a new URL's rank is fresh_s's

    def take(self) -> PlanCount:
        """Plan: choose the kind, offer, settle what left the list, adopt what is due."""
        source, frontier, ttl = self.source, self.frontier, self.source.ttl
        # leftovers of an earlier run are asked for again, not expired by this run's first claim
        renewed = frontier.renew_queue_ttl(self.name, now=self.now, queue_ttl_s=ttl.queue_ttl_s)
        mark = source.seed_mark()
        stored = frontier.plan_mark(self.name)
        if stored == mark:
            count = PlanCount("incremental", adopted=self._adopt(), renewed=renewed)
            count.fresh_uncounted = self._fresh_uncounted(count)
            return count
        frontier.set_plan_mark(self.name, None)
        copies, listed = None, None
        head = source.seed_list_head()
        if head is not None:  # the plan reads a copy of the list, kept for the next difference
            copies = ListCopies(source.state_path / "seedlists" / self.name)
            listed = copies.write(source.seed_list_blocks(head))
            mark = source.seed_mark(list_digest=listed.digest)
        if (range_diff := range_change(stored, mark)) is not None:
            count = self._range_difference(range_diff)
        elif (list_diff := _list_change(copies, listed, stored, mark)) is not None:
            assert listed is not None
            count = self._list_difference(list_diff, listed)
        else:
            count = self._full(listed)
        if copies is not None and listed is not None:
            copies.keep(listed)
        frontier.set_plan_mark(self.name, mark)
        count.renewed = renewed
        count.fresh_uncounted = self._fresh_uncounted(count)
        return count

    def _range_difference(self, change: RangeChange) -> PlanCount:
        """A template whose range alone changed: offer the numbers gained, settle the lost."""
        template_urls = self.source.template_urls
        swept = SweepResult()
        # settle the URLs that left first: then the adopt below leaves them alone
        for gone in change.removed:
            urls = template_urls(gone.start, gone.stop)
            swept += self.frontier.unlist(self.name, urls, self.tag, retire=self.retire)
        added = (template_urls(r.start, r.stop) for r in change.added)
        # the policy is unchanged and every refused number is still listed: nothing lifts
        result, offered = self.seeds.offer(
            chain.from_iterable(added), self.now, self.rank_for, left=set()
        )
        # the unchanged part, as an unchanged plan takes it
        return PlanCount("difference", result, offered, self._adopt(), swept)

    def _list_difference(self, change: ListChange, listed: ListCopy) -> PlanCount:
        """An edited seed list: offer the lines added, settle the URLs that left."""
        # a refusal lifts only when its refused form left the list (the shared lines are not
        # offered, so a form still listed there would not be refused again)
        dropped = change.removed
        left = {url_digest(u) for u in dropped} | {without_userinfo(u) for u in dropped}
        result, offered = self.seeds.offer(
            listed.urls(*change.added), self.now, self.rank_for, left=left, listed=listed
        )
        # after the offer: a URL that moved within the list is the run's now, and unlist leaves
        # the run's items alone
        swept = self.frontier.unlist(self.name, iter(dropped), self.tag, retire=self.retire)
        return PlanCount("difference", result, offered, self._adopt(), swept)

    def _full(self, listed: ListCopy | None) -> PlanCount:
        """Offer every seed, then sweep what earlier plans queued and the list dropped."""
        seeds = listed.urls() if listed else self.source.seed_urls()
        result, offered = self.seeds.offer(seeds, self.now, self.rank_for)
        swept = self.frontier.sweep(self.name, self.tag, retire=self.retire)
        return PlanCount("full", result, offered, 0, swept)

    def rank_for(self, url: str, age_s: float | None, fresh_s: float) -> float:
        """An item's rank at plan time; a new URL's, without priority rules, once per fresh_s."""
        priority, now = self.source.priority, self.now
        if age_s is None and not priority.rules:
            known = self._new_ranks.get(fresh_s)
            if known is None:
                known = self._new_ranks[fresh_s] = priority.rank_for(
                    url, enqueued_at=now, age_s=None, fresh_s=fresh_s
                )
            return known
        return priority.rank_for(url, enqueued_at=now, age_s=age_s, fresh_s=fresh_s)

    def _fresh_uncounted(self, count: PlanCount) -> int:
        """The fresh items a plan that adopts (incremental, difference) did not look at.

        Adopting reads only what is due, so after it every done item of the source is fresh;
        those a difference plan offered are counted in ``fresh_skipped`` already. One count
        of the frontier (no item is read), so the run can say what it skipped.
        """
        if count.kind == "full":
            return 0
        done = self.frontier.counts(self.name).done
        return max(0, done - count.result.fresh_skipped)

    def _adopt(self) -> int:
        """The due items of the source join the run (an unchanged list's whole intake)."""
        ttl = self.source.ttl
        return self.frontier.adopt(
            self.name,
            self.tag,
            now=self.now,
            queue_ttl_s=ttl.queue_ttl_s,
            rank_for=self.rank_for,
            fresh_for=ttl.fresh_for,
        ).total


def _list_change(
    copies: ListCopies | None, listed: ListCopy | None, stored: str | None, mark: str
) -> ListChange | None:
    """What an edit of the listed seeds changed, when the last plan's copy is here."""
    kept_digest = listed_digest(stored, mark)
    if copies is None or listed is None or kept_digest is None:
        return None
    kept = copies.kept(kept_digest)
    return None if kept is None else list_change(kept, listed)
