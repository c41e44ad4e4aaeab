"""Relays in front of real servers: a Redis that dies on cue, a store that answers slowly, and
a server that can be taken away and brought back (:class:`CutRelay`).

:class:`SlowRelay` passes every byte between clients and a real server (Redis, Postgres: any
TCP protocol), holding each request chunk ``delay_s`` before it goes on: every round trip takes
``delay_s`` longer, as from a store across a slow network (tests/test_offloop.py).

A Redis that dies at the worst moment, on cue: a TCP relay in front of a real redis-server.

``ReplyLoser`` passes every byte between clients and the server, except when a chosen script
is sent (``lose(sha, nth)``: its ``nth`` EVALSHA since armed, counted over every connection):

* ``ran=True``: the call goes on to the server, the relay waits for the server's reply (the
  script ran, and with ``appendfsync always`` its effects and its reply record are on disk),
  then stops the server and closes the client's connection without handing the reply over:
  a server that died right after running the script;
* ``ran=False``: the relay stops the server first and closes the connection; the call never
  reaches it: a server that died while the call was on its way (or while running it, before
  anything reached its append-only file).

Either way the server is started again (same port, same data) ``down_s`` later, from a thread,
and the relay takes new connections to it as before. While the server is down, a new connection
is closed at once (what a client sees of a server that is not there). Each trip happens once.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass
from types import TracebackType

from tests.servers import RedisServer


@dataclass
class _Trip:
    sha: bytes
    nth: int
    ran: bool
    seen: int = 0
    done: bool = False


class ReplyLoser:
    """``with ReplyLoser(server) as relay: relay.url`` -> a URL to hand to the code under test."""

    def __init__(self, server: RedisServer, *, down_s: float = 1.0) -> None:
        self.server = server
        self.down_s = down_s
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._trips: list[_Trip] = []
        self._restarts: list[threading.Thread] = []
        self._open: set[socket.socket] = set()
        self._closed = False
        self.lost: list[str] = []  # the scripts whose call was lost, in order ("<sha> ran")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def lose(self, sha: str, nth: int = 1, *, ran: bool = True) -> None:
        """Lose the ``nth`` call of the script with this SHA from now on (see the module)."""
        with self._lock:
            self._trips.append(_Trip(sha.encode("ascii"), nth, ran))

    def wait(self) -> None:
        """Until every restart the relay began has brought the server back."""
        for thread in list(self._restarts):
            thread.join()

    # --- relaying --------------------------------------------------------------------------
    def __enter__(self) -> ReplyLoser:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closed = True
        self._listener.close()
        self.wait()
        with self._lock:
            for sock in list(self._open):
                _close(sock)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.server.port), timeout=5)
            except OSError:  # the server is down: so is this connection
                _close(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open |= {client, upstream}
            pair = _Pair(self, client, upstream)
            threading.Thread(target=pair.requests, daemon=True).start()
            threading.Thread(target=pair.replies, daemon=True).start()

    def _match(self, seen: bytes) -> _Trip | None:
        """The trip a request chunk sets off (its SHA counted once per request)."""
        with self._lock:
            for trip in self._trips:
                if not trip.done and trip.sha in seen:
                    trip.seen += 1
                    if trip.seen == trip.nth:
                        trip.done = True
                        return trip
        return None

    def _stop_server(self, trip: _Trip) -> None:
        """Stop the server now; start it again ``down_s`` later (from a thread)."""
        with self._lock:
            self.lost.append(f"{trip.sha.decode()} {'ran' if trip.ran else 'not run'}")
            self._restarts.append(self.server.down_for(self.down_s))

    def _forget(self, *socks: socket.socket) -> None:
        with self._lock:
            for sock in socks:
                self._open.discard(sock)
                _close(sock)


class _Pair:
    """One client connection and its connection to the server."""

    def __init__(self, relay: ReplyLoser, client: socket.socket, upstream: socket.socket) -> None:
        self.relay = relay
        self.client = client
        self.upstream = upstream
        self.lose_reply: _Trip | None = None

    def requests(self) -> None:
        tail = b""
        try:
            while chunk := self.client.recv(65536):
                trip = self.relay._match(tail + chunk)
                tail = chunk[-39:]  # a SHA (40 hex digits) cut in two is still found
                if trip is not None and not trip.ran:
                    self.relay._stop_server(trip)  # the call never reaches it
                    break
                if trip is not None:
                    self.lose_reply = trip  # the next reply is this call's
                self.upstream.sendall(chunk)
        except OSError:
            pass
        self.relay._forget(self.client, self.upstream)

    def replies(self) -> None:
        try:
            while chunk := self.upstream.recv(65536):
                trip = self.lose_reply
                if trip is not None:  # the script ran; its reply goes nowhere
                    self.relay._stop_server(trip)
                    break
                self.client.sendall(chunk)
        except OSError:
            pass
        self.relay._forget(self.client, self.upstream)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # not connected (any more)
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class SlowRelay:
    """``with SlowRelay(port, delay_s=0.2) as relay: relay.port`` -> a slow way to ``port``."""

    def __init__(self, upstream_port: int, *, delay_s: float) -> None:
        self.upstream_port = upstream_port
        self.delay_s = delay_s
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        self.requests = 0  # request chunks relayed (each held delay_s)

    def __enter__(self) -> SlowRelay:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            for sock in list(self._open):
                _close(sock)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            upstream.settimeout(None)
            with self._lock:
                self._open |= {client, upstream}
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, source: socket.socket, target: socket.socket, slow: bool) -> None:
        try:
            while chunk := source.recv(65536):
                if slow:
                    time.sleep(self.delay_s)  # the request's way there; replies come back at once
                    with self._lock:
                        self.requests += 1
                target.sendall(chunk)
        except OSError:
            pass
        with self._lock:
            for sock in (source, target):
                self._open.discard(sock)
                _close(sock)


class CutRelay:
    """A TCP relay to ``127.0.0.1:upstream_port`` that can be taken down (every connection cut,
    new ones refused at once) and brought back on the same port; ``url()`` is a Prefect API's
    behind it (tests/test_lost_footing_cli.py)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._down = False
        self._closed = False
        self.refused = 0  # connections refused while down

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def __enter__(self) -> CutRelay:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closed = True
        self._listener.close()
        self._cut()

    def down(self) -> None:
        with self._lock:
            self._down = True
        self._cut()

    def up(self) -> None:
        with self._lock:
            self._down = False

    def _cut(self) -> None:
        with self._lock:
            for sock in list(self._open):
                _close(sock)
            self._open.clear()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                down = self._down
                self.refused += down
            if down:  # away: the connection is reset at once, as by a host with nothing there
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                target.sendall(chunk)
        with self._lock:
            for sock in (source, target):
                self._open.discard(sock)
                _close(sock)
