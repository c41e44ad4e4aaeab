"""Triage: settle every open dead letter of a source once, by rule, or hand it to a person.

For each open entry (``Triage.run``):

* **claim** it for this run (``DeadLetterStore.claim_for_triage``: one conditional write), so two
  triage runs that overlap never both work on one entry; the loser skips it;
* a quarantined **record** (stage ``validate``) gets the source's repair rules
  (:mod:`collector.recovery.repair`), is re-keyed and re-validated with the *current* suite;
  what passes
  is **replayed** into the sink under a fresh fencing token from the frontier and a batch id of
  its own (``triage:<run id>``, so ``collector compensate`` can undo a replay too); what still
  fails is **escalated** to manual review;
* a **fetch** failure whose cause was recoverable (timeouts, connection errors, 408/425/429/5xx)
  is **re-enqueued** in the frontier once its backoff since the last failure has passed
  (``retry.ceiling(n)`` for the n-th re-enqueue, at most ``TRIAGE_MAX_REQUEUES`` times); before
  that it stays open; after that, and for every other failure (404, parse errors, refused URLs,
  bodies too large), it is **escalated**.

Every entry ends in one of: repaired, reenqueued, escalated, discarded, or still open. The
resolution text starts with that kind (``"repaired: trimmed title"``), so :func:`tally` can
read the balance back from the store: ``quarantined = repaired + reenqueued + escalated +
discarded + open`` holds after every run, for entries triaged, reviewed or discarded by hand.
Plain Python over the protocols: the ``triage`` flow (``flows/triage.py``) only adds Prefect.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

from collector import defaults
from collector.config import Source
from collector.deadletter.base import DeadLetter, DeadLetterStore
from collector.frontier.base import Frontier
from collector.policy.retry import is_recoverable_status
from collector.recovery.requeue import reenqueue
from collector.settle.parse import dotted_get
from collector.sinks.base import Sink, SinkRecord

__all__ = [
    "KINDS",
    "EntryOutcome",
    "Tally",
    "Triage",
    "TriageReport",
    "is_recoverable_class",
    "kind_of",
    "resolution",
    "tally",
]

Kind = Literal["repaired", "reenqueued", "escalated", "discarded"]
KINDS: tuple[Kind, ...] = ("repaired", "reenqueued", "escalated", "discarded")
Outcome = Literal["repaired", "reenqueued", "escalated", "discarded", "open", "skipped"]
_RECOVERABLE = frozenset(
    {"timeout", "connect_error", "network_error", "retry_budget", "batch_time"}
)
_HTTP = re.compile(r"http_(\d{3})")


def resolution(kind: Kind | Literal["reviewed"], detail: str) -> str:
    """The resolution text of an entry: its kind first, so the balance can be read back."""
    return f"{kind}: {detail}"


def kind_of(entry: DeadLetter) -> str:
    """Which term of the balance an entry is in now (``other``: resolved outside Collector)."""
    return _term(entry.status, (entry.resolution or "").split(":", 1)[0].strip())


def _term(status: str, kind: str) -> str:
    """The balance term of an entry in ``status`` whose resolution has ``kind``."""
    if status == "open":
        return "open"
    if status == "review" or kind == "reviewed":  # settled by a person: still escalated
        return "escalated"
    return kind if kind in KINDS else "other"


def is_recoverable_class(error_class: str) -> bool:
    """Could fetching again help? (``retries_exhausted:http_503`` -> yes, ``http_404`` -> no)."""
    base = error_class.rsplit(":", 1)[-1]
    if base in _RECOVERABLE:
        return True
    match = _HTTP.fullmatch(base)
    return match is not None and is_recoverable_status(int(match.group(1)))


@dataclass(slots=True)
class Tally:
    """The balance of a source's dead letters, read from the store."""

    quarantined: int = 0
    repaired: int = 0
    reenqueued: int = 0
    escalated: int = 0
    discarded: int = 0
    open: int = 0
    other: int = 0

    @property
    def balanced(self) -> bool:
        return self.quarantined == (
            self.repaired + self.reenqueued + self.escalated + self.discarded + self.open
            + self.other
        )  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "balanced": self.balanced}


def tally(store: DeadLetterStore, source: str) -> Tally:
    """Count every entry of ``source`` once, by the term of the balance it is in.

    From the store's counts in one consistent read (:meth:`DeadLetterStore.status_kinds`), not
    by loading every entry: the same terms as :func:`kind_of` gives entry by entry.
    """
    counts = Tally()
    for key, n in store.status_kinds(source).items():
        status, _, kind = key.partition(":")
        term = _term(status, kind)
        counts.quarantined += n
        setattr(counts, term, getattr(counts, term) + n)
    return counts


@dataclass(slots=True)
class EntryOutcome:
    """What triage did with one entry, for the report."""

    id: str
    url: str
    stage: str
    error_class: str
    outcome: Outcome
    detail: str
    changes: list[str] = field(default_factory=list)
    failed_before: list[str] = field(default_factory=list)
    failed_after: list[str] = field(default_factory=list)


