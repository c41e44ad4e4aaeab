"""The run's accounts: where every discovered item ended, and the proof that none is missing.

Each item a run takes into its account ends the run in exactly one terminal state::

    discovered + unlisted = stored + fresh_skipped + expired + dead_lettered + queued
                            + held_by_others + retired

What a run *discovers* depends on how it planned (``plan``). A ``full`` plan (the seed list is
new or changed) offers every listed seed: ``discovered`` is the number of seeds listed, repeats
counted once (``duplicates`` says how many were dropped). An ``incremental`` plan (the seed list
is the one the last finished plan offered) offers nothing: ``discovered`` is the number of items
that were due and joined the run (queued or leased, expired, done whose freshness ran out);
fresh and dead items are not the run's business and are not counted. A ``difference`` plan (only
a template's range changed) counts the seeds of the numbers the range gained, plus the items of
the rest that were due, as an incremental plan does.

Items an earlier plan queued that a changed seed list no longer names (``unlisted``) join the
run too, and are settled by the source's ``seeds.on_removed``: ``retired`` (they end in the
frontier's ``retired`` state, counted here and proven against the frontier's count), or
``carried_over`` to be collected once more (they then end like any other item; leased ones are
always carried over: a holder may still ack them). ``unlisted = carried_over + retired``. None
is dropped silently.

``stored`` and ``dead_lettered`` are counted from the acks the frontier *accepted*;
``fresh_skipped`` from planning; ``expired``, ``queued`` and ``held_by_others`` (leased by a
live helper when the run ended) are read back from the frontier at the end. The check is then
made twice, against two independent sources: the equation above, and the frontier's own count
of the run's items per state (done = stored + fresh_skipped, dead = dead_lettered minus seeds
refused before reaching the frontier). An ack counted twice, an item dropped on the floor, or a
lease never returned makes one of them fail, and the run with it.

A third check covers what the run *claimed*: every claimed item was acked stored, acked dead,
acked back to the queue (``returned``), acked back deferred because its host's circuit breaker
was open (``deferred_by_circuit``: not an attempt, see collector.fetch.circuit), refused as
stale, or given back with its failed batch (``released``). Drain-only workers
(``collector work``) plan nothing, so this is their whole ledger (:meth:`Ledger.close_claims`).
When such workers help a run, the run's items they settled show in the frontier but not in the
run's acks: the run counts them as ``stored_by_others`` /
``dead_by_others`` (never negative), and each helper's own claim check covers them.

Records are counted beside the items (``records_written``, ``records_unchanged``,
``records_quarantined``), and so is what the sink's one-record-per-key upsert hides:
``key_collisions``, the records of this run whose key an earlier record of this run already
had (two pages naming the same item, or a page listing a key twice). Each replaced the earlier
record in the sink; the run logs one warning naming an example (the key and both URLs).

Compensation (a written batch found bad afterwards) is recorded in the source's
:class:`LedgerBook` (``<state_dir>/ledger.jsonl``): which batch, how many records it removed,
why and when.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from collector.errors import ConservationError
from collector.frontier.base import StateCounts

__all__ = ["Compensation", "Ledger", "LedgerBook", "compensate"]


@dataclass(slots=True)
class Ledger:
    discovered: int = 0
    fresh_skipped: int = 0
    stored: int = 0
    dead_lettered: int = 0
    expired: int = 0
    queued: int = 0
    held_by_others: int = 0  # leased by another live holder (a `collector work` helper) at the end
    unlisted: int = 0  # items earlier plans queued that the changed seed list no longer names
    retired: int = 0  # unlisted items retired by this run (seeds.on_removed: retire)
    # detail (not terms of the equation)
    # "full" (the seed list was offered), "incremental" (only due items), or "difference" (a
    # template's range changed: the numbers it gained offered, the rest as incremental)
    plan: str = ""
    duplicates: int = 0  # seeds listed more than once, counted once in discovered
    carried_over: int = 0  # unlisted items this run collects (unlisted - retired)
    refused_at_plan: int = 0  # seeds with a malformed or refused URL, dead-lettered at once
    already_dead: int = 0  # items still in the dead letters from earlier runs
    retried: int = 0  # attempts sent back to the queue (retry-later)
    records_written: int = 0
    records_unchanged: int = 0
    records_quarantined: int = 0  # records failing validation (their item may still be stored)
    stale_acks: int = 0  # outcomes refused because our lease had passed to someone else
    stale_writes: int = 0  # sink writes refused by the fencing token
    # records whose key an earlier record of this run (another page, or the same page) already
    # had: the sink keeps one record per key, so each replaced the earlier one (not a term of
    # the equation: records, not items; counted by the process that settled them)
    key_collisions: int = 0
    leases_reclaimed: int = 0
    claimed: int = 0  # items leased by this run's claims (an item claimed twice counts twice)
    returned: int = 0  # claimed items acked back to the queue (retry later, batch time)
    released: int = 0  # claimed items of batches whose task failed, given back unchanged
    deferred_by_circuit: int = 0  # deferrals: claims acked back unsent (host breaker open); an
    #                               item deferred in three claims counts three, as in `claimed`
    stored_by_others: int = 0  # this run's items stored by other workers (`collector work`)
    dead_by_others: int = 0  # this run's items dead-lettered by other workers
    requests: int = 0
    batches: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def terminal_sum(self) -> int:
        return (
            self.stored
            + self.stored_by_others
            + self.fresh_skipped
            + self.expired
            + self.dead_lettered
            + self.dead_by_others
            + self.queued
            + self.held_by_others
            + self.retired
        )

    def _claim_problems(self) -> list[str]:
        acked_dead = self.dead_lettered - self.already_dead - self.refused_at_plan
        settled = (
            self.stored
            + acked_dead
            + self.returned
            + self.deferred_by_circuit
            + self.stale_acks
            + self.released
        )
        if self.claimed == settled:
            return []
        return [
            f"claimed {self.claimed} != stored {self.stored} + dead {acked_dead} + returned "
            f"{self.returned} + deferred_by_circuit {self.deferred_by_circuit} + stale "
            f"{self.stale_acks} + released {self.released} (= {settled})"
        ]

    def close_claims(self) -> None:
        """The whole check of a drain-only worker: every item it claimed is accounted for."""
        self.problems = self._claim_problems()

    def close(self, final: StateCounts) -> None:
        """Read the end state of the run's items and check conservation both ways."""
        self.expired = final.expired
        # The run's own leases are all acked or released by now: what is leased is someone else's.
        self.queued = final.queued
        self.held_by_others = final.leased
        in_frontier_dead = self.dead_lettered - self.refused_at_plan
        # Items of this run that drain-only workers settled (zero when none helped).
        self.stored_by_others = max(0, final.done - self.stored - self.fresh_skipped)
        self.dead_by_others = max(0, final.dead - in_frontier_dead)
        problems = self._claim_problems()
        intake = self.discovered + self.unlisted
        if intake != self.terminal_sum:
            problems.append(
                f"discovered {self.discovered} + unlisted {self.unlisted} != stored "
                f"{self.stored} + fresh_skipped {self.fresh_skipped} + expired {self.expired} "
                f"+ dead_lettered {self.dead_lettered} + queued {self.queued} + held by others "
                f"{self.held_by_others} + retired {self.retired} (= {self.terminal_sum})"
            )
        if final.retired != self.retired:
            problems.append(
                f"frontier has {final.retired} of this run's items retired, but the run "
                f"retired {self.retired}"
            )
        if final.done != self.stored + self.stored_by_others + self.fresh_skipped:
            problems.append(
                f"frontier has {final.done} of this run's items done, but the run stored "
                f"{self.stored} and skipped {self.fresh_skipped} as fresh"
            )
        if final.dead != in_frontier_dead + self.dead_by_others:
            problems.append(
                f"frontier has {final.dead} of this run's items dead, but the run "
                f"dead-lettered {in_frontier_dead} of them"
            )
        if intake - self.refused_at_plan != final.total:
            problems.append(
                f"frontier holds {final.total} of this run's items, but the run discovered "
                f"{self.discovered - self.refused_at_plan} fetchable ones and took "
                f"{self.unlisted} unlisted ones"
            )
        self.problems = problems

    @property
    def balanced(self) -> bool:
        return not self.problems

    def raise_if_unbalanced(self) -> None:
        if self.problems:
            raise ConservationError("ledger does not balance: " + "; ".join(self.problems))

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["balanced"] = self.balanced
        return data


