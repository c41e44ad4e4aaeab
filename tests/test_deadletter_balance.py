"""The dead-letter balance can fail: faults injected behind the store's back, on both stores.

The left side of the balance is the archive (what was quarantined); the right side the store's
entries by state. An entry deleted from the database, one duplicated under another id (what a
bad migration leaves), or a Redis without persistence restarted make it fail, and the tally
names the ids; the normal life of entries (put again, resolved, escalated, reviewed, reopened)
keeps it balanced.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.deadletter.archive import JsonlArchive
from collector.deadletter.base import DeadLetter, DeadLetters
from collector.deadletter.sqlite import SqliteDeadLetterStore
from collector.recovery.triage import SHOWN_IDS, tally
from tests.servers import RedisServer

T0 = 1_700_000_000.0


def letter(n: int, *, seen: float = T0) -> DeadLetter:
    return DeadLetter(source="src", url=f"https://example.test/{n}", stage="fetch",
                      error_class="http_500", message="boom", attempts=1, first_seen=seen,
                      last_seen=seen, cause="retries_exhausted")  # fmt: skip


class Faults:
    """What a backend's fault injection needs: delete and duplicate an entry behind its back."""

    def __init__(self, store: DeadLetters, kind: str, where: Any) -> None:
        self.store, self.kind, self.where = store, kind, where

    def delete(self, entry_id: str) -> None:
        if self.kind == "sqlite":
            with sqlite3.connect(self.where) as db:
                db.execute("DELETE FROM deadletters WHERE id = ?", (entry_id,))
        else:
            self.where.delete(f"collector:dl:{entry_id}")

    def duplicate(self, entry_id: str, new_id: str) -> None:
        """A copy of the entry under another id (as a migration that changed ids would)."""
        if self.kind == "sqlite":
            with sqlite3.connect(self.where) as db:
                cols = [r[1] for r in db.execute("PRAGMA table_info(deadletters)")]
                picked = ", ".join("?" if c == "id" else c for c in cols)
                db.execute(
                    f"INSERT INTO deadletters ({', '.join(cols)}) SELECT {picked}"
                    " FROM deadletters WHERE id = ?",
                    (new_id, entry_id),
                )
        else:
            fields = self.where.hgetall(f"collector:dl:{entry_id}")
            self.where.hset(f"collector:dl:{new_id}", mapping={**fields, "id": new_id})
            self.where.zadd("collector:dl:ix:seen:src", {new_id: T0})


@pytest.fixture(params=["sqlite", "redis"])
def faults(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Faults]:
    if request.param == "sqlite":
        path = tmp_path / "dl.db"
        store: DeadLetters = SqliteDeadLetterStore(path, archive=tmp_path / "dl.jsonl")
        yield Faults(store, "sqlite", path)
    else:
        import redis

        from collector.deadletter.redis import RedisDeadLetterStore

        url = request.getfixturevalue("redis_url")
        store = RedisDeadLetterStore(url, archive=tmp_path / "dl.jsonl")
        client = redis.Redis.from_url(url, decode_responses=True)
        yield Faults(store, "redis", client)
        client.close()
    store.close()


def archive_of(tmp_path: Path) -> JsonlArchive:
    return JsonlArchive(tmp_path / "dl.jsonl")


def test_the_normal_life_of_entries_balances(faults: Faults, tmp_path: Path) -> None:
    store = faults.store
    entries = [letter(n) for n in range(6)]
    store.put(entries)
    store.put([letter(0, seen=T0 + 1)])  # seen again: one entry still
    assert store.resolve(entries[1].id, "repaired", "trimmed")
    assert store.resolve(entries[2].id, "reenqueued", "timeout", requeued=True)
    assert store.escalate(entries[3].id, "look")
    assert store.escalate(entries[4].id, "look")
    ((message, _),) = store.take_for_review("src", "alice")
    assert store.finish_review(message, entries[3].id, "reviewed", "ok")
    assert store.resolve(entries[5].id, "discarded", "spam")
    store.put([letter(5, seen=T0 + 2)])  # failed again after its resolution: open again
    balance = tally(store, "src", archive_of(tmp_path))
    assert balance.balanced, balance.difference()
    assert (balance.quarantined, balance.open, balance.repaired, balance.reenqueued) == (
        6, 2, 1, 1,
    )  # fmt: skip
    assert (balance.escalated, balance.discarded, balance.difference()) == (2, 0, "")


def test_an_entry_deleted_behind_the_store_fails_the_balance(
    faults: Faults, tmp_path: Path
) -> None:
    entries = [letter(n) for n in range(3)]
    faults.store.put(entries)
    faults.store.resolve(entries[2].id, "repaired", "x")
    faults.delete(entries[1].id)
    balance = tally(faults.store, "src", archive_of(tmp_path))
    assert not balance.balanced
    assert (balance.quarantined, balance.in_store) == (3, 2)
    assert (balance.lost, balance.unknown) == ([entries[1].id], [])
    assert f"1 lost by the store: {entries[1].id}" in balance.difference()
    assert "NOT balanced" in _markdown(balance)


