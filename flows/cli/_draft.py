"""``collector init --from-url``: the example page read once, and a suite drafted from it.

The page is fetched by the run's own engine, built from the source init just wrote
(:meth:`FetchEngine.for_source`): the same URL policy (no private address unless the source
allows it, every redirect hop checked), robots.txt, User-Agent, timeouts and size cap as a run,
one attempt. Its JSON is read by the source's own parser, and the first record gives the draft:

* every field is a column that must exist (``expect_column_to_exist``);
* every field with a value in the example must not be null (``..._to_not_be_null``);
* its type as JSON has it: a number may be either (``int`` or ``float``, ``..._in_type_list``),
  a string ``str``, a boolean ``bool``, a list, an object (``..._to_be_of_type``).

A draft is a guess from one page: init prints what it guessed, so the user loosens what is
optional. A page that cannot be read leaves the starter suite (the key not null), said why.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collector.config import Source

__all__ = ["Draft", "draft_suite", "read_example"]

_JSON_TYPES: tuple[tuple[type, str], ...] = (
    (bool, "bool"),  # before int: a bool is an int to Python
    (str, "str"),
    (list, "list"),
    (dict, "dict"),
)


@dataclass(slots=True)
class Draft:
    """What the example gave: the suite's expectations, and the lines that say so."""

    expectations: list[dict[str, Any]] = field(default_factory=list)
    said: list[str] = field(default_factory=list)


def _type_of(value: Any) -> str | list[str] | None:
    """The JSON type of a value as GX type names (a number: either kind)."""
    for kind, name in _JSON_TYPES:
        if isinstance(value, kind):
            return name
    if isinstance(value, int | float):
        return ["int", "float"]
    return None


def draft_suite(records: list[dict[str, Any]], key: str) -> Draft:
    """Expectations drafted from the first of an example page's records (see module)."""
    draft = Draft()
    if not records:
        draft.said.append("the page held no record: the suite stays the starter (key not null)")
        return draft
    record = records[0]
    types: list[str] = []
    not_null: list[str] = []
    for column, value in record.items():
        draft.expectations.append({"type": "expect_column_to_exist", "kwargs": {"column": column}})
        if value is not None:
            not_null.append(column)
            draft.expectations.append(
                {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": column}}
            )
        kind = _type_of(value)
        if isinstance(kind, list):
            draft.expectations.append({
                "type": "expect_column_values_to_be_in_type_list",
                "kwargs": {"column": column, "type_list": kind},
            })  # fmt: skip
            types.append(f"{column} number")
        elif kind is not None:
            draft.expectations.append({
                "type": "expect_column_values_to_be_of_type",
                "kwargs": {"column": column, "type_": kind},
            })  # fmt: skip
            types.append(f"{column} {kind}")
    draft.said += [
        f"columns: {', '.join(record)}",
        f"types: {', '.join(types) or 'none (every value null)'}",
        f"never null: {', '.join(not_null) or 'none'}",
    ]
    if key.split(".")[0] not in record:
        draft.said.append(f"the record key {key!r} is not a field of the example: set record.key")
    return draft


def _records_list_hint(body: bytes) -> str | None:
    """A field of a JSON object page that holds a list of objects (``record.records_path``)."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    for name, value in data.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            return str(name)
    return None


async def _fetch(source: Source, url: str) -> Any:
    from collector.fetch.engine import FetchEngine
    from collector.frontier.base import ClaimedItem
    from collector.policy.retry import RetryBudget

    once = source.model_copy(update={"retry": source.retry.model_copy(update={"max_attempts": 1})})
    async with FetchEngine.for_source(once) as engine:
        now = time.time()
        (result,) = await engine.fetch_batch(
            [ClaimedItem(url=url, attempts=0, first_attempt_at=None, enqueued_at=now)],
            budget=RetryBudget(ratio=0.0, min_retries=0),
            batch_timeout_s=source.ttl.batch_timeout_s,
        )
    return result


def read_example(source: Source, url: str) -> tuple[list[dict[str, Any]] | None, str]:
    """The example page's records (None when it could not be read) and one line saying what
    was read, or why not."""
    from collector.settle.parse import RecordParser

    try:
        result = asyncio.run(_fetch(source, url))
    except Exception as exc:  # a broken engine set-up is said, never a traceback from init
        return None, f"could not fetch it: {type(exc).__name__}: {exc}"
    if result.status != "ok":
        why = result.error.args[0] if result.error is not None and result.error.args else ""
        return None, f"could not fetch it: {why or result.status}"
    parser = RecordParser(parser=source.record.parser, records_path=source.record.records_path)
    try:
        records = parser.parse(url, result.body, result.content_type)
    except Exception as exc:
        hint = _records_list_hint(result.body)
        also = f" (its {hint!r} holds a list of records: set record.records_path)" if hint else ""
        return None, f"HTTP {result.http_status}, but not records: {exc}{also}"
    count = len(records)
    said = f"HTTP {result.http_status}, {count} record{'s' * (count != 1)}"
    hint = None if source.record.records_path else _records_list_hint(result.body)
    if hint and count == 1:  # one record holding a list of them: the list is the records
        said += f" (its {hint!r} holds a list of records: set record.records_path: {hint})"
    return records, said
