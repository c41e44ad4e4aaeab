"""What one run did, as one typed, frozen value: :class:`RunSummary`.

Built once at the end of a run (:meth:`collector.run.collection.Collection.summary`), read by
the flow (artifacts, events, its return value) and the CLI (the table, ``--json``). The flow
returns :meth:`RunSummary.as_dict` because Prefect stores results as JSON; everything in-process
reads the attributes, so a renamed field is a type error, not a silent ``KeyError`` at the end
of a long run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

__all__ = ["RunSummary"]

Role = Literal["run", "work"]


@dataclass(frozen=True, slots=True)
class RunSummary:
    """A run's ledger (see collector.run.ledger for each term) and how it went."""

    source: str
    run_id: str
    role: Role = "run"
    # the ledger: discovered + unlisted = stored + stored_by_others + fresh_skipped + expired
    #             + dead_lettered + dead_by_others + queued + held_by_others + retired
    discovered: int = 0
    unlisted: int = 0  # queued by earlier plans, no longer in the seed list (docs/planning.md)
    retired: int = 0
    stored: int = 0
    fresh_skipped: int = 0
    expired: int = 0
    dead_lettered: int = 0
    queued: int = 0
    held_by_others: int = 0
    deferred_by_circuit: int = 0  # deferrals, not distinct items: claims sent back unsent while
    #                               their host's breaker was open (not attempts)
    stored_by_others: int = 0
    dead_by_others: int = 0
    balanced: bool = True
    problems: tuple[str, ...] = ()
    # detail of the ledger
    plan: str = ""  # full (the seed list offered) | incremental (only due items)
    duplicates: int = 0  # seeds listed more than once, counted once
    carried_over: int = 0  # unlisted items collected once more (seeds.on_removed: collect)
    refused_at_plan: int = 0
    already_dead: int = 0
    replanned: int = 0  # old plan refusals closed: the URL policy allows them now (run/replan.py)
    renewed: int = 0  # queued items past their queue TTL the plan asked for again (not expired)
    retried: int = 0
    records_written: int = 0
    records_unchanged: int = 0
    records_quarantined: int = 0
    stale_acks: int = 0
    stale_writes: int = 0
    key_collisions: int = 0  # records that replaced an earlier record of this run (same key)
    # one of them: {"key", "first_url", "later_url"} (URLs scrubbed), empty when none
    key_collision: dict[str, str] = field(default_factory=dict)
    leases_reclaimed: int = 0
    claimed: int = 0
    returned: int = 0
    released: int = 0
    batches: int = 0
    # requests and time
    requests: int = 0
    retries: int = 0
    retry_budget_refused: int = 0
    fence_refused: int = 0
    seconds: float = 0.0
    pages_per_second: float = 0.0
    timings_s: dict[str, float] = field(default_factory=dict)
    validation: dict[str, Any] = field(default_factory=dict)
    # where things are
    sink: str = ""
    records_in_sink: int = 0
    frontier: str = ""
    deadletters: str = ""
    deadletter_archive: str = ""
    deadletter_reasons: dict[str, int] = field(default_factory=dict)
    hosts: dict[str, Any] = field(default_factory=dict)  # adaptive windows, breaker openings
    source_path: str = ""  # what a triggered triage is given (a file path or block:<name>)
    # how the run ended
    ending: str = "drained"  # drained | waited | max_items | stopped | skipped
    interrupted: str | None = None  # the signal or cancellation that stopped it, if any
    skipped: str | None = None  # "busy": another run held the source lock (nothing was done)
    wall_seconds: float | None = None

    @property
    def quarantined(self) -> int:
        """Items and records this run put in the dead letters (not the ones already there)."""
        return self.dead_lettered - self.already_dead + self.records_quarantined

    @property
    def all_refused(self) -> bool:
        """Every seed of a full plan was refused (malformed or forbidden URLs): the source as
        written cannot collect anything, which is a failure, not a quiet no-op."""
        return (
            self.plan == "full"
            and self.refused_at_plan > 0
            and self.refused_at_plan == self.discovered
            and not self.carried_over
        )

    @property
    def refused_all(self) -> str:
        """The one line that says so (logged by the flow, printed by the CLI)."""
        return (
            f"every seed URL of {self.source} was refused at plan ({self.refused_at_plan}): "
            f"nothing can be collected; see collector deadletters list --stage plan"
        )

    @property
    def interruption(self) -> str:
        """The one line that says what a stop did (logged by the flow, printed by the CLI)."""
        return (
            f"interrupted by {self.interrupted}: {self.stored} stored, "
            f"{self.returned + self.released} returned to the queue unchanged, lock released; "
            "run again to continue"
        )

    def with_(self, **changes: Any) -> RunSummary:
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["problems"] = list(self.problems)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSummary:
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        known["problems"] = tuple(known.get("problems", ()))
        return cls(**known)