def test_an_entry_duplicated_under_another_id_fails_the_balance(
    faults: Faults, tmp_path: Path
) -> None:
    entries = [letter(n) for n in range(3)]
    faults.store.put(entries)
    faults.duplicate(entries[0].id, "feedfacefeedfacefeedface")
    balance = tally(faults.store, "src", archive_of(tmp_path))
    assert not balance.balanced
    assert (balance.quarantined, balance.in_store, balance.open) == (3, 4, 4)
    assert (balance.lost, balance.unknown) == ([], ["feedfacefeedfacefeedface"])
    assert "in the store but never quarantined: feedfacefeedfacefeedface" in (balance.difference())


def test_a_lost_and_a_foreign_entry_together_still_fail(faults: Faults, tmp_path: Path) -> None:
    """Counts alone would match (one missing, one extra); the ids do not."""
    entries = [letter(n) for n in range(3)]
    faults.store.put(entries)
    faults.duplicate(entries[0].id, "0123456789abcdef01234567")
    faults.delete(entries[2].id)
    balance = tally(faults.store, "src", archive_of(tmp_path))
    assert balance.quarantined == balance.in_store == 3
    assert not balance.balanced
    assert (balance.lost, balance.unknown) == ([entries[2].id], ["0123456789abcdef01234567"])


def test_a_store_on_another_database_fails_the_balance(faults: Faults, tmp_path: Path) -> None:
    faults.store.put([letter(1)])
    other = SqliteDeadLetterStore(tmp_path / "elsewhere.db", archive=tmp_path / "other.jsonl")
    try:
        other.put([letter(2)])
        balance = tally(other, "src", archive_of(tmp_path))  # the first store's archive
        assert not balance.balanced
        assert (balance.lost, balance.unknown) == ([letter(1).id], [letter(2).id])
    finally:
        other.close()


def test_the_ids_named_are_bounded(tmp_path: Path) -> None:
    path = tmp_path / "dl.db"
    with SqliteDeadLetterStore(path, archive=tmp_path / "dl.jsonl") as store:
        store.put([letter(n) for n in range(SHOWN_IDS + 5)])
        with sqlite3.connect(path) as db:
            db.execute("DELETE FROM deadletters")
        balance = tally(store, "src", archive_of(tmp_path))
    assert (balance.lost_count, len(balance.lost)) == (SHOWN_IDS + 5, SHOWN_IDS)
    assert "(+5 more)" in balance.difference()


def test_a_redis_restarted_without_persistence_fails_the_balance(tmp_path: Path) -> None:
    from collector.deadletter.redis import RedisDeadLetterStore
    from collector.errors import BackendError

    with RedisServer() as server:
        store = RedisDeadLetterStore(server.url, archive=tmp_path / "dl.jsonl")
        try:
            entries = [letter(n) for n in range(4)]
            store.put(entries)
            assert tally(store, "src", archive_of(tmp_path)).balanced
            server.restart()  # no persistence: every entry is gone
            with pytest.raises(BackendError, match="gone"):
                store.counts("src")
            balance = tally(store, "src", archive_of(tmp_path))
            assert not balance.balanced
            assert (balance.quarantined, balance.in_store) == (4, 0)
            assert balance.lost == sorted(e.id for e in entries)
            store.put([letter(9)])  # the store carries on; the loss stays visible
            assert tally(store, "src", archive_of(tmp_path)).lost_count == 4
        finally:
            store.close()


def test_a_put_between_the_two_reads_is_not_a_fault(tmp_path: Path) -> None:
    """An entry stored but not archived yet when the archive was read is read again, not
    reported (a store writes an entry before archiving it)."""
    path = tmp_path / "dl.db"

    class Racing(JsonlArchive):
        reads = 0

        def quarantined_ids(self, source: str) -> set[str]:
            Racing.reads += 1
            found = super().quarantined_ids(source)
            if Racing.reads == 1:  # a collect run puts one meanwhile
                store.put([letter(7)])
            return found

    with SqliteDeadLetterStore(path, archive=tmp_path / "dl.jsonl") as store:
        store.put([letter(1)])
        balance = tally(store, "src", Racing(tmp_path / "dl.jsonl"))
    assert balance.balanced, balance.difference()
    assert (balance.quarantined, Racing.reads) == (2, 2)


def _markdown(balance: Any) -> str:
    from collector.recovery.triage import TriageReport

    report = TriageReport("src", "r", dry_run=False)
    report.balance = balance
    return report.markdown()


def test_a_sqlite_store_whose_database_was_deleted_fails_the_balance(tmp_path: Path) -> None:
    """The SQLite counterpart of a Redis restarted without persistence: the file is gone and a
    new, empty one is created on open; the archive still says what was quarantined."""
    entries = [letter(n) for n in range(3)]
    with SqliteDeadLetterStore(tmp_path / "dl.db", archive=tmp_path / "dl.jsonl") as store:
        store.put(entries)
    for path in tmp_path.glob("dl.db*"):
        path.unlink()
    with SqliteDeadLetterStore(tmp_path / "dl.db", archive=tmp_path / "dl.jsonl") as store:
        balance = tally(store, "src", archive_of(tmp_path))
    assert (balance.balanced, balance.quarantined, balance.in_store) == (False, 3, 0)
    assert balance.lost == sorted(e.id for e in entries)
