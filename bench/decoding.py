"""Decoding within the size cap: the memory a gzip bomb costs, and the CPU of normal bodies.

    .venv/bin/python bench/decoding.py [--pages 20000]

Side by side in one run, httpx's own decoding (``aiter_bytes``, what the fetch engine read
before) against the engine's (``aiter_raw`` + collector.fetch.decoding, bounded by
``max_response_bytes``):

1. **memory**: a local server sends a gzip bomb (64 MB of zeros in ~64 KB, a Content-Length
   under the 1 MB cap, so only the decoded size can catch it). Each reader fetches it once in a
   fresh process, on each pool, after a warm-up page; printed: the growth of the process's peak
   RSS (``ru_maxrss``) during the bomb's fetch, in MB. Both stop at the cap; the question is
   how much was decoded before they could.
2. **CPU**: the same raw chunks (a 2 KB and a 60 KB JSON page, plain and gzip, in 16 KB
   network reads) through a real ``httpx.Response`` each way, ``--pages`` times; printed: CPU
   microseconds per page each way and their ratio (new / old: 1.00 is unchanged).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from collector.fetch.decoding import bounded_decoder
from collector.fetch.engine import FetchEngine
from collector.fetch.transport import make_clients
from collector.frontier.base import ClaimedItem
from collector.policy.retry import RetryBudget, RetrySettings
from collector.policy.urls import HostPolicy

CAP = 1_000_000
BOMB = gzip.compress(b"\0" * (64 * CAP), compresslevel=9)
WARM = gzip.compress(b'{"warm": true}')


class _Quiet(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # readers hang up at the cap: that is the point


class _Bombs(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        body = BOMB if self.path == "/bomb" else WARM
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(OSError):  # the reader hung up at the cap
            self.wfile.write(body)


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


async def _httpx_read(pool: str, url: str) -> str:
    """The engine's read before: httpx's aiter_bytes, the cap checked on decoded chunks."""
    (client,) = make_clients(pool, connections=1, tls=httpx.create_ssl_context())  # type: ignore[arg-type]
    async with client:
        for path in ("/warm", "/bomb"):
            size = 0
            async with client.stream("GET", url + path) as response:
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > CAP:
                        break
            if path == "/warm":
                before = _peak_mb()
    return json.dumps({"growth_mb": round(_peak_mb() - before, 1), "stopped_at": size})


async def _engine_read(pool: str, url: str) -> str:
    engine = FetchEngine(
        retry=RetrySettings(max_attempts=1),
        host_policy=HostPolicy(allow_private_networks=True),
        max_response_bytes=CAP,
        concurrency=1,
        transport=pool,  # type: ignore[arg-type]
    )
    budget = RetryBudget(ratio=1.0, min_retries=10)
    async with engine:
        (warm,) = await engine.fetch_batch(
            [ClaimedItem(url + "/warm", 0, None, 0.0)], budget=budget
        )
        assert warm.status == "ok", warm
        before = _peak_mb()
        (bomb,) = await engine.fetch_batch(
            [ClaimedItem(url + "/bomb", 0, None, 0.0)], budget=budget
        )
    error = bomb.error.error_class if bomb.error else bomb.status
    return json.dumps({"growth_mb": round(_peak_mb() - before, 1), "stopped_at": error})


def _memory(url: str) -> None:
    print("1. peak RSS growth while fetching a 64 MB gzip bomb under a 1 MB cap (fresh process)")
    print(f"   {'pool':8} {'httpx aiter_bytes (before)':>28} {'engine, bounded (now)':>24}")
    for pool in ("httpx", "aiohttp"):
        row = []
        for reader in ("httpx", "engine"):
            out = subprocess.run(
                [sys.executable, __file__, "--child", reader, pool, url],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            row.append(json.loads(out.strip().splitlines()[-1]))
        print(f"   {pool:8} {row[0]['growth_mb']:>25.1f} MB {row[1]['growth_mb']:>21.1f} MB"
              f"   ({row[1]['stopped_at']})")  # fmt: skip


class _Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


async def _cpu_per_page(
    pages: int, headers: dict[str, str], chunks: list[bytes]
) -> tuple[float, float]:
    async def old() -> None:
        response = httpx.Response(200, headers=headers, stream=_Chunks(chunks))
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)

    async def new() -> None:
        response = httpx.Response(200, headers=headers, stream=_Chunks(chunks))
        decoder = bounded_decoder(response.headers.get("content-encoding"), CAP)
        size = 0
        async for raw in response.aiter_raw():
            chunk = raw if decoder is None else decoder.decode(raw)
            size += len(chunk)

    spent: dict[str, float] = {}
    for _ in range(2):  # interleaved, twice each: the same box for both
        for name, read in (("old", old), ("new", new)):
            began = time.process_time()
            for _ in range(pages):
                await read()
            spent[name] = spent.get(name, 0.0) + time.process_time() - began
    return spent["old"] / (2 * pages) * 1e6, spent["new"] / (2 * pages) * 1e6


def _cpu(pages: int) -> None:
    print(f"2. CPU per page, decoding the same raw reads ({pages} pages each way, twice)")
    print(f"   {'body':18} {'old us':>8} {'new us':>8} {'new/old':>8}")
    for size in (2_000, 60_000):
        body = json.dumps([{"id": i, "name": f"item {i}"} for i in range(size // 25)]).encode()[
            :size
        ]
        for encoding in ("identity", "gzip"):
            raw = gzip.compress(body) if encoding == "gzip" else body
            chunks = [raw[i : i + 16384] for i in range(0, len(raw), 16384)]
            headers = {"content-encoding": "gzip"} if encoding == "gzip" else {}
            old, new = asyncio.run(_cpu_per_page(pages, headers, chunks))
            print(f"   {f'{size // 1000} KB {encoding}':18} {old:8.1f} {new:8.1f} {new / old:8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=20_000)
    parser.add_argument(
        "--child", nargs=3, metavar=("READER", "POOL", "URL"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        reader, pool, url = args.child
        read = _httpx_read if reader == "httpx" else _engine_read
        print(asyncio.run(read(pool, url)))
        return
    server = _Quiet(("127.0.0.1", 0), _Bombs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    try:
        _memory(f"http://127.0.0.1:{server.server_address[1]}")
        _cpu(args.pages)
    finally:
        server.shutdown()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
