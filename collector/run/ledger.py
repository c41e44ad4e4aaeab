"""The run's accounts: where every discovered item ended, and the proof that none is missing.

Each item a run takes into its account ends the run in exactly one terminal state::

    discovered + unlisted = stored + not_modified + fresh_skipped + expired + dead_lettered
                            + queued + held_by_others + retired

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

``not_modified`` is an item fetched again with its validators and answered 304 (see
collector.fetch.conditional): done and fresh again like a stored one, with nothing parsed,
validated or written; it counts wherever ``stored`` does, as a term of its own.

``stored``, ``not_modified`` and ``dead_lettered`` are counted from the acks the frontier
*accepted*; ``fresh_skipped`` from planning; ``expired``, ``queued`` and ``held_by_others``
(leased by a live helper when the run ended) are read back from the frontier at the end. The
check is then made twice, against two independent sources: the equation above, and the
frontier's own count of the run's items per state (done = stored + not_modified +
fresh_skipped, dead = dead_lettered minus seeds refused before reaching the frontier). An ack
counted twice, an item dropped on the floor, or a lease never returned makes one of them fail,
and the run with it.

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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from collector.deadletter import DeadLetterStore
from collector.errors import ConservationError
from collector.frontier import Frontier
from collector.frontier.base import StateCounts
from collector.ops import tracing
from collector.run.account import (
    CLAIM_TERMS,
    END_TERMS,
    SETTLE_TERMS,
    TERMS,
    Account,
    equation,
)
from collector.sinks import Sink

__all__ = ["Compensation", "Ledger", "LedgerBook", "compensate"]


class Ledger(Account):
    """The run's account while it runs: changed only through its own steps, each of which
    checks what it is given (a broken invariant is an internal error, raised at once as a
    :class:`~collector.errors.ConservationError` naming the step, never a silent miscount).

    The steps: :meth:`planned` (once), :meth:`took` (a claim), :meth:`settled` (a batch),
    :meth:`gave_back` (a failed batch, or the run's own leases at the end), :meth:`reclaimed`
    (dead holders' leases revoked), then :meth:`close` or :meth:`close_claims`. Assigning a
    count from outside raises ``FrozenInstanceError``. :meth:`Account.frozen` is the value a
    summary keeps.
    """

    __slots__ = ()

    # --- the steps ------------------------------------------------------------------------------
    def planned(
        self,
        plan: str,
        *,
        discovered: int,
        duplicates: int = 0,
        fresh_skipped: int = 0,
        already_dead: int = 0,
        refused: int = 0,
        carried_over: int = 0,
        retired: int = 0,
        replanned: int = 0,
        renewed: int = 0,
        fresh_uncounted: int = 0,
    ) -> None:
        """The plan's intake: ``discovered`` counts every seed offered (repeats and refused
        ones included) and every adopted item; repeats are taken off here. ``fresh_uncounted``
        is outside the balance: fresh items the plan did not look at (said, not accounted)."""
        if self.plan:
            self._broken("plan", f"planned twice ({self.plan}, then {plan})")
        if plan not in ("full", "incremental", "difference"):
            self._broken("plan", f"unknown plan kind {plan!r}")
        took = discovered - duplicates
        settled_at_plan = fresh_skipped + already_dead + refused
        counts = (duplicates, fresh_skipped, already_dead, refused, carried_over, retired)
        if min(*counts, fresh_uncounted) < 0:
            self._broken("plan", "a negative count")
        if settled_at_plan > took:
            self._broken(
                "plan",
                f"{fresh_skipped} fresh + {already_dead} already dead + {refused} refused > "
                f"{took} discovered",
            )
        self._set(plan=plan, duplicates=duplicates, replanned=replanned, renewed=renewed)
        self._add(
            discovered=took,
            fresh_skipped=fresh_skipped,
            already_dead=already_dead,
            refused_at_plan=refused,
            dead_lettered=already_dead + refused,
            unlisted=carried_over + retired,
            carried_over=carried_over,
            retired=retired,
            fresh_uncounted=fresh_uncounted,
        )

    def took(self, items: int, *, reclaimed: int = 0) -> None:
        """A claim leased ``items`` items; on the way it sent ``reclaimed`` items of expired
        leases back to the queue (any number: they are not necessarily among its own, so
        nothing bounds one by the other; a SIGKILLed helper's whole lease comes back at the
        next claim of any size)."""
        self._add(claimed=items, leases_reclaimed=reclaimed)

    def reclaimed(self, items: int) -> None:
        """Leases of holders found dead were revoked (their items go back to the queue)."""
        self._add(leases_reclaimed=items)

    def gave_back(self, items: int) -> None:
        """Claimed items given back unchanged: a failed batch's, or the run's own at the end."""
        self._add(released=items)

    def settled(self, items: int, part: Account) -> None:
        """One batch of ``items`` claimed items settled: ``part`` is its share of the account
        (a :class:`~collector.run.summary.BatchReport`), whose :data:`SETTLE_TERMS` are added
        as they are; each item ended exactly one way, and no other term moved."""
        moved = {t.name: getattr(part, t.name) for t in SETTLE_TERMS}
        ends = [t.name for t in SETTLE_TERMS if t.claims < 0]
        ended = sum(moved[name] for name in ends)
        if ended != items:
            said = " + ".join(f"{name} {moved[name]}" for name in ends)
            self._broken("batch", f"{items} items but {said} (= {ended})")
        if moved["retried"] > moved["returned"]:
            self._broken("batch", f"{moved['retried']} retried of {moved['returned']} returned")
        stray = [t.name for t in TERMS if not t.settle and getattr(part, t.name)]
        if stray:
            self._broken("batch", f"terms a settle does not move: {', '.join(stray)}")
        self._add(**moved)

    def _add(self, **counts: int) -> None:
        for name, count in counts.items():
            if count < 0:
                self._broken("count", f"{name} would change by {count}")
        for name, count in counts.items():
            object.__setattr__(self, name, getattr(self, name) + count)

    def _set(self, **values: Any) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @staticmethod
    def _broken(step: str, what: str) -> None:
        raise ConservationError(f"internal error: the ledger's {step} step was given {what}")

    # --- the checks -----------------------------------------------------------------------------
    @property
    def terminal_sum(self) -> int:
        return sum(getattr(self, t.name) for t in END_TERMS)

    def _claim_problems(self) -> list[str]:
        claimed, settled, said = equation(self.values(), CLAIM_TERMS, "claims")
        return [] if claimed == settled else [said]

    def close_claims(self) -> None:
        """The whole check of a drain-only worker: every item it claimed is accounted for."""
        self._set(problems=tuple(self._claim_problems()))

    def close(self, final: StateCounts) -> None:
        """Read the end state of the run's items and check conservation both ways."""
        in_frontier_dead = self.dead_lettered - self.refused_at_plan
        done_here = self.stored + self.not_modified + self.fresh_skipped
        # The run's own leases are all acked or released by now: what is leased is someone
        # else's. Items of this run that drain-only workers settled (zero when none helped).
        self._set(
            expired=final.expired,
            queued=final.queued,
            held_by_others=final.leased,
            stored_by_others=max(0, final.done - done_here),
            dead_by_others=max(0, final.dead - in_frontier_dead),
        )
        problems = self._claim_problems()
        intake, ended, said = equation(self.values(), TERMS, "balance")
        if intake != ended:
            problems.append(said)
        if final.retired != self.retired:
            problems.append(
                f"frontier has {final.retired} of this run's items retired, but the run "
                f"retired {self.retired}"
            )
        if final.done != done_here + self.stored_by_others:
            problems.append(
                f"frontier has {final.done} of this run's items done, but the run stored "
                f"{self.stored}, found {self.not_modified} not modified and skipped "
                f"{self.fresh_skipped} as fresh"
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
        self._set(problems=tuple(problems))

    @property
    def balanced(self) -> bool:
        return not self.problems

    def raise_if_unbalanced(self) -> None:
        if self.problems:
            raise ConservationError("ledger does not balance: " + "; ".join(self.problems))

    def as_dict(self) -> dict[str, Any]:
        data = self.values()
        data["problems"] = list(self.problems)
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
    sink: Sink,
    book: LedgerBook,
    *,
    source: str,
    batch_id: str,
    reason: str,
    by: str = "",
    frontier: Frontier | None = None,
    deadletters: DeadLetterStore | None = None,
) -> Compensation:
    """Undo exactly one batch's writes in ``sink`` (``Sink.remove_batch``) and record it.

    With a ``frontier``, the pages of the removed records lose their freshness
    (``Frontier.make_stale``), so the next run fetches them again instead of skipping them as
    fresh; the suite of that run decides again whether they are stored.

    With ``deadletters`` (the source's store), the ``collector.compensate`` span links to the
    trace in which each of the batch's pages once failed (its dead letters, resolved or not):
    a replayed or reviewed record's batch leads back to the failure it repaired.
    """
    records = sink.records(batch_id) if frontier is not None or deadletters is not None else []
    pages = {r.url for r in records}
    origins = (
        [e for e in deadletters.list(source=source, status=None, limit=10_000) if e.url in pages]
        if deadletters is not None and pages
        else []
    )
    with tracing.recovery_span(
        "compensate", source, origins[:128], batch=batch_id, reason=reason
    ) as span:
        urls = sorted(pages) if frontier is not None else []
        removed = sink.remove_batch(batch_id)
        span.set_attribute("collector.compensate.removed", removed)
    entry = Compensation(source, batch_id, removed, reason, time.time(), by)
    book.record(entry)  # first: if the frontier fails below, the removal is still on record
    if urls and frontier is not None:
        frontier.make_stale(source, urls)
    return entry
