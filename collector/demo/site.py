"""A stdlib-only local HTTP server with deliberate, configurable faults.

Start it in-process (it binds a free port and serves from a daemon thread in milliseconds)::

    with FaultSite() as site:
        httpx.get(site.url("/items/5.json?status=503&times=2&retry_after=1"))

or from a shell: ``python -m collector.demo.site --port 8000``.

Routes (GET; HEAD is the same without a body):

``/items/{i}.json``
    200 JSON, a deterministic record (:func:`record`).
``/items?start=0&count=10``
    200 JSON ``{"items": [record(i) for i in range(start, start + count)]}``; ``count`` <= 1000.
``/__stats``
    ``{"requests": <number of logged requests>}``; not logged itself.
anything else
    404 JSON ``{"error": "not found"}``.

Fault knobs, query parameters on any item URL (combinable). Each distinct path+query string has
its own request counter, so each URL has its own fault history:

``status=CODE``     answer CODE (200..599) with a small JSON error body while the fault applies.
``times=N``         the fault applies to the first N requests to this exact URL; -1 means always.
                    Default: 1 for ``status``; always for the other knobs.
``retry_after=S``   with a fault status, add ``Retry-After: S`` (seconds, sent as given).
``delay=S``         sleep S seconds (float) before answering: every time, or only while the fault
                    applies if ``times`` is given.
``malformed=1``     200 with a truncated JSON body (``{"id": 5, "name": "item 5", "pri``).
``invalid=1``       200 with a record that breaks the schema: ``price`` -1, ``name`` null.
``bytes=N``         200 with a valid record padded by a ``"blob"`` field to about N bytes,
                    streamed in chunks with a correct Content-Length (N up to 1e9 is fine).
``redirect=PATH``   302 with ``Location: PATH`` (URL-decoded).

Precedence when several apply: ``delay`` first, then ``status``, ``redirect``, ``malformed``, then
the record (``invalid`` and ``bytes`` combine). ``status``, ``times``, ``retry_after``, ``delay``,
``redirect`` and ``malformed`` also work on the ``/items`` listing. A bad knob value answers 400.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["FaultSite", "RequestRecord", "record", "serve_forever_cli"]

CATEGORIES = ("books", "tools", "games", "food")
UPDATED = "2026-01-01T00:00:00Z"
LISTING_DEFAULT_COUNT = 10  # items per /items page when ?count= is absent
LISTING_MAX_COUNT = 1000  # larger ?count= values are clamped to this
MAX_DELAY_S = 600.0  # ?delay= is clamped to this many seconds
STREAM_CHUNK_BYTES = 256 * 1024  # ?bytes= bodies are written in chunks of this size
WRITE_BUFFER_BYTES = 64 * 1024  # headers and small bodies leave in one send
REQUEST_QUEUE_SIZE = 128  # listen() backlog
IDLE_TIMEOUT_S = 60.0  # a keep-alive connection idle this long is closed
POLL_INTERVAL_S = 0.05  # how quickly stop() is noticed by the serving thread
DEFAULT_CLI_PORT = 8000

_ITEM_PATH = re.compile(r"^/items/(\d+)\.json$")
_FAULT_KNOBS = frozenset(
    {"status", "times", "retry_after", "delay", "malformed", "invalid", "bytes", "redirect"}
)
_DISCONNECTS = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)


def record(i: int) -> dict[str, Any]:
    """The deterministic record served at ``/items/{i}.json``."""
    return {
        "id": i,
        "name": f"item {i}",
        "price": round(1 + (i * 37 % 1000) / 10, 2),
        "category": CATEGORIES[i % 4],
        "updated": UPDATED,
    }


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One logged request: what was asked, what was answered, when and by whom."""

    method: str
    path: str  # includes the query string
    status: int
    at: float  # time.time() when the response status was sent
    peer: str  # "ip:port" of the client connection


class _BadParameter(ValueError):
    pass


