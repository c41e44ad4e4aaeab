"""The GX validation worker process: same answers as in-process, and a safe fallback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.settle.rowsplit import BatchValidation
from collector.settle.validation import SuiteValidator
from collector.settle.validation_worker import ValidationWorker, prewarm
from collector.settle.worker_pool import pool

SUITE = {
    "name": "items",
    "expectations": [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "name"}},
        {
            "type": "expect_column_values_to_be_between",
            "kwargs": {"column": "price", "min_value": 0, "max_value": 100},
        },
    ],
}
RECORDS: list[dict[str, Any]] = [
    {"id": 1, "name": "a", "price": 5},
    {"id": 2, "name": None, "price": 5},
    {"id": 3, "name": "c", "price": -1},
    {"id": 4, "name": "d", "price": 50},
]


@pytest.fixture(autouse=True)
def _empty_pool() -> Iterator[None]:
    """Each test starts and ends with no idle worker in this process (none from other tests)."""
    pool.close_all()
    yield
    pool.close_all()


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(SUITE), encoding="utf-8")
    return path


# Every test sends at once (linger_s=0): lingering is tests/test_validation_many.py's subject,
# and here it only waited 5 s per validate.


def _shape(result: BatchValidation) -> tuple[list[int], list[tuple[int, tuple[str, ...]]]]:
    good = [r["id"] for r in result.good]
    bad = [(b.index, tuple(f.expectation for f in b.failed)) for b in result.bad]
    return good, bad


async def test_worker_answers_like_the_in_process_validator(suite: Path) -> None:
    prewarm(suite)
    (prewarmed,) = pool.idle()
    worker = ValidationWorker(suite, linger_s=0)
    try:
        remote = await worker.validate(RECORDS)
        assert worker._process is prewarmed.process and worker._process.poll() is None
        assert pool.idle() == []  # the prewarmed process was adopted, not shared
    finally:
        await worker.aclose()
    assert [idle.process for idle in pool.idle()] == [prewarmed.process]  # back, for the next
    assert _shape(remote) == _shape(SuiteValidator(suite).validate(RECORDS))
    assert _shape(remote) == (
        [1, 4],
        [
            (1, ("expect_column_values_to_not_be_null",)),
            (2, ("expect_column_values_to_be_between",)),
        ],
    )


async def test_a_dead_worker_falls_back_to_in_process_validation(suite: Path) -> None:
    worker = ValidationWorker(suite, linger_s=0)
    try:
        worker.start()
        assert worker._process is not None
        worker._process.kill()
        worker._process.wait()
        result = await worker.validate(RECORDS)
    finally:
        await worker.aclose()
    assert worker._failed is True
    assert _shape(result)[0] == [1, 4]
    assert pool.idle() == []  # a dead worker is never kept


async def test_ready_waits_for_the_worker_and_is_not_a_gx_call(suite: Path) -> None:
    worker = ValidationWorker(suite, linger_s=0)
    try:
        await worker.ready()  # GX imported in the worker: its greeting has been read
        assert worker._greeted is not None and worker._greeted is worker._process
        assert worker.calls == 0
        result = await worker.validate(RECORDS)  # the answer is not mistaken for the greeting
        await worker.ready()  # once per process: nothing more to read
    finally:
        await worker.aclose()
    assert worker._failed is False and worker.calls == 1
    assert _shape(result)[0] == [1, 4]


async def test_ready_gives_up_on_a_worker_that_died_during_start_up(suite: Path) -> None:
    worker = ValidationWorker(suite, linger_s=0)
    try:
        worker.start()
        assert worker._process is not None
        worker._process.kill()
        worker._process.wait()
        await worker.ready()  # returns, and batches will be validated in-process
        result = await worker.validate(RECORDS)
    finally:
        await worker.aclose()
    assert worker._failed is True
    assert _shape(result)[0] == [1, 4]
    assert pool.idle() == []  # a dead worker is never kept
