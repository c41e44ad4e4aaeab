"""Several batches validated in one GX call: the same answer as one call per batch, or no
coalescing at all (against real Great Expectations, no mocks)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from collector.settle.validation import BatchValidation, SuiteValidator
from collector.settle.validation_worker import ValidationWorker

ROW_LOCAL = [
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "name"}},
    {
        "type": "expect_column_values_to_be_between",
        "kwargs": {"column": "price", "min_value": 0, "max_value": 100},
    },
    {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "cat", "value_set": ["a"]}},
    {"type": "expect_column_values_to_be_of_type", "kwargs": {"column": "id", "type_": "int"}},
]
BATCHES: list[list[dict[str, Any]]] = [
    [
        {"id": 1, "name": "a", "price": 5, "cat": "a"},
        {"id": 2, "name": None, "price": 5, "cat": "a"},
    ],
    [
        {"id": 3, "name": "c", "price": 500, "cat": "a"},
        {"id": "4", "name": "d", "price": 1, "cat": "b"},
    ],
    [],
    [{"id": 5, "name": "e", "price": 7, "cat": "a"}],
]


def _suite(tmp_path: Path, name: str, expectations: list[dict[str, Any]]) -> SuiteValidator:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"name": name, "expectations": expectations}), encoding="utf-8")
    return SuiteValidator(path)


def _shape(result: BatchValidation) -> tuple[Any, ...]:
    return (
        [r["id"] for r in result.good],
        [(b.index, b.record["id"], tuple(f.message for f in b.failed)) for b in result.bad],
        tuple(f.message for f in result.table_failures),
    )


def _per_batch(validator: SuiteValidator, batches: list[list[dict[str, Any]]]) -> list[Any]:
    return [_shape(validator.validate(batch)) for batch in batches]


def test_row_level_suite_is_one_gx_call_with_the_same_answer(tmp_path: Path) -> None:
    validator = _suite(tmp_path, "rows", ROW_LOCAL)
    expected = _per_batch(validator, BATCHES)
    before = validator.gx_calls
    results = validator.validate_many(BATCHES)
    assert validator.gx_calls == before + 1
    assert [_shape(r) for r in results] == expected
    assert expected[1][1][1][:2] == (1, "4")  # local index, wrong type and not in set
    for batch, result in zip(BATCHES, results, strict=True):  # records keep their identity
        assert all(any(g is r for r in batch) for g in result.good)
        assert all(b.record is batch[b.index] for b in result.bad)


def test_cross_row_and_table_level_suites_stay_per_batch(tmp_path: Path) -> None:
    unique = _suite(
        tmp_path,
        "unique",
        [{"type": "expect_column_values_to_be_unique", "kwargs": {"column": "x"}}],
    )
    batches: list[list[dict[str, Any]]]
    batches = [[{"id": 1, "x": 1}, {"id": 2, "x": 2}], [{"id": 3, "x": 1}]]  # 1 twice, apart
    expected = _per_batch(unique, batches)
    before = unique.gx_calls
    assert [_shape(r) for r in unique.validate_many(batches)] == expected
    assert unique.gx_calls == before + 2
    assert expected == [([1, 2], [], ()), ([3], [], ())]

    table = _suite(
        tmp_path,
        "table",
        [
            *ROW_LOCAL[:1],
            {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 2}},
        ],
    )
    batches = [[{"id": 1, "name": "a"}, {"id": 2, "name": "b"}], [{"id": 3, "name": "c"}]]
    results = table.validate_many(batches)
    assert [_shape(r) for r in results] == _per_batch(table, batches)
    assert results[0].table_failures == () and len(results[1].table_failures) == 1


@pytest.mark.parametrize(
    "odd_batch",
    [
        [{"id": 9, "name": "x", "cat": "a"}],  # no price column at all: every row fails alone
        [{"id": 9, "name": "x", "price": "abc", "cat": "a"}],  # GX cannot compare: fallback
    ],
)
def test_batches_gx_would_judge_differently_together_are_validated_alone(
    tmp_path: Path, odd_batch: list[dict[str, Any]]
) -> None:
    validator = _suite(tmp_path, "odd", ROW_LOCAL)
    batches = [BATCHES[0], odd_batch, BATCHES[3]]
    expected = _per_batch(validator, batches)
    assert expected[1][0] == []  # the odd record fails
    assert [_shape(r) for r in validator.validate_many(batches)] == expected


@pytest.fixture
def row_suite(tmp_path: Path) -> Path:
    path = tmp_path / "suite.json"
    path.write_text(json.dumps({"name": "rows", "expectations": ROW_LOCAL}), encoding="utf-8")
    return path


async def test_worker_sends_waiting_batches_in_one_round_trip(row_suite: Path) -> None:
    worker = ValidationWorker(row_suite, linger_s=600, max_batches=len(BATCHES))
    try:
        results = await asyncio.wait_for(
            asyncio.gather(*(worker.validate(batch) for batch in BATCHES)), timeout=120
        )
    finally:
        await worker.aclose()
    assert worker.calls == 1  # max_batches reached: no lingering
    assert [_shape(r) for r in results] == _per_batch(SuiteValidator(row_suite), BATCHES)
    for batch, result in zip(BATCHES, results, strict=True):
        assert all(b.record is batch[b.index] for b in result.bad)


async def test_urgent_sends_at_once_instead_of_lingering(row_suite: Path) -> None:
    worker = ValidationWorker(row_suite, linger_s=600, max_batches=8)
    try:
        pending = asyncio.ensure_future(worker.validate(BATCHES[0]))
        await asyncio.sleep(0)
        assert not pending.done()
        with worker.urgent():
            result = await asyncio.wait_for(pending, timeout=120)  # not 600 s
    finally:
        await worker.aclose()
    assert _shape(result) == _shape(SuiteValidator(row_suite).validate(BATCHES[0]))
