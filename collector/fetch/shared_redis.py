"""Async Redis clients for the fetch engine's shared state: circuit breakers and rate limits.

The frontier and the dead-letter store talk to Redis through :mod:`collector._redis`
(synchronous redis-py). The engine's shared state lives on the event loop, so it needs
``redis.asyncio`` clients; this module gives them the same settings and the same rule about a
Redis restart, so all of Collector's Redis clients behave alike:

* the same connect timeout and health-check interval as :mod:`collector._redis`, and a reply
  timeout of :data:`SOCKET_TIMEOUT_S` (their scripts touch one key: a server that takes longer
  is in trouble);
* **no replay inside redis-py** (``Retry(NoBackoff(), 0)``: redis.asyncio's default retries a
  command whose reply was lost three times). Each caller decides what a failed call means, with
  the same backoff as :mod:`collector._redis` between its tries (:func:`backoff`):
  the circuit store answers from the worker's own state at once and tries Redis again after
  the backoff (:class:`~collector.fetch.circuit.RedisCircuitStore`); the rate limiter waits for
  Redis, up to ``COLLECTOR_REDIS_RECONNECT_S``, as the frontier does
  (:class:`~collector.fetch.ratelimit.LimitsRateLimiter`).

:data:`REDIS_DOWN` is what a call raises when the server is down, restarting or still loading
its data (``LOADING`` is a :class:`~redis.exceptions.ConnectionError` in redis-py).
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# One backoff for every Redis client of Collector (the numbers are collector._redis's).
from collector._redis import CONNECT_TIMEOUT_S, HEALTH_CHECK_INTERVAL_S, backoff

__all__ = ["REDIS_DOWN", "SOCKET_TIMEOUT_S", "backoff", "client_options"]

# Longest wait for one reply of a breaker or limiter script (a few keys, microseconds of work).
SOCKET_TIMEOUT_S = 5.0

REDIS_DOWN: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError, OSError)


def client_options() -> dict[str, Any]:
    """Keyword arguments for ``redis.asyncio.Redis.from_url`` (also what ``limits`` passes on)."""
    return {
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "socket_timeout": SOCKET_TIMEOUT_S,
        "health_check_interval": HEALTH_CHECK_INTERVAL_S,
        "retry": Retry(NoBackoff(), 0),  # the caller decides; nothing is sent twice here
    }
