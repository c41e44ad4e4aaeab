"""A page's declared charset is honoured by the built-in JSON parser (collector.settle.parse):
against a plain reference (decode with the declared codec, then ``json.loads``) on generated
records, and end to end through a real collect flow run against a real local HTTP server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.config import load_source
from collector.deadletter import SqliteDeadLetterStore
from collector.errors import PermanentFetchError
from collector.fetch.engine import FetchEngine
from collector.fetch.transport import TransportKind
from collector.frontier.base import ClaimedItem
from collector.policy.retry import RetryBudget, RetrySettings
from collector.policy.urls import HostPolicy
from collector.settle.parse import RecordParser, declared_charset
from tests.helpers import sink_lines, summary_of, write_source
from tests.servers import serving

CHARSETS = ["iso-8859-1", "cp1252", "utf-16", "utf-8"]


def _reference(body: bytes, content_type: str) -> Any:
    """What the page says, plainly: decoded with the declared charset (UTF-8 when none)."""
    charset = "utf-8"
    for param in content_type.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            charset = value.strip().strip('"')
    return json.loads(body.decode(charset))


def _text(charset: str) -> st.SearchStrategy[str]:
    """Text every one of ``charset``'s codecs can spell, non-ASCII included."""
    if charset != "cp1252":
        return st.text(alphabet=st.characters(codec=charset), max_size=20)
    alphabet = st.sampled_from(  # cp1252's letters beyond latin-1's, and some of latin-1's
        "abc \u00e9\u20ac\u0160\u0153\u0178\u2013\u2014\u201c\u201d\u2018\u2019"
        '\u2026\u00ff\u00c0\u00d7\u00f7\\"\t\n'
    )
    return st.text(alphabet=alphabet, max_size=20)


@st.composite
def _pages(draw: st.DrawFn) -> tuple[list[dict[str, Any]], str]:
    charset = draw(st.sampled_from(CHARSETS))
    text = _text("latin-1" if charset == "iso-8859-1" else charset)
    records = draw(
        st.lists(
            st.fixed_dictionaries({"id": st.integers(-(2**70), 2**70), "name": text}),
            min_size=1, max_size=4,
        )
    )  # fmt: skip
    return records, charset


@settings(max_examples=300, deadline=None)
@given(_pages(), st.sampled_from(["charset={}", 'charset="{}"', "CharSet={}"]), st.booleans())
def test_a_declared_charset_reads_as_the_reference_reads(
    page: tuple[list[dict[str, Any]], str], spelling: str, ascii_escapes: bool
) -> None:
    records, charset = page
    body = json.dumps(records, ensure_ascii=ascii_escapes).encode(charset)
    content_type = f"application/json; {spelling.format(charset)}"
    parsed = RecordParser().parse("http://127.0.0.1/x", body, content_type)
    assert parsed == _reference(body, content_type) == records
    assert [type(r["id"]) for r in parsed] == [int] * len(records)  # big integers stay exact


def test_utf8_takes_the_fast_path_and_a_bom_is_refused_as_before() -> None:
    assert declared_charset("application/json") is None
    assert declared_charset("application/json; charset=UTF-8") is None
    assert declared_charset("application/json; charset=utf8") is None
    assert declared_charset("application/json;charset=latin1") == "latin1"
    parser = RecordParser()
    bom = b'\xef\xbb\xbf{"id": 1}'
    for content_type in ("", "application/json; charset=utf-8"):
        with pytest.raises(PermanentFetchError, match="byte order mark"):
            parser.parse("u", bom, content_type)
        with pytest.raises(PermanentFetchError, match=r"not UTF-8 \(byte 0xff at offset 0\)"):
            parser.parse("u", '{"id": 1}'.encode("utf-16"), content_type)


