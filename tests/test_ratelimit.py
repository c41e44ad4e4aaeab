"""Per-host rate limits: in one worker (memory) and shared by workers (a real Redis)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from collector.config import SourceError, load_source
from collector.fetch.ratelimit import LimitsRateLimiter
from tests.helpers import write_source


async def _burst(limiter: LimitsRateLimiter, n: int) -> None:
    for _ in range(n):
        await limiter.acquire("host")


async def test_memory_limits_are_per_worker() -> None:
    one, two = LimitsRateLimiter("10/second"), LimitsRateLimiter("10/second")
    began = time.monotonic()
    await asyncio.gather(_burst(one, 10), _burst(two, 10))
    assert time.monotonic() - began < 0.5  # each has its own window


async def test_redis_limits_are_shared_by_workers(redis_url: str) -> None:
    one = LimitsRateLimiter("10/second", storage_uri=redis_url)
    two = LimitsRateLimiter("10/second", storage_uri=redis_url)
    began = time.monotonic()
    await asyncio.gather(_burst(one, 15), _burst(two, 15))
    assert time.monotonic() - began >= 1.9  # 30 requests through one 10/s window


async def test_keys_are_independent(redis_url: str) -> None:
    limiter = LimitsRateLimiter("5/second", storage_uri=redis_url)
    began = time.monotonic()
    await asyncio.gather(*(limiter.acquire(f"host-{i}") for i in range(20)))
    assert time.monotonic() - began < 0.5


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
