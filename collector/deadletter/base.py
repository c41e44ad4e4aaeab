"""Dead letters: items that failed, kept with everything needed to understand and resolve them.

An entry's ``id`` is derived from (source, url, stage, error class, record key), so the same
failure seen again (a rerun, a replay) updates one entry (``attempts``, ``last_seen``) instead of
adding a second: every dead letter exists once and is resolved once. Payloads are scrubbed of
secrets before they are stored.

``attempts`` counts across attempt cycles. Within one cycle (from the entry's first put, or its
reopening, to its resolution) puts keep the largest count seen, so a rerun or a resent call
never counts the same attempts twice. A put onto a *resolved* entry starts a new cycle (the item
was fetched again after a retry, a re-enqueue or a repair): its attempts add to the earlier
cycles', kept by the store beside the entry (``earlier_attempts``, never written by put). So a
page that fails once, is retried and fails once again shows 2 tries, not 1.

What an entry says is kept in fields, never encoded in strings: ``error_class`` is the final
class (``http_500``), ``cause`` says why fetching stopped when it is not the class itself
(``retries_exhausted``, ``max_total_exceeded``), and a resolution keeps its ``resolution_kind``
(:data:`RESOLUTION_KINDS`) beside the free-text ``resolution`` detail.

Three small protocols, one per concern (each with its conformance suite in
``tests/deadletter/conformance.py``; both backends implement all three, :class:`DeadLetters`):

* :class:`DeadLetterStore`: the entries (upsert, read, count, resolve-once);
* :class:`TriageClaims`: an owner and an expiry on an open entry, taken by one conditional
  write, so two triage runs that overlap never work on the same entry; a claim whose owner
  vanished expires;
* :class:`ReviewQueue`: :meth:`~ReviewQueue.escalate` moves an open entry to ``review`` and
  queues one review message for it, per source; reviewers :meth:`~ReviewQueue.take_for_review`
  messages no one else holds, :meth:`~ReviewQueue.claim_stale_reviews` takes over messages held
  too long by someone who vanished, :meth:`~ReviewQueue.put_back` hands one back untouched, and
  :meth:`~ReviewQueue.finish_review` resolves the entry once and drops the message.
"""

from __future__ import annotations

import builtins
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol, get_args, runtime_checkable

__all__ = [
    "CAUSES",
    "RESOLUTION_KINDS",
    "Census",
    "DeadLetter",
    "DeadLetterStore",
    "DeadLetters",
    "ResolutionKind",
    "ReviewQueue",
    "Stage",
    "TriageClaims",
    "check_kind",
    "count_status_kinds",
    "dead_letter_id",
    "reason_label",
    "url_digest",
    "without_userinfo",
]

Stage = Literal["plan", "fetch", "parse", "validate", "store"]
Status = Literal["open", "review", "resolved"]
ResolutionKind = Literal["repaired", "reenqueued", "escalated", "discarded", "reviewed"]
RESOLUTION_KINDS: tuple[ResolutionKind, ...] = get_args(ResolutionKind)
# Why fetching gave up when the error itself was recoverable ("" = the error was permanent),
# or "robots": never fetched, robots.txt disallows it (collector.fetch.robots; a later plan asks
# again, collector.run.robots_replan)
CAUSES = ("", "retries_exhausted", "max_total_exceeded", "robots")


def dead_letter_id(source: str, url: str, stage: str, error_class: str, key: str = "") -> str:
    raw = "\x1f".join((source, url, stage, error_class, key))
    return hashlib.blake2b(raw.encode(), digest_size=12).hexdigest()


def url_digest(url: str) -> str:
    """The digest an entry keeps of its real URL, userinfo removed (``DeadLetter.url_digest``).

    An entry's ``url`` is scrubbed (``user:password@`` and secret query values masked), so it
    cannot be compared with the URLs a later plan offers. The digest can: it is taken before
    scrubbing, with the userinfo left out, so a seed refused for its credentials matches the
    same URL listed without them (the fix the refusal asks for), and a masked query value
    matches the same value offered again. No password is in it; a query value is, one-way.
    """
    data = without_userinfo(url).encode("utf-8", "surrogatepass")
    return hashlib.blake2b(data, digest_size=16, person=b"collector-url").hexdigest()