@pytest.mark.parametrize(
    ("content_type", "body", "said"),
    [
        (
            "application/json; charset=klingon",
            b'{"id": 1}',
            "invalid JSON: the Content-Type declares charset 'klingon', which is not a text"
            " encoding Python knows",
        ),
        (
            "application/json; charset=base64",  # a codec, but not of text
            b'{"id": 1}',
            "invalid JSON: the Content-Type declares charset 'base64', which is not a text"
            " encoding Python knows",
        ),
        (
            "application/json; charset=us-ascii",
            '{"id": 1, "name": "café"}'.encode(),
            "invalid JSON: the body is not us-ascii as its Content-Type declares (byte 0xc3 at"
            " offset 22)",
        ),
        (
            "application/json; charset=iso-8859-1",
            b'{"id": 1,',
            "invalid JSON (read as iso-8859-1, as its Content-Type declares): unexpected end of"
            " data: line 1 column 10 (char 9)",
        ),
    ],
)
def test_a_wrong_declared_charset_is_a_dead_letter_naming_it(
    content_type: str, body: bytes, said: str
) -> None:
    with pytest.raises(PermanentFetchError) as info:
        RecordParser().parse("http://127.0.0.1/x", body, content_type)
    assert str(info.value) == said and info.value.error_class == "parse_error"


# --- end to end: a real server, a real collect flow run ----------------------------------------

PAGES: dict[str, tuple[str, bytes]] = {
    "/latin1.json": (
        "application/json; charset=iso-8859-1",
        '{"id": 1, "name": "café"}'.encode("latin-1"),
    ),
    "/cp1252.json": (
        "application/json; charset=windows-1252",
        '{"id": 2, "name": "\u20ac \u2013 ok"}'.encode("cp1252"),
    ),
    "/utf16.json": ("application/json; charset=utf-16", '{"id": 3, "name": "ß"}'.encode("utf-16")),
    "/utf8.json": ("application/json", '{"id": 4, "name": "naïve"}'.encode()),
    "/undeclared.json": ("application/json", '{"id": 5, "name": "café"}'.encode("latin-1")),
    "/unknown.json": ("application/json; charset=klingon", b'{"id": 6}'),
}


@pytest.fixture
def charset_site() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path not in PAGES:  # robots.txt
                self.send_error(404)
                return
            content_type, body = PAGES[self.path]
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    with serving(Handler) as base_url:
        yield base_url


@pytest.mark.usefixtures("prefect_api")
async def test_a_run_stores_pages_in_their_declared_charsets(
    tmp_path: Path, charset_site: str
) -> None:
    from flows.collect import collect

    path = write_source(tmp_path, seeds={"urls": [charset_site + p for p in PAGES]})
    summary = summary_of(await collect(source=str(path), batch_size=10))
    assert (summary["stored"], summary["dead_lettered"]) == (4, 2)
    names = {row["id"]: row["name"] for row in sink_lines(tmp_path / "out")}
    assert names == {1: "café", 2: "\u20ac \u2013 ok", 3: "ß", 4: "naïve"}
    source = load_source(path)
    store = SqliteDeadLetterStore(source.deadletter_path)
    try:
        said = {e.url.rsplit("/", 1)[1]: e.message for e in store.list(source=source.name)}
    finally:
        store.close()
    assert "not UTF-8 (byte 0xe9 at offset 22)" in said["undeclared.json"]
    assert "charset 'klingon', which is not a text encoding" in said["unknown.json"]


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
async def test_both_pools_carry_the_declared_charset_to_the_parser(
    charset_site: str, transport: TransportKind
) -> None:
    """The engine keeps each response's Content-Type on either HTTP pool (FetchResult)."""
    engine = FetchEngine(
        transport=transport,
        retry=RetrySettings(base_s=0.01, cap_s=0.05, max_attempts=1),
        host_policy=HostPolicy(allow_private_networks=True),
    )
    urls = [charset_site + p for p in ("/latin1.json", "/utf16.json")]
    async with engine:
        results = await engine.fetch_batch(
            [ClaimedItem(u, 0, None, 0.0) for u in urls],
            budget=RetryBudget(ratio=1.0, min_retries=10),
        )
    parser = RecordParser()
    names = [parser.parse(r.url, r.body, r.content_type)[0]["name"] for r in results]
    assert names == ["café", "ß"]
