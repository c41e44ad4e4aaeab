"""A page's GET built from its origin's prototype: what ``client.build_request`` gives, cheaper.

``httpx.AsyncClient.build_request`` parses and checks the whole URL for every request (the host
validated as an address by ``ipaddress``, every part quoted), merges the client's headers into
a new ``Headers`` and normalises each one, then builds the ``Request`` (content encoding, Host,
cookies): ~13 % of the fetch loop's thread on small pages (py-spy, bench/throughput.py). For a
crawl, everything but the path and query is the same for every page of an origin.

So a :class:`RequestMaker` builds one request per origin (``scheme://authority``) with
``build_request`` itself, and makes each page's request from it: the origin's parsed parts and
the path and query of the page, the prototype's headers list copied, its extensions and empty
body. Only where that is exactly what ``build_request`` would give:

* the rest of the URL is a path and an optional query whose characters httpx leaves as they are
  (printable ASCII outside its percent-encode sets), with no fragment and no ``.`` or ``..``
  segment to remove, within httpx's length limit;
* the request carries no headers of its own (a conditional refetch's validators) and the client
  holds no cookies (they would be merged in), and the client has no base URL or query params.

Anything else is built by ``build_request`` (the plain reference). ``tests/test_fetch_prebuilt.py``
compares the two, attribute by attribute, on generated URLs (docs/architecture.md, "Every fast
path has its oracle"). httpx is pinned (pyproject.toml): the request's attributes are its
0.28 layout, which that test checks.
"""

from __future__ import annotations

import re

import httpx
from httpx._urlparse import MAX_URL_LENGTH, ParseResult

__all__ = ["RequestMaker"]

_ORIGINS_KEPT = 4_096  # prototypes per client (oldest dropped first): a crawl of many hosts

# printable ASCII that httpx's quoting leaves as it is: in the path (not space " # < > ? ` { }),
# in the query (not space " # < >); '%' is left as is in both
_PATH = r"[!$-;=@-_a-z|~]"
_QUERY = r"[!$-;=?-~]"
_REST = re.compile(rf"(/{_PATH}*)(?:\?({_QUERY}*))?")


class RequestMaker:
    """``client``'s GET requests, each as ``client.build_request("GET", url, headers=...)``
    would build it, from per-origin prototypes where that is exact (see the module)."""

    __slots__ = ("_client", "_cookies", "_on", "_origins")

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client
        self._cookies = client.cookies
        # a base URL or client params would be merged into every request: not made here
        self._on = not str(client.base_url) and not client.params
        self._origins: dict[str, tuple[ParseResult, httpx.Request] | None] = {}

    def get(self, url: str, headers: dict[str, str] | None = None) -> httpx.Request:
        """The GET request for ``url`` (with ``headers`` merged over the client's)."""
        if headers is None and self._on and not self._cookies.jar._cookies:  # type: ignore[attr-defined]
            request = self._made(url)
            if request is not None:
                return request
        return self._client.build_request("GET", url, headers=headers)

    def _made(self, url: str) -> httpx.Request | None:
        """The request from its origin's prototype; None when that would not be exact."""
        start = url.find("://")
        if start < 0 or len(url) > MAX_URL_LENGTH:
            return None
        cut = url.find("/", start + 3)
        if cut < 0:
            return None
        origin = url[:cut]
        if "?" in origin or "#" in origin:  # the authority ends before the path: not ours
            return None
        rest = _REST.fullmatch(url, cut)
        if rest is None:
            return None
        path, query = rest.group(1, 2)
        if "." in path and ("/./" in path or "/../" in path or path.endswith(("/.", "/.."))):
            return None  # dot segments: httpx removes them
        try:
            known = self._origins[origin]
        except KeyError:
            known = self._prototype(origin)
        if known is None:
            return None
        parts, prototype = known
        made = httpx.URL.__new__(httpx.URL)
        made._uri_reference = parts._replace(path=path, query=query)
        request = httpx.Request.__new__(httpx.Request)
        request.method = "GET"
        request.url = made
        headers = httpx.Headers.__new__(httpx.Headers)
        headers._list = list(prototype.headers._list)
        headers._encoding = prototype.headers._encoding
        request.headers = headers
        request.extensions = dict(prototype.extensions)
        request.stream = prototype.stream
        request._content = b""
        return request

    def _prototype(self, origin: str) -> tuple[ParseResult, httpx.Request] | None:
        """The origin's request, built by ``build_request`` (None when the origin is not one
        httpx reads as scheme and authority); kept for the origin's next pages."""
        found: tuple[ParseResult, httpx.Request] | None = None
        try:
            prototype = self._client.build_request("GET", origin + "/")
        except (httpx.InvalidURL, httpx.UnsupportedProtocol, ValueError):
            prototype = None
        if prototype is not None:
            parts: ParseResult = prototype.url._uri_reference
            if parts.scheme and parts.path == "/" and parts.query is None and not parts.fragment:
                prototype.headers.encoding  # noqa: B018 - worked out once, kept with the copies
                found = (parts, prototype)
        if len(self._origins) >= _ORIGINS_KEPT:
            del self._origins[next(iter(self._origins))]
        self._origins[origin] = found
        return found
