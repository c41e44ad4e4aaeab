"""Throwaway real servers for tests: redis-server and a Postgres cluster on free ports, in
temporary folders, and a local site of numbered pages.

Never the machine's own services on default ports: each test session starts its own and stops it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Self

STOP_GRACE_S = 3.0  # how long a server asked to stop may take before it is killed (SIGKILL)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def end_process(
    process: subprocess.Popen[bytes],
    ask: Callable[[], object],
    *,
    grace_s: float,
    kill: Callable[[], object] | None = None,
) -> None:
    """Stop a throwaway server for good: ``ask`` it to stop, wait ``grace_s``, then SIGKILL.

    Why: a server that does not stop when asked (a Redis running an endless Lua script, a
    stuck Postgres) must not outlive its test and eat a core of a shared machine. ``ask`` may
    fail (the server no longer answers): the kill still comes (``kill``, default SIGKILL to
    the process; a server that runs a process group kills the group). Always reaps it.
    """
    if process.poll() is None:
        with contextlib.suppress(OSError):
            ask()
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                (kill or process.kill)()
    process.wait(timeout=30)


def wait_ready(process: subprocess.Popen[bytes], url: str, *, log: Path, timeout_s: float) -> None:
    """Until ``url`` answers 200 (a server's health or readiness endpoint); RuntimeError with
    the tail of its ``log`` when it exits first or does not answer within ``timeout_s``. The
    caller stops it then (:func:`end_process`): a server that failed to start is not left."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        if process.poll() is not None:
            break
        time.sleep(0.2)
    said = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise RuntimeError(f"{url} did not answer (exit {process.poll()}); {log}:\n{said}")


@contextlib.contextmanager
def numbered_pages(answer: Callable[[int], tuple[int, bytes]]) -> Iterator[str]:
    """A real local HTTP site on a free port; yields its base URL. ``GET /<n>.json`` answers
    ``answer(n)``: (status, JSON body). Served from a thread; shut down on leaving."""

    class Pages(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = answer(int(self.path.strip("/").split(".")[0]))
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with serving(Pages) as base_url:
        yield base_url


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` on a real local HTTP server on a free port, from a thread; yields its base
    URL and shuts it down on leaving."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


class RedisServer:
    """``with RedisServer() as redis: redis.url`` -> ``redis://127.0.0.1:PORT/0``.

    ``persistent=True``: an append-only file (fsync always), so the data survives ``restart``.
    """

    def __init__(self, *, persistent: bool = False) -> None:
        self.persistent = persistent
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not Path(binary).exists():
            raise RuntimeError("redis-server is not installed (./bootstrap test installs it)")
        self.binary = binary
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="collector-redis-"))
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self._process = subprocess.Popen(
            [
                self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--dir", str(self.folder),
                *(["--appendonly", "yes", "--appendfsync", "always"] if self.persistent
                  else ["--appendonly", "no"]),
                "--protected-mode", "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self, *, grace_s: float = STOP_GRACE_S) -> None:
        """``SCRIPT KILL`` (ends a busy read-only script) then ``SHUTDOWN NOSAVE`` (the one
        command a server busy with a script that wrote still obeys), both sent at once; killed
        (SIGKILL) if still alive ``grace_s`` later. A server inside a script answers nobody
        until the script has run ``busy-reply-threshold`` (5 s): the kill ends it sooner."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.ExitStack() as held:

            def ask() -> None:
                sock = held.enter_context(
                    socket.create_connection(("127.0.0.1", self.port), timeout=1)
                )
                sock.sendall(b"SCRIPT KILL\r\nSHUTDOWN NOSAVE\r\n")  # kept open till it ends

            end_process(process, ask, grace_s=grace_s)

    def restart(self) -> None:
        """Stop and start again on the same port (data is lost unless ``persistent``)."""
        self.stop()
        self.start()

    def down_for(self, seconds: float) -> threading.Thread:
        """Stop now; start again on the same port ``seconds`` later, from a thread (join it)."""
        self.stop()

        def later() -> None:
            time.sleep(seconds)
            self.start()

        thread = threading.Thread(target=later)
        thread.start()
        return thread

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


def _postgres_bin_dir() -> Path:
    """The folder holding initdb and postgres: on PATH, or Debian's /usr/lib/postgresql/N/bin."""
    for candidate in (shutil.which("initdb"), "/usr/local/bin/initdb"):
        if candidate and Path(candidate).exists():
            folder = Path(candidate).resolve().parent
            if (folder / "postgres").exists():
                return folder
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda path: int(path.parent.parent.name) if path.parent.parent.name.isdigit() else 0,
    )
    if versions:
        return versions[-1].parent
    raise RuntimeError("postgres is not installed (./bootstrap test installs it)")


class PostgresServer:
    """``with PostgresServer() as pg: pg.dsn()`` -> a throwaway cluster on a free port.

    initdb into a temporary folder, ``postgres`` bound to 127.0.0.1 with a private socket folder
    and fsync off (tests do not survive power cuts, and the box is shared). initdb and postgres
    refuse to run as root, so as root the cluster belongs to an unprivileged user.
    """

    def __init__(self) -> None:
        self.bin = _postgres_bin_dir()
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="collector-postgres-"))
        self.data = self.folder / "data"
        self.sockets = self.folder / "sockets"
        self._process: subprocess.Popen[bytes] | None = None
        self._user: dict[str, Any] = {}
        if os.getuid() == 0:
            account = _unprivileged_account()
            self._user = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
            os.chown(self.folder, account.pw_uid, account.pw_gid)
        self.sockets.mkdir()
        if self._user:
            os.chown(self.sockets, self._user["user"], self._user["group"])
        self._log = self.folder / "postgres.log"

    def dsn(self, dbname: str = "postgres", *, password: str | None = None) -> str:
        secret = f":{password}" if password else ""
        return f"postgresql://postgres{secret}@127.0.0.1:{self.port}/{dbname}"

    def _spawn(self, args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            args, cwd=self.folder, env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C"},
            **self._user, **kwargs,
        )  # fmt: skip

    def start(self) -> PostgresServer:
        if not self.data.exists():
            initdb = self._spawn(
                [str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
                 "--auth=trust", "--encoding=UTF8", "--no-locale", "--no-sync"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )  # fmt: skip
            output, _ = initdb.communicate(timeout=120)
            if initdb.returncode != 0:
                raise RuntimeError(f"initdb failed: {output.decode(errors='replace')[-2000:]}")
        log = self._log.open("ab")
        self._process = self._spawn(
            [str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port),
             "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.sockets}",
             "-c", "fsync=off", "-c", "full_page_writes=off", "-c", "shared_buffers=16MB",
             "-c", "max_connections=120"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + 60
        import psycopg

        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"postgres exited: {self._log.read_text()[-2000:]}")
            try:
                psycopg.connect(self.dsn(), connect_timeout=2).close()
                return self
            except psycopg.OperationalError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"postgres did not start on port {self.port}")

    def stop(self, *, grace_s: float = 10.0) -> None:
        """Fast shutdown (SIGINT: open sessions are cut, no checkpoint wait with fsync off);
        killed (SIGKILL) if still alive ``grace_s`` later. Its backends notice the postmaster
        is gone and exit on their own."""
        process, self._process = self._process, None
        if process is not None:
            end_process(process, lambda: process.send_signal(signal.SIGINT), grace_s=grace_s)

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; returns its DSN."""
        import psycopg

        name = name or f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def prefect_database(self) -> str:
        """A new empty database as a Prefect server's connection URL (asyncpg)."""
        return self.create_database().replace("postgresql://", "postgresql+asyncpg://", 1)

    def create_schema(self, dbname: str) -> str:
        """A new empty schema in ``dbname``; returns a DSN whose search_path is that schema only,
        so unqualified tables are created and found there (cheaper than a database per test)."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.dsn(dbname), autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
        return f"{self.dsn(dbname)}?options=-csearch_path%3D{name}"

    def drop_schema(self, dsn: str) -> None:
        import psycopg

        dbname = dsn.rsplit("/", 1)[1].split("?")[0]
        name = dsn.rsplit("%3D", 1)[1]
        with psycopg.connect(self.dsn(dbname), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


def _unprivileged_account() -> pwd.struct_passwd:
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError("running as root and there is no 'postgres' or 'nobody' user for postgres")


class ThreadedSite:
    """A local HTTP/1.1 site in a thread, for ``with``: a subclass answers every GET in
    ``_answer(handler)`` (the change and robots sites share this; the demo site has its own)."""

    def __init__(self) -> None:
        self.port = free_port()
        self._server: ThreadingHTTPServer | None = None

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                site._answer(self)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
