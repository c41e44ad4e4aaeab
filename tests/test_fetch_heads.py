"""The engine's one-pass read of a response's headers against ``httpx.Headers.get``, its plain
reference (docs/architecture.md, "Every fast path has its oracle"), on generated header blocks:
the names the engine reads in any case, repeated, among others, with values in every encoding
httpx may pick for the block (ascii, utf-8, latin-1)."""

from __future__ import annotations

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.fetch import conditional
from collector.fetch.engine import _heads

READ = ["content-length", "content-encoding", "content-type", "etag", "last-modified"]
OTHERS = ["server", "date", "x-etag", "content-lengths", "set-cookie", "vary"]


def _case(name: str) -> st.SearchStrategy[str]:
    """``name`` with each letter upper- or lower-cased."""
    return st.lists(st.booleans(), min_size=len(name), max_size=len(name)).map(
        lambda upper: "".join(c.upper() if u else c for c, u in zip(name, upper, strict=True))
    )


_values = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12).map(
        str.encode
    ),
    st.text(alphabet="éü€ß ab\"'/,;", max_size=8).map(lambda t: t.encode("utf-8")),
    st.binary(max_size=8).filter(lambda b: b"\r" not in b and b"\n" not in b),
)
_names = st.sampled_from(READ + OTHERS).flatmap(_case).map(str.encode)
_blocks = st.lists(st.tuples(_names, _values), max_size=12)


@settings(max_examples=400, deadline=None)
@given(_blocks)
def test_the_heads_are_what_headers_get_gives(block: list[tuple[bytes, bytes]]) -> None:
    headers = httpx.Headers(block)
    heads = _heads(headers)
    assert heads.content_length == headers.get("content-length")
    assert heads.content_encoding == headers.get("content-encoding")
    assert heads.content_type == headers.get("content-type", "")
    assert heads.validators == conditional.validators_of(headers)


def test_repeated_and_mixed_case_names_are_joined_as_httpx_joins_them() -> None:
    headers = httpx.Headers(
        [(b"ETag", b'"a"'), (b"Content-Type", b"text/html"), (b"etag", b'W/"b"')]
    )
    heads = _heads(headers)
    assert heads.validators.etag == '"a", W/"b"' == headers.get("etag")
    assert heads.content_type == "text/html" and heads.content_length is None
