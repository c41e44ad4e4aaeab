"""A local HTTP host with the behaviours the circuit breaker and the adaptive window answer to.

Real sockets, real aiohttp server, in a thread of its own (its own event loop, so the engine
under test shares nothing with it but TCP):

* ``/item/<i>`` answers ``{"id": i}``;
* outage: :meth:`PolitenessSite.go_down` closes the listening socket and every open connection
  (the client sees refused connections, as from a host that is down), :meth:`come_back` listens
  again on the same port;
* a fixed worker pool (``workers``, ``service_s``): at most ``workers`` requests are served at
  once, each taking ``service_s``; the others queue, so latency grows past ``workers`` requests
  in flight while throughput does not;
* an unannounced rate limit (``rate``): more than ``rate`` requests in the last second get 429,
  without Retry-After;
* a token bucket (``bucket`` per second, a burst of a tenth of a second): 429 above it, with
  ``Retry-After: <bucket_retry_after>`` when that is set;
* noise (``noise``): that share of requests, at random and whatever the rate, answers 503 (half)
  or 429 (half; every other one with ``Retry-After: 1``);
* latency (``latency_min``..``latency_max`` seconds, uniform) on every answer.

Every answer is logged as (monotonic time, status) in ``log``; ``latencies`` holds each 200's
time from arrival to answer (queueing in a worker pool included).
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from aiohttp import web

from tests.servers import free_port


class PolitenessSite:
    """``with PolitenessSite(workers=4, service_s=0.05) as site: site.url(i)``."""

    def __init__(
        self,
        *,
        workers: int | None = None,
        service_s: float = 0.0,
        rate: float | None = None,
        bucket: float | None = None,
        bucket_retry_after: float | None = None,
        noise: float = 0.0,
        latency_min: float = 0.0,
        latency_max: float = 0.0,
        host: str = "127.0.0.1",
    ) -> None:
        self.host = host
        self.port = free_port()
        self.workers = workers
        self.service_s = service_s
        self.rate = rate
        self.bucket = bucket
        self.bucket_retry_after = bucket_retry_after
        self.noise = noise
        self.latency_min = latency_min
        self.latency_max = max(latency_max, latency_min)
        self.log: list[tuple[float, int]] = []
        self.latencies: list[float] = []
        self._tokens = 0.0
        self._refilled = time.monotonic()
        self._random = random.Random(25)
        self._noisy = 0
        self.up = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._pool: asyncio.Semaphore | None = None
        self._recent: collections.deque[float] = collections.deque()

    # --- control (from the test's thread) ----------------------------------------------------
    def url(self, i: int) -> str:
        return f"http://{self.host}:{self.port}/item/{i}"

    def go_down(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)

    def come_back(self) -> None:
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)

    def served(self, status: int = 200) -> int:
        return sum(1 for _, s in list(self.log) if s == status)

    def __enter__(self) -> PolitenessSite:
        self._thread.start()
        self.come_back()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.up:
            self.go_down()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    # --- the server (in its thread) ----------------------------------------------------------
    async def _start(self) -> None:
        if self._pool is None and self.workers is not None:
            self._pool = asyncio.Semaphore(self.workers)
        app = web.Application()
        app.router.add_get("/item/{i}", self._item)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.up = True

    async def _stop(self) -> None:
        self.up = False
        if self._runner is not None:
            await self._runner.cleanup()  # closes the socket and every connection
            self._runner = None

    async def _item(self, request: web.Request) -> web.Response:
        arrived = time.monotonic()
        refused = self._refused(arrived)
        if refused is not None:
            return refused
        if self.rate is not None:
            now = time.monotonic()
            while self._recent and self._recent[0] <= now - 1.0:
                self._recent.popleft()
            if len(self._recent) >= self.rate:
                self.log.append((now, 429))
                return web.Response(status=429, text="slow down")
            self._recent.append(now)
        if self._pool is not None:
            async with self._pool:
                await asyncio.sleep(self.service_s)
        elif self.service_s:
            await asyncio.sleep(self.service_s)
        if self.latency_max:
            await asyncio.sleep(self._random.uniform(self.latency_min, self.latency_max))
        self.log.append((time.monotonic(), 200))
        self.latencies.append(time.monotonic() - arrived)
        body = json.dumps({"id": int(request.match_info["i"])})
        return web.Response(body=body, content_type="application/json")

    def _refused(self, now: float) -> web.Response | None:
        """A token bucket's 429, or noise's 503/429; None to answer normally."""
        if self.bucket is not None:
            burst = max(self.bucket / 10, 1.0)
            self._tokens = min(burst, self._tokens + (now - self._refilled) * self.bucket)
            self._refilled = now
            if self._tokens < 1:
                self.log.append((now, 429))
                headers = {}
                if self.bucket_retry_after is not None:
                    headers["Retry-After"] = f"{self.bucket_retry_after:g}"
                return web.Response(status=429, text="slow down", headers=headers)
            self._tokens -= 1
        if self.noise and self._random.random() < self.noise:
            self._noisy += 1
            status = 503 if self._noisy % 2 else 429
            headers = {"Retry-After": "1"} if self._noisy % 4 == 0 else {}
            self.log.append((now, status))
            return web.Response(status=status, text="busy", headers=headers)
        return None


class SiteProcess:
    """:class:`PolitenessSite` in a process of its own, off the client's GIL and event loop
    (so a client that keeps its own loop busy does not slow the host it measures);
    ``stats()`` after exit: the site's log."""

    def __init__(self, host: str = "127.0.0.1", **options: Any) -> None:
        self.host = host
        self.port = free_port()
        self._stats = Path(tempfile.mkdtemp()) / "stats.json"
        options = {**options, "host": host, "stats": self._stats}
        self.args = [f"--{k.replace('_', '-')}={v}" for k, v in options.items() if v is not None]
        self._process: subprocess.Popen[bytes] | None = None

    def url(self, i: int) -> str:
        return f"http://{self.host}:{self.port}/item/{i}"

    def __enter__(self) -> SiteProcess:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.politeness_site", str(self.port), *self.args],
            cwd=Path(__file__).resolve().parents[1],
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return self
            except OSError:
                if self._process.poll() is not None:
                    break
                time.sleep(0.05)
        self.__exit__(None, None, None)
        raise RuntimeError(f"politeness site on port {self.port} did not start")

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)

    def stats(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self._stats.read_text(encoding="utf-8"))
        return data


def main() -> None:
    """Serve until killed (the benches run the site in its own process, off the client's GIL):
    ``python -m tests.politeness_site PORT [--workers K --service-s S] [--rate R]``."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--workers", type=int)
    parser.add_argument("--service-s", type=float, default=0.0)
    parser.add_argument("--rate", type=float)
    parser.add_argument("--bucket", type=float)
    parser.add_argument("--bucket-retry-after", type=float)
    parser.add_argument("--noise", type=float, default=0.0)
    parser.add_argument("--latency-min", type=float, default=0.0)
    parser.add_argument("--latency-max", type=float, default=0.0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--stats", help="write the log here (JSON) on SIGTERM")
    args = parser.parse_args()
    site = PolitenessSite(
        workers=args.workers,
        service_s=args.service_s,
        rate=args.rate,
        bucket=args.bucket,
        bucket_retry_after=args.bucket_retry_after,
        noise=args.noise,
        latency_min=args.latency_min,
        latency_max=args.latency_max,
        host=args.host,
    )
    site.port = args.port
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with site:
        stop.wait()
    if args.stats:
        Path(args.stats).write_text(
            json.dumps({"log": site.log, "latencies": site.latencies}), encoding="utf-8"
        )


if __name__ == "__main__":
    main()
