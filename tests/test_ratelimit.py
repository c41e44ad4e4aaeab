"""Per-host rate limits: in one worker (memory) and shared by workers (a real Redis)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from pathlib import Path

import pytest

from collector.config import SourceError, load_source
from collector.fetch.ratelimit import (
    LimitsRateLimiter,
    LocalMovingWindow,
    RateLimiter,
    rate_limiter,
)
from tests.helpers import write_source
from tests.servers import RedisServer


async def _burst(limiter: RateLimiter, n: int) -> None:
    for _ in range(n):
        await limiter.acquire("host")


async def _within(work: Awaitable[object], seconds: float) -> bool:
    """Whether ``work`` ends within ``seconds`` (cancelled if not)."""
    try:
        await asyncio.wait_for(work, seconds)
    except TimeoutError:
        return False
    return True


def test_memory_storage_gets_the_local_window_and_redis_the_shared_one(redis_url: str) -> None:
    assert isinstance(rate_limiter("10/second"), LocalMovingWindow)
    assert isinstance(rate_limiter("10/second", storage_uri="async+memory://"), LocalMovingWindow)
    assert isinstance(rate_limiter("10/second", storage_uri=redis_url), LimitsRateLimiter)


async def test_the_local_window_never_holds_more_than_the_rate() -> None:
    limiter = LocalMovingWindow("10/second")
    stamps: list[float] = []

    async def one() -> None:
        await limiter.acquire("host")
        stamps.append(time.monotonic())

    await asyncio.gather(*(one() for _ in range(25)))  # all at once, as the engine asks
    assert stamps[-1] - stamps[0] >= 2.0 - 0.01  # 10 now, 10 after 1 s, 5 after 2 s
    for start in stamps:  # the moving window: no second holds more than 10
        assert sum(1 for t in stamps if start <= t < start + 0.999) <= 10


@pytest.mark.parametrize("kind", [LocalMovingWindow, LimitsRateLimiter])
async def test_memory_limits_are_per_worker(kind: type[LocalMovingWindow]) -> None:
    """Each has its own window: shared, the 11th of these 20 would wait a minute (the bound is
    half that, so a loaded box cannot pass for a shared window nor fail a separate one)."""
    one, two = kind("10/minute"), kind("10/minute")
    both = asyncio.gather(_burst(one, 10), _burst(two, 10))
    assert await _within(both, 30), "20 acquires through two 10/minute limiters waited"


async def test_redis_limits_are_shared_by_workers(redis_url: str) -> None:
    one = LimitsRateLimiter("10/second", storage_uri=redis_url)
    two = LimitsRateLimiter("10/second", storage_uri=redis_url)
    began = time.monotonic()
    await asyncio.gather(_burst(one, 15), _burst(two, 15))
    assert time.monotonic() - began >= 1.9  # 30 requests through one 10/s window


async def test_keys_are_independent(redis_url: str) -> None:
    limiter = LimitsRateLimiter("5/minute", storage_uri=redis_url)
    hosts = asyncio.gather(*(limiter.acquire(f"host-{i}") for i in range(20)))
    assert await _within(hosts, 30), "one acquire each for 20 hosts waited: keys share a window"


async def test_closing_a_shared_limiter_closes_its_redis_connections() -> None:
    """A helper runs many runs in one process: each run's limiter lets go of its sockets.

    A server of its own: on the session's shared one, other tests' clients come and go (the
    garbage collector closes them) while this counts."""
    import redis

    with RedisServer() as server:

        def clients() -> int:
            with redis.Redis.from_url(server.url) as admin:
                return len(admin.client_list()) - 1  # not counting this one

        assert clients() == 0
        limiter = LimitsRateLimiter("100/second", storage_uri=server.url)
        await asyncio.gather(*(limiter.acquire(f"host-{n}") for n in range(4)))
        assert clients() > 0
        await limiter.aclose()
        assert clients() == 0
    await LocalMovingWindow("1/second").aclose()  # nothing to close, and no error


def test_rate_storage_must_be_memory_or_redis(tmp_path: Path) -> None:
    path = write_source(
        tmp_path, seeds={"urls": ["http://a/x"]}, limits={"rate_storage": "mongodb://x"}
    )
    with pytest.raises(SourceError, match=r"limits.rate_storage: must be memory:// or a redis://"):
        load_source(path)
    ok = write_source(
        tmp_path, seeds={"urls": ["http://a/x"]}, limits={"rate_storage": "${env:RATE_REDIS}"}
    )
    assert load_source(ok).limits.rate_storage == "${env:RATE_REDIS}"
