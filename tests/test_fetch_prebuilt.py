"""Requests made from per-origin prototypes (``collector.fetch.prebuilt.RequestMaker``) against
``client.build_request``, their plain reference (docs/architecture.md, "Every fast path has its
oracle"): attribute by attribute, on generated URLs (schemes, hosts of every kind, user info,
ports, paths and queries with every printable character and some that are not, dot segments,
fragments), with and without a request's own headers, with and without cookies held."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.fetch.prebuilt import RequestMaker

_SCHEMES = ["http", "https", "HTTP", "Https", "ftp", "ws", "", "h_t", "1http"]
_HOSTS = [
    "127.0.0.1", "10.0.0.7", "999.1.1.1", "example.com", "EXAMPLE.com", "[::1]", "[fe80::1]",
    "[zz]", "xn--bcher-kva.example", "bücher.de", "a b", "", "host?x", "host#y", "h%41",
]  # fmt: skip
_PORTS = ["", ":80", ":443", ":8080", ":", ":x", ":0080"]
_USERS = ["", "u@", "u:p@", "u%20x@", "@"]
_PIECES = ["/", "/.", "/..", "./", "../", "?", "#", "%", "%2F", "%zz", "//", ";", "é", "\t", " "]
_rest = st.lists(
    st.one_of(
        st.sampled_from(_PIECES),
        st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=6),
        st.text(max_size=3),
    ),
    max_size=8,
).map("".join)
_urls = st.builds(
    lambda scheme, sep, user, host, port, rest: f"{scheme}{sep}{user}{host}{port}{rest}",
    st.sampled_from(_SCHEMES),
    st.sampled_from(["://", ":/", "//", ""]),
    st.sampled_from(_USERS),
    st.sampled_from(_HOSTS),
    st.sampled_from(_PORTS),
    st.one_of(_rest, _rest.map(lambda r: "/" + r)),
)
# mostly well-formed ones: the fast path's own ground, with every character it may pass on
_segment = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=8).filter(
    lambda t: "#" not in t
)
_plausible = st.builds(
    lambda scheme, user, host, port, segments, query: (
        f"{scheme}://{user}{host}{port}/{'/'.join(segments)}{query}"
    ),
    st.sampled_from(["http", "https", "HTTP"]),
    st.sampled_from(["", "", "u:p@"]),
    st.sampled_from(["127.0.0.1", "example.com", "EXAMPLE.com", "[::1]", "bücher.de"]),
    st.sampled_from(["", ":8080", ":80", ":443"]),
    st.lists(st.one_of(_segment, st.sampled_from([".", "..", "a.json", "", "%41"])), max_size=4),
    st.one_of(st.just(""), _segment.map(lambda q: "?" + q), st.just("?")),
)
_any_url = st.one_of(_plausible, _urls)
_headers = st.one_of(
    st.none(),
    st.just({"If-None-Match": '"abc"'}),
    st.just({"If-Modified-Since": "Sat, 05 Dec 2026 10:00:00 GMT", "user-agent": "other"}),
)


def _client(**options: Any) -> httpx.AsyncClient:
    """A client shaped as the engine's (collector.fetch.transport.make_clients), unopened."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(5.0),
        headers={"User-Agent": "collector-test/1", "Accept-Encoding": "gzip, deflate"},
        follow_redirects=True,
        trust_env=False,
        **options,
    )


def _built(build: Any, *args: Any, **kwargs: Any) -> httpx.Request | type[Exception]:
    try:
        request: httpx.Request = build(*args, **kwargs)
    except Exception as exc:  # the reference's refusal must be the fast path's too
        return type(exc)
    return request


def _same(made: httpx.Request | type[Exception], plain: httpx.Request | type[Exception]) -> None:
    if not isinstance(plain, httpx.Request) or not isinstance(made, httpx.Request):
        assert made == plain
        return
    assert made.headers.encoding == plain.headers.encoding  # worked out (and kept) on both
    assert set(vars(made)) == set(vars(plain))
    assert vars(made.url).keys() == vars(plain.url).keys()
    assert made.url._uri_reference == plain.url._uri_reference
    assert str(made.url) == str(plain.url) and made.url == plain.url
    assert made.method == plain.method
    assert made.headers.raw == plain.headers.raw
    assert vars(made.headers) == vars(plain.headers)
    assert made.extensions == plain.extensions
    assert type(made.stream) is type(plain.stream) and list(made.stream) == list(plain.stream)  # type: ignore[arg-type]
    assert made.content == plain.content


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(_any_url, _headers), min_size=1, max_size=6))
def test_made_requests_are_what_build_request_builds(pages: list[tuple[str, Any]]) -> None:
    client = _client()
    maker = RequestMaker(client)
    for url, headers in pages:  # several pages: the origin's prototype is made, then reused
        plain = _built(client.build_request, "GET", url, headers=headers)
        _same(_built(maker.get, url, headers), plain)


@settings(max_examples=100, deadline=None)
@given(_any_url)
def test_with_cookies_held_the_reference_builds_them(url: str) -> None:
    client = _client()
    maker = RequestMaker(client)
    _built(maker.get, "http://127.0.0.1:8080/warm")  # a prototype exists for this one
    client.cookies.set("session", "s1", domain="127.0.0.1")
    client.cookies.set("other", "o2", domain="example.com")
    for page in (url, "http://127.0.0.1:8080/items/1.json"):
        plain = _built(client.build_request, "GET", page)
        _same(_built(maker.get, page), plain)


@pytest.mark.parametrize(
    "options", [{"base_url": "http://127.0.0.1:9/base/"}, {"params": {"q": "1"}}]
)
def test_a_client_with_a_base_url_or_params_is_left_to_the_reference(
    options: dict[str, Any],
) -> None:
    client = _client(**options)
    maker = RequestMaker(client)
    for url in ("http://127.0.0.1:8080/items/1.json", "/items/2.json?x=1"):
        _same(_built(maker.get, url), _built(client.build_request, "GET", url))


def test_the_pages_of_one_origin_share_its_prototype_and_nothing_else() -> None:
    client = _client()
    maker = RequestMaker(client)
    first = maker.get("http://127.0.0.1:8080/items/1.json")
    second = maker.get("http://127.0.0.1:8080/items/2.json?x=1")
    assert first.headers is not second.headers and first.headers.raw == second.headers.raw
    first.headers["X-Mine"] = "1"  # a request's own headers stay its own
    assert "X-Mine" not in second.headers
    assert str(second.url) == "http://127.0.0.1:8080/items/2.json?x=1"
