"""Tests for collector.settle.validation against real Great Expectations (no mocks).

GX is imported once per test process (a few seconds); validators are module-scoped and every
batch is validated once per module, so the file stays well under a minute.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from collector.errors import ConfigError
from collector.settle.validation import (
    BatchValidation,
    FailedExpectation,
    RowFailure,
    SuiteValidator,
    check_suite_file,
)

ROOT = Path(__file__).resolve().parents[1]


def _write(directory: Path, name: str, suite: Any) -> Path:
    path = directory / name
    path.write_text(suite if isinstance(suite, str) else json.dumps(suite), encoding="utf-8")
    return path


def _suite(*expectations: dict[str, Any], name: str = "items") -> dict[str, Any]:
    return {"name": name, "expectations": list(expectations)}


def _exp(expectation_type: str, /, **kwargs: Any) -> dict[str, Any]:
    return {"type": expectation_type, "kwargs": kwargs}


# ----------------------------------------------------------------------------------------------
# Main suite: several row-level kinds, type checks, nested values, table-level failures
# ----------------------------------------------------------------------------------------------

MAIN_SUITE = _suite(
    _exp("expect_column_values_to_not_be_null", column="id"),  # 0
    _exp("expect_column_values_to_be_between", column="price", min_value=0, max_value=100),  # 1
    _exp("expect_column_values_to_match_regex", column="name", regex="^[a-z]+$"),  # 2
    _exp("expect_column_values_to_be_in_set", column="cat", value_set=["a", "b"]),  # 3
    {  # 4: the pre-1.0 key and a meta block are accepted
        "expectation_type": "expect_column_values_to_be_of_type",
        "kwargs": {"column": "id", "type_": "int"},
        "meta": {"notes": "ids are JSON integers"},
    },
    _exp("expect_column_values_to_be_in_type_list", column="price", type_list=["int", "float"]),
    _exp("expect_column_value_lengths_to_be_between", column="name", min_value=1, max_value=5),
    _exp("expect_column_values_to_be_unique", column="sku"),  # 7
    _exp("expect_column_values_to_be_in_set", column="kind", value_set=["x", "y"]),  # 8
    _exp("expect_table_row_count_to_be_between", min_value=1, max_value=3),  # 9 (table)
    _exp("expect_column_to_exist", column="id"),  # 10 (table, passes)
    _exp("expect_column_max_to_be_between", column="id", max_value=5),  # 11 (table, fails)
)


def _base(i: int, **changes: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "id": i,
        "price": 10,
        "name": "abc",
        "cat": "a",
        "sku": f"s{i}",
        "kind": "x",
        "tags": ["t1", "t2"],
        "info": {"nested": {"deep": [1, 2, {"k": None}]}},
    }
    record.update(changes)
    return record


def _main_records() -> list[dict[str, Any]]:
    records = [
        _base(0),  # 0 good
        _base(1, id=None),  # 1 null id
        _base(2, price=-3),  # 2 below min
        _base(3, name="AB1"),  # 3 regex
        _base(4, cat="z"),  # 4 not in set
        _base(5, id="5"),  # 5 id is a str
        _base(6, id=True),  # 6 id is a bool: not an int for JSON
        _base(7, price="abc"),  # 7 not comparable with 0..100, not int/float
        _base(8, name="abcdefgh"),  # 8 too long
        _base(9, sku="dup"),  # 9 duplicate
        _base(10, sku="dup"),  # 10 duplicate
        _base(11),  # 11 keys removed below
        _base(12, kind="y", tags=[{"a": [1]}], info={}),  # 12 good, other nested values
        _base(13, kind={"nested": 1}),  # 13 a dict where a string is expected
        _base(14, price=2.5),  # 14 good: float price
    ]
    del records[11]["id"]
    del records[11]["price"]
    return records


@pytest.fixture(scope="module")
def main_validator(tmp_path_factory: pytest.TempPathFactory) -> SuiteValidator:
    path = _write(tmp_path_factory.mktemp("suites"), "main.json", MAIN_SUITE)
    return SuiteValidator(path)


@pytest.fixture(scope="module")
def main_records() -> list[dict[str, Any]]:
    return _main_records()


@pytest.fixture(scope="module")
def main_result(main_validator: SuiteValidator, main_records: list[dict[str, Any]]) -> Any:
    return main_validator.validate(main_records)


def _by_index(result: BatchValidation) -> dict[int, RowFailure]:
    return {failure.index: failure for failure in result.bad}


def _types(failure: RowFailure) -> list[str]:
    return [f.expectation for f in failure.failed]


def test_expectation_types_in_file_order(main_validator: SuiteValidator) -> None:
    assert main_validator.expectation_types == tuple(
        e.get("type") or e.get("expectation_type") for e in MAIN_SUITE["expectations"]
    )


def test_good_rows_are_the_original_objects_in_order(
    main_result: BatchValidation, main_records: list[dict[str, Any]]
) -> None:
    assert isinstance(main_result, BatchValidation)
    assert [id(r) for r in main_result.good] == [id(main_records[i]) for i in (0, 12, 14)]
    assert main_records[12] == _base(12, kind="y", tags=[{"a": [1]}], info={})  # untouched
    assert main_result.seconds > 0


def test_bad_rows_in_input_order_with_original_records(
    main_result: BatchValidation, main_records: list[dict[str, Any]]
) -> None:
    indexes = [failure.index for failure in main_result.bad]
    assert indexes == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13]
    for failure in main_result.bad:
        assert failure.record is main_records[failure.index]
        assert all(isinstance(f, FailedExpectation) for f in failure.failed)


def test_null_and_missing_key(main_result: BatchValidation) -> None:
    bad = _by_index(main_result)
    assert _types(bad[1]) == ["expect_column_values_to_not_be_null"]  # type check skips nulls
    assert bad[1].failed[0].message == "id: value is null"
    assert bad[1].failed[0].column == "id"
    assert bad[1].failed[0].kwargs == {"column": "id"}
    # A key absent from one record is null for that record; nullable checks skip it.
    assert _types(bad[11]) == ["expect_column_values_to_not_be_null"]
    assert bad[11].failed[0].message == "id: key missing"


def test_between_regex_set_length_unique(main_result: BatchValidation) -> None:
    bad = _by_index(main_result)
    assert [f.message for f in bad[2].failed] == ["price: value -3 not between 0 and 100"]
    assert _types(bad[3]) == ["expect_column_values_to_match_regex"]
    assert "'AB1'" in bad[3].failed[0].message and "^[a-z]+$" in bad[3].failed[0].message
    assert [f.message for f in bad[4].failed] == ["cat: value 'z' not in set ['a', 'b']"]
    assert _types(bad[8]) == ["expect_column_value_lengths_to_be_between"]
    assert bad[8].failed[0].message.startswith("name: length of value 'abcdefgh'")
    for index in (9, 10):
        assert _types(bad[index]) == ["expect_column_values_to_be_unique"]
        assert bad[index].failed[0].message == "sku: value 'dup' is not unique in the batch"


def test_wrong_types(main_result: BatchValidation) -> None:
    bad = _by_index(main_result)
    assert _types(bad[5]) == ["expect_column_values_to_be_of_type"]
    assert bad[5].failed[0].message == "id: value '5' (str) is not of type int"
    assert _types(bad[6]) == ["expect_column_values_to_be_of_type"]
    assert "(bool)" in bad[6].failed[0].message
    # A string price cannot be compared with the bounds: GX raises for the whole column, the
    # module narrows it down to this row, and the type-list check also catches it.
    assert _types(bad[7]) == [
        "expect_column_values_to_be_between",
        "expect_column_values_to_be_in_type_list",
    ]
    assert (
        bad[7]
        .failed[0]
        .message.startswith(
            "price: value 'abc' could not be checked by expect_column_values_to_be_between"
        )
    )
    assert "(str) is not one of types ['int', 'float']" in bad[7].failed[1].message


def test_nested_value_where_scalar_expected(main_result: BatchValidation) -> None:
    bad = _by_index(main_result)
    assert _types(bad[13]) == ["expect_column_values_to_be_in_set"]
    assert bad[13].failed[0].column == "kind"
    assert bad[13].failed[0].message.startswith("kind: value {'nested': 1}")
    assert "\n" not in bad[13].failed[0].message


def test_table_level_failures_do_not_make_rows_bad(main_result: BatchValidation) -> None:
    assert [f.expectation for f in main_result.table_failures] == [
        "expect_table_row_count_to_be_between",
        "expect_column_max_to_be_between",
    ]
    row_count = main_result.table_failures[0]
    assert row_count.column is None
    assert "observed 15" in row_count.message and "max_value=3" in row_count.message
    assert main_result.table_failures[1].column == "id"
    assert len(main_result.good) == 3


def test_reusing_the_validator_gives_the_same_answer(
    main_validator: SuiteValidator,
    main_records: list[dict[str, Any]],
    main_result: BatchValidation,
    types_result: BatchValidation,  # another validator (and GX context) used in between
) -> None:
    again = main_validator.validate(main_records)
    assert again.good == main_result.good
    assert again.bad == main_result.bad
    assert again.table_failures == main_result.table_failures


def test_all_good_batch(main_validator: SuiteValidator) -> None:
    records = [_base(0), _base(1, kind="y"), _base(2, price=0.5)]
    result = main_validator.validate(records)
    assert result.bad == []
    assert result.table_failures == ()
    assert all(a is b for a, b in zip(result.good, records, strict=True))


def test_empty_batch(tmp_path: Path) -> None:
    """An empty batch is answered without GX: a fresh validator builds no runtime for it (its
    cost, not its speed: a loaded box can take 50 ms over anything)."""
    validator = SuiteValidator(_write(tmp_path, "main.json", MAIN_SUITE))
    result = validator.validate([])
    assert result.good == [] and result.bad == [] and result.table_failures == ()
    assert result.seconds >= 0 and validator._runtime is None


def test_records_must_be_dicts(main_validator: SuiteValidator) -> None:
    with pytest.raises(TypeError, match="record 1 is a list"):
        main_validator.validate([_base(0), [1, 2]])  # type: ignore[list-item]  # the test


def test_dataclasses_are_frozen(main_result: BatchValidation) -> None:
    failure = main_result.bad[0]
    with pytest.raises(AttributeError):
        failure.index = 5  # type: ignore[misc]  # frozen: the test
    assert not hasattr(failure, "__dict__")  # slotted


# ----------------------------------------------------------------------------------------------
# A column missing from every record
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def missing_result(tmp_path_factory: pytest.TempPathFactory) -> BatchValidation:
    suite = _suite(
        _exp("expect_column_values_to_not_be_null", column="weight"),
        _exp("expect_column_values_to_be_between", column="weight", min_value=0),
        _exp("expect_column_values_to_be_of_type", column="weight", type_="float"),
        _exp("expect_column_values_to_not_be_null", column="id"),
        _exp("expect_column_mean_to_be_between", column="weight", min_value=0),
        _exp("expect_column_to_exist", column="weight"),
        _exp("expect_column_pair_values_to_be_equal", column_A="id", column_B="weight"),
    )
    path = _write(tmp_path_factory.mktemp("suites"), "missing.json", suite)
    return SuiteValidator(path).validate([{"id": 1}, {"id": 2, "x": [1]}, {"id": None}])


def test_missing_column_fails_every_row(missing_result: BatchValidation) -> None:
    assert missing_result.good == []
    assert [f.index for f in missing_result.bad] == [0, 1, 2]
    for failure in missing_result.bad:
        assert _types(failure)[:3] == [
            "expect_column_values_to_not_be_null",
            "expect_column_values_to_be_between",
            "expect_column_values_to_be_of_type",
        ]
        assert [f.message for f in failure.failed if f.column == "weight"] == [
            "column 'weight' missing"
        ] * 3
        assert failure.failed[-1].expectation == "expect_column_pair_values_to_be_equal"
        assert failure.failed[-1].message == "column 'weight' missing"
    assert _types(missing_result.bad[2])[3] == "expect_column_values_to_not_be_null"  # id null


def test_missing_column_table_level(missing_result: BatchValidation) -> None:
    assert [(f.expectation, f.message) for f in missing_result.table_failures] == [
        ("expect_column_mean_to_be_between", "column 'weight' missing"),
        ("expect_column_to_exist", "column 'weight' missing"),
    ]


# ----------------------------------------------------------------------------------------------
# Type expectations on JSON values
# ----------------------------------------------------------------------------------------------

TYPES_SUITE = _suite(
    _exp("expect_column_values_to_be_of_type", column="a", type_="int64"),
    _exp("expect_column_values_to_be_of_type", column="b", type_="float"),
    _exp("expect_column_values_to_be_of_type", column="c", type_="str"),
    _exp("expect_column_values_to_be_of_type", column="d", type_="bool"),
    _exp("expect_column_values_to_be_in_type_list", column="e", type_list=["int", "str"]),
    _exp("expect_column_values_to_be_of_type", column="f", type_="int8"),
    _exp("expect_column_values_to_be_of_type", column="g", type_="dict"),
    _exp("expect_column_values_to_be_of_type", column="h", type_="list"),
    _exp("expect_column_values_to_be_of_type", column="i", type_="object"),
    _exp("expect_column_values_to_not_be_null", column="n"),
    name="types",
)
TYPES_RECORDS: list[dict[str, Any]] = [
    # all of the right type (Python ints for "int64", a float for "float", ...)
    {"a": 1, "b": 1.5, "c": "x", "d": True, "e": 3, "f": 100, "g": {}, "h": [], "i": [1], "n": 0},
    # all wrong: bool is not an int, an int is not a float, ...
    {"a": True, "b": 2, "c": 5, "d": 0, "e": 1.5, "f": 300, "g": [], "h": {}, "i": {}, "n": 1},
    # nulls are skipped by type checks, as GX does
    {"a": None, "b": None, "c": None, "d": None, "e": None, "g": None, "n": 2},
    {"a": 2**63, "e": "s", "f": -128, "n": 3},  # 2**63 does not fit int64
]


@pytest.fixture(scope="module")
def types_result(tmp_path_factory: pytest.TempPathFactory) -> BatchValidation:
    path = _write(tmp_path_factory.mktemp("suites"), "types.json", TYPES_SUITE)
    return SuiteValidator(path).validate(TYPES_RECORDS)


def test_type_expectations_per_row(types_result: BatchValidation) -> None:
    assert [id(r) for r in types_result.good] == [id(TYPES_RECORDS[0]), id(TYPES_RECORDS[2])]
    bad = _by_index(types_result)
    assert sorted(bad) == [1, 3]
    assert [f.column for f in bad[1].failed] == ["a", "b", "c", "d", "e", "f", "g", "h"]
    assert bad[1].failed[0].message == "a: value True (bool) is not of type int64"
    assert bad[1].failed[1].message == "b: value 2 (int) is not of type float"
    assert bad[1].failed[5].message == "f: value 300 (int) is not of type int8"
    assert [f.column for f in bad[3].failed] == ["a"]


# ----------------------------------------------------------------------------------------------
# Bad suites: one line, names the file and the problem
# ----------------------------------------------------------------------------------------------

LOAD_TIME_ERRORS: list[tuple[str, Any, str]] = [
    ("invalid_json", '{"name": "x", "expectations": [', "invalid JSON at line 1"),
    ("top_list", "[]", "not an expectation suite"),
    ("no_expectations", {"name": "x"}, "not an expectation suite: no 'expectations' key"),
    ("not_a_list", {"name": "x", "expectations": {}}, "'expectations' is not a list"),
    (
        "item_not_object",
        {"name": "x", "expectations": ["expect_table_row_count_to_equal"]},
        "expectations[0] is not an object",
    ),
    ("no_type", _suite({"kwargs": {"column": "a"}}), "expectations[0] has no 'type'"),
    (
        "unknown_type",
        _suite(_exp("expect_column_values_to_not_be_nul", column="a")),
        "expectations[0] (expect_column_values_to_not_be_nul): unknown expectation type "
        "(did you mean 'expect_column_values_to_not_be_null'?)",
    ),
    (
        "unknown_key",
        _suite({"type": "expect_column_to_exist", "kwarg": {"column": "a"}}),
        "unknown key 'kwarg'",
    ),
    (
        "kwargs_not_object",
        _suite({"type": "expect_column_to_exist", "kwargs": ["a"]}),
        "'kwargs' must be an object",
    ),
    (
        "bad_regex",
        _suite(_exp("expect_column_values_to_match_regex", column="a", regex="([a-z")),
        "invalid regex '([a-z'",
    ),
    (
        "unknown_type_name",
        _suite(_exp("expect_column_values_to_be_of_type", column="a", type_="integr")),
        "unknown type 'integr'",
    ),
]


def _assert_one_line(exc: ConfigError, path: Path, fragment: str) -> None:
    message = str(exc)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    assert fragment in message
    assert "Traceback" not in message


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    with pytest.raises(ConfigError) as info:
        check_suite_file(path)
    _assert_one_line(info.value, path, "suite file not found")
    with pytest.raises(ConfigError, match="suite file not found"):
        SuiteValidator(str(path))


@pytest.mark.parametrize(("name", "content", "fragment"), LOAD_TIME_ERRORS)
def test_bad_suite_at_load_time(tmp_path: Path, name: str, content: Any, fragment: str) -> None:
    path = _write(tmp_path, f"{name}.json", content)
    with pytest.raises(ConfigError) as info:
        check_suite_file(path)
    _assert_one_line(info.value, path, fragment)
    with pytest.raises(ConfigError):
        SuiteValidator(path)


GX_TIME_ERRORS: list[tuple[str, dict[str, Any], str]] = [
    (
        "extra_kwarg",
        _exp("expect_column_values_to_not_be_null", column="a", colour="red"),
        "invalid kwargs: colour: extra fields not permitted",
    ),
    (
        "wrong_kwarg_type",
        _exp("expect_column_values_to_be_in_set", column="a", value_set="abc"),
        "invalid kwargs: value_set: value is not a valid list",
    ),
    (
        "no_bounds",
        _exp("expect_column_values_to_be_between", column="a"),
        "min_value and max_value cannot both be None",
    ),
    (
        "missing_column_kwarg",
        _exp("expect_column_values_to_be_of_type", type_="int"),
        "column: field required",
    ),
    (
        "min_above_max",
        _exp("expect_column_values_to_be_between", column="a", min_value=5, max_value=1),
        "cannot be evaluated on records: min_value cannot be greater than max_value",
    ),
    (
        "no_pandas_implementation",
        _exp("expect_column_values_to_match_like_pattern", column="a", like_pattern="a%"),
        "cannot be evaluated on records: No provider found",
    ),
]


@pytest.mark.parametrize(("name", "expectation", "fragment"), GX_TIME_ERRORS)
def test_bad_kwargs_on_first_validate(
    tmp_path: Path, name: str, expectation: dict[str, Any], fragment: str
) -> None:
    suite = _suite(_exp("expect_column_values_to_not_be_null", column="a"), expectation)
    path = _write(tmp_path, f"{name}.json", suite)
    check_suite_file(path)  # needs GX to tell
    validator = SuiteValidator(path)
    with pytest.raises(ConfigError) as info:
        validator.validate([{"a": 1}])
    _assert_one_line(info.value, path, f"expectations[1] ({expectation['type']})")
    _assert_one_line(info.value, path, fragment)
    with pytest.raises(ConfigError) as again:  # remembered, not rebuilt
        validator.validate([{"a": 1}])
    assert str(again.value) == str(info.value)


# ----------------------------------------------------------------------------------------------
# Import cost and output
# ----------------------------------------------------------------------------------------------


def _run(code: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_import_does_not_import_great_expectations() -> None:
    done = _run(
        "import collector.settle.validation, sys; assert 'great_expectations' not in sys.modules"
    )
    assert done.returncode == 0, done.stderr


def test_load_and_empty_batch_do_not_import_gx_and_validation_prints_nothing(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path, "s.json", MAIN_SUITE)
    code = textwrap.dedent(
        f"""
        import sys
        from collector.settle.validation import SuiteValidator, check_suite_file
        check_suite_file({str(path)!r})
        v = SuiteValidator({str(path)!r})
        assert v.validate([]).good == []
        assert 'great_expectations' not in sys.modules
        result = v.validate([{{"id": 1, "price": 1, "name": "a", "cat": "a", "sku": "s",
                              "kind": "x"}}])
        assert 'great_expectations' in sys.modules
        assert len(result.good) == 1, result
        """
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
