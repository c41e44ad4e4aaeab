"""Redis frontier: the conformance suite, a differential run against SQLite, and what only Redis
has (several connections, an unreachable or restarting server, round trips per step)."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable, Iterator, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import redis

from collector._redis import REPLAY_LUA, Scripts, lua_source
from collector.errors import BackendError
from collector.frontier.base import (
    Completed,
    DeadLettered,
    Frontier,
    Lease,
    Offer,
    Outcome,
    RetryLater,
    StateCounts,
)
from collector.frontier.redis import _REPLAYED, _SCRIPTS, RedisFrontier
from collector.frontier.sqlite import SqliteFrontier
from tests.servers import RedisServer, free_port

from .conformance import (
    FRESH,
    LEASE,
    QUEUE_TTL,
    SRC,
    T0,
    FrontierConformance,
    claim,
    offer,
    url,
    urls_of,
)


class TestRedisFrontier(FrontierConformance):
    @pytest.fixture
    def frontier(self, redis_url: str) -> Iterator[Frontier]:
        f = RedisFrontier(redis_url)
        yield f
        f.close()

    @pytest.fixture
    def reopen(self, redis_url: str) -> Callable[[], Frontier]:
        return lambda: RedisFrontier(redis_url)  # a new client: what a restarted worker opens


@pytest.fixture
def frontier(redis_url: str) -> Iterator[RedisFrontier]:
    f = RedisFrontier(redis_url)
    yield f
    f.close()


# --- the same calls give the same results as SQLite --------------------------------------------
_OPS = (
    *("offer", "offer", "claim", "claim", "ack", "ack", "renew", "release", "requeue"),
    *("sweep", "adopt", "make_stale", "unlist"),
)


def _differential(redis_url: str, seed: int, steps: int, page: int = 2_000) -> None:
    rng = random.Random(seed)
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    client.close()
    ours, ref = RedisFrontier(redis_url, page=page), SqliteFrontier(":memory:")
    pool = [url(i) for i in range(12)]
    base_rank = {u: float(rng.choice([1, 2, 2, 3])) for u in pool}  # ties on purpose

    def rank_for(u: str, age: float | None, fresh_s: float) -> float:
        return base_rank[u] + (0.0 if age is None else age / 1_000.0)

    now = T0
    leases: list[Lease] = []
    try:
        for step in range(steps):
            got: Any
            want: Any
            source = rng.choice(["a", "a", "b"])
            op = rng.choice(_OPS)
            if op == "offer":
                picks = [rng.choice(pool) for _ in range(rng.randint(0, 6))]
                offers = [Offer(u, FRESH) for u in picks]
                kwargs: dict[str, Any] = dict(
                    now=now,
                    queue_ttl_s=rng.choice([40.0, 400.0, QUEUE_TTL]),
                    rank_for=rank_for,
                    run_id=rng.choice(["r1", "r2", "r3"]),
                    once_per_run=rng.random() < 0.5,
                )
                got, want = (
                    ours.offer(source, offers, **kwargs),
                    ref.offer(source, offers, **kwargs),
                )
            elif op == "claim":
                limit, lease_s = rng.randint(0, 5), rng.choice([10.0, LEASE])
                got = ours.claim(source, limit, now=now, lease_s=lease_s)
                want = ref.claim(source, limit, now=now, lease_s=lease_s)
                if got.items:
                    leases.append(got)
            elif op in ("ack", "renew", "release") and leases:
                lease = rng.choice(leases)
                if op == "ack":
                    outcomes: list[Outcome] = []
                    targets = [i.url for i in lease.items if rng.random() < 0.7]
                    targets += rng.sample(pool, rng.randint(0, 1))  # not (or no longer) ours
                    for u in targets:
                        kind = rng.choice(["done", "retry", "dead"])
                        if kind == "done":
                            outcomes.append(
                                Completed(u, now + rng.choice([0, 30, 300]), now, rng.random())
                            )
                        elif kind == "retry":
                            nb = now + rng.choice([-5.0, 0.0, 7.5, 30.0])
                            outcomes.append(
                                RetryLater(u, nb, rng.uniform(-1, 5), rng.randint(1, 4), now, "e")
                            )
                        else:
                            outcomes.append(DeadLettered(u, rng.randint(1, 4), "gone"))
                    got, want = (
                        ours.ack(lease, outcomes, now=now),
                        ref.ack(lease, outcomes, now=now),
                    )
                elif op == "renew":
                    lease_s = rng.choice([5.0, 60.0])
                    got = ours.renew(lease, now=now, lease_s=lease_s)
                    want = ref.renew(lease, now=now, lease_s=lease_s)
                else:
                    got, want = ours.release(lease, now=now), ref.release(lease, now=now)
            elif op == "requeue":
                picks = rng.sample(pool, rng.randint(1, 4))
                got = ours.requeue(source, picks, now=now, queue_ttl_s=100.0)
                want = ref.requeue(source, picks, now=now, queue_ttl_s=100.0)
            elif op == "sweep":
                run, retire = rng.choice(["r1", "r2", "r3"]), rng.random() < 0.5
                got = ours.sweep(source, run, retire=retire)
                want = ref.sweep(source, run, retire=retire)
            elif op == "adopt":
                adopt: dict[str, Any] = dict(
                    now=now,
                    queue_ttl_s=rng.choice([40.0, QUEUE_TTL]),
                    rank_for=rank_for,
                    fresh_for=lambda u: FRESH,
                )
                run = rng.choice(["r1", "r2", "r3"])
                got = ours.adopt(source, run, **adopt)
                want = ref.adopt(source, run, **adopt)
            elif op == "unlist":
                run, retire = rng.choice(["r1", "r2", "r3"]), rng.random() < 0.5
                picks = rng.sample(pool, rng.randint(1, 5))
                got = ours.unlist(source, picks, run, retire=retire)
                want = ref.unlist(source, picks, run, retire=retire)
            elif op == "make_stale":
                picks = rng.sample(pool, rng.randint(1, 3))
                got, want = ours.make_stale(source, picks), ref.make_stale(source, picks)
            else:
                got = want = None
            assert got == want, (seed, step, op)
            for s in ("a", "b"):
                assert ours.counts(s) == ref.counts(s), (seed, step, s)
                assert ours.next_event_at(s, now=now) == ref.next_event_at(s, now=now), (seed, step)
                for run in ("r1", "r2", "r3"):
                    assert ours.run_counts(s, run) == ref.run_counts(s, run), (seed, step, run)
            # time mostly moves on, sometimes a worker's clock is a little behind
            now += rng.choice([0.0, 0.5, 3.0, 8.0, 20.0, 45.0, -2.0])
    finally:
        ours.close()
        ref.close()


@pytest.mark.parametrize("seed", range(12))
def test_same_results_as_sqlite(redis_url: str, seed: int) -> None:
    _differential(redis_url, seed, 250)


@pytest.mark.parametrize("seed", range(100, 106))
def test_same_results_as_sqlite_when_adopt_and_sweep_read_two_members_a_page(
    redis_url: str, seed: int
) -> None:
    _differential(redis_url, seed, 250, page=2)


# --- several connections ---------------------------------------------------------------------
URL_COUNT = 600


def test_two_frontiers_in_two_threads_never_share_a_url(redis_url: str) -> None:
    seed = RedisFrontier(redis_url)
    offer(seed, [url(i) for i in range(URL_COUNT)], now=T0 - 1)
    seed.close()
    barrier = threading.Barrier(2)
    results: dict[int, list[tuple[int, list[str]]]] = {}
    errors: list[BaseException] = []

    def run(n: int) -> None:
        f = RedisFrontier(redis_url)
        try:
            barrier.wait()
            claims: list[tuple[int, list[str]]] = []
            while True:
                lease = f.claim(SRC, 7, now=T0, lease_s=1e6)
                claims.append((lease.token, [i.url for i in lease.items]))
                if not lease.items:
                    break
                if len(claims) % 2:
                    outcomes = [Completed(i.url, T0 + 1e6, T0) for i in lease.items]
                    assert f.ack(lease, outcomes, now=T0).accepted == len(outcomes)
            results[n] = claims
        except BaseException as exc:
            errors.append(exc)
        finally:
            f.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    claimed = [u for claims in results.values() for _, urls in claims for u in urls]
    assert len(claimed) == len(set(claimed)) == URL_COUNT
    tokens = [token for claims in results.values() for token, _ in claims]
    assert len(tokens) == len(set(tokens)), "a fencing token was handed out twice"
    for claims in results.values():
        assert all(a < b for a, b in pairwise(token for token, _ in claims))
    f = RedisFrontier(redis_url)
    try:
        total = f.counts(SRC)
        assert (total.total, total.queued) == (URL_COUNT, 0)
        assert claim(f, now=T0).token > max(tokens)
    finally:
        f.close()


def test_one_frontier_shared_by_threads_claims_without_false_alarms(
    frontier: RedisFrontier,
) -> None:
    """Concurrent claims of one object may finish out of order; that is not a lost counter."""
    offer(frontier, [url(i) for i in range(400)], now=T0 - 1)
    tokens: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for _ in range(50):
                tokens.append(frontier.claim(SRC, 2, now=T0, lease_s=1e6).token)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert sorted(tokens) == list(range(1, 201))
    assert frontier.counts(SRC) == StateCounts(leased=400)


def test_concurrent_offers_queue_each_url_once(redis_url: str) -> None:
    urls = [url(i) for i in range(2_000)]
    barrier = threading.Barrier(3)
    enqueued: list[int] = []
    errors: list[BaseException] = []

    def run(n: int) -> None:
        f = RedisFrontier(redis_url)
        try:
            mine = urls[n * 100 :] + urls[: n * 100]  # overlapping chunks, different order
            barrier.wait()
            result = offer(f, mine, run_id=f"r{n}")
            assert result.total == len(urls)
            enqueued.append(result.enqueued)
        except BaseException as exc:
            errors.append(exc)
        finally:
            f.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert sum(enqueued) == len(urls)
    f = RedisFrontier(redis_url)
    try:
        assert f.counts(SRC) == StateCounts(queued=len(urls))
        assert sum(f.run_counts(SRC, f"r{n}").queued for n in range(3)) == len(urls)
    finally:
        f.close()


def test_offer_decides_again_when_a_record_changes_after_it_was_read(
    frontier: RedisFrontier, redis_url: str
) -> None:
    """The optimistic path: between the read and the write another worker claims the URL."""
    offer(frontier, [url(1)], queue_ttl_s=10)
    assert claim(frontier, now=T0 + 20).expired == 1  # expired: a re-offer would queue it
    other = RedisFrontier(redis_url)
    real = frontier._run
    interfered: list[Lease] = []

    def run(what: str, name: str, source: str, args: Any) -> Any:
        reply = real(what, name, source, args)
        if name == "offer_read" and not interfered:
            offer(other, [url(1)], now=T0 + 21)  # the other worker queues and claims it first
            interfered.append(claim(other, now=T0 + 21))
        return reply

    frontier._run = run  # type: ignore[method-assign]  # a race at a chosen step
    try:
        result = offer(frontier, [url(1)], now=T0 + 22, run_id="late")
    finally:
        other.close()
    assert [i.url for i in interfered[0].items] == [url(1)]
    assert (result.enqueued, result.already_queued) == (0, 1)
    assert frontier.counts(SRC) == StateCounts(leased=1)
    assert frontier.run_counts(SRC, "late") == StateCounts(leased=1)
    assert frontier.run_counts(SRC, "run-1") == StateCounts()


# --- round trips -------------------------------------------------------------------------------
def _count_commands(f: RedisFrontier) -> list[str]:
    sent: list[str] = []
    client = f._client
    real: Callable[..., Any] = client.execute_command

    def execute_command(*args: Any, **options: Any) -> Any:
        sent.append(str(args[0]).upper())
        return real(*args, **options)

    client.execute_command = execute_command  # type: ignore[method-assign]  # records commands
    return sent


def _evalsha_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def test_claim_and_ack_of_500_are_one_round_trip_each(
    frontier: RedisFrontier, redis_url: str
) -> None:
    offer(frontier, [url(i) for i in range(600)], now=T0 - 1)
    watcher = redis.Redis.from_url(redis_url)
    sent = _count_commands(frontier)
    try:
        before = _evalsha_calls(watcher)
        lease = claim(frontier, 500)
        assert len(lease.items) == 500
        assert sent == ["EVALSHA"]
        assert _evalsha_calls(watcher) == before + 1
        outcomes: list[Outcome] = [Completed(i.url, T0 + 10, T0) for i in lease.items[:300]]
        outcomes += [RetryLater(i.url, T0 + 5, 1.0, 1, T0, "x") for i in lease.items[300:450]]
        outcomes += [DeadLettered(i.url, 3, "http_404") for i in lease.items[450:]]
        assert frontier.ack(lease, outcomes, now=T0).accepted == 500
        assert sent == ["EVALSHA", "EVALSHA"]
        assert _evalsha_calls(watcher) == before + 2
        assert frontier.counts(SRC) == StateCounts(queued=250, done=300, dead=50)
    finally:
        watcher.close()


def test_offer_is_two_round_trips_per_chunk(frontier: RedisFrontier) -> None:
    sent = _count_commands(frontier)
    assert offer(frontier, [url(i) for i in range(1_200)]).enqueued == 1_200
    assert sent == ["EVALSHA"] * 6  # three chunks of <= 500: read + apply each


# --- failures ----------------------------------------------------------------------------------
def test_unreachable_server_fails_at_construction() -> None:
    where = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(BackendError) as caught:
        RedisFrontier(where)
    message = str(caught.value)
    assert message.startswith(f"frontier {where}: cannot connect: ")
    assert "\n" not in message
    assert isinstance(caught.value.__cause__, redis.exceptions.ConnectionError)


def test_password_is_not_in_the_message() -> None:
    port = free_port()
    with pytest.raises(BackendError) as caught:
        RedisFrontier(f"redis://user:s3cret-pw@127.0.0.1:{port}/2")
    assert "s3cret-pw" not in str(caught.value)
    assert f"redis://user:[redacted]@127.0.0.1:{port}/2" in str(caught.value)


def test_invalid_url_is_a_backend_error() -> None:
    with pytest.raises(BackendError, match="invalid Redis URL"):
        RedisFrontier("http://127.0.0.1:1/0")


def test_server_restart_mid_use_is_a_backend_error_or_recovers(
    redis_server: RedisServer, redis_url: str
) -> None:
    f = RedisFrontier(redis_url)
    try:
        offer(f, [url(i) for i in range(10)])
        lease = claim(f, 5)
        redis_server.restart()  # no persistence: the data and the fencing counter are gone
        # the counter started again at 1: a claim must not hand out an old token silently
        with pytest.raises(BackendError) as caught:
            claim(f, 5, now=T0 + 1)
        message = str(caught.value)
        assert message.startswith(f"frontier {redis_url}: claim failed: fencing token went back")
        assert "\n" not in message
        for step in (
            lambda: f.ack(lease, [Completed(lease.items[0].url, T0 + 10, T0)], now=T0 + 1),
            lambda: f.counts(SRC),
            lambda: offer(f, [url(1)], now=T0 + 2),
        ):
            try:
                step()  # reconnects and reloads its scripts, or says why not
            except BackendError as exc:
                assert str(exc).startswith(f"frontier {redis_url}: ")
                assert "\n" not in str(exc)
            except redis.exceptions.RedisError as exc:  # pragma: no cover - the failure we test
                pytest.fail(f"raw redis error escaped: {exc!r}")
        assert offer(f, [url(99)], now=T0 + 3).total == 1
        assert f.counts(SRC).queued >= 1
        # a new frontier object starts from what the store says
        fresh = RedisFrontier(redis_url)
        assert claim(fresh, now=T0 + 4).items
        fresh.close()
    finally:
        f.close()
        client = redis.Redis.from_url(redis_server.url)
        client.flushdb()
        client.close()


def test_stopped_server_is_a_backend_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # a stopped server is one line after the reconnect window; 1 s instead of 30 per call
    monkeypatch.setenv("COLLECTOR_REDIS_RECONNECT_S", "1")
    with RedisServer() as own:
        f = RedisFrontier(own.url)
        offer(f, [url(1)])
        own.stop()
        try:
            for what, step in (
                ("claim", lambda: claim(f)),
                ("counts", lambda: f.counts(SRC)),
                ("offer", lambda: offer(f, [url(2)])),
            ):
                with pytest.raises(BackendError) as caught:
                    step()
                assert str(caught.value).startswith(f"frontier {own.url}: {what} failed: ")
                assert "\n" not in str(caught.value)
                assert isinstance(caught.value.__cause__, redis.exceptions.ConnectionError)
        finally:
            f.close()


# --- clients and keys --------------------------------------------------------------------------
def test_a_given_client_is_used_and_left_open(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        f = RedisFrontier(client, prefix="other")
        offer(f, [url(1)])
        f.close()
        assert client.ping()
        assert client.exists("{other:src}:q") == 1
        assert client.get("other:fencing_token") is None  # no claim yet
        assert RedisFrontier(client).counts(SRC) == StateCounts()  # prefixes are apart
    finally:
        client.close()


def test_keys_of_a_source_share_one_hash_tag(frontier: RedisFrontier, redis_url: str) -> None:
    offer(frontier, [url(i) for i in range(20)], queue_ttl_s=100, run_id="r")
    lease = claim(frontier, 10)
    frontier.ack(lease, [RetryLater(lease.items[0].url, T0 + 50, 1.0, 1, T0, "x")], now=T0)
    client = redis.Redis.from_url(redis_url)
    try:
        keys = sorted(k.decode() if isinstance(k, bytes) else k for k in client.keys("*"))
    finally:
        client.close()
    assert "collector:fencing_token" in keys
    assert all(k.startswith("{collector:src}:") for k in keys if k != "collector:fencing_token")


def test_large_offer_spans_chunks_and_tags_every_url(frontier: RedisFrontier) -> None:
    urls = [url(i) for i in range(1_234)]
    assert offer(frontier, urls).enqueued == 1_234
    again = frontier.offer(
        SRC,
        (Offer(u, FRESH) for u in urls),
        now=T0 + 1,
        queue_ttl_s=100,
        rank_for=lambda u, age, fresh: 1.0,
        run_id="r2",
    )
    assert again.already_queued == 1_234
    assert frontier.run_counts(SRC, "r2").queued == 1_234
    assert frontier.run_counts(SRC, "run-1") == StateCounts()


def test_times_round_trip_exactly(frontier: RedisFrontier) -> None:
    odd = T0 + 0.1 + 1e-7
    offer(frontier, [url(1)], now=odd)
    lease = claim(frontier, now=odd + 1 / 3, lease_s=1 / 7)
    assert lease.items[0].enqueued_at == odd
    assert lease.expires_at == odd + 1 / 3 + 1 / 7
    first = odd + 2 / 3
    frontier.ack(lease, [RetryLater(url(1), first, 1.0, 1, first, "x")], now=odd)
    assert frontier.next_event_at(SRC, now=odd) == first
    (item,) = claim(frontier, now=first).items
    assert item.first_attempt_at == first


def test_unusual_urls_and_errors_round_trip(frontier: RedisFrontier, redis_url: str) -> None:
    """URLs and errors travel inside JSON both ways: quotes, escapes, non-ASCII, control chars."""
    odd = [url('a"b'), url("c\\d"), url("é/ü?q=ß"), url("😀"), url("tab\there"), url("nl\nx")]
    assert offer(frontier, odd).enqueued == len(odd)
    lease = claim(frontier, 10)
    assert sorted(i.url for i in lease.items) == sorted(odd)
    error = 'boom "quoted" \\ 😀\nsecond line'
    retries = [RetryLater(u, T0, 1.0, 1, T0, error) for u in odd]
    assert frontier.ack(lease, retries, now=T0).accepted == len(odd)
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.hget("{collector:src}:err", odd[3]) == error.encode()
    finally:
        client.close()
    again = claim(frontier, 10, now=T0 + 1)
    assert sorted(i.url for i in again.items) == sorted(odd)
    done = [Completed(u, T0 + 100, T0 + 1) for u in odd]
    assert frontier.ack(again, done, now=T0 + 1).accepted == len(odd)
    assert offer(frontier, odd, now=T0 + 2).fresh_skipped == len(odd)


# --- adopt and sweep of a large leftover queue, a page at a time ---------------------------------
def test_adopt_and_sweep_read_a_large_queue_a_page_per_script(redis_url: str) -> None:
    frontier = RedisFrontier(redis_url, page=10)
    try:
        offer(frontier, [url(i) for i in range(95)], run_id="r1")
        sent = _count_commands(frontier)
        adopted = frontier.adopt(
            SRC, "r2", now=T0, queue_ttl_s=QUEUE_TTL, rank_for=lambda *_: 1.0,
            fresh_for=lambda _: FRESH,
        )  # fmt: skip
        assert adopted.already_queued == 95
        assert sent.count("EVALSHA") >= 10 + 1  # ten pages of tags, then the due read
        assert frontier.run_counts(SRC, "r2") == StateCounts(queued=95)
        sent.clear()
        offer(frontier, [url(i) for i in range(40)], run_id="r3")  # 55 are no longer listed
        sent.clear()
        assert frontier.sweep(SRC, "r3", retire=True).retired == 55
        assert sent.count("EVALSHA") >= 6
        assert frontier.run_counts(SRC, "r3") == StateCounts(queued=40, retired=55)
    finally:
        frontier.close()


def _untagged(frontier: RedisFrontier, run_id: str) -> int:
    """Queued and leased items of SRC not tagged with run_id (the frontier's own counts)."""
    everyone, ours = frontier.counts(SRC), frontier.run_counts(SRC, run_id)
    return everyone.queued + everyone.leased - ours.queued - ours.leased


@pytest.mark.parametrize("script", ["adopt_tag", "sweep"])
def test_claims_between_pages_leave_no_item_out_of_the_run(redis_url: str, script: str) -> None:
    """A helper claims and acks between the pages of an adopt or a sweep: the walk by position
    passes over some items, goes round again, and ends with every queued or leased item the
    run's, each counted once."""
    frontier, helper = RedisFrontier(redis_url, page=10), RedisFrontier(redis_url)
    try:
        ranks = {url(i): float(100 - i) for i in range(60)}
        offer(frontier, list(ranks), run_id="r1", rank_for=lambda u, *_: ranks[u])
        args = ["r2"] if script == "adopt_tag" else ["r2", "1"]
        pages = frontier._tag_pages(script, SRC, args)
        counted = [next(pages)]  # the first 10 by rank are the run's now
        assert _untagged(frontier, "r2") == 50
        # the helper leases 20 from the head of the queue: to the set of leased items, which
        # the walk has read already (and, adopting, the queue's positions shift under it)
        held = helper.claim(SRC, 20, now=T0, lease_s=LEASE, holder="helper")
        counted.append(next(pages))
        # five more are leased and acked done before the walk reaches them: not the run's
        gone = helper.claim(SRC, 5, now=T0, lease_s=LEASE, holder="helper")
        helper.ack(gone, [Completed(i.url, T0 + FRESH, T0) for i in gone.items], now=T0)
        counted += list(pages)
        assert len(counted) >= 6  # 55 in pages of 10, and a second round for the 20 leased
        assert _untagged(frontier, "r2") == 0
        tally = [sum(c) for c in zip(*counted, strict=True)]
        mine = frontier.run_counts(SRC, "r2")
        assert sum(tally) == mine.total == 55
        if script == "sweep":  # 10 retired, then 20 leased (carried), then 25 retired
            assert tally == [20, 35]
            assert mine == StateCounts(leased=20, retired=35)
        else:
            assert mine == StateCounts(queued=35, leased=20)
        assert helper.release(held, now=T0) == 20  # the helper gives them back: the run's still
        assert frontier.run_counts(SRC, "r2").total == 55
        assert frontier.counts(SRC).done == 5
        assert frontier.run_counts(SRC, "r1") == StateCounts(done=5)
    finally:
        helper.close()
        frontier.close()


# --- expiry lists: urls packed, the previous layout still read ----------------------------------
def _expiry_entries(client: redis.Redis) -> list[Any]:
    """Every entry of the source's expiry lists (B:x:T)."""
    keys = client.keys("{collector:src}:x:*")
    return [e for k in keys for e in client.lrange(k, 0, -1)]


def test_expiry_lists_pack_urls_and_every_one_expires(
    frontier: RedisFrontier, redis_url: str
) -> None:
    """URLs that share a prefix longer than a byte can say, rests over 255 bytes, URLs that are
    prefixes of others, control characters and non-ASCII, over more than one packed entry: each
    one comes out of its list and expires."""
    long = "https://example.test/" + "p" * 300
    odd = [
        long,
        long + "/a",
        long + "/b" + "r" * 70_000,
        url(""),
        url("nl\nx\x00y"),
        url("é/😀"),
        "x",
        "",
    ]
    many = [url(i) for i in range(2_345)]
    assert offer(frontier, odd + many, queue_ttl_s=100).enqueued == len(odd) + len(many)
    client = redis.Redis.from_url(redis_url)
    try:
        entries = _expiry_entries(client)
    finally:
        client.close()
    assert 3 <= len(entries) <= 10  # packed: a few entries, not one per url
    lease = claim(frontier, 1, now=T0 + 100)
    assert lease.expired == len(odd) + len(many)
    assert frontier.counts(SRC) == StateCounts(expired=len(odd) + len(many))
    again = frontier.requeue(SRC, odd, now=T0 + 200, queue_ttl_s=100)
    assert again == len(odd)
    assert claim(frontier, 1, now=T0 + 300).expired == len(odd)


def test_an_expiry_list_costs_a_few_bytes_a_url(frontier: RedisFrontier, redis_url: str) -> None:
    """The expiry list held each url whole (~39 bytes for these); packed, it is a few bytes."""
    n = 20_000
    offer(frontier, [f"http://127.0.0.1:9/items/{i}.json" for i in range(n)], queue_ttl_s=100)
    client = redis.Redis.from_url(redis_url)
    try:
        (key,) = client.keys("{collector:src}:x:*")
        used = client.memory_usage(key, samples=0)
    finally:
        client.close()
    assert used is not None
    assert used / n < 12


def test_expiry_lists_of_the_previous_layout_still_expire(
    frontier: RedisFrontier, redis_url: str
) -> None:
    """Layout 1 pushed each url as an entry of its own; a frontier written so keeps working: its
    items expire on time, beside entries packed since."""
    old = [url(i) for i in range(30)]
    offer(frontier, old, queue_ttl_s=100)
    client = redis.Redis.from_url(redis_url)
    try:
        (key,) = client.keys("{collector:src}:x:*")
        client.delete(key)
        client.rpush(key, *old)  # exactly what layout 1's claim found there
        offer(frontier, [url("new")], queue_ttl_s=100, run_id="run-2")
        assert client.llen(key) == len(old) + 1
    finally:
        client.close()
    assert claim(frontier, 0, now=T0 + 99).expired == 0
    lease = claim(frontier, 1, now=T0 + 100)
    assert lease.expired == len(old) + 1
    assert frontier.counts(SRC) == StateCounts(expired=len(old) + 1)


def test_records_of_every_state_stay_within_a_listpack_value(
    frontier: RedisFrontier, redis_url: str
) -> None:
    """A bucket holding one value over 64 bytes (Redis' hash-max-listpack-value) becomes a
    hashtable for good, ~90 bytes a record instead of ~40: a done item with a cost, a retried
    item leased again, a dead one all fit (holes in a record are packed as an array's)."""
    first = T0 + 1 / 3  # times and ranks of many digits: msgpack doubles, 9 bytes each
    offer(frontier, [url(1), url(2), url(3)], now=first, rank_for=lambda u, age, fresh: 1 / 7)
    lease = claim(frontier, 3, now=first)
    outcomes: list[Outcome] = [
        Completed(url(1), first + 86_400, first, cost=1 / 3),
        RetryLater(url(2), first, -T0 / 7, 2, first, "boom"),
        DeadLettered(url(3), 3, "dead"),
    ]
    frontier.ack(lease, outcomes, now=first)
    assert urls_of(claim(frontier, 3, now=first + 1)) == [url(2)]
    client = redis.Redis.from_url(redis_url)
    try:
        buckets = client.keys("{collector:src}:r:*")
        sizes = [client.hstrlen(b, f) for b in buckets for f in client.hkeys(b)]
        encodings = {client.object("encoding", b) for b in buckets}
    finally:
        client.close()
    assert len(sizes) == 3
    assert max(sizes) <= 64, sizes
    assert encodings == {b"listpack"}


# --- a frontier written by layout 1 (one url an expiry entry, records with holes as maps) -------
_LAYOUT_1 = Path(__file__).parent / "redis_layout1"  # its prelude and claim, verbatim
_PACKAGE = "collector.frontier"


class _Layout1Scripts(Scripts):
    """The scripts as layout 1 ran them: its prelude before every script, its claim."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._scripts = {}
        # layout 1's own scripts had no reply records: sent once, with the keys they expect
        self._replayed = frozenset(_REPLAYED) - {"claim"}
        self._resent = frozenset()
        # The current scripts read record fields by the names the current prelude gives them
        # (F_STATE: 1, ... the positions layout 1 used too): it goes first, and layout 1's
        # prelude after it redefines the helpers it had (its save writes maps, its expiry entries
        # are plain): the current scripts run on its helpers, with the current names.
        prelude = REPLAY_LUA + lua_source(_PACKAGE, None, "prelude") + "\n"
        prelude += (_LAYOUT_1 / "prelude.lua").read_text(encoding="utf-8")
        for name in _SCRIPTS:
            old = _LAYOUT_1 / f"{name}.lua"
            body = old.read_text("utf-8") if old.exists() else lua_source(_PACKAGE, None, name)
            self._scripts[name] = client.register_script(prelude + "\n" + body)

    def send(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        reply = super().send(name, keys, args)
        if name == "claim" and reply[3]:  # layout 1 kept no validators, no histories: none
            flat = json.loads(reply[3])
            items = [[*flat[i : i + 4], "", "", ""] for i in range(0, len(flat), 4)]
            reply = [*reply[:3], json.dumps([v for item in items for v in item])]
        return reply


def test_a_frontier_of_the_previous_layout_keeps_working(redis_url: str) -> None:
    """Layout 1 writes queued, leased, retried, done (with a cost) and dead items; the current
    scripts then claim, expire, ack and plan on that data with the same results as SQLite."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    old = RedisFrontier(client)
    old._scripts = _Layout1Scripts(client)
    new, ref = RedisFrontier(client), SqliteFrontier(":memory:")
    t = T0 + 1 / 3  # times and ranks of many digits: msgpack doubles

    def rank_for(u: str, age: float | None, fresh: float) -> float:
        return int(u.rsplit("/", 1)[1]) / 7 + (age or 0.0) / 1_000

    def both(step: Callable[[Frontier], Any], first: Frontier = old) -> Any:
        got, want = step(first), step(ref)
        assert got == want
        return got

    urls = [url(i) for i in range(40)]
    both(lambda f: f.offer(SRC, [Offer(u, FRESH) for u in urls], now=t, queue_ttl_s=100,
                           rank_for=rank_for, run_id="r1"))  # fmt: skip
    leases = {f: claim(f, 12, now=t) for f in (old, ref)}
    assert urls_of(leases[old]) == urls_of(leases[ref])

    def outcomes(lease: Lease) -> list[Outcome]:
        items = [i.url for i in lease.items]
        return [
            *(Completed(u, t + 50, t, cost=1 / 3) for u in items[:4]),
            *(RetryLater(u, t + 10, 1 / 9, 2, t, "boom") for u in items[4:8]),
            *(DeadLettered(u, 3, "dead") for u in items[8:10]),
        ]  # the last two stay leased

    assert old.ack(leases[old], outcomes(leases[old]), now=t) == ref.ack(
        leases[ref], outcomes(leases[ref]), now=t
    )
    entries = _expiry_entries(client)
    assert len(entries) == 40 + 4 and not any(e.startswith(b"\0") for e in entries)
    records = [v for b in client.keys("{collector:src}:r:*") for v in client.hvals(b)]
    maps = [v for v in records if isinstance(v, bytes) and v[0] & 0xF0 == 0x80]
    assert len(maps) == 4 + 4 + 2 + 2  # msgpack maps: done, retried, dead, leased
    # from here on, the current scripts (new) on layout 1's data
    both(lambda f: f.counts(SRC), new)
    later = t + LEASE + 1  # the leases expired: the two leased items are reclaimed
    got, want = claim(new, 3, now=later), claim(ref, 3, now=later)
    assert (urls_of(got), got.reclaimed, got.expired) == (urls_of(want), 2, 0)
    gone = t + 200  # past every queue TTL: the rest expires
    got, want = claim(new, 0, now=gone), claim(ref, 0, now=gone)
    assert got.expired == want.expired > 0
    both(lambda f: f.counts(SRC), new)
    again = gone + 100  # the done items are stale: a plan queues them with the rank of their age
    both(lambda f: f.offer(SRC, [Offer(u, FRESH) for u in urls], now=again, queue_ttl_s=100,
                           rank_for=rank_for, run_id="r2"), new)  # fmt: skip
    got, want = claim(new, 100, now=again), claim(ref, 100, now=again)
    assert urls_of(got) == urls_of(want)
    assert [i.enqueued_at for i in got.items] == [i.enqueued_at for i in want.items]
    both(lambda f: f.run_counts(SRC, "r2"), new)
    client.close()
