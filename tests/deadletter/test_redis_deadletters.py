"""Redis dead-letter store: the conformance suite, its event stream, the review queue, failures.

Runs against the session's own redis-server (``tests/servers.py``), never the machine's.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from collector.deadletter.base import DeadLetter, DeadLetterStore
from collector.deadletter.redis import REVIEW_GROUP, RedisDeadLetterStore
from collector.errors import BackendError
from tests.servers import RedisServer, free_port

from .conformance import T0, DeadLetterConformance, ReviewQueueConformance, letter


class TestRedisDeadLetterStore(DeadLetterConformance):
    @pytest.fixture
    def store(self, redis_url: str, tmp_path: Path) -> Iterator[DeadLetterStore]:
        s = RedisDeadLetterStore(redis_url, archive=tmp_path / "dl.jsonl")
        yield s
        s.close()


class TestRedisDeadLetterStoreOnAClient(DeadLetterConformance):
    """A caller's own client (decoded responses) and prefix: same behaviour."""

    @pytest.fixture
    def store(self, redis_url: str) -> Iterator[DeadLetterStore]:
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        yield RedisDeadLetterStore(client, prefix="other:app")
        client.close()


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url, decode_responses=True)
    yield c
    c.close()


@pytest.fixture
def store(redis_url: str, tmp_path: Path) -> Iterator[RedisDeadLetterStore]:
    s = RedisDeadLetterStore(redis_url, archive=tmp_path / "dl.jsonl")
    yield s
    s.close()


def stream(client: redis.Redis, key: str) -> list[dict[str, Any]]:
    """The fields of every message of a stream, oldest first."""
    return [
        {str(k): v for k, v in (fields or {}).items()} for _, fields in client.xrange(key) or []
    ]


def events(client: redis.Redis, store: RedisDeadLetterStore) -> list[tuple[str, str]]:
    return [(f["event"], f["id"]) for f in stream(client, store.events_key)]


def pending(client: redis.Redis, store: RedisDeadLetterStore) -> int:
    return int(client.xpending(store.review_key("src"), REVIEW_GROUP)["pending"])


def archive_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


# --- storage details the conformance suite does not see --------------------------------------


def test_entry_is_one_hash_under_the_prefix(
    store: RedisDeadLetterStore, client: redis.Redis
) -> None:
    entry = letter(payload={"price": -3}, flow_run_id="run-1")
    store.put([entry])
    stored = client.hgetall(f"collector:dl:{entry.id}")
    assert stored["source"] == "src"
    assert json.loads(stored["payload"]) == {"price": -3}
    assert stored["status"] == "open"


def test_prefixes_do_not_see_each_other(redis_url: str) -> None:
    a = RedisDeadLetterStore(redis_url, prefix="a")
    b = RedisDeadLetterStore(redis_url, prefix="b")
    try:
        a.put([letter()])
        assert a.counts()["open"] == 1
        assert b.counts()["open"] == 0
        assert b.get(letter().id) is None
    finally:
        a.close()
        b.close()


def test_a_second_store_on_the_same_data_shares_it(
    store: RedisDeadLetterStore, redis_url: str
) -> None:
    entry = letter()
    store.put([entry])
    other = RedisDeadLetterStore(redis_url)
    try:
        assert other.put([entry]) == 0
        assert other.resolve(entry.id, "discarded", "fixed") is True
        assert store.resolve(entry.id, "discarded", "again") is False
        assert store.counts() == {"open": 0, "review": 0, "resolved": 1}
    finally:
        other.close()


def test_values_orjson_refuses_round_trip_exactly(store: RedisDeadLetterStore) -> None:
    entry = letter(payload={"big": 2**70, "n": [1, 2]})
    store.put([entry])
    got = store.get(entry.id)
    assert got is not None
    assert got.payload == {"big": 2**70, "n": [1, 2]}


def test_ids_that_would_collide_with_store_keys_are_refused(store: RedisDeadLetterStore) -> None:
    for bad in ("events", "review", "meta", "ix:seen"):
        with pytest.raises(ValueError, match="Redis key"):
            store.put([letter(id=bad)])
        assert store.get(bad) is None
        assert store.resolve(bad, "discarded", "x") is False
        assert store.escalate(bad, "x") is False
    with pytest.raises(ValueError, match="finite"):
        store.put([letter(seen=float("nan"))])
    assert store.counts() == {"open": 0, "review": 0, "resolved": 0}


