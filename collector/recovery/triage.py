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

Every entry ends in one of: repaired, reenqueued, escalated, discarded, or still open; the kind is
the entry's ``resolution_kind`` field. A repaired record's page comes back to life in the
frontier (``Frontier.revive``: done, fresh until its TTL, fetched again after it).

The **balance** (:func:`tally`) is a check that can fail: its left side, ``quarantined``, is the
number of distinct entries the append-only archive saw quarantined for the source
(:meth:`collector.deadletter.archive.JsonlArchive.quarantined_ids`), a record the store cannot
rewrite together with its entries; the right side is the store's own entries by state
(:meth:`DeadLetterStore.census`). An entry the store lost, one it holds that was never
quarantined (duplicated, rewritten under another id, another database) makes it fail, and the
tally names those ids. Plain Python over the protocols: the ``triage`` flow
(``flows/triage.py``) only adds Prefect.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

from opentelemetry import trace

from collector import defaults
from collector.config import Source
from collector.deadletter.archive import JsonlArchive
from collector.deadletter.base import DeadLetter, DeadLetters, DeadLetterStore
from collector.frontier.base import Completed, Frontier
from collector.ops import tracing
from collector.policy.retry import is_recoverable_status
from collector.recovery.requeue import reenqueue
from collector.run.stop import StopRequest
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
    "tally",
]

Kind = Literal["repaired", "reenqueued", "escalated", "discarded"]
KINDS: tuple[Kind, ...] = ("repaired", "reenqueued", "escalated", "discarded")
Outcome = Literal["repaired", "reenqueued", "escalated", "discarded", "open", "skipped"]
_RECOVERABLE = frozenset(
    {"timeout", "connect_error", "network_error", "retry_budget", "batch_time"}
)
_HTTP = re.compile(r"http_(\d{3})")
SHOWN_IDS = 20  # ids named per side when the balance fails


def kind_of(entry: DeadLetter) -> str:
    """Which term of the balance an entry is in now (``other``: resolved without a kind)."""
    return _term(entry.status, entry.resolution_kind or "")


def _term(status: str, kind: str) -> str:
    """The balance term of an entry in ``status`` whose resolution has ``kind``."""
    if status == "open":
        return "open"
    if status == "review" or kind == "reviewed":  # settled by a person: still escalated
        return "escalated"
    return kind if kind in KINDS else "other"


def is_recoverable_class(error_class: str) -> bool:
    """Could fetching again help? (``http_503``, ``timeout`` -> yes, ``http_404`` -> no)."""
    if error_class in _RECOVERABLE:
        return True
    match = _HTTP.fullmatch(error_class)
    return match is not None and is_recoverable_status(int(match.group(1)))


@dataclass(slots=True)
class Tally:
    """The balance of a source's dead letters: the archive's count against the store's.

    ``quarantined`` is what the archive saw (distinct entries put); the other counts are the
    store's entries by term. ``lost`` names entries the archive saw and the store does not hold,
    ``unknown`` entries the store holds that were never quarantined through the archive (up to
    :data:`SHOWN_IDS` each; ``lost_count`` / ``unknown_count`` are the full numbers).
    """

    quarantined: int = 0
    repaired: int = 0
    reenqueued: int = 0
    escalated: int = 0
    discarded: int = 0
    open: int = 0
    other: int = 0
    lost_count: int = 0
    unknown_count: int = 0
    lost: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)

    @property
    def in_store(self) -> int:
        return (
            self.repaired + self.reenqueued + self.escalated + self.discarded + self.open
            + self.other
        )  # fmt: skip

    @property
    def balanced(self) -> bool:
        return self.quarantined == self.in_store and not (self.lost_count or self.unknown_count)

    def difference(self) -> str:
        """One line naming what does not match ("" when balanced)."""
        if self.balanced:
            return ""
        parts = [f"archive saw {self.quarantined} entries, store holds {self.in_store}"]
        for what, count, shown in (
            ("lost by the store", self.lost_count, self.lost),
            ("in the store but never quarantined", self.unknown_count, self.unknown),
        ):
            if count:
                more = f" (+{count - len(shown)} more)" if count > len(shown) else ""
                parts.append(f"{count} {what}: {', '.join(shown)}{more}")
        return "; ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "balanced": self.balanced, "difference": self.difference()}


def tally(store: DeadLetterStore, source: str, archive: JsonlArchive) -> Tally:
    """The balance of ``source``: the archive's quarantined entries against the store's.

    The store's side is one consistent read of ids and states (:meth:`DeadLetterStore.census`,
    no payload); the archive's side reads its files. Exact while collect runs put entries: a
    store writes an entry before archiving it, so the archive is read first (an id it holds
    that the store then lacks is lost), and read again for ids the store holds that it did not
    have yet (a put between the two reads; still missing then, never quarantined).
    """
    before = archive.quarantined_ids(source)
    census = store.census(source)
    seen = before
    if census.ids - before:
        seen = before | (archive.quarantined_ids(source) & census.ids)
    counts = Tally(quarantined=len(seen))
    for key, n in census.counts.items():
        status, _, kind = key.partition(":")
        term = _term(status, kind)
        setattr(counts, term, getattr(counts, term) + n)
    lost, unknown = sorted(seen - census.ids), sorted(census.ids - seen)
    counts.lost_count, counts.unknown_count = len(lost), len(unknown)
    counts.lost, counts.unknown = lost[:SHOWN_IDS], unknown[:SHOWN_IDS]
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
    pages_revived: int = 0  # dead pages made done again because their record was repaired
    replay_batch: str = ""
    interrupted: str | None = None  # the stop request (SIGINT/SIGTERM) that ended the run early
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
            "pages_revived": self.pages_revived,
            "interrupted": self.interrupted,
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
            + (" (balanced)" if b.balanced else f" (NOT balanced: {b.difference()})"),
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