def without_userinfo(url: str) -> str:
    """``url`` without its ``user:password@`` (masked or not), read on the raw text as
    :func:`collector.policy.urls.shown` reads it: the authority follows the first ``//`` up to
    ``/``, ``?`` or ``#``, and its userinfo ends at its last ``@``."""
    slashes = url.find("//")
    start = 0 if slashes < 0 else slashes + 2
    stop = len(url)
    for end in "/?#":
        found = url.find(end, start)
        if 0 <= found < stop:
            stop = found
    at = url.rfind("@", start, stop)
    return url if at < 0 else url[:start] + url[at + 1 :]


def reason_label(stage: str, cause: str, error_class: str) -> str:
    """How an entry's failure is shown and grouped: ``fetch/retries_exhausted:http_500``.

    Display only: nothing parses it back (the parts are fields of the entry).
    """
    return f"{stage}/{cause}:{error_class}" if cause else f"{stage}/{error_class}"


def check_kind(kind: str) -> ResolutionKind:
    """``kind`` if it is a resolution kind; ValueError naming the allowed ones otherwise."""
    if kind not in RESOLUTION_KINDS:
        raise ValueError(f"resolution kind {kind!r} is not one of {', '.join(RESOLUTION_KINDS)}")
    return kind


@dataclass(slots=True)
class DeadLetter:
    source: str
    url: str
    stage: Stage
    error_class: str  # the final class, e.g. http_500 (never a compound "cause:class")
    message: str
    attempts: int
    first_seen: float
    last_seen: float
    record_key: str = ""
    payload: Any = None  # the record or a body excerpt, scrubbed
    failed_expectations: list[dict[str, Any]] = field(default_factory=list)
    flow_run_id: str | None = None
    status: Status = "open"
    resolution: str | None = None  # free-text detail of the resolution
    requeues: int = 0  # times triage sent the item back to the frontier (kept by the store)
    cause: str = ""  # one of CAUSES: why fetching gave up on a recoverable error
    resolution_kind: ResolutionKind | None = None  # set exactly when status is resolved
    trace_id: str = ""  # OpenTelemetry trace id of the run that quarantined it, when traced
    url_digest: str = ""  # url_digest() of the real URL: what a re-plan matches (run/replan.py)
    span_id: str = ""  # OpenTelemetry span id of its ``collector.dead_letter`` span, when traced
    id: str = ""

    def __post_init__(self) -> None:
        if ":" in self.error_class:
            raise ValueError(
                f"dead letter {self.url}: error_class {self.error_class!r} must be the final"
                " class; put the reason fetching stopped in cause"
            )
        if self.cause not in CAUSES:
            raise ValueError(f"dead letter {self.url}: cause {self.cause!r} is not one of {CAUSES}")
        if not self.id:
            self.id = dead_letter_id(
                self.source, self.url, self.stage, self.error_class, self.record_key
            )

    @property
    def reason(self) -> str:
        return reason_label(self.stage, self.cause, self.error_class)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Census:
    """A source's entries by state and their ids, from one consistent read of the store.

    ``counts`` keys: ``open``, ``review`` and ``resolved:<kind>`` (``resolved:`` for an entry
    resolved without a kind, e.g. migrated from text the old layout could not read). Each
    entry is counted once, under what its own record says; ``ids`` are the entries that exist.
    """

    counts: dict[str, int]
    ids: frozenset[str]