@dataclass(slots=True)
class TriageReport:
    source: str
    run_id: str
    dry_run: bool
    seen: int = 0
    repaired: int = 0
    reenqueued: int = 0
    escalated: int = 0
    discarded: int = 0
    open: int = 0  # looked at, left open (waiting for a backoff)
    skipped: int = 0  # held by another triage run
    records_written: int = 0
    records_unchanged: int = 0
    replay_batch: str = ""
    entries: list[EntryOutcome] = field(default_factory=list)
    balance: Tally = field(default_factory=Tally)

    def add(self, outcome: EntryOutcome) -> None:
        self.entries.append(outcome)
        setattr(self, outcome.outcome, getattr(self, outcome.outcome) + 1)

    def counts(self) -> dict[str, int]:
        names = ("seen", "repaired", "reenqueued", "escalated", "discarded", "open", "skipped")
        return {name: getattr(self, name) for name in names}

    def expectation_rows(self) -> list[dict[str, Any]]:
        """Per expectation: how many records failed it before triage, and after repair."""
        rows: dict[str, dict[str, Any]] = {}
        for entry in self.entries:
            for name in entry.failed_before:
                rows.setdefault(name, {"expectation": name, "before": 0, "after": 0})["before"] += 1
            for name in entry.failed_after:
                rows.setdefault(name, {"expectation": name, "before": 0, "after": 0})["after"] += 1
        return [rows[name] for name in sorted(rows)]

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "run_id": self.run_id,
            "dry_run": self.dry_run,
            **self.counts(),
            "records_written": self.records_written,
            "records_unchanged": self.records_unchanged,
            "replay_batch": self.replay_batch,
            "balance": self.balance.as_dict(),
            "expectations": self.expectation_rows(),
            "entries": [asdict(e) for e in self.entries],
        }

    def markdown(self) -> str:
        lines = [f"# Triage of `{self.source}`" + (" (dry run)" if self.dry_run else ""), ""]
        lines += ["| outcome | entries |", "|---|---|"]
        lines += [f"| {name} | {n} |" for name, n in self.counts().items()]
        b = self.balance
        lines += [
            "",
            f"Balance: quarantined {b.quarantined} = repaired {b.repaired} + re-enqueued "
            f"{b.reenqueued} + escalated {b.escalated} + discarded {b.discarded} + open {b.open}"
            + (f" + other {b.other}" if b.other else "")
            + (" (balanced)" if b.balanced else " (NOT balanced)"),
            f"Records replayed: {self.records_written} written, {self.records_unchanged} "
            f"unchanged (batch `{self.replay_batch}`)",
        ]
        expectations = self.expectation_rows()
        if expectations:
            lines += ["", "| expectation | failed before | failed after repair |", "|---|---|---|"]
            lines += [
                f"| {r['expectation']} | {r['before']} | {r['after']} |" for r in expectations
            ]
        if self.entries:
            lines += ["", "| entry | stage/error | outcome | detail |", "|---|---|---|---|"]
            for e in self.entries[:200]:
                detail = e.detail.replace("|", "\\|")[:160]
                lines.append(f"| `{e.id}` | {e.stage}/{e.error_class} | {e.outcome} | {detail} |")
            if len(self.entries) > 200:
                lines.append(f"| ... | {len(self.entries) - 200} more | | |")
        return "\n".join(lines)


class RecordValidator(Protocol):
    """What triage needs of a validator (``collector.settle.validation.SuiteValidator`` has it)."""

    def validate(self, records: list[dict[str, Any]]) -> Any: ...


def _names(failed: list[dict[str, Any]] | tuple[Any, ...]) -> list[str]:
    out = []
    for f in failed:
        name = f["expectation"] if isinstance(f, dict) else f.expectation
        column = f.get("column") if isinstance(f, dict) else f.column
        out.append(f"{name}({column})" if column else name)
    return out


