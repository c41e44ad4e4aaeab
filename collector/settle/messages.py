"""Short, one-line human texts for failed expectations (what a dead letter's reason says).

A failed row reads ``price: value -3 not between 0 and 100``; a failed table-level expectation
``expect_table_row_count_to_be_between failed: observed 3, expected min_value=10, ...``. Record
values are shown through :func:`collector.settle.suite.show` (short, safe against hostile
``__repr__``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from collector.settle.gx_runtime import Plan
from collector.settle.suite import show

__all__ = ["missing_text", "row_message", "table_message", "value_text"]


def _kwargs_text(kwargs: Mapping[str, Any]) -> str:
    skip = {"column", "column_A", "column_B", "result_format", "catch_exceptions", "meta"}
    parts = [f"{k}={show(v, 40)}" for k, v in kwargs.items() if k not in skip]
    return ", ".join(parts) if parts else "no kwargs"


def value_text(record: Mapping[str, Any], column: str) -> str:
    return f"value {show(record[column])}" if column in record else "key missing"


def row_message(plan: Plan, record: Mapping[str, Any]) -> str:
    """Short human text for one row failing one row-level expectation."""
    kind, kw = plan.spec.type, plan.spec.kwargs
    column = plan.column
    if column is None:
        shown = ", ".join(f"{c}={show(record.get(c), 30)}" for c in plan.columns)
        return f"{shown} failed {kind}"
    value = record.get(column)
    text = value_text(record, column)
    if kind == "expect_column_values_to_not_be_null":
        return f"{column}: {'value is null' if column in record else 'key missing'}"
    if kind == "expect_column_values_to_be_between":
        return f"{column}: {text} not between {kw.get('min_value')} and {kw.get('max_value')}"
    if kind == "expect_column_values_to_be_in_set":
        return f"{column}: {text} not in set {show(kw.get('value_set'))}"
    if kind == "expect_column_values_to_not_be_in_set":
        return f"{column}: {text} is in forbidden set {show(kw.get('value_set'))}"
    if kind == "expect_column_values_to_match_regex":
        return f"{column}: {text} does not match regex {show(kw.get('regex'))}"
    if kind == "expect_column_values_to_not_match_regex":
        return f"{column}: {text} matches forbidden regex {show(kw.get('regex'))}"
    if kind == "expect_column_values_to_be_of_type":
        return f"{column}: {text} ({type(value).__name__}) is not of type {kw.get('type_')}"
    if kind == "expect_column_values_to_be_in_type_list":
        return (
            f"{column}: {text} ({type(value).__name__}) is not one of types "
            f"{show(kw.get('type_list'))}"
        )
    if kind == "expect_column_value_lengths_to_be_between":
        return (
            f"{column}: length of {text} not between {kw.get('min_value')} and "
            f"{kw.get('max_value')}"
        )
    if kind == "expect_column_value_lengths_to_equal":
        return f"{column}: length of {text} is not {kw.get('value')}"
    if kind == "expect_column_values_to_be_unique":
        return f"{column}: {text} is not unique in the batch"
    if kind == "expect_column_values_to_be_null":
        return f"{column}: {text} is not null"
    return f"{column}: {text} failed {kind}"


def table_message(plan: Plan, result: Any) -> str:
    """Short human text for a failed table-level expectation."""
    prefix = f"{plan.column}: " if plan.column else ""
    observed = (getattr(result, "result", None) or {}).get("observed_value")
    return (
        f"{prefix}{plan.spec.type} failed: observed {show(observed)}, "
        f"expected {_kwargs_text(plan.spec.kwargs)}"
    )


def missing_text(missing: Sequence[str]) -> str:
    if len(missing) == 1:
        return f"column {missing[0]!r} missing"
    return "columns " + ", ".join(repr(c) for c in missing) + " missing"