class _State:
    """The request log and per-URL fault counters, behind one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.log: list[RequestRecord] = []
        self.counters: dict[str, int] = {}

    def next_index(self, key: str) -> int:
        """How many requests this exact URL has seen before this one."""
        with self.lock:
            n = self.counters.get(key, 0)
            self.counters[key] = n + 1
            return n

    def append(self, rec: RequestRecord) -> None:
        with self.lock:
            self.log.append(rec)

    def total(self) -> int:
        with self.lock:
            return len(self.log)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = REQUEST_QUEUE_SIZE

    def __init__(self, address: tuple[str, int], state: _State) -> None:
        self.state = state
        self.conn_lock = threading.Lock()
        self.connections: set[socket.socket] = set()
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], _DISCONNECTS):
            return  # the client went away; nothing to report
        super().handle_error(request, client_address)

    def close_connections(self) -> None:
        with self.conn_lock:
            conns = list(self.connections)
            self.connections.clear()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


def _first(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


def _number(query: dict[str, list[str]], name: str, kind: type[int] | type[float]) -> Any:
    raw = _first(query, name)
    if raw is None:
        return None
    try:
        value = kind(raw)
    except ValueError:
        raise _BadParameter(f"{name}={raw!r} is not a valid {kind.__name__}") from None
    if kind is float and value != value:  # NaN
        raise _BadParameter(f"{name}={raw!r} is not a valid float")
    return value


def _flag(query: dict[str, list[str]], name: str) -> bool:
    raw = _first(query, name)
    return raw is not None and raw.lower() not in ("", "0", "false", "no")


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "CollectorFaultSite/1"
    sys_version = ""
    disable_nagle_algorithm = True
    wbufsize = WRITE_BUFFER_BYTES
    timeout = IDLE_TIMEOUT_S

    # -- connection bookkeeping, so stop() can close keep-alive connections -------------------

    def setup(self) -> None:
        super().setup()
        with self.server.conn_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.conn_lock:
            self.server.connections.discard(self.connection)
        with contextlib.suppress(*_DISCONNECTS):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the request log is FaultSite.requests

    # -- methods ---------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch(head=False)

    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    def do_POST(self) -> None:
        self._drain_body()
        body = {"error": "method not allowed"}
        self._send_json(405, body, head=False, extra={"Allow": "GET, HEAD"})

    do_PUT = do_POST
    do_PATCH = do_POST
    do_DELETE = do_POST

    def _drain_body(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        while length > 0:
            chunk = self.rfile.read(min(length, STREAM_CHUNK_BYTES))
            if not chunk:
                break
            length -= len(chunk)

    def _dispatch(self, *, head: bool) -> None:
        try:
            self._route(head=head)
        except _DISCONNECTS:
            self.close_connection = True

    # -- routing ---------------------------------------------------------------------------------

    def _route(self, *, head: bool) -> None:
        parts = urlsplit(self.path)
        path = parts.path
        if path == "/__stats":
            self._send_json(200, {"requests": self.server.state.total()}, head=head, log=False)
            return
        match = _ITEM_PATH.match(path)
        if match is None and path != "/items":
            self._send_json(404, {"error": "not found"}, head=head)
            return
        query = parse_qs(parts.query, keep_blank_values=True)
        try:
            self._serve(int(match.group(1)) if match else None, query, head=head)
        except _BadParameter as exc:
            self._send_json(400, {"error": str(exc)}, head=head)

    def _serve(self, item: int | None, query: dict[str, list[str]], *, head: bool) -> None:
        status = _number(query, "status", int)
        if status is not None and not 200 <= status <= 599:
            raise _BadParameter(f"status={status} is outside 200..599")
        times = _number(query, "times", int)
        retry_after = _first(query, "retry_after")
        if retry_after is not None:
            _number(query, "retry_after", float)  # validate; sent as given
        delay = _number(query, "delay", float)
        size = _number(query, "bytes", int)
        redirect = _first(query, "redirect")
        malformed = _flag(query, "malformed")
        invalid = _flag(query, "invalid")

        # Which faults apply to this request, from this URL's own history.
        knobs = _FAULT_KNOBS.intersection(query)
        n = self.server.state.next_index(self.path) if knobs else 0
        within = times is None or times < 0 or n < times
        status_on = status is not None and (within if times is not None else n < 1)

        if delay is not None and delay > 0 and within:
            time.sleep(min(delay, MAX_DELAY_S))

        if status_on and status is not None:
            extra = {"Retry-After": retry_after} if retry_after is not None else {}
            body = {"error": "injected fault", "status": status}
            self._send_json(status, body, head=head, extra=extra)
            return
        if redirect is not None and within:
            body = {"redirect": redirect}
            self._send_json(302, body, head=head, extra={"Location": redirect})
            return

        payload: dict[str, Any]
        if item is None:
            start = _number(query, "start", int) or 0
            count = _number(query, "count", int)
            if count is None:
                count = LISTING_DEFAULT_COUNT
            count = max(0, min(count, LISTING_MAX_COUNT))
            payload = {"items": [record(i) for i in range(start, start + count)]}
        else:
            payload = record(item)
            if invalid and within:
                payload["price"] = -1
                payload["name"] = None

        if malformed and within:
            text = json.dumps(payload)
            cut = text.find('"pri')
            cut = cut + 4 if cut >= 0 else len(text) // 2
            self._send(200, text[:cut].encode(), "application/json", head=head)
            return
        if item is not None and size is not None and within:
            self._send_padded(payload, size, head=head)
            return
        self._send_json(200, payload, head=head)

    # -- responses -------------------------------------------------------------------------------

    def _log(self, status: int) -> None:
        host, port = self.client_address[:2]
        rec = RequestRecord(self.command, self.path, status, time.time(), f"{host}:{port}")
        self.server.state.append(rec)

    def _start(self, status: int, content_type: str, length: int, extra: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(length))
        for name, value in extra.items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str,
        *,
        head: bool,
        extra: dict[str, str] | None = None,
        log: bool = True,
    ) -> None:
        if log:
            self._log(status)
        self._start(status, content_type, len(body), extra or {})
        if not head:
            self.wfile.write(body)

    def _send_json(
        self,
        status: int,
        payload: dict[str, Any],
        *,
        head: bool,
        extra: dict[str, str] | None = None,
        log: bool = True,
    ) -> None:
        body = json.dumps(payload).encode()
        self._send(status, body, "application/json", head=head, extra=extra, log=log)

    def _send_padded(self, payload: dict[str, Any], size: int, *, head: bool) -> None:
        """A valid JSON record whose ``"blob"`` field pads the body to about ``size`` bytes."""
        prefix = (json.dumps(payload)[:-1] + ', "blob": "').encode()
        suffix = b'"}'
        pad = max(0, size - len(prefix) - len(suffix))
        self._log(200)
        self._start(200, "application/json", len(prefix) + pad + len(suffix), {})
        if head:
            return
        self.wfile.write(prefix)
        chunk = memoryview(b"x" * min(pad, STREAM_CHUNK_BYTES))
        while pad > 0:
            step = min(pad, len(chunk))
            self.wfile.write(chunk[:step])
            pad -= step
        self.wfile.write(suffix)


class FaultSite:
    """Context manager; binds 127.0.0.1 on a free port (port=0) unless a port is given."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._host = host
        self._port = port
        self._state = _State()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> FaultSite:
        """Bind and serve in a background daemon thread; returns self."""
        if self._server is not None:
            raise RuntimeError("FaultSite is already running")
        server = _Server((self._host, self._port), self._state)
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": POLL_INTERVAL_S},
            name=f"FaultSite:{server.server_address[1]}",
            daemon=True,
        )
        self._server, self._thread = server, thread
        thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close the listening socket and any open keep-alive connections."""
        server, thread = self._server, self._thread
        if server is None:
            return
        self._server = self._thread = None
        server.shutdown()
        server.close_connections()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> FaultSite:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the running site."""
        if self._server is None:
            raise RuntimeError("FaultSite is not running; call start() first")
        host, port = self._server.server_address[:2]
        if isinstance(host, bytes):
            host = host.decode()
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}"

    def url(self, path: str) -> str:
        """``base_url + path``."""
        return self.base_url + path

    @property
    def requests(self) -> list[RequestRecord]:
        """A copy of the request log, oldest first."""
        with self._state.lock:
            return list(self._state.log)

    def request_count(self, path_prefix: str = "") -> int:
        """How many logged requests have a path (with query) starting with ``path_prefix``."""
        with self._state.lock:
            return sum(1 for r in self._state.log if r.path.startswith(path_prefix))

    def reset(self) -> None:
        """Clear the request log and every per-URL fault counter."""
        with self._state.lock:
            self._state.log.clear()
            self._state.counters.clear()


def serve_forever_cli(argv: list[str] | None = None) -> int:
    """``python -m collector.demo.site --port 8000``: serve until Ctrl-C."""
    parser = argparse.ArgumentParser(
        prog="python -m collector.demo.site",
        description="Serve the Collector demo site (with deliberate faults) until Ctrl-C.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_CLI_PORT, help="port to bind; 0 picks a free one"
    )
    args = parser.parse_args(argv)
    site = FaultSite(args.host, args.port)
    try:
        site.start()
    except OSError as exc:
        print(f"cannot bind {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    print(site.base_url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        site.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(serve_forever_cli())
