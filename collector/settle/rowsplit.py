"""Records to rows and back: the result types, the DataFrame GX reads, one answer per batch.

Records become an object-dtype DataFrame whose index is the record's position (nested dicts and
lists stay whole Python objects), so GX's ``unexpected_index_list`` maps straight back to the
original record objects in :class:`RowFailure`. When several batches were validated in one GX
call, :func:`split_answer` cuts the combined answer back into one per batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "BatchValidation",
    "FailedExpectation",
    "RowFailure",
    "check_records",
    "split_answer",
    "to_frame",
]


@dataclass(frozen=True, slots=True)
class FailedExpectation:
    """One expectation that a row (or the whole batch) did not meet.

    ``kwargs`` is the expectation's kwargs as read from the suite file (JSON-safe). The same
    dict is shared by every failure of that expectation, so treat it as read-only.
    """

    expectation: str
    column: str | None
    kwargs: dict[str, Any]
    message: str


@dataclass(frozen=True, slots=True)
class RowFailure:
    """A record that failed at least one row-level expectation, with every one it failed."""

    index: int
    record: dict[str, Any]
    failed: tuple[FailedExpectation, ...]


@dataclass(frozen=True, slots=True)
class BatchValidation:
    """The outcome of validating one batch: rows to keep, rows to reject, batch-level problems."""

    good: list[dict[str, Any]]
    bad: list[RowFailure]
    table_failures: tuple[FailedExpectation, ...]
    seconds: float


def to_frame(records: Sequence[Mapping[str, Any]], columns: Iterable[str]) -> pd.DataFrame:
    """Object-dtype DataFrame, index = position; nested values stay whole Python objects."""
    import pandas as pd

    index = pd.RangeIndex(len(records))
    data = {
        column: pd.Series([record.get(column) for record in records], dtype=object, index=index)
        for column in columns
    }
    return pd.DataFrame(data, index=index)


def check_records(records: Sequence[object]) -> None:
    for position, record in enumerate(records):
        if not isinstance(record, dict):
            raise TypeError(f"record {position} is a {type(record).__name__}, expected a dict")


def split_answer(
    outcome: BatchValidation, batches: Sequence[list[dict[str, Any]]]
) -> list[BatchValidation]:
    """Cut the answer for concatenated ``batches`` into one answer per batch (local indexes)."""
    total = sum(len(records) for records in batches) or 1
    bad = iter(outcome.bad)
    row = next(bad, None)
    answers = []
    offset = 0
    for records in batches:
        end = offset + len(records)
        failures: list[RowFailure] = []
        while row is not None and row.index < end:
            failures.append(RowFailure(row.index - offset, row.record, row.failed))
            row = next(bad, None)
        failing = {failure.index for failure in failures}
        answers.append(
            BatchValidation(
                good=[record for i, record in enumerate(records) if i not in failing],
                bad=failures,
                table_failures=(),
                seconds=outcome.seconds * len(records) / total,
            )
        )
        offset = end
    return answers