@dataclass(frozen=True, slots=True)
class Compensation:
    """One batch's writes undone: which batch, how many records went, why, when, by whom."""

    source: str
    batch_id: str
    removed: int
    reason: str
    at: float
    by: str = ""


class LedgerBook:
    """The source's durable ledger of compensations: an append-only JSONL file.

    A run's :class:`Ledger` lives in memory and in the run's artifacts; undoing a batch happens
    later (an operator, or triage), so it is recorded here, beside the frontier, where
    ``collector compensate`` and the next reader find it.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def record(self, entry: Compensation) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"event": "compensated", **asdict(entry)}, ensure_ascii=False)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def compensations(self, source: str | None = None) -> list[Compensation]:
        if not self.path.exists():
            return []
        found = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if row.pop("event", None) == "compensated" and source in (None, row["source"]):
                found.append(Compensation(**row))
        return found

    def compensated(self, source: str, batch_id: str) -> Compensation | None:
        for entry in self.compensations(source):
            if entry.batch_id == batch_id and entry.removed:
                return entry
        return None


def compensate(
    sink: Any,
    book: LedgerBook,
    *,
    source: str,
    batch_id: str,
    reason: str,
    by: str = "",
    frontier: Any = None,
) -> Compensation:
    """Undo exactly one batch's writes in ``sink`` (``Sink.remove_batch``) and record it.

    With a ``frontier``, the pages of the removed records lose their freshness
    (``Frontier.make_stale``), so the next run fetches them again instead of skipping them as
    fresh; the suite of that run decides again whether they are stored.
    """
    urls = sorted({r.url for r in sink.records(batch_id)}) if frontier is not None else []
    removed = sink.remove_batch(batch_id)
    entry = Compensation(source, batch_id, removed, reason, time.time(), by)
    book.record(entry)  # first: if the frontier fails below, the removal is still on record
    if urls:
        frontier.make_stale(source, urls)
    return entry
