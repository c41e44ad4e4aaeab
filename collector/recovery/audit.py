"""Audit: check the batches already in the sink against the suite's table-level expectations.

The pipeline validates a batch *before* writing it, with the suite of that moment. When the suite
later gains or changes a table-level expectation (row count, column set, unique values, mean...),
batches written under the old suite were never checked against it. :func:`audit` reads each
batch back from the sink (``Sink.batches``, ``Sink.records``), runs the source's *current* suite
on it (Great Expectations stays the evaluator:
:class:`collector.settle.validation.SuiteValidator`), and
for each batch with a failed table-level expectation undoes exactly that batch's writes
(:func:`collector.run.ledger.compensate`, i.e. ``Sink.remove_batch``) and records it in the
:class:`~collector.run.ledger.LedgerBook`, with the failed expectations as the reason.

What "a batch" is: the records whose current version the batch wrote, as the sink holds them
now, which are exactly the records ``remove_batch`` would remove. A record the batch wrote that
a later batch overwrote belongs to the later batch; a row the pipeline quarantined was never
written. Row-level failures are only reported (``rows_failing``), never compensated: the audit
judges batches, and a whole batch is what compensation can undo.

Idempotent by construction: a compensated batch holds no records any more, so a second audit
does not see it. Given the source's frontier (as ``collector compensate`` does), the removed
records' pages lose their freshness (``Frontier.make_stale``): the next run fetches them again,
and its suite, which now checks the table-level expectation before writing, decides again.
Plain Python over the protocols; ``collector audit`` (``flows/cli/recovery.py``) is the command.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from collector.frontier.base import Frontier
from collector.run.ledger import LedgerBook, compensate
from collector.sinks.base import Sink

__all__ = ["AuditReport", "BatchAudit", "audit", "audit_reason"]


class BatchValidator(Protocol):
    """What the audit needs of a validator (``settle.validation.SuiteValidator`` has it)."""

    def validate(self, records: list[dict[str, Any]]) -> Any: ...


@dataclass(frozen=True, slots=True)
class BatchAudit:
    """One batch checked: its size, the table-level expectations it failed, what was removed."""

    batch_id: str
    records: int
    failed: tuple[dict[str, Any], ...]  # expectation, column, kwargs, message
    rows_failing: int  # records failing a row-level expectation (reported, not compensated)
    removed: int | None  # records removed; None when the batch passed or on a dry run

    @property
    def passed(self) -> bool:
        return not self.failed


@dataclass(slots=True)
class AuditReport:
    source: str
    dry_run: bool
    batches: list[BatchAudit] = field(default_factory=list)

    @property
    def failed(self) -> list[BatchAudit]:
        return [b for b in self.batches if not b.passed]

    @property
    def compensated(self) -> list[BatchAudit]:
        return [b for b in self.batches if b.removed is not None]

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "dry_run": self.dry_run,
            "audited": len(self.batches),
            "failed": len(self.failed),
            "compensated": len(self.compensated),
            "removed": sum(b.removed or 0 for b in self.batches),
            "batches": [
                {
                    "batch_id": b.batch_id,
                    "records": b.records,
                    "failed": list(b.failed),
                    "rows_failing": b.rows_failing,
                    "removed": b.removed,
                }
                for b in self.batches
            ],
        }


def audit_reason(failed: Sequence[dict[str, Any]]) -> str:
    """The ledger's reason for a compensation: ``audit: <expectation> (<message>); ...``."""
    parts = [f"{f['expectation']} ({f['message']})" for f in failed]
    return "audit: table-level expectations failed: " + "; ".join(parts)


def _as_dict(failed: Any) -> dict[str, Any]:
    return {
        "expectation": failed.expectation,
        "column": failed.column,
        "kwargs": failed.kwargs,
        "message": failed.message,
    }


def audit(
    sink: Sink,
    validator: BatchValidator,
    book: LedgerBook,
    *,
    source: str,
    batch_ids: Sequence[str] | None = None,
    dry_run: bool = False,
    by: str = "audit",
    frontier: Frontier | None = None,
) -> AuditReport:
    """Check each batch (all the sink holds, or ``batch_ids``) and compensate those that fail.

    A batch id the sink does not hold is skipped (it holds no records, so there is nothing to
    check or undo). On a dry run nothing is removed or recorded. With ``frontier``, the pages of
    removed records are fetched again by the next run (see :func:`collector.run.ledger.compensate`).
    """
    report = AuditReport(source=source, dry_run=dry_run)
    held = sink.batches()
    if batch_ids is not None:
        holding = set(held)
        held = [batch_id for batch_id in batch_ids if batch_id in holding]
    for batch_id in held:
        records = [r.record for r in sink.records(batch_id)]
        if not records:
            continue
        outcome = validator.validate(records)
        failed = tuple(_as_dict(f) for f in outcome.table_failures)
        removed = None
        if failed and not dry_run:
            entry = compensate(
                sink,
                book,
                source=source,
                batch_id=batch_id,
                reason=audit_reason(failed),
                by=by,
                frontier=frontier,
            )
            removed = entry.removed
        report.batches.append(BatchAudit(batch_id, len(records), failed, len(outcome.bad), removed))
    return report
