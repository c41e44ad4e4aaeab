"""What a source's run still on its way will have due once it planned, before it plans.

The autoscaler reads a source's backlog from its frontier, and a run's plan is what fills it: a
run that is starting or planning shows nothing due, and helpers asked for once it planned and
claimed come a plan and a process start after it (docs/fleet.md, "Forecast"). What the plan
will find is known before: the items already due in the frontier (:meth:`Frontier.due_count`:
queued, expired, done with their freshness passed) and the seeds the frontier does not hold yet
(a source never planned: all of its seeds). The frontier's part is read from counts and
indexes, never from the items; a seed file's lines are counted. Read when a run is first seen on
its way and every 5 s while it waits (flows/fleet.py).

Prefect-free: plain functions of a frontier and a source.
"""

from __future__ import annotations

from collector import defaults
from collector.config import Source
from collector.frontier.base import Frontier

__all__ = ["expected_due", "prior_throughput"]


def expected_due(frontier: Frontier, source: Source, *, now: float) -> int:
    """Items a plan of ``source`` at ``now`` is expected to leave due: the frontier's due count
    and the seeds beyond what it holds (an estimate: a seed list that lost as many URLs as it
    gained counts none of the new ones; repeats in the list count). A seed file that cannot
    be read counts nothing: its run will say why."""
    due = frontier.due_count(source.name, now=now)
    try:
        seeds = source.seed_count()
    except (OSError, UnicodeDecodeError):
        seeds = 0
    held = frontier.counts(source.name).total
    return due + max(0, seeds - held)


def prior_throughput(source: Source) -> float:
    """Items/s one process of ``source`` is taken to claim before any was measured: its request
    slots (``limits.concurrency``) at ``FLEET_SLOT_RATE_PRIOR`` each."""
    return source.limits.concurrency * defaults.FLEET_SLOT_RATE_PRIOR
