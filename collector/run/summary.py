"""What one run did, as one typed, frozen value: :class:`RunSummary`; what one batch did:
:class:`BatchReport` (a progress display's and the metrics' input).

Built once at the end of a run (:meth:`collector.run.collection.Collection.summary`), read by
the flow (artifacts, events, its return value) and the CLI (the table, ``--json``). The flow
returns :meth:`RunSummary.as_dict` because Prefect stores results as JSON; everything in-process
reads the attributes, so a renamed field is a type error, not a silent ``KeyError`` at the end
of a long run.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

from collector.policy.retry import is_recoverable_status
from collector.run.account import Account

__all__ = ["BatchReport", "RunSummary", "host_line"]

Role = Literal["run", "work"]

# failures without an HTTP answer that a later attempt may get past (the rest are permanent)
_NO_ANSWER = frozenset({"connect_error", "timeout", "network_error"})


def _failing(facts: dict[str, Any]) -> bool:
    """A host that is down: its breaker is not closed, or nothing it answered this run was a
    success and something was a failure worth retrying (refused, timed out, 5xx, 429)."""
    if facts.get("breaker") in ("open", "half-open"):
        return True
    answers: dict[str, int] = facts.get("answers", {})
    succeeded = any(what.isdigit() and int(what) < 400 for what in answers)
    retryable = any(
        (what.isdigit() and is_recoverable_status(int(what))) or what in _NO_ANSWER
        for what in answers
    )
    return retryable and not succeeded


def _answered_ok(facts: dict[str, Any]) -> bool:
    """Whether a host answered any request with a 2xx or 3xx status."""
    return any(str(code)[:1] in ("2", "3") for code in facts.get("answers", {}))


# what a host "answered" that was no HTTP answer, in words (an HTTP status stays its number)
_ANSWER_WORDS = {
    "connect_error": "could not connect",
    "timeout": "timed out",
    "network_error": "network error",
}


def _hosts(count: int) -> str:
    return f"{count} host{'' if count == 1 else 's'}"


def host_line(host: str, facts: dict[str, Any], *, now: float | None = None) -> str:
    """One host's end-of-run line: what it answered, its breaker, when it is tried again."""
    answers: dict[str, int] = dict(facts.get("answers", {}))
    if facts.get("connect_errors"):  # the system's words: "connection refused", not a class
        answers.pop("connect_error", None)
        answers.update(facts["connect_errors"])
    said = ", ".join(
        f"{'HTTP ' + what if what.isdigit() else _ANSWER_WORDS.get(what, what)} x{count}"
        for what, count in sorted(answers.items(), key=lambda kv: -kv[1])
    )
    breaker = facts.get("breaker", "off")
    retry_at = facts.get("retry_at")
    now = time.time() if now is None else now
    if breaker == "open" and retry_at is not None and retry_at > now:
        clock = datetime.fromtimestamp(retry_at, UTC).strftime("%H:%M:%S UTC")
        when = f"breaker open until {clock} (in {retry_at - now:.0f} s); the next run after that"
    elif breaker in ("open", "half-open"):
        when = "breaker half-open: the next run probes it"
    elif breaker == "off":
        when = "no breaker (limits.circuit off): the next run tries it again"
    else:
        when = "breaker closed: the next run tries it again"
    return f"{host}: {said or 'no answer'}; {when}"