@runtime_checkable
class DeadLetterStore(Protocol):
    """The entries: upsert by id, read, count, resolve once."""

    def put(self, entries: Sequence[DeadLetter]) -> int:
        """Store entries (upsert by id); returns how many ids were new."""
        ...

    def get(self, entry_id: str) -> DeadLetter | None: ...

    def list(
        self,
        *,
        source: str | None = None,
        stage: str | None = None,
        error_class: str | None = None,
        status: str | None = "open",
        limit: int = 100,
        first_seen_before: float | None = None,
    ) -> list[DeadLetter]:
        """Newest ``last_seen`` first; ``first_seen_before`` keeps entries first seen earlier."""
        ...

    def counts(self, source: str | None = None) -> dict[str, int]:
        """Entries per status (open, review, resolved)."""
        ...

    def reasons(self, source: str, *, status: str | None = "open") -> dict[str, int]:
        """Entries per :func:`reason_label` (``stage/[cause:]error_class``)."""
        ...

    def census(self, source: str) -> Census:
        """Entries of ``source`` by state, and their ids, in one consistent read (no payload).

        What the triage balance compares with the archive: an entry is counted from its own
        record, so an index that lies (Redis) or a row the store cannot read shows.
        """
        ...

    def resolve(
        self, entry_id: str, kind: ResolutionKind, detail: str, *, requeued: bool = False
    ) -> bool:
        """Mark an entry that is not resolved yet resolved; False if it was (happens once).

        ``kind`` goes in its own field (ValueError if it is not a resolution kind), ``detail``
        is free text. ``requeued`` says the item went back to the frontier: the entry's
        ``requeues`` count grows by one (triage's backoff and its limit read it).
        """
        ...

    def location(self) -> str:
        """Where the entries live (a file, or a Redis URL without password and prefix)."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc_info: object) -> None: ...


@runtime_checkable
class TriageClaims(Protocol):
    """Exclusive, expiring claims of open entries by triage runs."""

    def claim_for_triage(self, entry_id: str, owner: str, *, now: float, lease_s: float) -> bool:
        """Take an open entry for triage until ``now + lease_s``, in one conditional write.

        True when the entry is open and unclaimed, claimed by ``owner`` already, or its claim
        expired before ``now``; False otherwise (another triage run holds it, or it is not open).
        """
        ...

    def release_claim(self, entry_id: str, owner: str) -> bool:
        """Drop ``owner``'s triage claim (the entry stays as it is); False if not held."""
        ...


@runtime_checkable
class ReviewQueue(Protocol):
    """Escalated entries waiting for a person, one queue per source."""

    def escalate(self, entry_id: str, reason: str) -> bool:
        """Move an open entry to manual review (status ``review``); True exactly once."""
        ...

    def take_for_review(
        self, source: str, reviewer: str, *, count: int = 1, block_ms: int = 0
    ) -> builtins.list[tuple[str, DeadLetter]]:
        """Up to ``count`` escalated entries of ``source`` no other reviewer holds, as
        (message id, entry). ``block_ms`` waits that long for work; 0 returns at once."""
        ...

    def claim_stale_reviews(
        self, source: str, reviewer: str, *, idle_ms: int, count: int = 100
    ) -> builtins.list[tuple[str, DeadLetter]]:
        """Take over reviews of ``source`` held longer than ``idle_ms`` by someone who
        vanished."""
        ...

    def take_entry_for_review(
        self, source: str, entry_id: str, reviewer: str, *, idle_ms: int | None = None
    ) -> builtins.list[tuple[str, DeadLetter]]:
        """The review of one escalated entry of ``source``, out of turn, as [(message id,
        entry)]: when it waits, or ``reviewer`` holds it already, or (``idle_ms`` given) its
        holder has been idle that long. ``[]`` when it is not in review in ``source`` or another
        reviewer holds it. The other waiting entries keep their order."""
        ...

    def put_back(self, message_id: str, entry_id: str) -> bool:
        """Hand a held review back to the queue, entry untouched, *behind* the entries waiting
        (a new message at the end): the next take hands out the next entry, so a reviewer who
        puts one back is not given it again at once. False when the message is no longer the
        entry's current review (the message id it had is then no longer valid)."""
        ...

    def finish_review(
        self, message_id: str, entry_id: str, kind: ResolutionKind, detail: str
    ) -> bool:
        """Resolve the reviewed entry (once) and drop its message (always).

        False when the entry was already resolved or the message is no longer its current
        review; ValueError when the message is about another entry.
        """
        ...


@runtime_checkable
class DeadLetters(DeadLetterStore, TriageClaims, ReviewQueue, Protocol):
    """A backend with all three parts (what :func:`collector.backends.open_deadletters` gives)."""


def count_status_kinds(rows: Iterable[tuple[str, str | None, int]]) -> dict[str, int]:
    """``(status, resolution kind, count)`` rows as :attr:`Census.counts` keys."""
    counts: dict[str, int] = {"open": 0, "review": 0}
    for status, kind, n in rows:
        key = f"resolved:{kind or ''}" if status == "resolved" else status
        counts[key] = counts.get(key, 0) + int(n)
    return counts
