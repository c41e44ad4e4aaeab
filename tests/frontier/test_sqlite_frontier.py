"""SQLite frontier: the conformance suite (file and ``:memory:``) plus what only SQLite has."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path

import pytest

from collector.frontier.base import Completed, Frontier, Offer, StateCounts
from collector.frontier.sqlite import SCHEMA_VERSION, SqliteFrontier, url_key

from . import _claim_worker
from .conformance import (
    FRESH,
    SRC,
    T0,
    FrontierConformance,
    claim,
    done,
    offer,
    ranked,
    url,
    urls_of,
)


class TestSqliteFrontier(FrontierConformance):
    @pytest.fixture
    def frontier(self, tmp_path: Path) -> Iterator[Frontier]:
        f = SqliteFrontier(tmp_path / "f.db")
        yield f
        f.close()

    @pytest.fixture
    def reopen(self, tmp_path: Path) -> Callable[[], Frontier]:
        return lambda: SqliteFrontier(tmp_path / "f.db")


class TestSqliteMemoryFrontier(FrontierConformance):
    @pytest.fixture
    def frontier(self) -> Iterator[Frontier]:
        f = SqliteFrontier(":memory:")
        yield f
        f.close()

    @pytest.fixture
    def reopen(self, frontier: Frontier) -> Callable[[], Frontier]:
        return lambda: frontier  # nothing outlives the object: the same one


# --- SQLite only ---------------------------------------------------------------------------------
def test_state_survives_close_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "f.db"  # parent folders are created
    first = SqliteFrontier(path)
    offer(first, [url(i) for i in range(5)], run_id="r1")
    lease = claim(first, 2)
    first.ack(lease, [done(lease.items[0].url)], now=T0)
    before = first.counts(SRC)
    first.close()

    second = SqliteFrontier(path)
    try:
        assert second.counts(SRC) == before == StateCounts(queued=3, leased=1, done=1)
        assert second.run_counts(SRC, "r1") == before
        # the lease taken before the restart is still valid, and tokens keep growing
        assert second.ack(lease, [done(lease.items[1].url)], now=T0 + 1).accepted == 1
        later = claim(second, 10, now=T0 + 2)
        assert later.token > lease.token
        assert len(later.items) == 3
        # fresh-skip uses the stored freshness after the restart
        assert offer(second, [lease.items[0].url], now=T0 + 3).fresh_skipped == 1
    finally:
        second.close()


def test_ack_after_expiry_without_takeover_is_accepted(tmp_path: Path) -> None:
    """The token is still the item's (nobody claimed it since), so the ack is not stale."""
    f = SqliteFrontier(tmp_path / "f.db")
    try:
        offer(f, [url(1)])
        lease = claim(f, now=T0, lease_s=10)
        result = f.ack(lease, [done(url(1), T0 + 100)], now=T0 + 100)
        assert (result.accepted, result.stale) == (1, [])
        assert f.counts(SRC) == StateCounts(done=1)
    finally:
        f.close()


def test_opening_a_non_database_raises_backend_error(tmp_path: Path) -> None:
    from collector.errors import BackendError

    path = tmp_path / "f.db"
    path.write_bytes(b"this is not a sqlite database, not at all" * 100)
    with pytest.raises(BackendError, match=r"f\.db"):
        SqliteFrontier(path)


def test_large_offer_spans_chunks(tmp_path: Path) -> None:
    f = SqliteFrontier(tmp_path / "f.db")
    try:
        urls = [url(i) for i in range(1_234)]
        assert offer(f, urls).enqueued == 1_234
        again = f.offer(
            SRC,
            (Offer(u, FRESH) for u in urls),  # any iterable, here a generator
            now=T0 + 1,
            queue_ttl_s=100,
            rank_for=ranked(),
            run_id="r2",
        )
        assert again.already_queued == 1_234
        assert f.run_counts(SRC, "r2").queued == 1_234
    finally:
        f.close()


URL_COUNT = 300


def _check_claims(per_worker: list[list[tuple[int, list[str]]]]) -> None:
    claimed = [u for claims in per_worker for _, urls in claims for u in urls]
    assert len(claimed) == len(set(claimed)), "a URL was claimed twice"
    assert set(claimed) == {url(i) for i in range(URL_COUNT)}
    tokens = [token for claims in per_worker for token, _ in claims]
    assert len(tokens) == len(set(tokens)), "a fencing token was handed out twice"
    for claims in per_worker:
        mine = [token for token, _ in claims]
        assert mine == sorted(mine)
        assert all(a < b for a, b in pairwise(mine))
    # (not asserted: that both workers got items; SQLite's busy handler may let one starve)


def _seed(path: Path) -> None:
    f = SqliteFrontier(path)
    offer(f, [url(i) for i in range(URL_COUNT)], now=_claim_worker.NOW - 1)
    f.close()


