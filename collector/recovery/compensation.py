"""Compensation with replacements: undo one batch, write back only what passes the suite.

``collector.run.ledger.compensate`` undoes exactly one batch's writes. An operator who knows the
right values can also give *replacement* records for some of the batch's keys (the corrected
prices of a bad feed, say). :func:`compensate_batch` then:

1. keys each replacement (``record.key``; it must name a key of the batch, else ConfigError
   before anything changes) and checks all of them with the source's current suite, as the
   pipeline checks a batch (``SuiteValidator``: a table-level failure fails every replacement,
   a row-level one its row);
2. sends each failing replacement to the manual-review queue: a ``validate`` dead letter of the
   record's page (``schema`` or ``table_expectation``, the failed expectations and GX's words
   kept), escalated at once, so ``collector review`` shows it and the balance counts it;
3. writes the passing ones to the sink under a fresh fencing token, in a batch of their own
   (``compensate:<batch>``, undone by compensating that batch);
4. undoes the rest of the batch (``ledger.compensate``: removed, recorded in the LedgerBook,
   pages made stale so the next run fetches them again).

**Interrupted and run again** (a crash, a killed worker): the steps are ordered so that a rerun
finishes the job and repeats nothing. Review entries have ids derived from page, stage, class
and key (a second put updates the one entry, a second escalation is refused); a replacement
written already is *unchanged* the second time (same content); a replaced key no longer
belongs to the batch, so its record is never removed twice. The ledger line is written *before*
the removal, with the number of records about to go: a batch with a line that still holds
records was interrupted before its removal (the rerun removes them and writes no second line);
a batch with a line that holds nothing is compensated, and a rerun changes nothing. The one
window left is the frontier's: killed after the removal but before its pages were made stale,
the pages stay fresh until their TTL (as with ``collector.run.ledger.compensate``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from collector.config import Source
from collector.deadletter.base import DeadLetter, DeadLetters
from collector.errors import ConfigError
from collector.frontier.base import Frontier
from collector.ops.scrub import Scrubber
from collector.recovery.triage import RecordValidator, expectation_names
from collector.run.ledger import Compensation, LedgerBook, compensate
from collector.settle.parse import dotted_get
from collector.sinks.base import Sink, SinkRecord

__all__ = [
    "CompensationReport",
    "Refused",
    "compensate_batch",
    "done_before",
    "replacement_batch",
]

Status = Literal["compensated", "dry_run", "already", "missing"]


def replacement_batch(batch_id: str) -> str:
    """The batch the replacements of ``batch_id`` are written in."""
    return f"compensate:{batch_id}"


def done_before(
    book: LedgerBook, source: str, batch_id: str, *, holds: bool
) -> Compensation | None:
    """The ledger's line for a batch compensated before (None: not yet, or not finished).

    A line is written before the removal, so it says the batch is done only once the batch
    holds nothing; a line beside records still held is a compensation to finish.
    """
    if holds:
        return None
    lines = [e for e in book.compensations(source) if e.batch_id == batch_id]
    return lines[-1] if lines else None


class _Recorded(LedgerBook):
    """The ledger for ``ledger.compensate`` when the line is written already (no second one)."""

    def record(self, entry: Compensation) -> None:
        return None


@dataclass(frozen=True, slots=True)
class Refused:
    """A replacement the suite refused: where it went for review, and why."""

    key: str
    entry_id: str
    failed: list[str]
    message: str


@dataclass(slots=True)
class CompensationReport:
    """What one compensation did (or, on a dry run, would do)."""

    source: str
    batch_id: str
    status: Status
    reason: str = ""
    held: int = 0  # records the batch held when this run began
    written: list[str] = field(default_factory=list)  # replacements stored with new content
    unchanged: list[str] = field(default_factory=list)  # stored already (a rerun)
    superseded: list[str] = field(default_factory=list)  # a newer write holds the key
    review: list[Refused] = field(default_factory=list)
    removed: int | None = None  # records removed (None: nothing removed by this run)
    earlier: str = ""  # the ledger's reason when the batch was compensated before

    @property
    def replacement_batch(self) -> str:
        return replacement_batch(self.batch_id)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["review"] = [asdict(r) for r in self.review]
        data["replacement_batch"] = self.replacement_batch
        return data

    def rows(self) -> list[dict[str, str]]:
        """One row per replacement (the artifact's table)."""
        rows = [{"key": k, "outcome": "written", "detail": self.replacement_batch}
                for k in self.written]  # fmt: skip
        rows += [{"key": k, "outcome": "unchanged", "detail": "stored already"}
                 for k in self.unchanged]  # fmt: skip
        rows += [{"key": k, "outcome": "superseded", "detail": "a newer write holds the key"}
                 for k in self.superseded]  # fmt: skip
        rows += [{"key": r.key, "outcome": "review", "detail": r.message} for r in self.review]
        return rows

    def markdown(self) -> str:
        """The flow run's report, for the UI."""
        head = f"# Compensation of batch `{self.batch_id}` ({self.source})\n\n"
        if self.status == "already":
            return head + f"Compensated before, nothing changed: {self.earlier}\n"
        if self.status == "missing":
            return head + "The sink holds no record of this batch: nothing changed.\n"
        verb = "would be" if self.status == "dry_run" else "were"
        lines = [
            f"- reason: {self.reason}",
            f"- records the batch held: {self.held}",
            f"- removed: {self.removed if self.removed is not None else '-'}",
            f"- replacements written to `{self.replacement_batch}`: {len(self.written)}"
            f" (unchanged {len(self.unchanged)}, superseded {len(self.superseded)})",
            f"- replacements failing the suite, sent to review: {len(self.review)}",
        ]
        for refused in self.review:
            lines.append(f"  - `{refused.key}` (entry {refused.entry_id}): {refused.message}")
        note = (
            f"\nDry run: these {verb} the changes; nothing changed.\n"
            if self.status == "dry_run"
            else ""
        )
        return head + "\n".join(lines) + "\n" + note


def _usable(key: Any) -> bool:
    return key is not None and not isinstance(key, (dict, list)) and key != ""


def _keyed(
    source: Source, replacements: Sequence[Any], batch_id: str, urls: dict[str, str]
) -> list[tuple[str, dict[str, Any]]]:
    """Each replacement with its key; ConfigError (nothing changed) for one that names no key
    of the batch, or a key twice."""
    keyed: list[tuple[str, dict[str, Any]]] = []
    seen: set[str] = set()
    for index, record in enumerate(replacements, 1):
        if not isinstance(record, dict):
            raise ConfigError(f"replacement {index}: a record is a JSON object")
        key = dotted_get(record, source.record.key, None)
        if not _usable(key):
            raise ConfigError(f"replacement {index}: no usable key at {source.record.key!r}")
        key = str(key)
        if key not in urls:
            raise ConfigError(
                f"replacement {index}: key {key!r} is not a record of batch {batch_id}"
            )
        if key in seen:
            raise ConfigError(f"replacement {index}: key {key!r} is given twice")
        seen.add(key)
        keyed.append((key, record))
    return keyed


def _split(
    keyed: list[tuple[str, dict[str, Any]]], validator: RecordValidator | None
) -> tuple[
    list[tuple[str, dict[str, Any]]], list[tuple[str, dict[str, Any], list[dict[str, Any]], str]]
]:
    """Passing and failing replacements, as the pipeline splits a batch: table-level failures
    fail every record, row-level ones their row (failing: key, record, failed, error class)."""
    if validator is None or not keyed:
        return keyed, []
    outcome = validator.validate([record for _, record in keyed])
    table = [_failed(f) for f in outcome.table_failures]
    rows = {row.index: [_failed(f) for f in row.failed] for row in outcome.bad}
    good, bad = [], []
    for index, (key, record) in enumerate(keyed):
        if table:
            bad.append((key, record, table + rows.get(index, []), "table_expectation"))
        elif index in rows:
            bad.append((key, record, rows[index], "schema"))
        else:
            good.append((key, record))
    return good, bad


def _failed(failure: Any) -> dict[str, Any]:
    return {
        "expectation": failure.expectation,
        "column": failure.column,
        "kwargs": failure.kwargs,
        "message": failure.message,
    }


def compensate_batch(
    source: Source,
    *,
    sink: Sink,
    book: LedgerBook,
    deadletters: DeadLetters,
    frontier: Frontier,
    validator: RecordValidator | None,
    batch_id: str,
    reason: str,
    by: str,
    run_id: str,
    replacements: Sequence[Any] = (),
    dry_run: bool = False,
    clock: Callable[[], float] = time.time,
) -> CompensationReport:
    """Undo batch ``batch_id``, writing back the ``replacements`` that pass the suite (see the
    module docstring); a rerun after an interruption finishes what the first run began."""
    report = CompensationReport(source.name, batch_id, "dry_run" if dry_run else "compensated")
    report.reason = reason
    held = {r.key: r for r in sink.records(batch_id)}
    report.held = len(held)
    earlier = done_before(book, source.name, batch_id, holds=bool(held))
    if earlier is not None:
        report.status, report.earlier = "already", earlier.reason
        return report
    replaced = {r.key: r for r in sink.records(replacement_batch(batch_id))}
    if not held and not replaced:
        report.status = "missing"
        return report
    urls = {key: r.url for key, r in {**replaced, **held}.items()}
    good, bad = _split(_keyed(source, replacements, batch_id, urls), validator)
    scrub = Scrubber(source.secret_values())
    letters = [_letter(source, scrub, batch_id, run_id, urls[k], k, r, failed, error_class, clock())
               for k, r, failed, error_class in bad]  # fmt: skip
    report.review = [
        Refused(letter.record_key, letter.id, expectation_names(letter.failed_expectations),
                letter.message)
        for letter in letters
    ]  # fmt: skip
    if dry_run:
        report.written = [key for key, _ in good]
        report.removed = len([key for key in held if key not in {k for k, _ in good}])
        return report
    if letters:  # first: a failing replacement is never lost, whatever happens after
        deadletters.put(letters)
        for letter in letters:
            deadletters.escalate(letter.id, letter.message)
    if good:
        _write(source, sink, frontier, batch_id, urls, good, report, clock())
    remaining = len(sink.records(batch_id))
    if not [e for e in book.compensations(source.name) if e.batch_id == batch_id]:
        reason = _ledger_reason(reason, report)
        book.record(Compensation(source.name, batch_id, remaining, reason, clock(), by))
    entry = compensate(
        sink,
        _Recorded(book.path),
        source=source.name,
        batch_id=batch_id,
        reason=reason,
        by=by,
        frontier=frontier,
        deadletters=deadletters,
    )
    report.removed = entry.removed
    return report


def _write(
    source: Source,
    sink: Sink,
    frontier: Frontier,
    batch_id: str,
    urls: dict[str, str],
    good: list[tuple[str, dict[str, Any]]],
    report: CompensationReport,
    now: float,
) -> None:
    """The passing replacements, under a fresh fencing token (newer than the batch's)."""
    token = frontier.claim(source.name, 0, now=now, lease_s=source.ttl.lease_s).token
    before = {r.key: r.record for r in sink.records(replacement_batch(batch_id))}
    records = [SinkRecord(key, record, urls[key]) for key, record in good]
    stale = set(sink.write(records, token=token, batch_id=replacement_batch(batch_id)).stale_keys)
    for key, record in good:
        if key in stale:
            report.superseded.append(key)
        elif before.get(key) == record:
            report.unchanged.append(key)  # written by an earlier, interrupted run
        else:
            report.written.append(key)


def _ledger_reason(reason: str, report: CompensationReport) -> str:
    if not (report.written or report.unchanged or report.superseded or report.review):
        return reason
    kept = len(report.written) + len(report.unchanged)
    return (
        f"{reason} (replacements: {kept} written to {report.replacement_batch},"
        f" {len(report.review)} failing the suite sent to review)"
    )


def _letter(
    source: Source,
    scrub: Scrubber,
    batch_id: str,
    run_id: str,
    url: str,
    key: str,
    record: dict[str, Any],
    failed: list[dict[str, Any]],
    error_class: str,
    now: float,
) -> DeadLetter:
    """A refused replacement as a ``validate`` dead letter of its page, for review."""
    words = "; ".join(str(f["message"]) for f in failed)[:400]
    message = f"replacement in the compensation of batch {batch_id} fails the suite: {words}"
    return DeadLetter(
        source=source.name,
        url=scrub.url(url),
        stage="validate",
        error_class=error_class,
        message=scrub.text(message),
        attempts=1,
        first_seen=now,
        last_seen=now,
        record_key=key,
        payload=scrub(record),
        failed_expectations=failed,
        flow_run_id=run_id,
    )
