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
  without Retry-After.

Every answer is logged as (monotonic time, status) in ``log``.
"""

from __future__ import annotations

import asyncio
import collections
import json
import threading
import time
from types import TracebackType

from aiohttp import web

from tests.servers import free_port


class PolitenessSite:
    """``with PolitenessSite(workers=4, service_s=0.05) as site: site.url(i)``."""

    def __init__(
        self, *, workers: int | None = None, service_s: float = 0.0, rate: float | None = None
    ) -> None:
        self.port = free_port()
        self.workers = workers
        self.service_s = service_s
        self.rate = rate
        self.log: list[tuple[float, int]] = []
        self.up = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._pool: asyncio.Semaphore | None = None
        self._recent: collections.deque[float] = collections.deque()

    # --- control (from the test's thread) ----------------------------------------------------
    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.port}/item/{i}"

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
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        self.up = True

    async def _stop(self) -> None:
        self.up = False
        if self._runner is not None:
            await self._runner.cleanup()  # closes the socket and every connection
            self._runner = None

    async def _item(self, request: web.Request) -> web.Response:
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
        self.log.append((time.monotonic(), 200))
        body = json.dumps({"id": int(request.match_info["i"])})
        return web.Response(body=body, content_type="application/json")


def main() -> None:
    """Serve until killed (the benches run the site in its own process, off the client's GIL):
    ``python -m tests.politeness_site PORT [--workers K --service-s S] [--rate R]``."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--workers", type=int)
    parser.add_argument("--service-s", type=float, default=0.0)
    parser.add_argument("--rate", type=float)
    args = parser.parse_args()
    site = PolitenessSite(workers=args.workers, service_s=args.service_s, rate=args.rate)
    site.port = args.port
    with site:
        threading.Event().wait()


if __name__ == "__main__":
    main()
