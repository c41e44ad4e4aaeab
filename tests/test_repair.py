"""Repair rules: what each step changes, what it refuses to guess, and config errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from collector.config import SourceError, load_source
from collector.recovery.repair import CoerceType, RepairRules, coerce_value
from tests.helpers import write_source


def rules(**kwargs: object) -> RepairRules:
    return RepairRules.model_validate(kwargs)


def test_empty_rules_change_nothing() -> None:
    record = {"id": 1, "title": "  x  "}
    out, changes = RepairRules().apply(record)
    assert RepairRules().empty
    assert out == record and changes == []


def test_steps_run_in_order_and_say_what_they_did() -> None:
    r = rules(
        rename={"Price": "price", "ID": "id"},
        trim=["title"],
        rewrite=[{"field": "sku", "pattern": r"^sku-(\d+)$", "replace": r"SKU\1"}],
        coerce={"price": "float", "id": "int", "stock": "int"},
        defaults={"currency": "EUR", "stock": 0},
    )
    record = {"ID": "7", "Price": " 12.50", "title": "  Lamp \n", "sku": "sku-42", "stock": None}
    out, changes = r.apply(record)
    assert out == {
        "id": 7,
        "price": 12.5,
        "title": "Lamp",
        "sku": "SKU42",
        "stock": 0,
        "currency": "EUR",
    }
    assert changes == [
        "renamed Price -> price",
        "renamed ID -> id",
        "trimmed title",
        r"rewrote sku with /^sku-(\d+)$/",
        "coerced price to float",
        "coerced id to int",
        "defaulted currency",
        "defaulted stock",
    ]
    assert record["ID"] == "7"  # the input is not modified


def test_rename_never_overwrites_an_existing_key() -> None:
    out, changes = rules(rename={"a": "b"}).apply({"a": 1, "b": 2})
    assert out == {"a": 1, "b": 2} and changes == []


def test_values_that_do_not_convert_are_left_alone() -> None:
    r = rules(coerce={"n": "int", "f": "float", "b": "bool"})
    out, changes = r.apply({"n": "12abc", "f": "nan", "b": "maybe"})
    assert out == {"n": "12abc", "f": "nan", "b": "maybe"} and changes == []


@pytest.mark.parametrize(
    ("value", "kind", "expected"),
    [
        ("7", "int", (True, 7)),
        (" 7 ", "int", (True, 7)),
        ("7.0", "int", (True, 7)),
        (7.5, "int", (False, 7.5)),
        ("7.5", "int", (False, 7.5)),
        (True, "int", (False, True)),
        ("1e3", "float", (True, 1000.0)),
        ("inf", "float", (False, "inf")),
        (3, "float", (True, 3.0)),
        (3, "str", (True, "3")),
        ([1], "str", (False, [1])),
        ("Yes", "bool", (True, True)),
        (0, "bool", (True, False)),
        ("2", "bool", (False, "2")),
        (None, "int", (False, None)),
    ],
)
def test_coerce_value(value: object, kind: CoerceType, expected: tuple[bool, object]) -> None:
    ok, got = coerce_value(value, kind)
    assert (ok, got) == expected
    assert type(got) is type(expected[1])


def test_repair_section_loads(tmp_path: Path) -> None:
    path = write_source(
        tmp_path,
        seeds={"urls": ["http://127.0.0.1:1/a"]},
        repair={"trim": ["title"], "coerce": {"price": "float"}},
    )
    source = load_source(path)
    assert source.repair.trim == ["title"]
    assert source.repair.coerce == {"price": "float"}


@pytest.mark.parametrize(
    ("repair", "expected"),
    [
        (
            {"rewrite": [{"field": "sku", "pattern": "([a-z"}]},
            "repair.rewrite[0]: invalid regex '([a-z'",
        ),
        (
            {"rewrite": [{"field": "sku", "pattern": "a", "replace": r"\3"}]},
            "repair.rewrite[0]: invalid regex 'a': invalid group reference 3",
        ),
        ({"coerce": {"price": "decimal"}}, "repair.coerce.price: Input should be"),
        ({"trimm": ["x"]}, "repair.trimm: unknown key"),
    ],
)
def test_bad_repair_rules_are_one_line_naming_the_field(
    tmp_path: Path, repair: dict[str, Any], expected: str
) -> None:
    path = write_source(tmp_path, seeds={"urls": ["http://127.0.0.1:1/a"]}, repair=repair)
    with pytest.raises(SourceError) as caught:
        load_source(path)
    (problem,) = caught.value.problems
    assert problem.startswith(f"{path}: {expected}")
    assert "\n" not in problem
