"""The fetch engine's shared state (circuit breakers, rate limits) across a real Redis restart.

A real redis-server with an append-only file is stopped and started again on the same port
while a real local host is fetched (collector.fetch.shared_redis says why each part does what):

* the shared breaker does not stop the batch: while Redis is away it answers from the worker's
  own state (a host that fails meanwhile is opened there, its items deferred), and when Redis
  answers again the opening made meanwhile is written there, so other workers learn of it;
* the shared rate limiter waits for Redis and keeps the rate across the restart; a Redis that
  stays down past ``COLLECTOR_REDIS_RECONNECT_S`` fails the batch with one line;
* in every case no task of the batch is left with an exception nobody retrieved (asyncio would
  log "Task exception was never retrieved" with a traceback for each).
"""

from __future__ import annotations

import asyncio
import gc
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis

from collector.config import CircuitSettings
from collector.errors import BackendError
from collector.fetch.circuit import CircuitBoard, RedisCircuitStore
from collector.fetch.engine import FetchEngine, FetchResult, host_of
from collector.fetch.ratelimit import LimitsRateLimiter
from collector.frontier.base import ClaimedItem
from collector.policy.retry import RetryBudget, RetrySettings
from collector.policy.urls import HostPolicy
from tests.politeness_site import PolitenessSite
from tests.servers import RedisServer

SETTINGS = CircuitSettings(failures=3, cooldown_s=30, jitter=0, probes=1)


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer(persistent=True) as running:
        yield running


@pytest.fixture
def site() -> Iterator[PolitenessSite]:
    with PolitenessSite() as running:
        yield running


@pytest.fixture
async def unretrieved() -> AsyncIterator[list[dict[str, Any]]]:
    """What the event loop's exception handler was told (unretrieved task exceptions)."""
    told: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: told.append(context))
    yield told
    loop.set_exception_handler(None)


def _engine(**options: Any) -> FetchEngine:
    return FetchEngine(
        retry=RetrySettings(base_s=0.01, cap_s=0.02, max_attempts=3, max_inline_delay_s=0),
        host_policy=HostPolicy(allow_private_networks=True),
        concurrency=2,
        per_domain_concurrency=2,
        http_timeout_s=2.0,
        request_deadline_s=2.0,
        **options,
    )


async def _batch(engine: FetchEngine, site: PolitenessSite, n: int) -> list[FetchResult]:
    items = [ClaimedItem(site.url(i), 0, None, 0.0) for i in range(n)]
    return await engine.fetch_batch(items, budget=RetryBudget(ratio=1.0, min_retries=1000))


async def test_the_shared_breaker_rides_out_a_restart_and_shares_what_it_learned(
    server: RedisServer, site: PolitenessSite, unretrieved: list[dict[str, Any]]
) -> None:
    store = RedisCircuitStore(server.url, "src", SETTINGS)
    board = CircuitBoard(SETTINGS, store=store, sync_s=0.0, rng=random.Random(1))
    host = host_of(site.url(0))
    key = f"collector:circuit:src:{host}"
    async with _engine(circuit=board) as engine:
        assert Counter(r.status for r in await _batch(engine, site, 10)) == {"ok": 10}

        server.stop()
        assert Counter(r.status for r in await _batch(engine, site, 10)) == {"ok": 10}
        assert store.down  # answered from the worker's own state, the batch went on

        site.go_down()  # the host fails while Redis is away: the breaker opens here
        results = await _batch(engine, site, 20)
        counts = Counter(r.status for r in results)
        assert counts["deferred"] >= 20 - 2 * SETTINGS.failures, counts
        assert set(counts) <= {"deferred", "failed"}, counts
        assert board.opened == 1 and board.deferred_until(host) is not None

        server.start()
        client = redis.Redis.from_url(server.url)
        try:
            assert client.hget(key, "opens") is None  # Redis never saw the opening
            deadline = time.monotonic() + 10  # the store tries Redis again after its backoff
            while store.down and time.monotonic() < deadline:
                await board.admit(host)
                await asyncio.sleep(0.1)
            assert not store.down
            assert client.hget(key, "opens") == b"1"  # the opening is shared now
        finally:
            client.close()

    # another worker of the source sees the host open and sends nothing to it
    other = CircuitBoard(SETTINGS, store=RedisCircuitStore(server.url, "src", SETTINGS))
    try:
        assert not (await other.admit(host)).go
    finally:
        await other.aclose()
    gc.collect()
    assert unretrieved == []


async def test_the_shared_rate_limit_waits_for_redis_and_holds_across_a_restart(
    server: RedisServer,
) -> None:
    one = LimitsRateLimiter("10/second", storage_uri=server.url)
    two = LimitsRateLimiter("10/second", storage_uri=server.url)
    stamps: list[float] = []

    async def burst(limiter: LimitsRateLimiter, n: int) -> None:
        for _ in range(n):
            await limiter.acquire("host")
            stamps.append(time.monotonic())

    await asyncio.gather(burst(one, 5), burst(two, 5))  # both reached Redis
    restarting = server.down_for(1.5)
    began = time.monotonic()
    await asyncio.gather(burst(one, 10), burst(two, 10))  # sent while it is down: they wait
    waited = time.monotonic() - began
    await asyncio.to_thread(restarting.join)
    assert waited >= 1.5, "the limiter did not meet the server down"
    # One shared moving window across the restart: never more than 10 a second. (The stamps are
    # taken when acquire returns, up to a backoff's wake-up after Redis counted the request.)
    for start in stamps:
        assert sum(1 for t in stamps if start <= t < start + 0.8) <= 10, stamps


async def test_a_rate_limit_redis_that_stays_down_fails_the_batch_in_one_line(
    server: RedisServer,
    site: PolitenessSite,
    monkeypatch: pytest.MonkeyPatch,
    unretrieved: list[dict[str, Any]],
) -> None:
    monkeypatch.setenv("COLLECTOR_REDIS_RECONNECT_S", "1")
    limiter = LimitsRateLimiter("1000/second", storage_uri=server.url)
    async with _engine(rate_limiter=limiter) as engine:
        assert Counter(r.status for r in await _batch(engine, site, 4)) == {"ok": 4}
        server.stop()
        began = time.monotonic()
        message = await _batch_failure(engine, site, 10)
        waited = time.monotonic() - began
    assert 1.0 <= waited < 10, waited
    assert message.startswith(
        f"rate limiter {server.url}: Redis unreachable for 1 s: ConnectionError: "
    ), message
    assert "\n" not in message
    gc.collect()
    assert unretrieved == []  # ten tasks raised; the batch retrieved every exception


async def test_a_rate_limit_redis_never_reached_fails_at_once(site: PolitenessSite) -> None:
    stopped = RedisServer()  # a port nothing listens on
    limiter = LimitsRateLimiter("10/second", storage_uri=stopped.url)
    async with _engine(rate_limiter=limiter) as engine:
        began = time.monotonic()
        message = await _batch_failure(engine, site, 2)
    assert time.monotonic() - began < 5
    assert message.startswith(f"rate limiter {stopped.url}: Redis unreachable (never reached)")


async def _batch_failure(engine: FetchEngine, site: PolitenessSite, n: int) -> str:
    """The one-line message the batch failed with (the exception itself is not kept: its
    traceback would keep the batch's tasks alive past the garbage collection)."""
    try:
        await _batch(engine, site, n)
    except BackendError as exc:
        return str(exc)
    raise AssertionError("the batch did not fail")