@dataclass(frozen=True, slots=True)
class RunSummary(Account):
    """A run's account, frozen (every term of :class:`~collector.run.account.Account`, none
    repeated here), and how the run went."""

    source: str
    run_id: str
    role: Role = "run"
    balanced: bool = True
    # one key collision: {"key", "first_url", "later_url"} (URLs scrubbed), empty when none
    key_collision: dict[str, str] = field(default_factory=dict)
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
    # the source's OPEN dead letters by reason, whatever run wrote them (as `collector status`)
    deadletter_reasons: dict[str, int] = field(default_factory=dict)
    # the dead letters THIS run wrote, by reason (the entries behind dead_lettered - already_dead
    # and records_quarantined)
    deadletter_reasons_this_run: dict[str, int] = field(default_factory=dict)
    hosts: dict[str, Any] = field(default_factory=dict)  # adaptive windows, breaker openings
    source_path: str = ""  # what a triggered triage is given (a file path or block:<name>)
    # how the run ended
    ending: str = "drained"  # drained | waited | max_items | stopped | skipped | lost
    interrupted: str | None = None  # the signal or cancellation that stopped it, if any
    lost: str | None = None  # what the run lost (a lease, its heartbeat, its source lock)
    skipped: str | None = None  # "busy": another run held the source lock (nothing was done)
    wall_seconds: float | None = None

    @property
    def ledger(self) -> Account:
        """The run's account alone, as a frozen value."""
        return self.frozen()

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
            "nothing can be collected; see collector deadletters list "
            f"{self.source_path or 'SOURCE'} --stage plan"
        )

    @property
    def hosts_down(self) -> dict[str, dict[str, Any]]:
        """The hosts that kept items queued: a run that waited out its drain with items left
        and hosts that did not answer (or whose breaker stayed open). Empty otherwise."""
        if self.role != "run" or self.interrupted or self.skipped:
            return {}
        if self.ending != "waited" or not self.queued:
            return {}
        hosts: dict[str, dict[str, Any]] = self.hosts.get("hosts", {})
        return {host: facts for host, facts in hosts.items() if _failing(facts)}

    @property
    def hosts_down_line(self) -> str:
        """The one line that says so (the flow run's Failed message; the CLI's headline)."""
        down = self.hosts_down
        silent = sorted(h for h, facts in down.items() if not _answered_ok(facts))
        failing = sorted(h for h in down if h not in silent)
        parts = []
        if silent:
            parts.append(f"{_hosts(len(silent))} did not answer ({', '.join(silent)})")
        if failing:  # it did answer some pages: say what held it back, not that it was silent
            parts.append(
                f"{_hosts(len(failing))} kept failing until its breaker held the rest back "
                f"({', '.join(failing)})"
            )
        return (
            f"{self.queued} items of {self.source} left queued: {'; '.join(parts)}; the next "
            "run tries them again"
        )

    @property
    def interruption(self) -> str:
        """The one line that says what a stop did (logged by the flow, printed by the CLI)."""
        returned = self.returned + self.released
        # Items never claimed were queued all along: without the total, "45 stored, 155
        # returned" of 300 reads as 100 items lost.
        waiting = f" ({self.queued} queued in all)" if self.queued != returned else ""
        return (
            f"interrupted by {self.interrupted}: {self.stored} stored, "
            f"{returned} returned to the queue unchanged{waiting}, lock released; "
            "run again to continue"
        )

    def with_(self, **changes: Any) -> RunSummary:
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """Every field by name (the flow's result, ``--json``), who and which run first."""
        data = asdict(self)
        data["problems"] = list(self.problems)
        return {"source": self.source, "run_id": self.run_id, "role": self.role} | data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSummary:
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        known["problems"] = tuple(known.get("problems", ()))
        return cls(**known)


@dataclass(frozen=True, slots=True)
class BatchReport(Account):
    """One batch's part of the run's account, and what it did besides (progress displays,
    metrics).

    An :class:`~collector.run.account.Account` whose only counts are the terms a settle moves
    (:data:`~collector.run.account.SETTLE_TERMS`, ``batches`` = 1): the ledger adds exactly
    these, so the run's account is its plan, its claims and the sum of its batches. Here, not
    beside the run that fills it, so that its readers (:mod:`collector.ops.metrics`) do not
    depend on the run's whole machinery.
    """

    token: int = 0
    items: int = 0  # claimed in the batch
    skipped: int = 0  # of its returned items, those the batch had no time to try
    validation_s: float = 0.0
    reasons: dict[str, int] = field(default_factory=dict)  # dead-lettered items by reason
    windows: dict[str, int] = field(default_factory=dict)  # host -> adaptive window, at fetch
    slowed: dict[str, str] = field(default_factory=dict)  # host -> why it is held back, at fetch
