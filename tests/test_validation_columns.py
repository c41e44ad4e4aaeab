"""An expectation on ``price`` reads the key ``price``, whatever else the records hold.

Great Expectations resolves a column name the way a database would: case-insensitively, and
through quotes and backticks (``get_dbms_compatible_column_names``), taking the first column of
the frame that matches. For records, ``Price`` and ``price`` are two different keys: a batch
whose first record says ``Price`` made GX judge ``price`` by the ``Price`` column, so that record
passed and the others failed with ``price: value is null`` (issue 24). Real GX, no mocks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.errors import ConfigError
from collector.settle.validation import BatchValidation, SuiteValidator

SUITE = [
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "price"}},
    {
        "type": "expect_column_values_to_be_between",
        "kwargs": {"column": "price", "min_value": 1, "max_value": 50},
    },
]


@pytest.fixture(scope="module")
def validator(tmp_path_factory: pytest.TempPathFactory) -> SuiteValidator:
    path = tmp_path_factory.mktemp("suite") / "suite.json"
    path.write_text(json.dumps({"name": "price", "expectations": SUITE}), encoding="utf-8")
    return SuiteValidator(path)


def _verdicts(result: BatchValidation) -> dict[int, tuple[str, ...]]:
    verdict: dict[int, tuple[str, ...]] = {record["id"]: () for record in result.good}
    for row in result.bad:
        verdict[row.record["id"]] = tuple(f.message for f in row.failed)
    return verdict


@pytest.mark.parametrize("other", ["Price", "PRICE", "`price`", "`Price`", '"price"'])
def test_a_look_alike_key_before_the_real_one_does_not_stand_in_for_it(
    validator: SuiteValidator, other: str
) -> None:
    records: list[dict[str, Any]] = [
        {"id": 1, other: 6.25},  # no price: fails, although its look-alike is in range
        {"id": 2, "price": 22.25},
        {"id": 3, "price": 99.0, other: 5.0},  # out of range, whatever the look-alike says
    ]
    expected = {
        1: ("price: key missing",),
        2: (),
        3: ("price: value 99.0 not between 1 and 50",),
    }
    assert _verdicts(validator.validate(records)) == expected
    together = validator.validate_many([records[:2], records[2:]])
    assert {**_verdicts(together[0]), **_verdicts(together[1])} == expected


def test_a_suite_reading_two_look_alike_columns_judges_each_by_its_own(tmp_path: Path) -> None:
    path = tmp_path / "both.json"
    expectations = [
        {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": c, "value_set": [c]}}
        for c in ("Price", "price")
    ]
    path.write_text(json.dumps({"name": "both", "expectations": expectations}), encoding="utf-8")
    records: list[dict[str, Any]] = [
        {"id": 1, "Price": "Price", "price": "price"},
        {"id": 2, "Price": "price", "price": "price"},
        {"id": 3, "Price": "Price", "price": "Price"},
    ]
    assert _verdicts(SuiteValidator(path).validate(records)) == {
        1: (),
        2: ("Price: value 'price' not in set ['Price']",),
        3: ("price: value 'Price' not in set ['price']",),
    }


LOOK_ALIKES = ["price", "Price", "PRICE", "`price`", '"price"', "[price]", "pRiCe"]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(LOOK_ALIKES), st.none() | st.floats(-10, 100), min_size=0, max_size=3
        ),
        min_size=1,
        max_size=8,
    )
)
def test_verdicts_are_the_plain_reading_of_the_price_key(
    validator: SuiteValidator, drawn: list[dict[str, Any]]
) -> None:
    """The plain reference: not null and between 1 and 50, read from the key ``price`` alone."""
    records = [{"id": n, **record} for n, record in enumerate(drawn)]
    if not any("price" in record for record in records):
        return  # a column missing from the whole batch is its own rule (every row fails)
    expected = {
        record["id"]: record.get("price") is not None and 1 <= record["price"] <= 50
        for record in records
    }
    verdicts = _verdicts(validator.validate(records))
    assert {n: not failed for n, failed in verdicts.items()} == expected


def test_one_expectation_reading_two_look_alikes_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "pair.json"
    pair = {
        "type": "expect_column_pair_values_to_be_equal",
        "kwargs": {"column_A": "Price", "column_B": "price"},
    }
    path.write_text(json.dumps({"name": "pair", "expectations": [pair]}), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        SuiteValidator(path).validate([{"Price": 1, "price": 1}])
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    assert "reads columns 'Price' and 'price'" in message
