"""Refusals whose cause is gone: seeds dead-lettered at plan that the URL policy allows now.

A seed refused at plan (``plan/refused_url``: a loopback host without
``allow_private_networks``, a host outside ``allowed_hosts``) never reaches the frontier, so no
fetch can ever close its dead letter, and triage, which sees a permanent error, would escalate it
to a person. Once the source is fixed, the next plan offers the URL again; this module closes
its old entry at that moment, as re-enqueued, so the dead letters tell the truth and the entry is
counted once (``Collection.replanned``).

Only entries whose URL the policy now accepts *and* that this plan offered are closed: a URL
no longer in the seeds keeps its entry (its cause is not known to be gone). On a crash between
the offer and the resolve, the entry stays open and the next plan closes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from collector.errors import RecoverableFetchError

if TYPE_CHECKING:
    from collector.deadletter.base import DeadLetterStore

__all__ = ["LiftedRefusals"]

_MAX_ENTRIES = 100_000  # open plan refusals looked at per plan


class LiftedRefusals:
    """Open plan refusals the policy accepts now; :meth:`offered` marks those offered again."""

    def __init__(self, store: DeadLetterStore, source: str, refusal: Callable[[str], str | None]):
        self.store = store
        self.pending: dict[str, str] = {}  # url -> entry id
        self.offered_urls: set[str] = set()
        entries = store.list(
            source=source, stage="plan", error_class="refused_url", status="open",
            limit=_MAX_ENTRIES,
        )  # fmt: skip
        for entry in entries:
            try:
                if refusal(entry.url) is None:
                    self.pending[entry.url] = entry.id
            except RecoverableFetchError:
                continue  # DNS does not answer now: decide at a later plan

    def offered(self, url: str) -> None:
        """Called for every URL the plan offers to the frontier."""
        if url in self.pending:
            self.offered_urls.add(url)

    def resolve(self) -> int:
        """Close the entries of the offered URLs; how many were closed."""
        detail = "re-planned: the URL policy allows it now"
        return sum(
            self.store.resolve(self.pending[url], "reenqueued", detail)
            for url in sorted(self.offered_urls)
        )
