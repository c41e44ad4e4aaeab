"""Seeds offered to the frontier, streamed: each checked, refused ones dead-lettered in chunks.

Every plan kind that offers seeds (``full``, and the part a ``difference`` plan offers) goes
through :class:`SeedOffer`: memory stays constant however long the list (the frontier reads the
offers as a generator; refused seeds are written 500 at a time), each seed is counted once as
offered, and refusals an earlier plan made that the URL policy allows now are closed
(:class:`~collector.run.replan.LiftedRefusals`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from collector.config import Source
from collector.deadletter import DeadLetter, DeadLetterStore
from collector.deadletter.base import without_userinfo
from collector.errors import RecoverableFetchError
from collector.frontier import Frontier, Offer, OfferResult
from collector.policy.urls import HostPolicy
from collector.run.replan import LiftedRefusals
from collector.run.seedlist import ListCopy, named_in
from collector.run.seeds import SeedCheck
from collector.settle.letters import Letters

__all__ = ["REFUSED_CHUNK", "Offered", "RankFor", "SeedOffer"]

REFUSED_CHUNK = 500  # refused seeds written to the dead letters at a time (bounded memory)
RankFor = Callable[[str, "float | None", float], float]
"""``(url, age_s, fresh_s) -> rank`` at plan time (collector.policy.priority)."""


@dataclass(slots=True)
class Offered:
    """What one offer of seeds counted, for the ledger's plan step."""

    seen: int = 0  # seeds offered, repeats and refused ones included
    refused: int = 0  # of them refused before the frontier (dead-lettered at plan)
    replanned: int = 0  # old plan refusals closed: the policy allows those URLs now


class SeedOffer:
    """Offers seeds of one source for one run (see the module docstring)."""

    def __init__(
        self,
        source: Source,
        frontier: Frontier,
        deadletters: DeadLetterStore,
        *,
        tag: str,
        letters: Letters,
        file_letters: Callable[[list[DeadLetter]], None],
    ) -> None:
        self.source = source
        self.frontier = frontier
        self.deadletters = deadletters
        self.tag = tag
        self.letters = letters
        self.file_letters = file_letters  # the run's way to put dead letters (and count them)
        self.check = SeedCheck(
            HostPolicy(
                allow_private_networks=source.allow_private_networks,
                allowed_hosts=source.limits.allowed_hosts,
            )
        )

    def offer(
        self,
        seeds: Iterable[str],
        now: float,
        rank_for: RankFor,
        *,
        left: set[str] | None = None,
        listed: ListCopy | None = None,
    ) -> tuple[OfferResult, Offered]:
        """Check and offer ``seeds`` (streamed), counting each; refused ones go to the dead
        letters, 500 at a time.

        A difference plan offers part of the list: ``left`` are the keys of the URLs that left
        it (collector.run.replan.LiftedRefusals), ``listed`` the whole new list, read for the
        lifted refusals' URLs when some are pending."""
        counted = Offered()
        refused: list[DeadLetter] = []
        name = self.source.name
        lifted = LiftedRefusals(self.deadletters, name, self.check.refusal, left=left)
        result = self.frontier.offer(
            name,
            self._offers(seeds, counted, refused, lifted),
            now=now,
            queue_ttl_s=self.source.ttl.queue_ttl_s,
            rank_for=rank_for,
            run_id=self.tag,
            once_per_run=True,
        )
        self._put_refused(refused, counted)
        if listed is not None and lifted.pending:  # a difference plan: unchanged lines count
            plain = {without_userinfo(entry.url) for entry in lifted.pending.values()}
            for url in named_in(listed, plain):
                lifted.offered(url)
        counted.replanned = lifted.resolve()  # old refusals allowed now (collector.run.replan)
        return result, counted

    def _offers(
        self,
        seeds: Iterable[str],
        counted: Offered,
        refused: list[DeadLetter],
        lifted: LiftedRefusals,
    ) -> Iterator[Offer]:
        ttl = self.source.ttl
        fresh_for = ttl.fresh_for if (ttl.rules or ttl.hook) else None
        default_fresh = ttl.default_fresh_s
        refusal, lifting = self.check.refusal, bool(lifted.pending)  # per-URL work kept short
        for url in seeds:
            counted.seen += 1
            try:
                reason = refusal(url)
            except RecoverableFetchError:
                reason = None  # DNS may recover: let the fetch step retry it
            if reason is not None:
                refused.append(self.letters.refused(url, reason))
                if len(refused) >= REFUSED_CHUNK:
                    self._put_refused(refused, counted)
                continue
            if lifting:
                lifted.offered(url)
            yield Offer(url, fresh_for(url) if fresh_for else default_fresh)

    def _put_refused(self, refused: list[DeadLetter], counted: Offered) -> None:
        self.file_letters(refused)
        counted.refused += len(refused)
        refused.clear()
