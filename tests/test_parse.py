"""Response bodies to records (collector.settle.parse)."""

from __future__ import annotations

import json
import textwrap
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.errors import ConfigError, PermanentFetchError
from collector.settle.parse import RecordParser, dotted_get

URL = "https://example.com/items.json"


def _module(tmp_path, monkeypatch, body: str) -> str:
    name = f"parse_hook_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _parse_error(parser: RecordParser, body: bytes) -> PermanentFetchError:
    with pytest.raises(PermanentFetchError) as info:
        parser.parse(URL, body)
    error = info.value
    assert error.error_class == "parse_error"
    assert error.stage == "parse"
    assert error.permanent
    return error


# --- built-in JSON parser ------------------------------------------------------------------------
def test_object_is_one_record():
    assert RecordParser().parse(URL, b'{"id": 1, "name": "a"}') == [{"id": 1, "name": "a"}]


def test_list_is_many_records():
    body = b'[{"id": 1}, {"id": 2}, {"id": 3}]'
    assert RecordParser().parse(URL, body) == [{"id": 1}, {"id": 2}, {"id": 3}]


def test_empty_list_is_no_records():
    assert RecordParser().parse(URL, b"[]") == []


@settings(max_examples=100, deadline=None)
@given(
    records=st.lists(
        st.dictionaries(
            st.text(max_size=5), st.integers(-1000, 1000) | st.text(max_size=5), max_size=4
        ),
        max_size=8,
    )
)
def test_round_trip_property(records):
    body = json.dumps(records).encode()
    assert RecordParser().parse(URL, body) == records


def test_records_path():
    body = json.dumps({"data": {"items": [{"id": 1}, {"id": 2}]}, "meta": {}}).encode()
    assert RecordParser(records_path="data.items").parse(URL, body) == [{"id": 1}, {"id": 2}]


def test_records_path_with_list_index():
    body = json.dumps({"pages": [{"items": [{"id": 1}]}, {"items": [{"id": 2}, {"id": 3}]}]})
    parser = RecordParser(records_path="pages.1.items")
    assert parser.parse(URL, body.encode()) == [{"id": 2}, {"id": 3}]


def test_records_path_to_a_single_object():
    body = b'{"data": {"item": {"id": 9}}}'
    assert RecordParser(records_path="data.item").parse(URL, body) == [{"id": 9}]


@pytest.mark.parametrize("path", ["data.nope", "nope", "data.items.5", "data.items.x"])
def test_missing_records_path(path):
    body = b'{"data": {"items": [{"id": 1}]}}'
    error = _parse_error(RecordParser(records_path=path), body)
    assert repr(path) in str(error)
    assert "not found" in str(error)


@pytest.mark.parametrize(
    "body", [b"", b"{", b"not json", b'{"a": 1,}', b"\xff\xfe\x00", b"[1, 2", b"NaN"]
)
def test_invalid_json(body):
    error = _parse_error(RecordParser(), body)
    assert str(error).startswith("invalid JSON")


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (b"[1, 2]", "a number"),
        (b'[{"id": 1}, "x"]', "a string"),
        (b"[[]]", "a list"),
        (b"null", "null"),
        (b"3", "a number"),
        (b"[2.5]", "a number"),
        (b"[true]", "true or false"),
        (b'"text"', "a string"),
    ],
)
def test_non_dict_records(body, kind):
    """Named as JSON names them: a user wrote JSON, not Python ("a NoneType", "a int")."""
    error = _parse_error(RecordParser(), body)
    assert f"is {kind}, not an object" in str(error)


@pytest.mark.parametrize("depth", [2_000, 100_000])
@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_deeply_nested_json_is_a_parse_error_not_a_crash(depth, opener):
    body = (opener * depth).encode()
    _parse_error(RecordParser(), body)
    closed = (opener * depth + ("]" if opener == "[" else "}") * depth).encode()
    _parse_error(RecordParser(), closed)


# --- custom parser -------------------------------------------------------------------------------
def test_custom_parser_by_dotted_path(tmp_path, monkeypatch):
    module = _module(
        tmp_path,
        monkeypatch,
        """
        def parse(url, body):
            return [{"url": url, "line": line} for line in body.decode().splitlines()]
        """,
    )
    for path in (f"{module}:parse", f"{module}.parse"):
        parser = RecordParser(parser=path)
        assert parser.parse(URL, b"a\nb") == [{"url": URL, "line": "a"}, {"url": URL, "line": "b"}]


def test_custom_parser_with_records_path(tmp_path, monkeypatch):
    module = _module(
        tmp_path, monkeypatch, "def parse(url, body):\n    return {'x': [{'id': 1}]}\n"
    )
    assert RecordParser(parser=f"{module}:parse", records_path="x").parse(URL, b"") == [{"id": 1}]


