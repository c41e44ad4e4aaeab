"""Dead letters: items that failed, kept with everything needed to understand and resolve them.

An entry's ``id`` is derived from (source, url, stage, error class, record key), so the same
failure seen again (a rerun, a replay) updates one entry (``attempts``, ``last_seen``) instead of
adding a second: every dead letter exists once and is resolved once. Payloads are scrubbed of
secrets before they are stored. Every backend passes ``tests/deadletter/conformance.py``.

Two kinds of ownership sit on top of the statuses (open -> review -> resolved):

* a *triage claim* (:meth:`DeadLetterStore.claim_for_triage`): an owner and an expiry on an open
  entry, taken by one conditional write, so two triage runs that overlap never work on the
  same entry (the loser gets False and skips it); a claim whose owner vanished expires;
* the *manual-review queue*: :meth:`~DeadLetterStore.escalate` moves an open entry to
  ``review`` and queues one review message for it; reviewers :meth:`take_for_review` messages
  no one else holds, :meth:`claim_stale_reviews` takes over messages held too long by someone
  who vanished, and :meth:`finish_review` resolves the entry once and drops the message.
"""

from __future__ import annotations

import builtins
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = ["DeadLetter", "DeadLetterStore", "Stage", "count_status_kinds", "dead_letter_id"]

Stage = Literal["plan", "fetch", "parse", "validate", "store"]
Status = Literal["open", "review", "resolved"]


def dead_letter_id(source: str, url: str, stage: str, error_class: str, key: str = "") -> str:
    raw = "\x1f".join((source, url, stage, error_class.split(":")[-1], key))
    return hashlib.blake2b(raw.encode(), digest_size=12).hexdigest()


@dataclass(slots=True)
class DeadLetter:
    source: str
    url: str
    stage: Stage
    error_class: str
    message: str
    attempts: int
    first_seen: float
    last_seen: float
    record_key: str = ""
    payload: Any = None  # the record or a body excerpt, scrubbed
    failed_expectations: list[dict[str, Any]] = field(default_factory=list)
    flow_run_id: str | None = None
    status: Status = "open"
    resolution: str | None = None
    requeues: int = 0  # times triage sent the item back to the frontier (kept by the store)
    id: str = ""
    trace_id: str = ""  # OpenTelemetry trace of the batch that made it ("" when not traced)

    def __post_init__(self) -> None:
        if not self.id:
            self.id = dead_letter_id(
                self.source, self.url, self.stage, self.error_class, self.record_key
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class DeadLetterStore(Protocol):
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
        """Open entries per ``stage/error_class``."""
        ...

    def status_kinds(self, source: str) -> dict[str, int]:
        """Entries of ``source`` by state, in one consistent read, without loading them.

        Keys: ``open``, ``review``, and ``resolved:<kind>`` where kind is the resolution text
        before its first ``:``, stripped (triage writes ``"repaired: ..."``). What the triage
        balance is computed from, so it costs a count, not a read of every payload.
        """
        ...

    def resolve(self, entry_id: str, resolution: str, *, requeued: bool = False) -> bool:
        """Mark an open entry resolved; False if it was not open (resolve happens once).

        ``requeued`` says the item went back to the frontier: the entry's ``requeues`` count
        grows by one (triage's backoff and its limit read it when the item fails again).
        """
        ...

    # --- triage claims -------------------------------------------------------------------
    def claim_for_triage(self, entry_id: str, owner: str, *, now: float, lease_s: float) -> bool:
        """Take an open entry for triage until ``now + lease_s``, in one conditional write.

        True when the entry is open and unclaimed, claimed by ``owner`` already, or its claim
        expired before ``now``; False otherwise (another triage run holds it, or it is not open).
        """
        ...

    def release_claim(self, entry_id: str, owner: str) -> bool:
        """Drop ``owner``'s triage claim (the entry stays as it is); False if not held."""
        ...

    # --- manual-review queue --------------------------------------------------------------
    def escalate(self, entry_id: str, reason: str) -> bool:
        """Move an open entry to manual review (status ``review``); True exactly once."""
        ...

    def take_for_review(
        self, reviewer: str, *, count: int = 1, block_ms: int = 0
    ) -> builtins.list[tuple[str, DeadLetter]]:
        """Up to ``count`` escalated entries no other reviewer holds, as (message id, entry).

        ``block_ms`` waits that long for work when there is none; 0 returns at once.
        """
        ...

    def claim_stale_reviews(
        self, reviewer: str, *, idle_ms: int, count: int = 100
    ) -> builtins.list[tuple[str, DeadLetter]]:
        """Take over reviews held longer than ``idle_ms`` by a reviewer who vanished."""
        ...

    def finish_review(self, message_id: str, entry_id: str, resolution: str) -> bool:
        """Resolve the reviewed entry (once) and drop its message (always).

        False when the entry was already resolved or the message is no longer its current
        review; ValueError when the message is about another entry.
        """
        ...

    def close(self) -> None: ...


def count_status_kinds(rows: Iterable[tuple[str, str, int]]) -> dict[str, int]:
    """``(status, resolution prefix, count)`` rows as :meth:`DeadLetterStore.status_kinds` keys."""
    counts: dict[str, int] = {"open": 0, "review": 0}
    for status, prefix, n in rows:
        key = f"resolved:{prefix.strip()}" if status == "resolved" else status
        counts[key] = counts.get(key, 0) + int(n)
    return counts
