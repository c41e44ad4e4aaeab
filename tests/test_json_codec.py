"""collector._json: every value a parser can produce reads back exactly, and encodes stably."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from collector import _json

EDGE = [2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, 2**70, -(2**200)]
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from(EDGE)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


def same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (2**70 == 1.18e21 as a float)."""
    return repr(a) == repr(b) and a == b


@given(JSON)
def test_any_json_value_round_trips_exactly(value: Any) -> None:
    data = _json.dumps(value)
    assert same(_json.loads(data), value)
    assert same(_json.loads(data.decode()), value)  # Postgres and Redis hand back text
    assert same(_json.loads(bytearray(data)), value)
    assert same(_json.loads(memoryview(data)), value)


@given(JSON)
def test_encoding_is_stable_across_a_round_trip(value: Any) -> None:
    """What the digest needs: the bytes of a value read back are the bytes that were written."""
    for sort_keys in (False, True):
        data = _json.dumps(value, sort_keys=sort_keys)
        assert _json.dumps(_json.loads(data), sort_keys=sort_keys) == data


@pytest.mark.parametrize("value", EDGE)
def test_integers_beyond_orjson_are_exact(value: int) -> None:
    data = _json.dumps({"n": value})
    assert data == f'{{"n":{value}}}'.encode()
    got = _json.loads(data)["n"]
    assert type(got) is int and got == value


def test_orjson_alone_would_turn_a_big_integer_into_a_float() -> None:
    """The reason for the codec: if orjson ever reads these exactly, it can take over alone."""
    assert type(orjson.loads(b"1180591620717411303424")) is float
    assert type(orjson.loads(b"-9223372036854775809")) is float


def test_long_digit_runs_in_strings_are_only_a_slower_path() -> None:
    value = {"id": "12345678901234567890123", "x": 0.12345678901234568}
    assert same(_json.loads(_json.dumps(value)), value)


def test_lone_surrogates_and_control_characters() -> None:
    for text in ["\ud800", "a\udfffb", "\u0000", "\u001f\u2028\u2029", "é☃漢字🚀"]:
        assert same(_json.loads(_json.dumps(text)), text)
        assert same(_json.loads(_json.dumps(text).decode("utf-8", "surrogatepass")), text)


def test_values_json_has_no_type_for_become_text_on_both_paths() -> None:
    assert _json.loads(_json.dumps({"d": Decimal("1.10")})) == {"d": "1.10"}
    assert _json.loads(_json.dumps({"big": 2**70, "d": Decimal("1.10")})) == {
        "big": 2**70,
        "d": "1.10",
    }


@pytest.mark.parametrize("bad", [b"", b"{", b"nope", "{'a': 1}", b"\xff", b"[1] 2"])
def test_not_json_is_a_value_error(bad: bytes | str) -> None:
    with pytest.raises(ValueError):
        _json.loads(bad)
    assert issubclass(orjson.JSONDecodeError, json.JSONDecodeError)  # one except clause for both


# -- the codec's two paths against the plain reference, the standard library (issue 24) ---------


@given(JSON, st.booleans())
def test_loads_reads_what_the_stdlib_reads(value: Any, ascii: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii)  # written by the plain reference
    reference = json.loads(text)
    assert same(_json.loads(text), reference)
    try:
        data = text.encode()
    except UnicodeEncodeError:  # a lone surrogate unescaped: only the str form exists
        return
    assert same(_json.loads(data), reference)
    assert same(_json.parse(data), reference)


@given(JSON)
def test_dumps_writes_what_the_stdlib_reads_back(value: Any) -> None:
    assert same(json.loads(_json.dumps(value)), value)
    assert same(
        json.loads(_json.dumps(value, sort_keys=True)),
        json.loads(json.dumps(value, sort_keys=True)),
    )
