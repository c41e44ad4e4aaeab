"""A Redis restart is ridden out: calls wait for the server (collector._redis), none runs twice.

A real redis-server with an append-only file is stopped and started again on the same port
while the frontier and the dead-letter store are in use; calls made while it is down wait for
it and then run once (their scripts loaded again: the restarted server forgot them). A server
that stays down fails the call after ``COLLECTOR_REDIS_RECONNECT_S`` with one line.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from collector import _redis
from collector.deadletter.base import DeadLetter
from collector.deadletter.redis import RedisDeadLetterStore
from collector.errors import BackendError
from collector.frontier import Completed, Offer
from collector.frontier.redis import RedisFrontier
from tests.servers import RedisServer

SOURCE = "restart"
URLS = [f"http://example.test/items/{i}" for i in range(30)]


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer(persistent=True) as running:
        yield running


def _letter(url: str) -> DeadLetter:
    now = time.time()
    return DeadLetter(SOURCE, url, "fetch", "http_500", "server error", 3, now, now)


def test_calls_made_while_redis_restarts_wait_for_it_and_run_once(server: RedisServer) -> None:
    frontier = RedisFrontier(server.url)
    store = RedisDeadLetterStore(server.url)
    try:
        now = time.time()
        frontier.offer(SOURCE, [Offer(u, 60) for u in URLS], now=now, queue_ttl_s=600,
                       rank_for=lambda *a: 1.0, run_id="r")  # fmt: skip
        lease = frontier.claim(SOURCE, 10, now=now, lease_s=600)
        assert len(lease.items) == 10

        restarting = server.down_for(1.5)
        started = time.monotonic()
        acked = frontier.ack(  # sent while the server is down: waits, then runs once
            lease, [Completed(i.url, now + 3600, now) for i in lease.items], now=now
        )
        waited = time.monotonic() - started
        restarting.join()
        assert waited >= 1.0, "the ack did not meet the server down"
        assert acked.accepted == 10 and acked.stale == []  # ran once: none refused as stale

        restarting = server.down_for(1.0)
        assert store.put([_letter(URLS[-1])]) == 1  # the dead-letter store waits the same way
        restarting.join()

        # the pooled connections died with the old server: the next calls reconnect quietly
        server.restart()
        lease = frontier.claim(SOURCE, 100, now=now, lease_s=600)
        assert len(lease.items) == 20
        frontier.ack(lease, [Completed(i.url, now + 3600, now) for i in lease.items], now=now)
        counts = frontier.counts(SOURCE)
        assert (counts.done, counts.queued, counts.leased) == (30, 0, 0)
        assert store.counts(SOURCE)["open"] == 1
    finally:
        frontier.close()
        store.close()


def test_a_server_that_stays_down_fails_the_call_after_the_wait_in_one_line(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLLECTOR_REDIS_RECONNECT_S", "1.5")
    frontier = RedisFrontier(server.url)
    try:
        server.stop()
        started = time.monotonic()
        with pytest.raises(BackendError) as caught:
            frontier.counts(SOURCE)
        waited = time.monotonic() - started
    finally:
        frontier.close()
    assert 1.5 <= waited < 10, waited
    message = str(caught.value)
    assert message.startswith(f"frontier {server.url}: counts failed: ConnectionError: ")
    assert "\n" not in message


def test_the_wait_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _redis.reconnect_s() == _redis.RECONNECT_S == 30.0
    monkeypatch.setenv("COLLECTOR_REDIS_RECONNECT_S", "0")
    assert _redis.reconnect_s() == 0.0
    monkeypatch.setenv("COLLECTOR_REDIS_RECONNECT_S", "soon")
    with pytest.raises(BackendError, match="COLLECTOR_REDIS_RECONNECT_S='soon'"):
        _redis.reconnect_s()
