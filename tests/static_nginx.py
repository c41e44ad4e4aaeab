"""A throwaway nginx on a free loopback port serving a folder of static files, with nginx's own
``ETag`` (``"<mtime hex>-<size hex>"``) and ``Last-Modified`` and its own answers to
``If-None-Match`` / ``If-Modified-Since``: the validators of a real server, not ours.

nginx-light is installed by ``./bootstrap`` (as for the benchmarks, bench/_nginx.py).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from tests.servers import free_port

_CONF = """
worker_processes 1;
daemon off;
error_log {root}/error.log warn;
pid {root}/nginx.pid;
events {{ worker_connections 256; }}
http {{
    access_log {root}/access.log;
    client_body_temp_path {root}/tmp;
    proxy_temp_path {root}/tmp;
    fastcgi_temp_path {root}/tmp;
    uwsgi_temp_path {root}/tmp;
    scgi_temp_path {root}/tmp;
    types {{ application/json json; text/plain txt; }}
    server {{
        listen 127.0.0.1:{port};
        root {root}/www;
    }}
}}
"""


def nginx_binary() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else "")
    if not found:
        raise RuntimeError("nginx is not installed: run ./bootstrap test (it installs nginx-light)")
    return found


class StaticNginx:
    """``with StaticNginx() as site: site.write("a.json", b"{}"); site.url("a.json")``"""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="collector-nginx-"))
        self.www = self.root / "www"
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    def write(self, path: str, body: bytes, *, mtime: float | None = None) -> None:
        """Write a file; ``mtime`` sets its time (nginx's ETag and Last-Modified follow it)."""
        file = self.www / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(body)
        file.parent.chmod(0o755)
        file.chmod(0o644)
        if mtime is not None:
            os.utime(file, (mtime, mtime))

    def requests(self) -> list[str]:
        """The access log's lines so far (nginx writes a line after each response)."""
        log = self.root / "access.log"
        return log.read_text().splitlines() if log.exists() else []

    def __enter__(self) -> StaticNginx:
        binary = nginx_binary()
        self.root.chmod(0o755)  # nginx workers run as an unprivileged user when started as root
        self.www.mkdir(parents=True, exist_ok=True)
        self.www.chmod(0o755)
        (self.root / "tmp").mkdir()
        conf = self.root / "nginx.conf"
        conf.write_text(_CONF.format(root=self.root, port=self.port))
        self._process = subprocess.Popen(
            [binary, "-c", str(conf), "-p", str(self.root)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.__exit__(None, None, None)
        raise RuntimeError(f"nginx did not start; see {self.root}/error.log")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
            self._process = None
        shutil.rmtree(self.root, ignore_errors=True)
