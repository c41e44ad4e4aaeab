"""Throwaway real servers for tests: a redis-server on a free port, in a temporary folder.

Never the machine's own services on default ports: each test session starts its own and stops it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """``with RedisServer() as redis: redis.url`` -> ``redis://127.0.0.1:PORT/0``."""

    def __init__(self) -> None:
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
                "--save", "", "--appendonly", "no", "--dir", str(self.folder),
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
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
            self._process = None

    def restart(self) -> None:
        """Stop and start again on the same port (data is lost: no persistence)."""
        self.stop()
        self.start()

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
