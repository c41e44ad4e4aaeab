"""SQL table names a source may give its Postgres sink (checked without importing psycopg, so
``collector validate`` stays fast)."""

from __future__ import annotations

import re

__all__ = ["DEFAULT_TABLE", "check_table_name"]

DEFAULT_TABLE = "collector_records"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,47}")  # leaves room for the index name


def check_table_name(name: str) -> tuple[str, ...]:
    """``table`` or ``schema.table``, each an unquoted SQL identifier; else ValueError."""
    parts = tuple(name.split("."))
    if len(parts) > 2 or not all(_IDENTIFIER.fullmatch(part) for part in parts):
        raise ValueError(
            f"{name!r} is not a table name (letters, digits and '_', not starting with a digit, "
            "at most 48 characters; optionally schema.table)"
        )
    return parts
