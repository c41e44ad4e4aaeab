"""Turn a response body into records, and find each record's key.

The built-in parser reads JSON exactly (:func:`collector._json.parse`: a big integer stays that
integer) (a document, or a list of documents) and optionally descends a
dotted ``records_path`` (``data.items``) to the list of records. A source may name its own
parser instead (``record.parser: mypkg.parsers:parse_listing``), called as
``parser(url, body) -> list[dict]`` with the body's bytes as sent (its charset is its own
business); whatever it raises becomes a permanent ``parse_error``.

JSON is UTF-8 (RFC 8259), yet real sites send latin-1 or cp1252 and say so in
``Content-Type: application/json; charset=iso-8859-1``. The built-in parser honours a declared
charset: the body is decoded with it, strictly, and the text read as JSON exactly as a UTF-8 page
is. A page with no charset, or one declaring UTF-8, takes the fast path (the bytes straight to
the JSON reader, no copy), so a UTF-8 byte order mark or an undeclared UTF-16 page is refused as
before. A declared charset Python has no codec for, or bytes it cannot decode, is a
``parse_error`` naming the charset (and the byte), never a crash nor a silent guess.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from collector import _json
from collector._hooks import resolve_callable
from collector.errors import PermanentFetchError

__all__ = ["RecordParser", "declared_charset", "dotted_get"]

_MISSING = object()
# What a JSON value that is not a record is, in the words of JSON (not Python's type names).
_JSON_KIND: dict[type, str] = {
    int: "a number", float: "a number", str: "a string", list: "a list", bool: "true or false",
    type(None): "null",
}  # fmt: skip
_INDEX = re.compile(r"-?[0-9]+")


def dotted_get(document: Any, path: str, default: Any = _MISSING) -> Any:
    """``dotted_get({"a": {"b": 1}}, "a.b") == 1``; list indices are allowed (``items.0``)."""
    current = document
    for part in path.split("."):
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and _INDEX.fullmatch(part):
            try:
                current = current[int(part)]
            except IndexError:
                current = _MISSING
        else:
            current = _MISSING
        if current is _MISSING:
            if default is _MISSING:
                raise KeyError(path)
            return default
    return current


class RecordParser:
    """Parse bodies of one source into lists of records."""

    def __init__(self, *, parser: str = "json", records_path: str | None = None) -> None:
        self.records_path = records_path
        self._custom: Callable[[str, bytes], Any] | None = (
            None if parser == "json" else resolve_callable(parser, field="record.parser")
        )

    def parse(self, url: str, body: bytes, content_type: str = "") -> list[dict[str, Any]]:
        """The records of one page; ``content_type`` is its ``Content-Type`` header (its
        ``charset`` decides how the built-in parser reads the bytes)."""
        if self._custom is not None:
            try:
                parsed = self._custom(url, body)
            except Exception as exc:
                raise PermanentFetchError(
                    f"custom parser failed: {type(exc).__name__}: {exc}",
                    error_class="parse_error",
                    stage="parse",
                ) from exc
        elif (charset := declared_charset(content_type)) is not None:
            parsed = _parse_declared(body, charset)
        else:
            try:
                parsed = _json.parse(body)
            except ValueError as exc:
                markup = _markup_hint(body)  # said first: an HTML page is not JSON in any charset
                raise PermanentFetchError(
                    f"invalid JSON{markup}: {(not markup and _not_utf8(body)) or exc}",
                    error_class="parse_error",
                    stage="parse",
                ) from exc
        if self.records_path:
            try:
                parsed = dotted_get(parsed, self.records_path)
            except KeyError:
                raise PermanentFetchError(
                    f"record.records_path {self.records_path!r} not found in the document",
                    error_class="parse_error",
                    stage="parse",
                ) from None
        records = parsed if isinstance(parsed, list) else [parsed]
        for index, record in enumerate(records):
            if not isinstance(record, dict):
                where = (  # "record 2" read as the second to a person counting from 1
                    f"record {index} (counted from 0) of {len(records)}"
                    if isinstance(parsed, list)
                    else "the document"
                )
                raise PermanentFetchError(
                    f"{where} is {_JSON_KIND.get(type(record), 'a value')}, not an object",
                    error_class="parse_error",
                    stage="parse",
                )
        return records


def declared_charset(content_type: str) -> str | None:
    """The charset a ``Content-Type`` declares, when it is not UTF-8 (None: read as UTF-8)."""
    if "charset" not in content_type.lower():  # the common case: one scan, no split
        return None
    for param in content_type.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            charset = value.strip().strip("'\"").strip()
            return None if not charset or _is_utf8(charset) else charset
    return None


@lru_cache(maxsize=64)
def _is_utf8(charset: str) -> bool:
    try:
        return codecs.lookup(charset).name == "utf-8"
    except LookupError:
        return False  # said by _parse_declared, where the page is known


def _parse_declared(body: bytes, charset: str) -> Any:
    """The JSON value of a page in a declared charset other than UTF-8: decoded with it, then
    read by the same exact reader as a UTF-8 page (a big integer stays that integer)."""
    try:
        text = body.decode(charset)
    except UnicodeDecodeError as exc:
        raise PermanentFetchError(
            f"invalid JSON: the body is not {charset} as its Content-Type declares (byte"
            f" 0x{body[exc.start]:02x} at offset {exc.start})",
            error_class="parse_error",
            stage="parse",
        ) from exc
    except (LookupError, ValueError) as exc:  # no such codec, or not a text encoding (base64)
        raise PermanentFetchError(
            f"invalid JSON: the Content-Type declares charset {charset[:60]!r}, which is not a"
            " text encoding Python knows",
            error_class="parse_error",
            stage="parse",
        ) from exc
    try:
        return _json.parse(text.encode("utf-8", "surrogatepass"))
    except ValueError as exc:
        markup = _markup_hint(body)
        raise PermanentFetchError(
            f"invalid JSON{markup} (read as {charset}, as its Content-Type declares): {exc}",
            error_class="parse_error",
            stage="parse",
        ) from exc


def _markup_hint(body: bytes) -> str:
    """A page of HTML or XML where JSON was expected (a login page, an error page, the site's
    front end instead of its API) is said as such: "unexpected character" alone hides it."""
    if body.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] == b"<":
        return " (the body starts with '<': an HTML or XML page, not JSON)"
    return ""


def _not_utf8(body: bytes) -> str | None:
    """Where a body stops being UTF-8 (None: it is UTF-8), said instead of orjson's "str is not
    valid UTF-8: surrogates not allowed: line 1 column 1 (char 0)", which names neither the byte
    nor where it is. JSON is UTF-8 (RFC 8259); a page in another charset (latin-1 and the like)
    must declare it, or needs a ``record.parser`` that decodes it."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (
            f"the body is not UTF-8 (byte 0x{body[exc.start]:02x} at offset {exc.start}); JSON "
            "is UTF-8: a page in another charset must declare it (Content-Type: ...; charset=)"
            " or needs a record.parser that decodes it"
        )
    return None
