"""`collector.recovery.audit`: written batches checked against the current suite; failing ones
undone.

The same checks on the JSONL and the Postgres sink, with the real GX suite (SuiteValidator).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.recovery.audit import audit
from collector.run.ledger import LedgerBook
from collector.settle.validation import SuiteValidator
from collector.sinks.base import Sink, SinkRecord
from collector.sinks.jsonl import JsonlSink

SOURCE = "audited"


def suite(folder: Path, *expectations: dict[str, Any]) -> SuiteValidator:
    path = folder / "suite.json"
    path.write_text(json.dumps({"name": "s", "expectations": list(expectations)}), "utf-8")
    return SuiteValidator(path)


NOT_NULL = {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "price"}}
AT_MOST_TWO_ROWS = {"type": "expect_table_row_count_to_be_between", "kwargs": {"max_value": 2}}
PRICE_MAX_50 = {
    "type": "expect_column_max_to_be_between",
    "kwargs": {"column": "price", "max_value": 50},
}


def fill(sink: Sink) -> None:
    """Three batches: r:1 with 2 records, r:2 with 3 (one price 99), r:3 with 1."""

    def recs(*prices: tuple[str, float | None]) -> list[SinkRecord]:
        return [SinkRecord(k, {"id": k, "price": p}, f"https://x.test/{k}") for k, p in prices]

    sink.write(recs(("a", 1.0), ("b", 2.0)), token=1, batch_id="r:1")
    sink.write(recs(("c", 3.0), ("d", 99.0), ("e", None)), token=2, batch_id="r:2")
    sink.write(recs(("f", 4.0)), token=3, batch_id="r:3")


@pytest.fixture(params=["jsonl", "postgres"])
def opened(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Sink]]:
    sinks: list[Sink] = []

    def open_sink() -> Sink:
        if request.param == "jsonl":
            sink: Sink = JsonlSink(tmp_path / "out", source=SOURCE)
        else:
            from collector.sinks.postgres import PostgresSink

            dsn = request.getfixturevalue("postgres_dsn")
            sink = PostgresSink(dsn, source=SOURCE)
        sinks.append(sink)
        return sink

    yield open_sink
    for sink in sinks:
        sink.close()


def test_a_batch_failing_a_table_expectation_is_compensated_and_recorded(
    opened: Callable[[], Sink], tmp_path: Path
) -> None:
    sink = opened()
    fill(sink)
    book = LedgerBook(tmp_path / "ledger.jsonl")
    validator = suite(tmp_path, NOT_NULL, AT_MOST_TWO_ROWS)

    report = audit(sink, validator, book, source=SOURCE)

    assert [(b.batch_id, b.records, b.removed) for b in report.batches] == [
        ("r:1", 2, None),
        ("r:2", 3, 3),
        ("r:3", 1, None),
    ]
    (failing,) = report.failed
    assert [f["expectation"] for f in failing.failed] == ["expect_table_row_count_to_be_between"]
    assert failing.rows_failing == 1  # e's null price: reported, not a reason to compensate
    assert sink.batches() == ["r:1", "r:3"]
    assert [sink.get(k) for k in "cde"] == [None, None, None]
    assert sink.get("a") == {"id": "a", "price": 1.0}
    assert sink.get("f") == {"id": "f", "price": 4.0}
    (entry,) = book.compensations(SOURCE)
    assert (entry.batch_id, entry.removed, entry.by) == ("r:2", 3, "audit")
    assert entry.reason.startswith("audit: table-level expectations failed: ")
    assert "expect_table_row_count_to_be_between" in entry.reason
    # durable: another instance (process, worker) sees the same
    assert opened().batches() == ["r:1", "r:3"]

    again = audit(sink, validator, book, source=SOURCE)
    assert again.failed == [] and again.compensated == []
    assert [b.batch_id for b in again.batches] == ["r:1", "r:3"]
    assert len(book.compensations(SOURCE)) == 1
    assert sink.count() == 3


def test_dry_run_and_named_batches(opened: Callable[[], Sink], tmp_path: Path) -> None:
    sink = opened()
    fill(sink)
    book = LedgerBook(tmp_path / "ledger.jsonl")
    validator = suite(tmp_path, PRICE_MAX_50)

    dry = audit(sink, validator, book, source=SOURCE, dry_run=True)
    assert [b.batch_id for b in dry.failed] == ["r:2"]
    assert dry.failed[0].removed is None
    assert dry.as_dict()["failed"] == 1 and dry.as_dict()["removed"] == 0
    assert sink.count() == 6 and book.compensations() == []

    only = audit(sink, validator, book, source=SOURCE, batch_ids=["r:1", "never"])
    assert [b.batch_id for b in only.batches] == ["r:1"] and only.failed == []
    assert sink.count() == 6

    done = audit(sink, validator, book, source=SOURCE, batch_ids=["r:2"])
    assert [(b.batch_id, b.removed) for b in done.batches] == [("r:2", 3)]
    assert "expect_column_max_to_be_between" in book.compensations(SOURCE)[0].reason
    assert sink.count() == 3
