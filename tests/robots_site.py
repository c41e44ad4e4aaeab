"""A local site with a robots.txt the test sets and changes.

``/robots.txt`` answers ``robots = (status, body)``; ``/p/<anything>`` answers
``{"id": "<anything>"}``. Every request is logged as (monotonic time, path, User-Agent, status)
in ``log``. Real sockets, stdlib threads.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler

from tests.servers import ThreadedSite


class RobotsSite(ThreadedSite):
    """``with RobotsSite() as site: site.robots = (200, "User-agent: *\\nDisallow: /p/x")``"""

    def __init__(self) -> None:
        super().__init__()
        self.robots: tuple[int, str] = (404, "no robots here")
        self.log: list[tuple[float, str, str, int]] = []
        self._lock = threading.Lock()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def paths(self, prefix: str = "") -> list[str]:
        return [path for _, path, _, _ in self.log if path.startswith(prefix)]

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        path = handler.path
        if path == "/robots.txt":
            status, text = self.robots
            body, kind = text.encode(), "text/plain"
        elif path.startswith("/p/"):
            status, kind = 200, "application/json"
            body = json.dumps({"id": path.removeprefix("/p/")}).encode()
        else:
            status, body, kind = 404, b"{}", "application/json"
        with self._lock:
            agent = handler.headers.get("User-Agent", "")
            self.log.append((time.monotonic(), path, agent, status))
        handler.send_response(status)
        handler.send_header("Content-Type", kind)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
