"""The one JSON codec of every store and sink: orjson's speed, the stdlib's exactness.

Every sink (JSONL, Postgres), both dead-letter stores (SQLite, Redis) and the record digest
(:mod:`collector.sinks._encode`) write and read JSON through :func:`dumps` and :func:`loads`, so a
value reads back as the value that was written whichever backend holds it, and "unchanged" means
the same everywhere.

Why not orjson alone: it refuses to *write* an integer beyond 64 bits, and it silently *reads*
one as a float (``2**70`` comes back as ``1.1805916207174113e+21``), so a reopened JSONL sink
would compute another digest for such a record (a replay would no longer be "unchanged") and a
dead letter's payload would change. Why not the stdlib alone: orjson is several times faster on
the hot paths (every record written, every line of a JSONL segment read at open).

* :func:`dumps` tries orjson and, only when orjson refuses the value (an integer beyond 64 bits,
  a string with a lone surrogate, a key that is not a string), writes it with the stdlib
  instead (ASCII only, so any string encodes). Which encoder runs is a function of the value
  alone, so equal values give equal bytes. Values JSON has no type for become ``str(value)``
  (``default=str``) on both paths.
* :func:`loads` reads with orjson unless the text holds a run of 19 or more digits (the only way
  to spell an integer orjson cannot hold: 2**63 has 19 digits) or orjson refuses it (NaN,
  Infinity and lone surrogates, which the stdlib writes and reads): those go to the stdlib, which
  is exact. The check is a bytes.translate and a substring search (``bench/json_codec.py``).

* :func:`parse` reads a fetched page (:mod:`collector.settle.parse`) the same way, so that the
  record is exactly the page's value from the first step on (a big integer never becomes a
  float), but only accepts JSON: NaN, Infinity, numbers beyond a double's range,
  invalid UTF-8 and a byte order mark are refused, as orjson refuses them.

NaN and infinities written by orjson become ``null`` (orjson's choice); :func:`parse` never
produces them, because JSON has no literal for them.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

__all__ = ["JSONDecodeError", "dumps", "loads", "parse"]

JSONDecodeError = json.JSONDecodeError  # orjson.JSONDecodeError derives from it

_SORTED = orjson.OPT_SORT_KEYS
# Every integer outside orjson's range (-2**63 .. 2**64 - 1) has at least 19 digits in a row.
# Long digit runs in strings or float mantissas are found too; they only take the exact path.
# Mapping digits to "0" and searching for 19 of them is ~4x cheaper than a regex scan.
_DIGITS_AS_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_DIGITS = b"0" * 19


def dumps(value: Any, *, sort_keys: bool = False) -> bytes:
    """Compact JSON bytes of ``value``; ``sort_keys`` for a canonical form (digests)."""
    try:
        return orjson.dumps(value, default=str, option=_SORTED if sort_keys else None)
    except orjson.JSONEncodeError:
        return json.dumps(value, default=str, sort_keys=sort_keys, separators=(",", ":")).encode()


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """The value ``data`` spells, exactly (big integers stay integers); ValueError if not JSON."""
    if type(data) is not bytes:
        if isinstance(data, str):
            # "surrogatepass": any str encodes; orjson then refuses a lone surrogate and the
            # stdlib reads it from the original text
            raw = data.encode("utf-8", "surrogatepass")
            if _LONG_DIGITS not in raw.translate(_DIGITS_AS_ZERO):
                try:
                    return orjson.loads(raw)
                except orjson.JSONDecodeError:
                    pass
            return json.loads(data)
        data = bytes(data)
    if _LONG_DIGITS not in data.translate(_DIGITS_AS_ZERO):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)


def _not_json(literal: str) -> Any:
    raise ValueError(f"{literal} is not JSON")


def _finite(text: str) -> float:
    number = float(text)
    if number in (_INF, -_INF):
        raise ValueError(f"number {text[:40]} is beyond a double's range")
    return number


_INF = float("inf")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def parse(body: bytes) -> Any:
    """The JSON value a fetched page spells, exactly; ValueError (one line) if it is not JSON.

    orjson where it is exact (no run of 19 digits), the stdlib otherwise and for the one thing
    orjson refuses but JSON allows (an escaped lone surrogate). What orjson refuses for another
    reason is reported with orjson's message, as before; the stdlib's nesting limit (about 1,000
    levels, orjson's is 1,024) is reported as a ValueError too, not a RecursionError.
    """
    if _LONG_DIGITS not in body.translate(_DIGITS_AS_ZERO):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            if _SURROGATE_ESCAPE.search(body) is None:
                raise
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_not_json, parse_float=_finite)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
