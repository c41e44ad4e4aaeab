"""A cheap local HTTP server that logs which worker fetched which item (multi-worker proofs).

It runs in its own process (asyncio, a minimal HTTP/1.1 keep-alive loop), so 20,000 requests
cost it little CPU and none of the test process's GIL. ``GET /items/{i}.json`` answers
``{"id": i, "name": "item i"}`` and logs ``(i, worker)``, the worker being the
``X-Collector-Worker`` request header (each worker process sends its own through
``limits.headers``). Control routes (not logged): ``/__log`` (the log as JSON),
``/__delay?s=S`` (answer items after S seconds, to catch a worker mid-batch), ``/__stats``
(``max_in_flight``: the most item requests ever served at once).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from collections import Counter
from types import TracebackType
from typing import Any

WORKER_HEADER = "X-Collector-Worker"


class _State:
    def __init__(self) -> None:
        self.log: list[tuple[int, str]] = []
        self.delay_s = 0.0
        self.in_flight = 0
        self.max_in_flight = 0


def _response(status: int, body: bytes) -> bytes:
    reason = {200: "OK", 404: "Not Found"}.get(status, "OK")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _answer(state: _State, target: str, worker: str) -> bytes:
    path, _, query = target.partition("?")
    if path == "/__log":
        return _response(200, json.dumps(state.log).encode())
    if path == "/__stats":
        return _response(200, json.dumps({"max_in_flight": state.max_in_flight}).encode())
    if path == "/__delay":
        state.delay_s = float(query.partition("=")[2])
        return _response(200, b"{}")
    if not (path.startswith("/items/") and path.endswith(".json")):
        return _response(404, b'{"error": "not found"}')
    item = int(path[len("/items/") : -len(".json")])
    state.in_flight += 1
    state.max_in_flight = max(state.max_in_flight, state.in_flight)
    try:
        if state.delay_s:
            await asyncio.sleep(state.delay_s)
    finally:
        state.in_flight -= 1
    state.log.append((item, worker))
    return _response(200, json.dumps({"id": item, "name": f"item {item}"}).encode())


async def _serve() -> None:
    state = _State()
    header = WORKER_HEADER.lower().encode()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                target = lines[0].split(b" ")[1].decode()
                worker = "?"
                for line in lines[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == header:
                        worker = value.strip().decode()
                writer.write(await _answer(state, target, worker))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", 0, backlog=512)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


class WorkerSite:
    """``with WorkerSite() as site: site.url("/items/{i}.json")``; ``site.fetches()``."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[str] | None = None
        self.port = 0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _get(self, path: str) -> Any:  # the answer's JSON
        with urllib.request.urlopen(self.url(path), timeout=60) as answer:
            return json.loads(answer.read())

    def set_delay(self, seconds: float) -> None:
        self._get(f"/__delay?s={seconds}")

    def fetches(self) -> list[tuple[int, str]]:
        """Every logged fetch as (item, worker), in order."""
        return [(int(item), str(worker)) for item, worker in self._get("/__log")]

    def fetch_counts(self) -> Counter[int]:
        return Counter(item for item, _ in self.fetches())

    @property
    def max_in_flight(self) -> int:
        return int(self._get("/__stats")["max_in_flight"])

    def __enter__(self) -> WorkerSite:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.worker_site"], stdout=subprocess.PIPE, text=True
        )
        assert self._process.stdout is not None
        self.port = int(self._process.stdout.readline())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
            if self._process.stdout is not None:  # else a ResourceWarning (unclosed file)
                self._process.stdout.close()


if __name__ == "__main__":
    asyncio.run(_serve())
