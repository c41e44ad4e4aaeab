"""A person's decision on an escalated dead letter: accept a corrected record, discard, put back.

Plain Python over the protocols, called by ``collector review`` (``flows/cli/review.py``). The
entry is one the reviewer holds (:meth:`~collector.deadletter.base.ReviewQueue.take_for_review`
or :meth:`~collector.deadletter.base.ReviewQueue.claim_stale_reviews`, by its message id):

* :func:`accept` checks the corrected record (a usable key, the current suite), writes it to the
  sink under a fresh fencing token and a batch id of its own (``review:<reviewer>:<message>``,
  so ``collector compensate`` can undo it), makes its page live again in the frontier (done,
  fresh for its TTL, as triage does for a repaired record) and resolves the entry ``reviewed``;
  a record that still fails is refused and the entry stays held, nothing written;
* :func:`discard` resolves it ``discarded`` with the reviewer's reason;
* putting back is :meth:`~collector.deadletter.base.ReviewQueue.put_back`.

Ctrl-C or a crash between the sink write and the resolution leaves the entry in review with the
record written: accepting it again writes nothing new ("unchanged") and resolves it.

The change itself (write, revive, resolve) runs inside ``guard``, which the command uses to hold
the source's lock: a ``collect`` run in progress counts the dead page in its account, so reviving
it under the run would make its ledger fail. The checks before it need no lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace

from collector.config import Source
from collector.deadletter.base import DeadLetter, ReviewQueue
from collector.frontier.base import Completed, Frontier
from collector.ops import tracing
from collector.recovery.triage import RecordValidator, expectation_names
from collector.settle.parse import dotted_get
from collector.sinks.base import Sink, SinkRecord

__all__ = ["Decision", "accept", "discard"]


@dataclass(slots=True)
class Decision:
    """What a review did: ``done`` False means refused (the entry is still held)."""

    done: bool
    detail: str
    failed: list[str] = field(default_factory=list)
    batch_id: str = ""


def accept(
    source: Source,
    entry: DeadLetter,
    record: Any,
    *,
    message_id: str,
    reviewer: str,
    queue: ReviewQueue,
    frontier: Frontier,
    sink: Sink,
    validator: RecordValidator | None,
    clock: Callable[[], float] = time.time,
    guard: Callable[[Callable[[], Decision]], Decision] = lambda change: change(),
) -> Decision:
    """Store ``record`` as the corrected version of ``entry``'s record and resolve the entry.

    ``guard(change)`` runs the change (after the record's checks) and returns its Decision."""
    with tracing.recovery_span(
        "review", source.name, [entry], decision="accept", reviewer=reviewer
    ) as span:
        decision = _refusal(source.record.key, record, validator) or _rekeyed(
            source.record.key, record, entry.record_key
        )
        if decision is None:
            key = str(dotted_get(record, source.record.key, None))

            def change() -> Decision:
                now = clock()
                token = frontier.claim(source.name, 0, now=now, lease_s=source.ttl.lease_s).token
                batch_id = f"review:{reviewer}:{message_id}"
                written = sink.write(
                    [SinkRecord(key, record, entry.url)], token=token, batch_id=batch_id
                )
                if written.stale_keys:
                    return Decision(False, "a newer write of this key holds the sink: not stored")
                fresh_until = now + source.ttl.fresh_for(entry.url)
                frontier.revive(source.name, [Completed(entry.url, fresh_until, entry.last_seen)])
                detail = f"accepted a corrected record from {reviewer} (batch {batch_id})"
                if not queue.finish_review(message_id, entry.id, "reviewed", detail):
                    return Decision(
                        False, "the entry is no longer in this review (resolved meanwhile)"
                    )
                return Decision(True, detail, batch_id=batch_id)

            decision = guard(change)
        _decided(span, decision)
        return decision


def _decided(span: trace.Span, decision: Decision) -> None:
    """The decision's outcome on the review span (refused = status ERROR with the reason)."""
    span.set_attribute("collector.review.done", decision.done)
    if not decision.done:
        span.set_status(trace.Status(trace.StatusCode.ERROR, decision.detail))


def _refusal(key_path: str, record: Any, validator: RecordValidator | None) -> Decision | None:
    """Why ``record`` cannot be stored as a corrected record (None: it can): not a JSON
    object, no usable key at ``key_path``, or it fails the current suite."""
    if not isinstance(record, dict):
        return Decision(False, f"a record is a JSON object, not {type(record).__name__}")
    key = dotted_get(record, key_path, None)
    if key is None or isinstance(key, (dict, list)) or key == "":
        return Decision(False, f"the record has no usable key at {key_path!r}")
    if validator is not None:
        outcome = validator.validate([record])
        failed = expectation_names(outcome.table_failures)
        for row in outcome.bad:
            failed += expectation_names(row.failed)
        if failed:
            return Decision(False, "the record fails " + ", ".join(failed), failed=failed)
    return None


def _rekeyed(key_path: str, record: dict[str, Any], kept_key: str) -> Decision | None:
    """A correction that changed the record's key is refused (None: the key is the kept one,
    or the entry kept none: its record failed for having no usable key).

    Stored, it would be a record under a key the page never had: the page's own record stays
    missing, and when the page is fetched again it fails again under its old key, while the
    typo stays in the sink for good (seen: id 12 corrected as 999, stored without a word)."""
    key = str(dotted_get(record, key_path, None))
    if not kept_key or key == kept_key:
        return None
    return Decision(
        False,
        f"the corrected record's key is {key!r}, not the entry's {kept_key!r} (at {key_path!r}):"
        " a correction keeps its record's key; fix it back, or discard this entry",
    )


def discard(
    entry: DeadLetter, reason: str, *, message_id: str, reviewer: str, queue: ReviewQueue
) -> Decision:
    """Resolve ``entry`` as discarded, with the reviewer's reason."""
    with tracing.recovery_span(
        "review", entry.source, [entry], decision="discard", reviewer=reviewer
    ) as span:
        decision = _discard(entry, reason, message_id=message_id, reviewer=reviewer, queue=queue)
        _decided(span, decision)
        return decision


def _discard(
    entry: DeadLetter, reason: str, *, message_id: str, reviewer: str, queue: ReviewQueue
) -> Decision:
    if not reason.strip():
        return Decision(False, "a discard needs a reason")
    detail = f"{reason.strip()} ({reviewer})"
    if not queue.finish_review(message_id, entry.id, "discarded", detail):
        return Decision(False, "the entry is no longer in this review (resolved meanwhile)")
    return Decision(True, detail)