def expectation_names(failed: list[dict[str, Any]] | tuple[Any, ...]) -> list[str]:
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
        store: DeadLetters,
        archive: JsonlArchive,
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
        self.archive = archive
        self.frontier = frontier
        self.sink = sink
        self.run_id = run_id
        self.validator = validator
        self.clock = clock
        self.claim_s = claim_s
        self.max_requeues = max_requeues
        self.owner = f"triage:{run_id}"

    def run(
        self,
        *,
        limit: int = defaults.TRIAGE_LIMIT,
        dry_run: bool = False,
        stop: StopRequest | None = None,
    ) -> TriageReport:
        """Settle each open entry once. A ``stop`` request (Ctrl-C) ends the claiming: the
        entries claimed so far are settled (records replayed), the others stay open for the
        next run, untouched."""
        with tracing.recovery_span(
            "triage", self.source.name, run_id=self.run_id, dry_run=dry_run
        ) as span:
            report = self._run(span, limit=limit, dry_run=dry_run, stop=stop)
            if span.is_recording():
                counts = report.counts().items()
                span.set_attributes({f"collector.triage.{k}": v for k, v in counts})
                for out in report.entries:
                    attributes: dict[str, Any] = {
                        "messaging.message.id": out.id,
                        "collector.triage.outcome": out.outcome,
                    }
                    if out.outcome == "escalated":  # into the manual-review queue: level 2
                        attributes["messaging.dlq.level"] = 2
                    span.add_event("triage_entry", attributes)
            return report

    def _run(
        self, span: trace.Span, *, limit: int, dry_run: bool, stop: StopRequest | None
    ) -> TriageReport:
        report = TriageReport(self.source.name, self.run_id, dry_run)
        report.replay_batch = f"triage:{self.run_id}"
        records: list[DeadLetter] = []
        for entry in self.store.list(source=self.source.name, status="open", limit=limit):
            if stop is not None and stop.reason is not None:
                report.interrupted = stop.reason
                break
            report.seen += 1
            tracing.link_entry(span, entry)  # to the trace in which the entry failed
            if not dry_run and not self.store.claim_for_triage(
                entry.id, self.owner, now=self.clock(), lease_s=self.claim_s
            ):
                report.add(self._outcome(entry, "skipped", "held by another triage run"))
                continue
            if entry.stage == "validate" and isinstance(entry.payload, dict):
                records.append(entry)
            elif entry.cause == "robots":  # not for a person: a later plan asks robots.txt again
                if not dry_run:
                    self.store.release_claim(entry.id, self.owner)
                why = "refused by robots.txt: a plan asks again after politeness.robots_ttl_s"
                report.add(self._outcome(entry, "open", why))
            elif entry.stage == "fetch" and is_recoverable_class(entry.error_class):
                report.add(self._fetch_failure(entry, dry_run))
            else:
                report.add(self._escalate(entry, self._why_not(entry), dry_run))
        if records:
            self._records(records, report, dry_run)
        report.balance = tally(self.store, self.source.name, self.archive)
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
            table = expectation_names(outcome.table_failures)
            for row in outcome.bad:
                failed_rows[row.index] = expectation_names(row.failed)
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
        with tracing.recovery_span(
            "replay",
            self.source.name,
            [entry for entry, _, _ in passing],
            batch=report.replay_batch,
            dry_run=dry_run,
        ):
            self._replay(passing, report, dry_run)

    def _replay(
        self,
        passing: list[tuple[DeadLetter, SinkRecord, list[str]]],
        report: TriageReport,
        dry_run: bool,
    ) -> None:
        """Write the repaired records under a fresh token, resolve their entries, revive their
        pages."""
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
        revive: dict[str, float] = {}  # url -> when it was fetched
        for entry, replayed, changes in passing:
            if replayed.key in stale:
                detail = "a newer write of this key holds the sink: replay refused"
                if not dry_run:
                    self.store.resolve(entry.id, "discarded", detail)
                out = self._outcome(entry, "discarded", detail)
            else:
                detail = "; ".join(changes) if changes else "valid under the current suite"
                if not dry_run:
                    self.store.resolve(entry.id, "repaired", detail)
                    revive.setdefault(entry.url, entry.last_seen)
                out = self._outcome(entry, "repaired", detail)
            out.changes = changes
            report.add(out)
        if revive:  # the pages live on: done, fetched again once their freshness passes
            now = self.clock()
            fresh_for = self.source.ttl.fresh_for
            report.pages_revived += self.frontier.revive(
                self.source.name,
                [Completed(url, now + fresh_for(url), fetched) for url, fetched in revive.items()],
            )

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
            failed_before=expectation_names(entry.failed_expectations),
        )
