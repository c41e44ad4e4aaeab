"""A throwaway nginx on a free loopback port serving N small JSON pages (installed with apt if
missing). Used by the benchmarks only; never by the test suite."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

NGINX_CONF = """
worker_processes 2;
daemon off;
error_log {root}/error.log warn;
pid {root}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 1000000;
    keepalive_timeout 65;
    client_body_temp_path {root}/tmp;
    proxy_temp_path {root}/tmp;
    fastcgi_temp_path {root}/tmp;
    uwsgi_temp_path {root}/tmp;
    scgi_temp_path {root}/tmp;
    types {{ application/json json; }}
    server {{
        listen 127.0.0.1:{port};
        root {root}/www;
    }}
}}
"""


def ensure_nginx() -> str:
    found = shutil.which("nginx") or (
        "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
    )
    if found:
        return found
    print("bench: installing nginx with apt-get", flush=True)
    subprocess.run(["apt-get", "update", "-qq"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "nginx-light"],
        check=True,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )
    return shutil.which("nginx") or "/usr/sbin/nginx"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class StaticSite:
    """``with StaticSite(pages=20000) as site: site.url(i)``"""

    def __init__(self, pages: int) -> None:
        self.pages = pages
        self.root = Path(tempfile.mkdtemp(prefix="collector-bench-"))
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.port}/items/{i}.json"

    def __enter__(self) -> StaticSite:
        binary = ensure_nginx()
        self.root.chmod(0o755)  # nginx workers run as an unprivileged user when started as root
        www = self.root / "www" / "items"
        www.mkdir(parents=True)
        (self.root / "tmp").mkdir()
        for i in range(self.pages):
            record = {"id": i, "name": f"item {i}", "price": round(1 + (i * 37 % 1000) / 10, 2),
                      "category": ["books", "tools", "games", "food"][i % 4]}  # fmt: skip
            (www / f"{i}.json").write_text(json.dumps(record))
        conf = self.root / "nginx.conf"
        conf.write_text(NGINX_CONF.format(root=self.root, port=self.port))
        self._process = subprocess.Popen([binary, "-c", str(conf), "-p", str(self.root)])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nginx did not start")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)
