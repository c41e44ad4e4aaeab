"""A local stdlib HTTP server serving every kind of bad input a source can meet.

Used by the end-to-end dead-letter test (bad records) and by tests/test_hostile_responses.py
(bad answers: a gzip bomb, encoded pages, a dripped body, a redirect loop, a short body, 200 KB
of headers). The 1 GB body is generated while it is sent (64 KiB at a time, never held in
memory), without a Content-Length, so only the fetch engine's streaming size cap can stop it;
the server counts what it managed to send.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

GIB = 1 << 30
_CHUNK = b" " * 65536


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8")


# path -> (status, body); bodies are what a careless or hostile server really sends
PAGES: dict[str, tuple[int, bytes]] = {
    **{
        f"/ok/{n}.json": (200, _json({"id": n, "name": f"item {n}", "price": 10.0 + n}))
        for n in range(5)
    },
    "/malformed.json": (200, b'{"id": 100, "name": "cut off", "price": 1.'),
    "/bad-utf8.json": (200, b'{"id": 107, "name": "\xff\xfe\xfa", "price": 1.0}'),
    "/wrong-types.json": (200, _json({"id": 101, "name": "  Lamp  ", "price": "12.50"})),
    "/nulls.json": (200, _json({"id": 102, "name": None, "price": None})),
    "/duplicates.json": (
        200,
        _json(
            [{"id": 103, "name": "twin", "price": 3.0}, {"id": 103, "name": "twin", "price": 3.0}]
        ),
    ),
    "/huge-field.json": (200, _json({"id": 104, "name": "x" * 200_000, "price": 1.0})),
    "/unicode.json": (
        200,
        _json(
            {
                "id": 105,
                "name": "\u202eevil\u200d\u0000 \u2603 \U0001d518\U0001f680 e\u0301",
                "price": 2.0,
            }
        ),
    ),
    "/missing.json": (404, b"not here"),
    "/flaky.json": (503, b"try later"),
}
HOSTILE = "/hostile-1gb.json"
CAP = 1_000_000  # the max_response_bytes the bomb is meant for
BOMB = gzip.compress(b"\0" * (64 * CAP), compresslevel=9)  # 64 MB of zeros in ~64 KB

PAGE = b'{"id": 1, "name": "' + b"x" * 50_000 + b'"}'
# query name -> (Content-Encoding value, encoder)
_ENCODERS: dict[str, tuple[str, Callable[[bytes], bytes]]] = {
    "gzip": ("gzip", gzip.compress),
    "deflate": ("deflate", zlib.compress),  # the RFC's deflate: zlib-wrapped
    "rawdeflate": ("deflate", lambda b: _raw_deflate(b)),  # what some servers send instead
    "bogus": ("bogus", lambda b: b),  # an encoding nobody knows: the body is as sent
    "corrupt": ("gzip", lambda b: gzip.compress(b)[:10] + b"\x07" * 30),  # a reserved block type
}


def _raw_deflate(body: bytes) -> bytes:
    deflate = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return deflate.compress(body) + deflate.flush()


class HostileSite:
    """``with HostileSite() as site: site.url("/nulls.json")``."""

    def __init__(self) -> None:
        self.hostile_bytes_sent = 0
        self.requests: dict[str, int] = {}
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                site.requests[path] = site.requests.get(path, 0) + 1
                if path == HOSTILE:
                    self._hostile()
                    return
                answer = getattr(self, "_answer_" + path.strip("/"), None)
                if answer is not None:  # an answer that misbehaves, not a bad record
                    answer()
                    return
                status, body = PAGES.get(path, (404, b"no such page"))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _hostile(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()  # no Content-Length: the client must count
                try:
                    self.wfile.write(b"[")
                    while site.hostile_bytes_sent < GIB:
                        self.wfile.write(_CHUNK)
                        site.hostile_bytes_sent += len(_CHUNK)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _answer_bomb(self) -> None:
                """Gzip whose small Content-Length passes: only the decoded size can catch it."""
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(BOMB)))
                self.end_headers()
                self.wfile.write(BOMB)

            def _answer_encoded(self) -> None:
                """/encoded?gzip,deflate: PAGE encoded in that order, the header saying so."""
                names = self.path.split("?", 1)[1].split(",")
                body = PAGE
                for name in names:
                    body = _ENCODERS[name][1](body)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Encoding", ", ".join(_ENCODERS[n][0] for n in names))
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _answer_drip(self) -> None:
                """A byte every 50 ms of a declared 1,000: only a deadline ends it."""
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "1000")
                self.end_headers()
                try:
                    for _ in range(1000):
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        time.sleep(0.05)
                except OSError:
                    pass  # the client gave up, as it should

            def _answer_loop(self) -> None:
                self.send_response(302)
                self.send_header("Location", "/loop")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _answer_short(self) -> None:
                """9 bytes of a declared 100, then the connection closes."""
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "100")
                self.end_headers()
                self.wfile.write(b'{"id": 1}')

            def _answer_headers(self) -> None:
                self.send_response(200)
                for n in range(200):
                    self.send_header(f"X-Padding-{n}", "x" * 1000)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # clients hang up on the drip, the bomb and the 1 GB body: the point

        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        assert isinstance(host, str)  # an AF_INET server's host (bytes only for AF_UNIX)
        return f"http://{host}:{port}"

    def url(self, path: str) -> str:
        return self.base_url + path

    def __enter__(self) -> HostileSite:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