class Triage:
    """One triage run over one source's open dead letters."""

    def __init__(
        self,
        source: Source,
        *,
        store: DeadLetterStore,
        frontier: Frontier,
        sink: Sink,
        run_id: str,
        validator: RecordValidator | None = None,
        clock: Callable[[], float] = time.time,
        claim_s: float = defaults.TRIAGE_CLAIM_S,
        max_requeues: int = defaults.TRIAGE_MAX_REQUEUES,
    ) -> None:
        self.source = source
        self.store = store
        self.frontier = frontier
        self.sink = sink
        self.run_id = run_id
        self.validator = validator
        self.clock = clock
        self.claim_s = claim_s
        self.max_requeues = max_requeues
        self.owner = f"triage:{run_id}"

    def run(self, *, limit: int = defaults.TRIAGE_LIMIT, dry_run: bool = False) -> TriageReport:
        report = TriageReport(self.source.name, self.run_id, dry_run)
        report.replay_batch = f"triage:{self.run_id}"
        records: list[DeadLetter] = []
        for entry in self.store.list(source=self.source.name, status="open", limit=limit):
            report.seen += 1
            if not dry_run and not self.store.claim_for_triage(
                entry.id, self.owner, now=self.clock(), lease_s=self.claim_s
            ):
                report.add(self._outcome(entry, "skipped", "held by another triage run"))
                continue
            if entry.stage == "validate" and isinstance(entry.payload, dict):
                records.append(entry)
            elif entry.stage == "fetch" and is_recoverable_class(entry.error_class):
                report.add(self._fetch_failure(entry, dry_run))
            else:
                report.add(self._escalate(entry, self._why_not(entry), dry_run))
        if records:
            self._records(records, report, dry_run)
        report.balance = tally(self.store, self.source.name)
        return report

    # --- fetch failures ------------------------------------------------------------------
    def _fetch_failure(self, entry: DeadLetter, dry_run: bool) -> EntryOutcome:
        if entry.requeues >= self.max_requeues:
            return self._escalate(
                entry, f"still failing after {entry.requeues} re-enqueues", dry_run
            )
        now = self.clock()
        due = entry.last_seen + self.source.retry.ceiling(entry.requeues + 1)
        if now < due:
            if not dry_run:
                self.store.release_claim(entry.id, self.owner)
            return self._outcome(entry, "open", f"backoff: due in {due - now:.1f}s")
        detail = f"recoverable {entry.error_class}, re-enqueue #{entry.requeues + 1}"
        if dry_run:
            return self._outcome(entry, "reenqueued", detail)
        if not reenqueue(self.store, self.frontier, self.source, entry, detail=detail, now=now):
            return self._escalate(
                entry, "the frontier does not hold this URL as dead, cannot re-enqueue", dry_run
            )
        return self._outcome(entry, "reenqueued", detail)

    @staticmethod
    def _why_not(entry: DeadLetter) -> str:
        if entry.stage == "fetch":
            return f"permanent fetch failure ({entry.error_class}): fetching again cannot help"
        if entry.stage == "validate":
            return "no record kept to repair"
        return f"{entry.stage} failure ({entry.error_class}) has no repair rule"

    # --- records -------------------------------------------------------------------------
    def _records(self, entries: list[DeadLetter], report: TriageReport, dry_run: bool) -> None:
        key_path = self.source.record.key
        repaired: list[tuple[DeadLetter, dict[str, Any], list[str], str]] = []
        for entry in entries:
            record, changes = self.source.repair.apply(entry.payload)
            key = dotted_get(record, key_path, None)
            if key is None or isinstance(key, (dict, list)) or key == "":
                out = self._escalate(entry, f"still no usable key at {key_path!r}", dry_run)
                out.changes = changes
                report.add(out)
                continue
            repaired.append((entry, record, changes, str(key)))
        if not repaired:
            return
        failed_rows: dict[int, list[str]] = {}
        table: list[str] = []
        if self.validator is not None:
            outcome = self.validator.validate([record for _, record, _, _ in repaired])
            table = _names(outcome.table_failures)
            for row in outcome.bad:
                failed_rows[row.index] = _names(row.failed)
        passing: list[tuple[DeadLetter, SinkRecord, list[str]]] = []
        for index, (entry, record, changes, key) in enumerate(repaired):
            failed_after = failed_rows.get(index, []) + table
            if failed_after:
                what = "fails " + ", ".join(failed_after)
                if table and index not in failed_rows:
                    what = "the triage batch fails table-level " + ", ".join(table)
                out = self._escalate(
                    entry, what + (" after " + "; ".join(changes) if changes else ""), dry_run
                )
                out.changes, out.failed_after = changes, failed_after
                report.add(out)
            else:
                passing.append((entry, SinkRecord(key, record, entry.url), changes))
        if not passing:
            return
        stale: set[str] = set()
        if not dry_run:
            token = self.frontier.claim(
                self.source.name, 0, now=self.clock(), lease_s=self.source.ttl.lease_s
            ).token  # a fresh fencing token: newer than every write made so far
            written = self.sink.write(
                [r for _, r, _ in passing], token=token, batch_id=report.replay_batch
            )
            report.records_written += written.written
            report.records_unchanged += written.unchanged
            stale = set(written.stale_keys)
        for entry, replayed, changes in passing:
            if replayed.key in stale:
                detail = "a newer write of this key holds the sink: replay refused"
                if not dry_run:
                    self.store.resolve(entry.id, resolution("discarded", detail))
                out = self._outcome(entry, "discarded", detail)
            else:
                detail = "; ".join(changes) if changes else "valid under the current suite"
                if not dry_run:
                    self.store.resolve(entry.id, resolution("repaired", detail))
                out = self._outcome(entry, "repaired", detail)
            out.changes = changes
            report.add(out)

    # --- helpers -------------------------------------------------------------------------
    def _escalate(self, entry: DeadLetter, reason: str, dry_run: bool) -> EntryOutcome:
        if not dry_run:
            self.store.escalate(entry.id, reason)
        return self._outcome(entry, "escalated", reason)

    @staticmethod
    def _outcome(entry: DeadLetter, outcome: Outcome, detail: str) -> EntryOutcome:
        return EntryOutcome(
            id=entry.id,
            url=entry.url,
            stage=entry.stage,
            error_class=entry.error_class,
            outcome=outcome,
            detail=detail,
            failed_before=_names(entry.failed_expectations),
        )
