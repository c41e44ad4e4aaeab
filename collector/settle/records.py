"""A batch's records keyed and checked: the good ones for the sink, the bad ones dead letters.

A record without a usable key (missing, empty, or not a scalar at ``record.key``) is bad at once;
the rest go to the source's suite in one call (:class:`~collector.settle.validation_worker.
ValidationWorker`). A table expectation that fails makes every record of the batch bad; a row
expectation only its row. A page all of whose records are bad is dead-lettered; a page with at
least one good record is stored (its bad ones are quarantined, counted per record).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from collector.deadletter import DeadLetter
from collector.fetch.engine import FetchResult
from collector.ops import tracing
from collector.settle.letters import Letters, expectation_dict
from collector.settle.parse import dotted_get
from collector.sinks import SinkRecord

if TYPE_CHECKING:
    from collector.settle.rowsplit import BatchValidation
    from collector.settle.validation_worker import ValidationWorker

__all__ = ["Checked", "key_and_validate"]

_Candidate = tuple[FetchResult, str, dict[str, Any]]  # the page, the record's key, the record


@dataclass(slots=True)
class Checked:
    """What the check of one batch's records found."""

    good: list[SinkRecord] = field(default_factory=list)
    failed_items: set[str] = field(default_factory=set)  # pages all of whose records failed
    quarantined: int = 0  # bad records (their page may still be stored)
    validated: int = 0  # records the suite saw
    validation_s: float = 0.0  # the worker's own time
    waited_s: float = 0.0  # this process's wait for the worker (not its own work)


async def key_and_validate(
    parsed: list[tuple[FetchResult, list[dict[str, Any]]]],
    *,
    key_path: str,
    validator: ValidationWorker | None,
    letters: Letters,
    bad: list[DeadLetter],
    traces: tracing.BatchTraces,
) -> Checked:
    """Key every record, run the suite over the batch, split good from bad (bad ones are
    appended to ``bad`` as dead letters)."""
    checked = Checked()
    total_per_item = {result.url: len(records) for result, records in parsed}
    bad_per_item: dict[str, int] = {}
    candidates = _keyed(parsed, key_path, letters, bad, bad_per_item)
    keep = [True] * len(candidates)
    if validator is not None and candidates:
        waiting = time.monotonic()
        with traces.step("validate"):
            outcome = await validator.validate([record for _, _, record in candidates])
        checked.waited_s = time.monotonic() - waiting
        checked.validation_s = outcome.seconds
        checked.validated = len(candidates)
        _mark_bad(outcome, candidates, keep, letters, bad)
    for index, (result, key, record) in enumerate(candidates):
        if keep[index]:
            checked.good.append(SinkRecord(key, record, result.url))
        else:
            bad_per_item[result.url] = bad_per_item.get(result.url, 0) + 1
    checked.quarantined = sum(bad_per_item.values())
    checked.failed_items = {
        url for url, count in bad_per_item.items() if count and count == total_per_item[url]
    }
    return checked


def _keyed(
    parsed: list[tuple[FetchResult, list[dict[str, Any]]]],
    key_path: str,
    letters: Letters,
    bad: list[DeadLetter],
    bad_per_item: dict[str, int],
) -> list[_Candidate]:
    """The records with a usable key; the others become ``missing_key`` dead letters."""
    candidates: list[_Candidate] = []
    for result, records in parsed:
        for record in records:
            key = dotted_get(record, key_path, None)
            if key is None or isinstance(key, (dict, list)) or key == "":
                message = f"record has no usable key at {key_path!r}"
                bad.append(letters.record(result, record, "missing_key", message))
                bad_per_item[result.url] = bad_per_item.get(result.url, 0) + 1
                continue
            candidates.append((result, str(key), record))
    return candidates


def _mark_bad(
    outcome: BatchValidation,
    candidates: list[_Candidate],
    keep: list[bool],
    letters: Letters,
    bad: list[DeadLetter],
) -> None:
    """The suite's verdict: table failures fail every record, row
    failures their row; each bad record becomes one dead letter."""
    if outcome.table_failures:
        failed = [expectation_dict(f) for f in outcome.table_failures]
        names = ", ".join(f.expectation for f in outcome.table_failures)
        for index, (result, key, record) in enumerate(candidates):
            keep[index] = False
            bad.append(
                letters.record(
                    result, record, "table_expectation", f"batch failed {names}",
                    key=key, failed=failed,
                )
            )  # fmt: skip
    for row in outcome.bad:
        if not keep[row.index]:
            continue
        keep[row.index] = False
        result, key, record = candidates[row.index]
        failed = [expectation_dict(f) for f in row.failed]
        message = "; ".join(f.message for f in row.failed)[:500]
        bad.append(letters.record(result, record, "schema", message, key=key, failed=failed))