def test_two_frontiers_in_two_threads_never_share_a_url(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    _seed(path)
    barrier = threading.Barrier(2)
    results: dict[int, list[tuple[int, list[str]]]] = {}
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            results[n] = _claim_worker.claim_until_empty(str(path), barrier, 3)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    _check_claims([results[0], results[1]])
    f = SqliteFrontier(path)
    try:
        total = f.counts(SRC)
        assert total.total == URL_COUNT
        assert total.queued == 0
        assert total == f.scan_counts(SRC)  # the kept counts moved with every claim and ack
    finally:
        f.close()


def test_two_frontiers_in_two_processes_never_share_a_url(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    _seed(path)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_claim_worker.process_main, args=(str(path), barrier, queue, n, 3))
        for n in ("p0", "p1")
    ]
    for p in procs:
        p.start()
    try:
        got = dict(queue.get(timeout=60) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert all(isinstance(v, list) for v in got.values()), got
    assert all(p.exitcode == 0 for p in procs)
    _check_claims([got["p0"], got["p1"]])
    f = SqliteFrontier(path)
    try:
        assert f.counts(SRC).total == URL_COUNT
        assert f.counts(SRC) == f.scan_counts(SRC)  # two writers kept one count
        # a claim after both processes: the token is above every token they were given
        top = max(token for claims in got.values() for token, _ in claims)
        assert claim(f, now=_claim_worker.NOW).token > top
    finally:
        f.close()


def test_completed_fields_round_trip_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    f = SqliteFrontier(path)
    offer(f, [url(1)])
    lease = claim(f)
    f.ack(lease, [Completed(url(1), fresh_until=T0 + 10, fetched_at=T0)], now=T0)
    f.close()
    f = SqliteFrontier(path)
    try:
        assert offer(f, [url(1)], now=T0 + 5).fresh_skipped == 1
        assert offer(f, [url(1)], now=T0 + 11).enqueued == 1
    finally:
        f.close()


# --- files written by schema version 1 keep working ---------------------------------------------
_V1_SCHEMA = """
CREATE TABLE items (
    source TEXT NOT NULL, url TEXT NOT NULL, state TEXT NOT NULL, rank REAL NOT NULL,
    enqueued_at REAL NOT NULL, not_before REAL NOT NULL DEFAULT 0, expires_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0, first_attempt_at REAL, lease_token INTEGER,
    lease_expires REAL, fresh_until REAL, last_fetched_at REAL, cost REAL NOT NULL DEFAULT 0,
    last_error TEXT, run_id TEXT, PRIMARY KEY (source, url)
) WITHOUT ROWID;
CREATE INDEX items_queue ON items (source, state, rank DESC);
CREATE INDEX items_lease ON items (source, lease_token) WHERE state = 'leased';
CREATE INDEX items_run ON items (source, run_id, state);
CREATE INDEX items_expiry ON items (source, state, expires_at);
CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT INTO meta (key, value) VALUES ('fencing_token', 41);
"""


def test_a_version_1_file_is_migrated_on_open(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(_V1_SCHEMA)
    rows = [
        # source, url, state, rank, enqueued_at, expires_at, lease_token, lease_expires,
        # fresh_until, last_fetched_at, run_id
        (SRC, url("q2"), "queued", 2.0, T0, T0 + 1e4, None, None, None, None, "r1"),
        (SRC, url("q5"), "queued", 5.0, T0, T0 + 1e4, None, None, None, None, "r1"),
        (SRC, url("l"), "leased", 1.0, T0, T0 + 1e4, 41, T0 + 60, None, None, "r1"),
        (SRC, url("d"), "done", 1.0, T0, T0 + 1e4, None, None, T0 + 100, T0, "r1"),
        (SRC, url("x"), "dead", 1.0, T0, T0 + 1e4, None, None, None, None, "r0"),
        (SRC, url("e"), "expired", 1.0, T0, T0 + 1e4, None, None, None, None, None),
        ("other", url("q2"), "queued", 9.0, T0, T0 + 1e4, None, None, None, None, "r9"),
    ]
    db.executemany(
        "INSERT INTO items (source, url, state, rank, enqueued_at, expires_at, lease_token,"
        " lease_expires, fresh_until, last_fetched_at, run_id) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        rows,
    )
    db.commit()
    db.close()

    frontier = SqliteFrontier(path)
    try:
        assert frontier.counts(SRC) == StateCounts(queued=2, leased=1, done=1, dead=1, expired=1)
        assert frontier.counts("other") == StateCounts(queued=1)
        assert frontier.run_counts(SRC, "r1") == StateCounts(queued=2, leased=1, done=1)
        assert frontier.run_counts(SRC, "r0") == StateCounts(dead=1)
        # the old lease is still held (its ack is accepted); new tokens continue the counter
        from collector.frontier.base import ClaimedItem, Lease

        old = Lease(SRC, 41, T0 + 60, (ClaimedItem(url("l"), 0, None, T0),))
        assert frontier.ack(old, [done(url("l"))], now=T0 + 1).accepted == 1
        lease = claim(frontier, 10, now=T0 + 1)
        assert lease.token == 42
        assert [i.url for i in lease.items] == [url("q5"), url("q2")]  # rank kept
        assert offer(frontier, [url("d")], now=T0 + 2, run_id="r2").fresh_skipped == 1
    finally:
        frontier.close()
    again = sqlite3.connect(path)
    assert again.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    assert (
        again.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'items_v1'").fetchone()[0]
        == 0
    )
    again.close()


# --- files written by schema version 2 (h: the first 64 bits of SHA-1) are re-keyed ---------------
def test_a_version_2_file_is_rekeyed_on_open(tmp_path: Path) -> None:
    import hashlib
    import sqlite3

    def sha1_64(text: str) -> int:
        return int.from_bytes(hashlib.sha1(text.encode()).digest()[:8], "big", signed=True)

    path = tmp_path / "v2.db"
    first = SqliteFrontier(path)
    offer(first, [url(i) for i in range(6)], run_id="r1")
    lease = claim(first, 2)
    first.ack(lease, [done(i.url) for i in lease.items], now=T0 + 1)
    held = claim(first, 1, now=T0 + 2)
    first.close()
    db = sqlite3.connect(path)
    db.create_function("sha1_64", 1, sha1_64)
    db.execute("UPDATE items SET h = sha1_64(url)")
    db.execute("PRAGMA user_version = 2")
    db.commit()
    db.close()

    again = SqliteFrontier(path)
    try:
        keys = again._db.execute("SELECT url, h FROM items").fetchall()
        assert keys and all(h == url_key(u) for u, h in keys)
        assert again.ack(held, [done(i.url) for i in held.items], now=T0 + 3).accepted == 1
        result = offer(again, [url(i) for i in range(6)], now=T0 + 4, run_id="r2")
        assert (result.fresh_skipped, result.already_queued, result.enqueued) == (3, 3, 0)
        assert again.counts(SRC).total == 6  # found by their new keys: nothing inserted twice
    finally:
        again.close()
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    check.close()


def test_urls_sharing_a_key_are_told_apart(tmp_path: Path) -> None:
    # the same shape and number: one key ("007" and "7"), two URLs, two items
    a, b = "https://example.org/items/007.json", "https://example.org/items/7.json"
    assert url_key(a) == url_key(b)
    f = SqliteFrontier(tmp_path / "f.db")
    try:
        assert offer(f, [a, b, a], run_id="r1").enqueued == 2
        lease = claim(f, 10)
        assert sorted(i.url for i in lease.items) == sorted([a, b])
        assert f.ack(lease, [done(a)], now=T0 + 1).accepted == 1
        assert f.counts(SRC) == StateCounts(leased=1, done=1)
        result = offer(f, [a, b], now=T0 + 2, run_id="r2")
        assert (result.fresh_skipped, result.already_queued) == (1, 1)
    finally:
        f.close()


def test_ack_finds_each_item_through_the_url_index(tmp_path: Path) -> None:
    # Through items_lease (src, lease_token) every item's update would scan the whole batch's
    # leased rows: O(batch^2) per ack, ~25 us a page at batch 500 (bench/throughput.py).
    f = SqliteFrontier(tmp_path / "f.db")
    try:
        offer(f, [url(i) for i in range(3)])
        lease = claim(f, 3)
        statements: list[str] = []
        f._db.set_trace_callback(statements.append)
        f.ack(lease, [done(u) for u in urls_of(lease)], now=T0)
        f._db.set_trace_callback(None)
        updates = {s for s in statements if s.lstrip().upper().startswith("UPDATE ITEMS")}
        assert updates
        for sql in updates:  # the traced text has the values inlined
            plan = f._db.execute(f"EXPLAIN QUERY PLAN {sql}").fetchall()
            assert any("items_url" in row[-1] for row in plan), plan
    finally:
        f.close()


# --- files written by schema version 3 (no validators) keep working: none known ---------------
def test_a_version_3_file_gets_empty_validators_on_open(tmp_path: Path) -> None:
    import sqlite3

    from collector.frontier.base import Completed

    path = tmp_path / "v3.db"
    first = SqliteFrontier(path)
    offer(first, [url(i) for i in range(3)], run_id="r1")
    lease = claim(first, 1)
    first.ack(lease, [done(i.url) for i in lease.items], now=T0 + 1)
    held = claim(first, 1, now=T0 + 2)
    first.close()
    db = sqlite3.connect(path)  # the version 3 table: the same without the two columns
    db.execute("ALTER TABLE items DROP COLUMN etag")
    db.execute("ALTER TABLE items DROP COLUMN last_modified")
    db.execute("PRAGMA user_version = 3")
    db.commit()
    db.close()

    again = SqliteFrontier(path)
    try:
        page = Completed(held.items[0].url, T0 + 10, T0 + 3, etag='"e"')
        assert again.ack(held, [page], now=T0 + 3).accepted == 1  # the old lease still holds
        assert offer(again, [url(i) for i in range(3)], now=T0 + 20_000, run_id="r2").enqueued == 2
        items = {i.url: (i.etag, i.last_modified) for i in claim(again, 10, now=T0 + 20_001).items}
        assert items == {url(0): (None, None), held.items[0].url: ('"e"', None)}
    finally:
        again.close()
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    check.close()