def test_custom_parser_raising_is_parse_error(tmp_path, monkeypatch):
    module = _module(
        tmp_path,
        monkeypatch,
        """
        def parse(url, body):
            raise ValueError("no table found")
        """,
    )
    error = _parse_error(RecordParser(parser=f"{module}:parse"), b"<html>")
    assert "custom parser failed: ValueError: no table found" in str(error)
    assert isinstance(error.__cause__, ValueError)


def test_custom_parser_recursion_error_is_parse_error(tmp_path, monkeypatch):
    module = _module(
        tmp_path,
        monkeypatch,
        """
        import json
        def parse(url, body):
            return json.loads(body)
        """,
    )
    _parse_error(RecordParser(parser=f"{module}:parse"), b"[" * 100_000 + b"]" * 100_000)


def test_custom_parser_returning_non_dicts(tmp_path, monkeypatch):
    module = _module(tmp_path, monkeypatch, "def parse(url, body):\n    return ['a']\n")
    error = _parse_error(RecordParser(parser=f"{module}:parse"), b"")
    assert "record 0 (counted from 0) of 1 is a string" in str(error)


def test_custom_parser_that_does_not_import():
    with pytest.raises(ConfigError, match=r"record\.parser: cannot import module"):
        RecordParser(parser="no_such_pkg_xyz.parsers:parse")


# --- dotted_get ----------------------------------------------------------------------------------
DOC = {"a": {"b": {"c": 1}}, "items": [{"id": 10}, {"id": 20}], "0": "key zero", "n": None}


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("a.b.c", 1),
        ("a.b", {"c": 1}),
        ("items.0.id", 10),
        ("items.1", {"id": 20}),
        ("items.-1.id", 20),
        ("0", "key zero"),
        ("n", None),
    ],
)
def test_dotted_get_found(path, expected):
    assert dotted_get(DOC, path) == expected


@pytest.mark.parametrize("path", ["x", "a.x", "a.b.c.d", "items.2", "items.id", "n.x", ""])
def test_dotted_get_missing(path):
    with pytest.raises(KeyError):
        dotted_get(DOC, path)
    assert dotted_get(DOC, path, default="dflt") == "dflt"
    assert dotted_get(DOC, path, None) is None


@settings(max_examples=200, deadline=None)
@given(
    path=st.lists(
        st.sampled_from(["a", "b", "c", "items", "0", "1", "-1", "id", "zz"]),
        min_size=1,
        max_size=5,
    )
)
def test_dotted_get_returns_value_or_default(path):
    sentinel = object()
    got = dotted_get(DOC, ".".join(path), sentinel)
    if got is not sentinel:
        # Walking by hand gives the same value.
        current: Any = DOC  # a walk through JSON: a dict, a list or a leaf at each step
        for part in path:
            current = current[part] if isinstance(current, dict) else current[int(part)]
        assert got == current


@pytest.mark.parametrize("path", ["items.--1", "items.²"])
def test_dotted_get_odd_index_is_missing_not_a_crash(path):
    assert dotted_get(DOC, path, None) is None


def test_odd_records_path_is_parse_error():
    _parse_error(RecordParser(records_path="items.--1"), b'{"items": [{"id": 1}]}')


# -- the page is the record: parsing is exact (issue 24) ----------------------------------------

_JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**63 - 2, max_value=2**80)
    | st.integers(min_value=-(2**80), max_value=-(2**63) + 2)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_JSON_VALUES = st.recursive(
    _JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def test_a_big_integer_is_read_as_the_integer_the_page_says() -> None:
    body = b'{"id": 1, "big": 1180591620717411303425, "neg": -1180591620717411303425}'
    [record] = RecordParser().parse(URL, body)
    assert record == {"id": 1, "big": 2**70 + 1, "neg": -(2**70 + 1)}
    assert type(record["big"]) is int


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(), _JSON_VALUES, max_size=6), st.booleans())
def test_parsing_is_the_stdlib_reading_of_the_page(document: dict[str, Any], ascii: bool) -> None:
    """The plain reference: the standard library's reading of the same bytes (exact)."""
    try:
        body = json.dumps(document, ensure_ascii=ascii).encode()
    except UnicodeEncodeError:  # a lone surrogate: a page can only hold it escaped
        body = json.dumps(document).encode()
    [record] = RecordParser().parse(URL, body)
    expected = json.loads(body)
    assert repr(record) == repr(expected)  # types all the way down: 2**70 is no float, -0.0
    assert record == expected


@pytest.mark.parametrize("body", [b"[1e400]", b"[-1e999]", b"[Infinity]", b"[-Infinity]"])
def test_numbers_json_cannot_hold_are_invalid_json(body: bytes) -> None:
    error = _parse_error(RecordParser(), body)
    assert str(error).startswith("invalid JSON")
