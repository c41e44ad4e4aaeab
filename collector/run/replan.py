"""Refusals whose cause is gone: seeds dead-lettered at plan that the URL policy allows now.

A seed refused at plan (``plan/refused_url``: a loopback host without
``allow_private_networks``, a host outside ``allowed_hosts``, credentials in the URL) never
reaches the frontier, so no fetch can ever close its dead letter, and triage, which sees a
permanent error, would escalate it to a person. Once the source is fixed, the next plan offers
the URL again; this module closes its old entry at that moment, as re-enqueued, so the dead
letters tell the truth and the entry is counted once (``Ledger.replanned``).

An entry's ``url`` is scrubbed (userinfo and secret query values masked), so it is matched by
its ``url_digest`` (:func:`collector.deadletter.base.url_digest`: the real URL, userinfo
left out): a seed refused for ``user:password@`` is closed when the plan offers the same URL
without them (the credentials moved to a header, as the refusal asks), and one with a masked
query value when that URL is offered again. Entries written before the digest existed are
matched by their stored URL with its masked userinfo left out (exact unless a query value was
masked too).

Only entries whose URL the policy now accepts *and* that this plan offered are closed: a URL
no longer in the seeds keeps its entry (its cause is not known to be gone), and so does one
this plan refused again (a seed list naming ``https://u:p@h/x`` and ``https://h/x``: the first
is still refused, its entry seen again). On a crash between the offer and the resolve, the
entry stays open and the next plan closes it. A difference plan (collector.run.seedlist) offers
only the lines that changed, so there an entry lifts only when its refused form left the list
(``left``: a form still listed in the unchanged lines is not offered, so it would not be seen
refused again) and its allowed form is named by the new list: offered, or found in the
unchanged lines by one read of the list (Collection._offer_seeds).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from collector.deadletter.base import url_digest, without_userinfo
from collector.errors import RecoverableFetchError

if TYPE_CHECKING:
    from collector.deadletter.base import DeadLetter, DeadLetterStore

__all__ = ["LiftedRefusals"]

_MAX_ENTRIES = 100_000  # open plan refusals looked at per plan
_LIFTED = "re-planned: the URL policy allows it now"
_UNCREDENTIALED = "re-planned: the URL is listed without credentials now"


class LiftedRefusals:
    """Open plan refusals the policy accepts now; :meth:`offered` marks those offered again."""

    def __init__(
        self,
        store: DeadLetterStore,
        source: str,
        refusal: Callable[[str], str | None],
        *,
        left: set[str] | None = None,
    ):
        """``left``: for a plan that offers only part of the list (a difference plan), the keys
        (``url_digest`` and the URL without userinfo) of the URLs that left it; only entries
        whose refused URL is among them can lift, since the rest of the list is not offered
        and a form still listed there would not be refused again. None: a full plan."""
        self.store = store
        # url (entries without a digest) or url_digest -> entry; a digest (32 hex digits) is
        # never a URL, so one dict serves both and its truth says whether anything may lift
        self.pending: dict[str, DeadLetter] = {}
        self.offered_ids: set[str] = set()
        entries = store.list(
            source=source, stage="plan", error_class="refused_url", status="open",
            limit=_MAX_ENTRIES,
        )  # fmt: skip
        for entry in entries:
            plain = without_userinfo(entry.url)  # what a fixed seed list would offer
            try:
                if refusal(plain) is not None:
                    continue  # the host or scheme is still refused: nothing can lift it now
            except RecoverableFetchError:
                continue  # DNS does not answer now: decide at a later plan
            key = entry.url_digest or plain
            if left is None or key in left:
                self.pending[key] = entry

    def offered(self, url: str) -> None:
        """Called for every URL the plan offers to the frontier (each passed the URL check)."""
        pending = self.pending
        entry = pending.get(url) or pending.get(url_digest(url))
        if entry is not None:
            self.offered_ids.add(entry.id)

    def resolve(self) -> int:
        """Close the entries of the offered URLs; how many were closed."""
        listed = {entry.id: entry for entry in self.pending.values()}
        closed = 0
        for entry_id in sorted(self.offered_ids):
            before = listed[entry_id]
            now = self.store.get(entry_id)
            if now is None or now.status != "open" or now.last_seen != before.last_seen:
                continue  # refused again by this plan (seen since it was listed), or settled
            detail = _LIFTED if without_userinfo(before.url) == before.url else _UNCREDENTIALED
            closed += self.store.resolve(entry_id, "reenqueued", detail)
        return closed
