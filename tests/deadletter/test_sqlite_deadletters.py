"""SQLite dead-letter store: the conformance suite plus its persistence and JSONL archive."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.deadletter.base import DeadLetterStore
from collector.deadletter.sqlite import SqliteDeadLetterStore
from collector.errors import BackendError

from .conformance import T0, DeadLetterConformance, letter


class TestSqliteDeadLetterStore(DeadLetterConformance):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[DeadLetterStore]:
        s = SqliteDeadLetterStore(tmp_path / "dl.db", archive=tmp_path / "dl.jsonl")
        yield s
        s.close()


class TestSqliteMemoryDeadLetterStore(DeadLetterConformance):
    @pytest.fixture
    def store(self) -> Iterator[DeadLetterStore]:
        s = SqliteDeadLetterStore(":memory:")
        yield s
        s.close()


def archive_lines(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return [json.loads(line) for line in data.splitlines()]


def test_entries_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "dl.db"
    first = SqliteDeadLetterStore(path)
    kept, done = letter("https://example.test/1"), letter("https://example.test/2")
    first.put([kept, done])
    first.resolve(done.id, "discarded", "ok")
    first.close()
    second = SqliteDeadLetterStore(path)
    try:
        assert second.location() == str(path)
        assert second.counts() == {"open": 1, "review": 0, "resolved": 1}
        got = second.get(done.id)
        assert got is not None
        assert (got.resolution_kind, got.resolution) == ("discarded", "ok")
        assert second.put([kept]) == 0
    finally:
        second.close()


def test_opening_a_non_database_raises_backend_error(tmp_path: Path) -> None:
    path = tmp_path / "dl.db"
    path.write_bytes(b"definitely not sqlite " * 100)
    with pytest.raises(BackendError, match=r"dl\.db"):
        SqliteDeadLetterStore(path)


def test_every_put_and_resolve_is_archived(tmp_path: Path) -> None:
    archive = tmp_path / "archive" / "dl.jsonl"  # parent folders are created
    store = SqliteDeadLetterStore(tmp_path / "dl.db", archive=archive)
    try:
        a = letter("https://example.test/a", payload={"name": "Zoë", "n": [1, 2]})
        b = letter("https://example.test/b", stage="parse", error_class="parse_error")
        store.put([a, b])
        rows = archive_lines(archive)
        assert [(r["event"], r["id"]) for r in rows] == [
            ("quarantined", a.id),
            ("quarantined", b.id),
        ]
        assert rows[0]["payload"] == {"name": "Zoë", "n": [1, 2]}
        assert rows[0]["url"] == a.url
        assert rows[1]["stage"] == "parse"
        assert all(isinstance(r["at"], float) for r in rows)

        store.put([letter("https://example.test/a", attempts=3, seen=T0 + 1)])  # seen again
        assert store.resolve(a.id, "repaired", "fixed") is True
        assert (
            store.resolve(a.id, "repaired", "fixed twice") is False
        )  # not archived: nothing happened
        assert store.resolve("no-such-id", "discarded", "x") is False
        rows = archive_lines(archive)
        assert [(r["event"], r["id"]) for r in rows[2:]] == [
            ("quarantined", a.id),
            ("resolved", a.id),
        ]
        assert rows[2]["attempts"] == 3
        assert (rows[3]["kind"], rows[3]["resolution"]) == ("repaired", "fixed")
        assert store.put([]) == 0
        assert len(archive_lines(archive)) == 4
    finally:
        store.close()


def test_archive_is_append_only(tmp_path: Path) -> None:
    archive = tmp_path / "dl.jsonl"
    store = SqliteDeadLetterStore(tmp_path / "dl.db", archive=archive)
    snapshots: list[bytes] = []

    def step() -> None:
        data = archive.read_bytes()
        if snapshots:
            assert data.startswith(snapshots[-1])
            assert len(data) > len(snapshots[-1])
        snapshots.append(data)

    try:
        for n in range(3):
            store.put([letter(f"https://example.test/{n}", attempts=n + 1)])
            step()
        store.put([letter("https://example.test/0", attempts=9, seen=T0 + 5)])
        step()
        store.resolve(letter("https://example.test/1").id, "discarded", "done")
        step()
        store.put([letter("https://example.test/1", seen=T0 + 9)])  # re-opens it
        step()
    finally:
        store.close()
    # a new store on the same files keeps appending to the same archive
    again = SqliteDeadLetterStore(tmp_path / "dl.db", archive=archive)
    try:
        again.resolve(letter("https://example.test/2").id, "discarded", "later")
        step()
    finally:
        again.close()
    events = [r["event"] for r in archive_lines(archive)]
    assert events == ["quarantined"] * 4 + ["resolved", "quarantined", "resolved"]


def test_archive_survives_a_deleted_database(tmp_path: Path) -> None:
    archive = tmp_path / "dl.jsonl"
    store = SqliteDeadLetterStore(tmp_path / "dl.db", archive=archive)
    entry = letter(payload={"x": 1})
    store.put([entry])
    store.close()
    for path in tmp_path.glob("dl.db*"):
        path.unlink()
    rows = archive_lines(archive)
    assert rows[0]["id"] == entry.id
    assert rows[0]["payload"] == {"x": 1}


def test_archive_rotates_by_size_and_loses_nothing(tmp_path: Path) -> None:
    archive = tmp_path / "dl.jsonl"
    store = SqliteDeadLetterStore(tmp_path / "dl.db", archive=archive, archive_max_bytes=2000)
    try:
        entries = [letter(f"https://example.test/{n}", payload={"n": n}) for n in range(30)]
        for entry in entries:
            store.put([entry])
        big = letter("https://example.test/big", payload={"blob": "x" * 5000})
        store.put([big])  # larger than the limit: lands whole in a file of its own
        store.resolve(entries[0].id, "discarded", "done")
    finally:
        store.close()
    assert store.archive is not None
    rotated = store.archive.rotated()
    assert len(rotated) >= 3
    assert [p.name for p in rotated] == sorted(p.name for p in rotated)
    assert rotated[0].name == "dl.00001.jsonl"
    for path in rotated:
        assert path.stat().st_size <= 2000 or len(archive_lines(path)) == 1
    rows = [row for path in store.archive.files() for row in archive_lines(path)]
    assert [r["id"] for r in rows] == [e.id for e in entries] + [big.id, entries[0].id]
    assert [r["event"] for r in rows][-1] == "resolved"
    assert archive_lines(archive)[-1]["event"] == "resolved"
    # a new store continues the numbering, never rewrites a rotated file
    before = {p.name: p.read_bytes() for p in rotated}
    again = SqliteDeadLetterStore(tmp_path / "dl.db", archive=archive, archive_max_bytes=2000)
    try:
        for n in range(30, 45):
            again.put([letter(f"https://example.test/{n}")])
    finally:
        again.close()
    assert again.archive is not None
    after = again.archive.rotated()
    assert len(after) > len(rotated)
    assert {p.name: p.read_bytes() for p in after if p.name in before} == before
    total = [row for path in again.archive.files() for row in archive_lines(path)]
    assert len(total) == len(rows) + 15


def test_a_store_created_before_the_review_columns_is_upgraded(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE deadletters (id TEXT PRIMARY KEY, source TEXT NOT NULL, url TEXT NOT NULL,"
        " stage TEXT NOT NULL, error_class TEXT NOT NULL, message TEXT NOT NULL,"
        " attempts INTEGER NOT NULL, first_seen REAL NOT NULL, last_seen REAL NOT NULL,"
        " record_key TEXT NOT NULL DEFAULT '', payload BLOB, failed_expectations BLOB,"
        " flow_run_id TEXT, status TEXT NOT NULL DEFAULT 'open', resolution TEXT);"
        "INSERT INTO deadletters VALUES ('old1', 'src', 'u', 'fetch', 'timeout', 'm', 1, 1.0,"
        " 1.0, '', NULL, NULL, NULL, 'open', NULL);"
    )
    db.commit()
    db.close()
    store = SqliteDeadLetterStore(path)
    try:
        got = store.get("old1")
        assert got is not None and got.requeues == 0
        assert store.escalate("old1", "human")
        ((_, taken),) = store.take_for_review("src", "alice")
        assert taken.id == "old1"
    finally:
        store.close()


# The layout before version 2 (user_version 0): the cause inside error_class, the kind inside the
# resolution text, review messages without a source. Written as that code wrote it.
_LAYOUT_1 = """
CREATE TABLE deadletters (
    id TEXT PRIMARY KEY, source TEXT NOT NULL, url TEXT NOT NULL, stage TEXT NOT NULL,
    error_class TEXT NOT NULL, message TEXT NOT NULL, attempts INTEGER NOT NULL,
    first_seen REAL NOT NULL, last_seen REAL NOT NULL, record_key TEXT NOT NULL DEFAULT '',
    payload BLOB, failed_expectations BLOB, flow_run_id TEXT,
    status TEXT NOT NULL DEFAULT 'open', resolution TEXT,
    claimed_by TEXT, claim_expires REAL, review_msg INTEGER, review_reason TEXT,
    requeues INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX deadletters_source ON deadletters (source, status, stage);
CREATE TABLE reviews (
    msg_id INTEGER PRIMARY KEY AUTOINCREMENT, entry_id TEXT NOT NULL, reason TEXT NOT NULL,
    created_at REAL NOT NULL, reviewer TEXT, taken_at REAL
);
CREATE INDEX reviews_free ON reviews (reviewer, msg_id);
"""


def test_a_store_of_the_previous_layout_is_migrated_on_open(tmp_path: Path) -> None:
    import sqlite3

    from collector.deadletter.base import dead_letter_id

    path = tmp_path / "v1.db"
    ids = {
        name: dead_letter_id("src", f"https://example.test/{name}", "fetch", cls)
        for name, cls in (("ex", "http_500"), ("rep", "http_404"), ("odd", "timeout"),
                          ("rev", "http_400"), ("open", "too_large"))
    }  # fmt: skip
    rows = [
        (ids["ex"], "ex", "retries_exhausted:http_500", "resolved", "reenqueued: re-enqueue #1",
         1, None),
        (ids["rep"], "rep", "http_404", "resolved", "repaired: trimmed name", 0, None),
        (ids["odd"], "odd", "max_total_exceeded:timeout", "resolved", "fixed by hand", 0, None),
        (ids["rev"], "rev", "http_400", "review", None, 0, 1),
        (ids["open"], "open", "too_large", "open", None, 0, None),
    ]  # fmt: skip
    db = sqlite3.connect(path)
    db.executescript(_LAYOUT_1)
    for eid, name, cls, status, resolution, requeues, msg in rows:
        db.execute(
            "INSERT INTO deadletters (id, source, url, stage, error_class, message, attempts,"
            " first_seen, last_seen, payload, failed_expectations, status, resolution, requeues,"
            " review_msg, review_reason) VALUES (?, 'src', ?, 'fetch', ?, 'm', 3, 1.0, 2.0,"
            " '{\"x\": 1}', '[]', ?, ?, ?, ?, ?)",
            (eid, f"https://example.test/{name}", cls, status, resolution, requeues, msg,
             "human" if msg else None),
        )  # fmt: skip
    db.execute("INSERT INTO reviews VALUES (1, ?, 'human', 1.0, NULL, NULL)", (ids["rev"],))
    db.commit()
    db.close()

    store = SqliteDeadLetterStore(path)
    try:
        ex = store.get(ids["ex"])
        assert ex is not None
        assert (ex.error_class, ex.cause, ex.requeues) == ("http_500", "retries_exhausted", 1)
        assert (ex.resolution_kind, ex.resolution) == ("reenqueued", "re-enqueue #1")
        rep = store.get(ids["rep"])
        assert rep is not None and (rep.resolution_kind, rep.resolution) == (
            "repaired",
            "trimmed name",
        )
        odd = store.get(ids["odd"])
        assert odd is not None
        assert (odd.error_class, odd.cause) == ("timeout", "max_total_exceeded")
        assert (odd.resolution_kind, odd.resolution) == (None, "fixed by hand")  # no kind known
        assert store.census("src").counts == {
            "open": 1, "review": 1, "resolved:reenqueued": 1, "resolved:repaired": 1,
            "resolved:": 1,
        }  # fmt: skip
        assert store.reasons("src", status=None)["fetch/retries_exhausted:http_500"] == 1
        assert store.list(error_class="http_500", status=None)[0].id == ids["ex"]
        ((message, taken),) = store.take_for_review("src", "alice")  # the queue kept its message
        assert taken.id == ids["rev"]
        assert store.finish_review(message, taken.id, "reviewed", "ok")
    finally:
        store.close()
    again = SqliteDeadLetterStore(path)  # a second open finds layout 2: nothing to do
    try:
        assert again.get(ids["ex"]) == ex
        assert again._db.execute("PRAGMA user_version").fetchone() == (2,)
    finally:
        again.close()


def test_a_closed_store_refuses_work(tmp_path: Path) -> None:
    with SqliteDeadLetterStore(tmp_path / "dl.db") as store:
        store.put([letter()])
    with pytest.raises(Exception, match="closed"):  # sqlite3's own error
        store.put([letter("https://example.test/2")])
