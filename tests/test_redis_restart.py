"""A Redis restart is ridden out: calls wait for the server (collector._redis), none runs twice.

A real redis-server with an append-only file is stopped and started again on the same port
while the frontier and the dead-letter store are in use; calls made while it is down wait for
it and then run once (their scripts loaded again: the restarted server forgot them). A server
that stays down fails the call after ``COLLECTOR_REDIS_RECONNECT_S`` with one line.

A call in flight when the server goes away is sent again: tests/redis_proxy.py stops the server
just after it ran a chosen script and never hands its reply over (or just before it reaches the
server). The claim, the ack and the dead-letter put are sent again with their request id and
run once; so does a whole run of the demo source that loses three replies this way.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from collector import _redis
from collector._redis import Scripts, script_text
from collector.config import load_source
from collector.deadletter.base import DeadLetter
from collector.deadletter.redis import RedisDeadLetterStore
from collector.demo.scenario import EXPECTED, write_demo_source
from collector.demo.site import FaultSite
from collector.errors import BackendError
from collector.frontier import Completed, Offer
from collector.frontier.redis import RedisFrontier
from flows.collect import collect
from tests.helpers import duplicate_keys, sink_lines, summary_of
from tests.redis_proxy import ReplyLoser
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


# --- calls whose reply was lost ------------------------------------------------------------------
def _sha(package: str, name: str) -> str:
    return hashlib.sha1(script_text(package, "prelude", name).encode()).hexdigest()


FRONTIER, DEAD_LETTERS = "collector.frontier", "collector.deadletter"


@pytest.mark.parametrize("ran", [True, False], ids=["ran", "never-ran"])
def test_a_claim_an_ack_and_a_put_whose_replies_were_lost_are_sent_again_and_run_once(
    server: RedisServer, tmp_path: Path, ran: bool
) -> None:
    with ReplyLoser(server) as relay:
        frontier = RedisFrontier(relay.url)
        store = RedisDeadLetterStore(relay.url, archive=tmp_path / "dl.jsonl")
        try:
            now = time.time()
            frontier.offer(SOURCE, [Offer(u, 60) for u in URLS], now=now, queue_ttl_s=600,
                           rank_for=lambda *a: 1.0, run_id="r")  # fmt: skip

            relay.lose(_sha(FRONTIER, "claim"), ran=ran)
            lease = frontier.claim(SOURCE, 10, now=now, lease_s=600)
            assert len(lease.items) == 10
            counts = frontier.counts(SOURCE)
            assert (counts.leased, counts.queued) == (10, 20)  # one batch leased, not two

            relay.lose(_sha(FRONTIER, "ack"), ran=ran)
            acked = frontier.ack(
                lease, [Completed(i.url, now + 3600, now) for i in lease.items], now=now
            )
            assert acked.accepted == 10 and acked.stale == []  # none found stale by a rerun
            counts = frontier.counts(SOURCE)
            assert (counts.done, counts.leased, counts.queued) == (10, 0, 20)

            relay.lose(_sha(DEAD_LETTERS, "put"), ran=ran)
            assert store.put([_letter(URLS[-1])]) == 1  # new, as the first run said
            assert store.counts(SOURCE)["open"] == 1
        finally:
            frontier.close()
            store.close()
        relay.wait()
    assert len(relay.lost) == 3  # each call met a server that went away
    client = redis.Redis.from_url(server.url)
    try:
        assert client.xlen("collector:dl:events") == 1  # quarantined once
        assert client.get("collector:fencing_token") == b"1"  # one claim took a token
    finally:
        client.close()
    assert len((tmp_path / "dl.jsonl").read_text().splitlines()) == 1  # archived once


def test_a_script_that_is_not_replayed_still_fails_in_one_line_when_its_reply_is_lost(
    server: RedisServer,
) -> None:
    """Sent once, as before, when the backend does not say it may be sent again."""
    with ReplyLoser(server) as relay:
        client = _redis.connect(relay.url, what="test")
        try:
            client.ping()
            scripts = Scripts(client, FRONTIER, ["counts"], prelude="prelude")
            relay.lose(_sha(FRONTIER, "counts"))
            with pytest.raises(redis.ConnectionError):
                scripts("counts", ["{collector:src}"], [""])
            assert scripts("counts", ["{collector:src}"], [""]) == []  # the next call waits
        finally:
            client.close()
        relay.wait()


def test_a_replayed_call_is_not_sent_again_once_its_record_may_be_gone(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wait so long that a resend could come after the record expired (REPLAY_S): the call
    fails as it did before replays, in one line; a read is still sent again."""
    monkeypatch.setenv("COLLECTOR_REDIS_RECONNECT_S", str(_redis.REPLAY_S // 2))
    with ReplyLoser(server) as relay:
        frontier = RedisFrontier(relay.url)
        try:
            now = time.time()
            frontier.offer(SOURCE, [Offer(u, 60) for u in URLS], now=now, queue_ttl_s=600,
                           rank_for=lambda *a: 1.0, run_id="r")  # fmt: skip
            relay.lose(_sha(FRONTIER, "claim"))
            with pytest.raises(BackendError) as caught:
                frontier.claim(SOURCE, 10, now=now, lease_s=600)
            assert str(caught.value).startswith(f"frontier {relay.url}: claim failed: ")
            relay.wait()
            relay.lose(_sha(FRONTIER, "counts"))
            assert frontier.counts(SOURCE).leased == 10  # the claim ran; the read is sent again
        finally:
            frontier.close()
        relay.wait()


async def test_a_run_whose_redis_loses_replies_mid_run_ends_balanced(
    tmp_path: Path, site: FaultSite, server: RedisServer, prefect_api: str
) -> None:
    """The demo source on the Redis frontier and dead-letter store, through a relay that stops
    Redis (append-only file) right after it ran the run's 2nd claim, its 2nd ack and its 1st
    dead-letter put, and loses each reply: every item ends in its one expected state."""
    with ReplyLoser(server) as relay:
        source_path = write_demo_source(tmp_path, site.base_url)
        text = source_path.read_text(encoding="utf-8")
        source_path.write_text(
            text
            + f"frontier: {{type: redis, url: '{relay.url}'}}\n"
            + f"deadletters: {{type: redis, url: '{relay.url}'}}\n",
            encoding="utf-8",
        )
        relay.lose(_sha(FRONTIER, "claim"), nth=2)
        relay.lose(_sha(FRONTIER, "ack"), nth=2)
        relay.lose(_sha(DEAD_LETTERS, "put"), nth=1)
        summary = summary_of(await collect(source=str(source_path), batch_size=40))
        relay.wait()

    assert len(relay.lost) == 3, relay.lost
    assert {name: summary[name] for name in EXPECTED} == EXPECTED
    assert summary["balanced"], summary
    rows = sink_lines(tmp_path / "out")
    assert len(rows) == EXPECTED["stored"] and duplicate_keys(rows) == []
    source = load_source(source_path)
    frontier = RedisFrontier(server.url)
    store = RedisDeadLetterStore(server.url)
    try:
        counts = frontier.counts(source.name)
        assert (counts.queued, counts.leased, counts.dead) == (0, 0, EXPECTED["dead_lettered"])
        assert store.counts(source.name)["open"] == EXPECTED["dead_lettered"]
    finally:
        frontier.close()
        store.close()
    archive = source.deadletter_archive_path.read_text(encoding="utf-8").splitlines()
    assert len(archive) == EXPECTED["dead_lettered"]  # each dead letter archived once
