"""The run's accounts: where every discovered item ended, and the proof that none is missing.

Each item a run discovers (a seed URL) ends the run in exactly one terminal state::

    discovered = stored + fresh_skipped + expired + dead_lettered + queued

``stored`` and ``dead_lettered`` are counted from the acks the frontier *accepted*;
``fresh_skipped`` from planning; ``expired`` and ``queued`` are read back from the frontier at
the end. The check is then made twice, against two independent sources: the equation above,
and the frontier's own count of the run's items per state (done = stored + fresh_skipped, dead
= dead_lettered minus seeds refused before reaching the frontier). An ack counted twice, an item
dropped on the floor, or a lease never returned makes one of them fail, and the run with it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from collector.errors import ConservationError
from collector.frontier.base import StateCounts

__all__ = ["Ledger"]


@dataclass(slots=True)
class Ledger:
    discovered: int = 0
    fresh_skipped: int = 0
    stored: int = 0
    dead_lettered: int = 0
    expired: int = 0
    queued: int = 0
    # detail (not terms of the equation)
    refused_at_plan: int = 0  # seeds with a malformed or refused URL, dead-lettered at once
    already_dead: int = 0  # items still in the dead letters from earlier runs
    retried: int = 0  # attempts sent back to the queue (retry-later)
    records_written: int = 0
    records_unchanged: int = 0
    records_quarantined: int = 0  # records failing validation (their item may still be stored)
    stale_acks: int = 0  # outcomes refused because our lease had passed to someone else
    stale_writes: int = 0  # sink writes refused by the fencing token
    leases_reclaimed: int = 0
    requests: int = 0
    batches: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def terminal_sum(self) -> int:
        return self.stored + self.fresh_skipped + self.expired + self.dead_lettered + self.queued

    def close(self, final: StateCounts) -> None:
        """Read the end state of the run's items and check conservation both ways."""
        self.expired = final.expired
        self.queued = final.queued + final.leased
        problems = []
        if self.discovered != self.terminal_sum:
            problems.append(
                f"discovered {self.discovered} != stored {self.stored} + fresh_skipped "
                f"{self.fresh_skipped} + expired {self.expired} + dead_lettered "
                f"{self.dead_lettered} + queued {self.queued} (= {self.terminal_sum})"
            )
        if final.done != self.stored + self.fresh_skipped:
            problems.append(
                f"frontier has {final.done} of this run's items done, but the run stored "
                f"{self.stored} and skipped {self.fresh_skipped} as fresh"
            )
        in_frontier_dead = self.dead_lettered - self.refused_at_plan
        if final.dead != in_frontier_dead:
            problems.append(
                f"frontier has {final.dead} of this run's items dead, but the run "
                f"dead-lettered {in_frontier_dead} of them"
            )
        if self.discovered - self.refused_at_plan != final.total:
            problems.append(
                f"frontier holds {final.total} of this run's items, but the run discovered "
                f"{self.discovered - self.refused_at_plan} fetchable ones"
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
