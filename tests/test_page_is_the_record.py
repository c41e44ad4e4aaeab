"""End to end, the page is the record: what is stored is the page's JSON value, exactly.

Hypothesis draws JSON documents with what codecs get wrong (integers beyond 64 bits, negative
ones, ``1.5e300``, ``-0.0``, ``\\u0000``, escaped lone surrogates, deep nesting, long strings,
duplicate keys in the text), a real local HTTP server serves them as pages, and a real
``collect`` run fetches them. The plain reference is the standard library's reading of each
page's bytes. Checked: what the sink holds (JSONL, Postgres) and what a dead letter's payload
holds (SQLite, Redis; a suite that fails every record sends each there) equal that value,
types all the way down; and a second run of the same pages counts every record unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from collector.backends import open_backends
from collector.config import load_source
from tests.helpers import summary_of, write_source, write_suite
from tests.servers import numbered_pages

pytestmark = [pytest.mark.usefixtures("prefect_api"), pytest.mark.slow]

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([2**63, 2**64, 2**70 + 1, -(2**63) - 1, -(2**70), 10**40, -1])
    | st.sampled_from([1.5e300, -1.5e300, -0.0, 0.0, 5e-324, 1e-300, 0.1])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
    | st.sampled_from(["\u0000", "\ud800", "a\udfffb", "\u202e\u200d", "x" * 5000])
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=12,
)


def deep(levels: int) -> Any:
    value: Any = [2**70, -0.0, "\u0000"]
    for level in range(levels):
        value = {f"l{level}": value} if level % 2 else [value]
    return value


@st.composite
def page_bodies(draw: st.DrawFn) -> list[bytes]:
    """Page bodies: an object with an ``id`` and anything else, written in several ways."""
    bodies = []
    for n in range(draw(st.integers(1, 4))):
        fields = draw(
            st.dictionaries(
                st.text().filter(lambda k: k not in ("id", "_collector")), VALUES, max_size=5
            )
        )
        document = {"id": n, **fields}
        text = json.dumps(document, ensure_ascii=True)  # lone surrogates can only be escaped
        if draw(st.booleans()):
            try:
                text = json.dumps(document, ensure_ascii=False)
                text.encode()
            except UnicodeEncodeError:
                text = json.dumps(document, ensure_ascii=True)
        if draw(st.booleans()):  # the same key twice in the text: the last one counts
            text = '{"id": "first", ' + text[1:]
        bodies.append(text.encode())
    return bodies


def canonical(value: Any) -> Any:
    """A form that is equal exactly when two JSON values are: types, -0.0, key order aside."""
    if isinstance(value, dict):
        return ("object", sorted((k, canonical(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("array", [canonical(v) for v in value])
    return (type(value).__name__, repr(value))


_BODIES: list[bytes] = []  # what the site serves: page n is _BODIES[n] (set per example)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with numbered_pages(lambda n: (200, _BODIES[n])) as url:
        yield url


FAIL_ALL = [{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "no such key"}}]


def _run_twice(folder: Path, site: str, bodies: list[bytes], **sections: Any) -> dict[str, Any]:
    import asyncio

    from flows.collect import collect

    _BODIES[:] = bodies
    path = write_source(
        folder,
        name="pages",
        seeds={"template": f"{site}/{{i}}.json", "range": [0, len(bodies)]},
        ttl={"default_fresh_s": 0},
        **sections,
    )
    first = summary_of(asyncio.run(collect(source=str(path), drain_wait_s=2)))
    second = summary_of(asyncio.run(collect(source=str(path), drain_wait_s=2)))
    source = load_source(path)
    expected = {str(json.loads(body)["id"]): json.loads(body) for body in bodies}
    with open_backends(source) as backends:
        stored = {key: backends.sink.get(key) for key in expected}
        letters = {
            e.record_key: e.payload
            for e in backends.deadletters.list(source=source.name, status=None)
        }
    return {
        "first": first,
        "second": second,
        "expected": expected,
        "stored": stored,
        "letters": letters,
    }


def _stored_exactly(found: dict[str, Any]) -> None:
    for key, page in found["expected"].items():
        record = found["stored"][key]
        assert record is not None, f"record {key} not stored; {found['first']}"
        record = {k: v for k, v in record.items() if k != "_collector"}
        assert canonical(record) == canonical(page)
    assert found["second"]["records_unchanged"] == len(found["expected"]), found["second"]


def _dead_lettered_exactly(found: dict[str, Any]) -> None:
    for key, page in found["expected"].items():
        assert key in found["letters"], f"record {key} not dead-lettered; {found['first']}"
        assert canonical(found["letters"][key]) == canonical(page)


SLOW = settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
DEEP = [json.dumps({"id": 0, "deep": deep(300), "big": 2**70 + 1, "neg": -(2**70)}).encode()]


@SLOW
@given(page_bodies())
@example(DEEP)
def test_the_jsonl_sink_holds_the_page(tmp_path: Path, server: str, bodies: list[bytes]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
        _stored_exactly(_run_twice(Path(folder), server, bodies))


@SLOW
@given(page_bodies())
@example(DEEP)
def test_the_postgres_sink_holds_the_page(
    tmp_path: Path, server: str, postgres_dsn: str, bodies: list[bytes]
) -> None:
    import tempfile

    with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
        name = Path(folder).name.replace("-", "_").lower()
        sink = {"type": "postgres", "dsn": postgres_dsn, "table": f"pages_{name}"}
        _stored_exactly(_run_twice(Path(folder), server, bodies, sink=sink))


@pytest.mark.parametrize("store", ["sqlite", "redis"])
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@given(bodies=page_bodies())
@example(bodies=DEEP)
def test_a_dead_letter_holds_the_page(
    tmp_path: Path, server: str, request: pytest.FixtureRequest, store: str, bodies: list[bytes]
) -> None:
    import tempfile

    with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
        write_suite(Path(folder) / "never.json", FAIL_ALL)
        sections: dict[str, Any] = {"validation": {"suite": "never.json"}}
        if store == "redis":
            url = request.getfixturevalue("redis_url")
            sections["deadletters"] = {"type": "redis", "url": url}
        _dead_lettered_exactly(_run_twice(Path(folder), server, bodies, **sections))
