"""A local HTTP site whose pages change, with the validator behaviours servers really have.

``/p/<name>`` serves ``pages[name]`` (JSON bytes the test sets and changes). Per page, ``modes``
picks how it answers conditional requests:

* ``strong`` (default): ``ETag: "<sha1 of the body>"`` and a ``Last-Modified`` that moves when
  the body changes; 304 when ``If-None-Match`` matches (else when ``If-Modified-Since`` is not
  older than the page);
* ``weak``: the same with ``W/"..."`` tags, compared weakly (RFC 9110 13.1.2);
* ``date``: only ``Last-Modified`` (no ETag);
* ``ignore``: sends validators but answers 200 to every request, conditional or not;
* ``lie``: 304 to any ``If-None-Match`` at all, whatever the page is now (a broken cache);
* ``none``: no validators.

Every request is logged as (path, its If-None-Match, its If-Modified-Since, status) in ``log``.
Real sockets, stdlib threads.
"""

from __future__ import annotations

import hashlib
import threading
from datetime import UTC, datetime
from email.utils import format_datetime, parsedate_to_datetime
from http.server import BaseHTTPRequestHandler

from tests.servers import ThreadedSite

_START = 1_780_000_000.0  # the first page time; every change moves it on by a minute


class ChangeSite(ThreadedSite):
    """``with ChangeSite() as site: site.set("a", b'{"id": 1}'); site.url("a")``."""

    def __init__(self) -> None:
        super().__init__()
        self.pages: dict[str, bytes] = {}
        self.modes: dict[str, str] = {}
        self.changed_at: dict[str, float] = {}
        self.log: list[tuple[str, str | None, str | None, int]] = []
        self._clock = _START
        self._lock = threading.Lock()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/p/{name}"

    def set(self, name: str, body: bytes, mode: str | None = None) -> None:
        """Create or change a page (its Last-Modified moves on only when the body changes)."""
        with self._lock:
            if self.pages.get(name) != body:
                self._clock += 60
                self.changed_at[name] = self._clock
            self.pages[name] = body
            if mode is not None:
                self.modes[name] = mode

    def statuses(self) -> list[int]:
        return [status for *_, status in self.log]

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        name = handler.path.removeprefix("/p/")
        match_tag = handler.headers.get("If-None-Match")
        since = handler.headers.get("If-Modified-Since")
        with self._lock:
            body = self.pages.get(name)
            mode = self.modes.get(name, "strong")
            changed = self.changed_at.get(name, _START)
        if body is None:
            self._send(handler, name, match_tag, since, 404, b"{}", {})
            return
        tag = '"' + hashlib.sha1(body).hexdigest()[:16] + '"'
        if mode == "weak":
            tag = "W/" + tag
        modified = format_datetime(datetime.fromtimestamp(changed, UTC), usegmt=True)
        headers = {"ETag": tag, "Last-Modified": modified}
        if mode == "date":
            del headers["ETag"]
        elif mode == "none":
            headers = {}
        status = 200
        if mode == "lie" and match_tag:
            status = 304
        elif mode in ("strong", "weak", "date"):
            if match_tag is not None and "ETag" in headers:
                sent = {t.strip().removeprefix("W/") for t in match_tag.split(",")}
                if tag.removeprefix("W/") in sent:
                    status = 304
            elif since is not None and match_tag is None:
                try:
                    if parsedate_to_datetime(since).timestamp() >= changed:
                        status = 304
                except (TypeError, ValueError):
                    pass
        self._send(handler, name, match_tag, since, status, b"" if status == 304 else body, headers)

    def _send(
        self,
        handler: BaseHTTPRequestHandler,
        name: str,
        match_tag: str | None,
        since: str | None,
        status: int,
        body: bytes,
        headers: dict[str, str],
    ) -> None:
        with self._lock:
            self.log.append((name, match_tag, since, status))
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, value)
        if status != 304:
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if body:
            handler.wfile.write(body)