def test_odd_names_do_not_mix_indexes(store: RedisDeadLetterStore) -> None:
    # "a:b" + stage "c" and "a" + stage "b:c" would share a key without escaping
    one = letter("https://example.test/1", source="a:b", stage="c")
    two = letter("https://example.test/2", source="a", stage="b:c")
    pct = letter("https://example.test/3", source="a%3Ab", stage="c")
    store.put([one, two, pct])
    assert [e.id for e in store.list(source="a:b", stage="c")] == [one.id]
    assert [e.id for e in store.list(source="a", stage="b:c")] == [two.id]
    assert [e.id for e in store.list(source="a%3Ab", stage="c")] == [pct.id]
    assert store.counts("a:b")["open"] == 1


def test_list_is_newest_first_across_both_strategies(
    store: RedisDeadLetterStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = [letter(f"https://example.test/{n}", seen=T0 + n) for n in range(30)]
    entries += [letter(f"https://example.test/p{n}", stage="parse", seen=T0 + n) for n in range(5)]
    store.put(entries)
    expected = [e.id for e in sorted(entries, key=lambda e: -e.last_seen) if e.stage == "fetch"]
    for candidates_max in (5000, 0):  # read the smallest set / walk the zset
        monkeypatch.setattr("collector.deadletter.redis._CANDIDATES_MAX", candidates_max)
        assert [e.id for e in store.list(stage="fetch", limit=10)] == expected[:10]
        assert [e.id for e in store.list(source="src", stage="fetch", limit=-1)] == expected
        assert store.list(stage="fetch", limit=0) == []
    assert [e.last_seen for e in store.list(limit=3)] == [T0 + 29, T0 + 28, T0 + 27]


def test_reasons_follow_status_changes(store: RedisDeadLetterStore) -> None:
    a, b = letter("https://example.test/a"), letter("https://example.test/b")
    store.put([a, b])
    store.escalate(a.id, "weird")
    assert store.reasons("src") == {"fetch/http_500": 1}
    assert store.reasons("src", status="review") == {"fetch/http_500": 1}
    store.resolve(a.id, "discarded", "ok")
    store.resolve(b.id, "discarded", "ok")
    assert store.reasons("src") == {}
    assert store.reasons("src", status="resolved") == {"fetch/http_500": 2}
    assert store.reasons("src", status=None) == {"fetch/http_500": 2}


# --- the events stream (and the local archive) -----------------------------------------------


def test_one_event_per_put_resolve_and_escalate(
    store: RedisDeadLetterStore, client: redis.Redis, tmp_path: Path
) -> None:
    a, b = letter("https://example.test/a"), letter("https://example.test/b")
    store.put([a])
    assert events(client, store) == [("quarantined", a.id)]
    store.put([a, b])  # one per entry, seen again or not
    store.escalate(a.id, "looks odd")
    store.escalate(a.id, "again")  # not open any more: nothing happened, no event
    store.resolve(b.id, "discarded", "fixed")
    store.resolve(b.id, "discarded", "fixed twice")  # nothing happened
    store.resolve("no-such-id", "discarded", "x")
    store.put([])
    expected = [
        ("quarantined", a.id),
        ("quarantined", a.id),
        ("quarantined", b.id),
        ("escalated", a.id),
        ("resolved", b.id),
    ]
    assert events(client, store) == expected
    data = json.loads(stream(client, store.events_key)[0]["data"])
    assert data["event"] == "quarantined"
    assert data["url"] == a.url
    assert isinstance(data["at"], float)
    # the local archive holds the same history
    lines = archive_lines(tmp_path / "dl.jsonl")
    assert [(r["event"], r["id"]) for r in lines] == expected
    assert lines[3]["reason"] == "looks odd"
    assert lines[4]["resolution"] == "fixed"


def test_events_stream_is_capped(redis_url: str, client: redis.Redis) -> None:
    store = RedisDeadLetterStore(redis_url, events_maxlen=10)
    try:
        for n in range(20):
            store.put([letter(f"https://example.test/{m}") for m in range(n * 50, n * 50 + 50)])
        length = client.xlen(store.events_key)
        assert 10 <= length < 1000  # "~": trimmed by whole stream nodes
        assert store.counts()["open"] == 1000  # the entries themselves are never trimmed
    finally:
        store.close()


# --- the manual-review queue ------------------------------------------------------------------


# The review scenarios are the conformance suite's (ReviewQueueConformance); run here again,
# each is followed by what only Redis keeps: the stream, its pending entries, the events.
SCENARIOS = ReviewQueueConformance()


def test_a_review_taken_over_and_finished_leaves_nothing_pending(
    store: RedisDeadLetterStore, client: redis.Redis
) -> None:
    SCENARIOS.test_vanished_reviewer_is_taken_over_and_resolved_once(store)
    assert pending(client, store) == 0
    assert [e for e, _ in events(client, store)].count("resolved") == 1
    assert client.xlen(store.review_key("src")) == 0  # the queue holds only outstanding work


def test_a_resolved_or_reopened_review_leaves_nothing_pending(
    store: RedisDeadLetterStore, client: redis.Redis
) -> None:
    SCENARIOS.test_resolving_an_entry_in_review_drops_its_review(store)
    assert pending(client, store) == 0
    assert client.xlen(store.review_key("src")) == 0
    SCENARIOS.test_a_reopened_entry_is_reviewed_anew(store)
    assert pending(client, store) == 0


def test_a_stale_claim_takes_every_entry_once_and_resets_their_idle_time(
    store: RedisDeadLetterStore, client: redis.Redis
) -> None:
    """Reviewers gone an hour (Redis is told so, not waited for): one claim takes all their
    entries, and a second reviewer right after ("right after": anything under a minute; a
    loaded box once took over 100 ms between two calls) gets nothing."""
    entries = [letter(f"https://example.test/{n}") for n in range(40)]
    store.put(entries)
    for e in entries:
        assert store.escalate(e.id, "check")
    for name in ("alice", "bob"):
        while store.take_for_review("src", name, count=7):
            pass
    assert pending(client, store) == 40
    stream = store.review_key("src")
    for held in client.xpending_range(stream, REVIEW_GROUP, "-", "+", 100):
        holder = held["consumer"]
        assert isinstance(holder, bytes | str), held
        client.xclaim(stream, REVIEW_GROUP, holder, 0, [held["message_id"]], idle=3_600_000)
    claimed = [e.id for _, e in store.claim_stale_reviews("src", "dave", idle_ms=60_000, count=100)]
    assert sorted(claimed) == sorted(e.id for e in entries)
    owners = client.xpending_range(stream, REVIEW_GROUP, "-", "+", 100)
    assert {o["consumer"] for o in owners} in ({"dave"}, {b"dave"})
    late = store.claim_stale_reviews("src", "erin", idle_ms=60_000)
    assert late == [], f"erin took {len(late)} entries dave had just claimed"


def test_take_for_review_waits_for_work(store: RedisDeadLetterStore) -> None:
    entry = letter()
    store.put([entry])
    started = time.monotonic()
    assert store.take_for_review("src", "alice", block_ms=200) == []
    assert time.monotonic() - started >= 0.19
    timer = threading.Timer(0.1, store.escalate, args=(entry.id, "later"))
    timer.start()
    try:
        ((_, got),) = store.take_for_review("src", "alice", block_ms=60_000)
    finally:
        timer.join()
    assert got.id == entry.id
    took = time.monotonic() - started
    assert took < 30, f"woken {took:.1f} s after an entry came, not by it"  # block: 60 s


def test_the_group_is_created_on_first_use(
    store: RedisDeadLetterStore, client: redis.Redis
) -> None:
    assert not client.exists(store.review_key("src"))
    assert store.take_for_review("src", "alice") == []
    groups = client.xinfo_groups(store.review_key("src"))
    assert [g["name"] for g in groups] == [REVIEW_GROUP]
    other = RedisDeadLetterStore(client)  # a second store: BUSYGROUP is fine
    assert other.claim_stale_reviews("src", "bob", idle_ms=0) == []


# --- failures ---------------------------------------------------------------------------------


def test_unreachable_server_is_one_backend_error_naming_the_url() -> None:
    port = free_port()  # nothing listens there
    url = f"redis://:s3cret-pw@127.0.0.1:{port}/0"
    started = time.monotonic()
    with pytest.raises(BackendError) as caught:
        RedisDeadLetterStore(url)
    assert time.monotonic() - started < 5  # fails fast
    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message
    assert "s3cret" not in message
    assert "\n" not in message
    assert isinstance(caught.value.__cause__, redis.ConnectionError)


def test_a_bad_url_is_a_backend_error() -> None:
    with pytest.raises(BackendError, match="nope://"):
        RedisDeadLetterStore("nope://host")


def _calls(store: RedisDeadLetterStore, entry: DeadLetter) -> dict[str, Any]:
    return {
        "put": lambda: store.put([letter("https://example.test/new")]),
        "get": lambda: store.get(entry.id),
        "list": lambda: store.list(),
        "counts": lambda: store.counts(),
        "reasons": lambda: store.reasons("src"),
        "resolve": lambda: store.resolve(entry.id, "discarded", "x"),
        "escalate": lambda: store.escalate(entry.id, "x"),
        "take_for_review": lambda: store.take_for_review("src", "alice"),
        "claim_stale_reviews": lambda: store.claim_stale_reviews("src", "alice", idle_ms=0),
        "finish_review": lambda: store.finish_review("0-1", entry.id, "reviewed", "x"),
    }


CALLS = [
    "put", "get", "list", "counts", "reasons", "resolve", "escalate",
    "take_for_review", "claim_stale_reviews", "finish_review",
]  # fmt: skip


@pytest.mark.parametrize("call", CALLS)
def test_server_restart_is_a_backend_error_then_the_store_carries_on(
    redis_server: RedisServer, redis_url: str, call: str
) -> None:
    store = RedisDeadLetterStore(redis_url)
    try:
        entry = letter()
        store.put([entry])
        store.take_for_review("src", "warm-up")  # the review group exists before the restart
        redis_server.restart()  # no persistence: everything stored is gone
        with pytest.raises(BackendError) as caught:
            _calls(store, entry)[call]()
        message = str(caught.value)
        assert redis_server.url in message
        assert "gone" in message
        assert "\n" not in message
        # said once; the store then works on the (empty) server again
        assert store.counts() == {"open": 0, "review": 0, "resolved": 0}
        _calls(store, entry)[call]()
    finally:
        store.close()


def test_server_down_is_a_backend_error_and_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a stopped server is one line after the reconnect window; 1 s instead of 30 per call
    monkeypatch.setenv("COLLECTOR_REDIS_RECONNECT_S", "1")
    with RedisServer() as server:
        store = RedisDeadLetterStore(server.url)
        try:
            store.put([letter()])
            server.stop()
            for call in _calls(store, letter()).values():
                with pytest.raises(BackendError) as caught:
                    call()
                assert server.url in str(caught.value)
                assert "\n" not in str(caught.value)
                assert isinstance(caught.value.__cause__, redis.RedisError)
            server.start()
            with pytest.raises(BackendError, match="gone"):  # its data did not survive
                store.counts()
            assert store.put([letter()]) == 1
            assert store.counts()["open"] == 1
        finally:
            store.close()


def test_a_server_that_keeps_its_data_restarts_silently(
    redis_url: str, client: redis.Redis
) -> None:
    store = RedisDeadLetterStore(redis_url)
    try:
        store.put([letter()])
        client.client_kill_filter(_type="normal", skipme=True)  # drop the store's connection
        assert store.counts()["open"] == 1  # a stale connection is simply re-opened
    finally:
        store.close()


# --- layout 1 -> 2 -----------------------------------------------------------------------------

_LAYOUT_1 = Path(__file__).parent / "redis_layout1"  # the scripts of the previous layout, verbatim


def _layout1_put(client: redis.Redis, meta: str, epoch: str, entry: dict[str, Any]) -> None:
    """Write one entry exactly as the previous layout's store did (its put.lua, 19 values)."""
    lua = (_LAYOUT_1 / "prelude.lua").read_text() + (_LAYOUT_1 / "put.lua").read_text()
    args = [
        entry["id"], entry["source"], entry["url"], entry["stage"], entry["error_class"], "m", 3,
        "1.0", "2.0", "", json.dumps(entry.get("payload")), "[]", "", "0", "open", "", "0",
        "orjson", json.dumps(entry),
    ]  # fmt: skip
    client.eval(lua, 1, meta, "collector:dl:", epoch, 100, *args)


def _layout1(client: redis.Redis, meta: str, epoch: str, name: str, *args: Any) -> Any:
    lua = (_LAYOUT_1 / "prelude.lua").read_text() + (_LAYOUT_1 / f"{name}.lua").read_text()
    return client.eval(lua, 1, meta, "collector:dl:", epoch, 100, *args)


def test_a_store_of_the_previous_layout_is_migrated_on_open(
    redis_url: str, client: redis.Redis
) -> None:
    from collector.deadletter.base import dead_letter_id

    meta, epoch = "collector:dl:meta", "old-epoch"
    client.hset(meta, mapping={"epoch": epoch, "created": "1.0"})  # no layout field: layout 1

    def make(name: str, cls: str, source: str = "src") -> str:
        final = cls.rsplit(":", 1)[-1]
        eid = dead_letter_id(source, f"https://example.test/{name}", "fetch", final)
        entry = {"id": eid, "source": source, "url": f"https://example.test/{name}",
                 "stage": "fetch", "error_class": cls, "payload": {"n": name}}  # fmt: skip
        _layout1_put(client, meta, epoch, entry)
        return eid

    ex = make("ex", "retries_exhausted:http_500")
    rep = make("rep", "http_404")
    odd = make("odd", "max_total_exceeded:timeout")
    rev = make("rev", "http_400")
    other = make("other", "http_400", source="b")
    _layout1(client, meta, epoch, "resolve", ex, "reenqueued: re-enqueue #1", "{}", "1")
    _layout1(client, meta, epoch, "resolve", rep, "repaired: trimmed name", "{}", "0")
    _layout1(client, meta, epoch, "resolve", odd, "fixed by hand", "{}", "0")
    _layout1(client, meta, epoch, "escalate", rev, "human", "{}")
    _layout1(client, meta, epoch, "escalate", other, "human too", "{}")
    assert client.xlen("collector:dl:review") == 2  # one stream for every source

    store = RedisDeadLetterStore(redis_url)
    try:
        got = store.get(ex)
        assert got is not None
        assert (got.error_class, got.cause, got.requeues) == ("http_500", "retries_exhausted", 1)
        assert (got.resolution_kind, got.resolution) == ("reenqueued", "re-enqueue #1")
        got = store.get(odd)
        assert got is not None
        assert (got.error_class, got.cause) == ("timeout", "max_total_exceeded")
        assert (got.resolution_kind, got.resolution) == (None, "fixed by hand")  # no kind known
        got = store.get(rep)
        assert got is not None and (got.resolution_kind, got.resolution) == (
            "repaired",
            "trimmed name",
        )
        assert store.census("src").counts == {
            "open": 0, "review": 1, "resolved:reenqueued": 1, "resolved:repaired": 1,
            "resolved:": 1,
        }  # fmt: skip
        assert store.reasons("src", status=None) == {
            "fetch/retries_exhausted:http_500": 1, "fetch/http_404": 1,
            "fetch/max_total_exceeded:timeout": 1, "fetch/http_400": 1,
        }  # fmt: skip
        assert [e.id for e in store.list(error_class="http_500", status=None)] == [ex]
        assert store.list(error_class="retries_exhausted:http_500", status=None) == []
        assert not client.exists("collector:dl:review")  # moved to one stream per source
        ((message, taken),) = store.take_for_review("src", "alice")
        assert taken.id == rev
        assert store.finish_review(message, rev, "reviewed", "ok")
        ((_, theirs),) = store.take_for_review("b", "alice")
        assert theirs.id == other
    finally:
        store.close()
    before = {key: client.hgetall(key) for key in client.keys("collector:dl:*") if
              client.type(key) == "hash"}  # fmt: skip
    again = RedisDeadLetterStore(redis_url)  # layout 2 now: opening changes nothing
    try:
        assert client.hget(meta, "layout") == "2"
        after = {key: client.hgetall(key) for key in before}
        assert after == before
    finally:
        again.close()
