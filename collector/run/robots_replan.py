"""Pages robots.txt refused, asked about again: a later plan puts them back in the queue.

A URL robots.txt disallows is a dead letter (error class and cause ``robots``, see
collector.fetch.robots), and its item is dead, so no plan would offer it again and triage sees a
permanent error. robots.txt changes, though: at each plan, the source's open ``robots`` dead
letters last seen more than ``politeness.robots_ttl_s`` ago (at once with
``politeness.robots: ignore``) are re-enqueued (collector.recovery.requeue: the item queued, the
entry resolved as ``reenqueued``). The run then checks each against the robots.txt it holds (no
page request unless it is allowed now); one still disallowed is dead-lettered again (the same
entry, seen again). Before the plan's own steps, so the items join the run's ledger like any
queued item (``already_queued`` / ``discovered``).

On a crash between the requeue and the resolve the entry stays open with its item queued; the
next plan resolves it (the frontier no longer holds the URL as dead: ``reenqueue`` says False
and the entry is closed then, see :func:`reexamine`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from collector.recovery.requeue import reenqueue

if TYPE_CHECKING:
    from collector.config import Source
    from collector.deadletter.base import DeadLetterStore
    from collector.frontier.base import Frontier

__all__ = ["ROBOTS_LISTED", "reexamine"]

ROBOTS_LISTED = 100_000  # robots dead letters read per plan (newest first: the rest next plan)


def reexamine(
    deadletters: DeadLetterStore, frontier: Frontier, source: Source, *, now: float
) -> int:
    """Re-enqueue the source's robots dead letters due for another look; returns how many."""
    politeness = source.politeness
    cutoff = now - politeness.robots_ttl_s if politeness.robots == "obey" else now
    entries = deadletters.list(
        source=source.name, error_class="robots", status="open", limit=ROBOTS_LISTED
    )
    requeued = 0
    for entry in entries:
        if entry.last_seen > cutoff:
            continue
        detail = "robots.txt asked again (politeness.robots)"
        if reenqueue(deadletters, frontier, source, entry, detail=detail, now=now):
            requeued += 1
        else:  # its item is not dead any more (queued by a plan cut short after the requeue)
            deadletters.resolve(entry.id, "reenqueued", detail, requeued=True)
    return requeued
