"""The one write transaction both SQLite stores use: all or nothing, one-line errors."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from collector.errors import BackendError
from collector.sqlite_tx import write_transaction


@pytest.fixture
def db(tmp_path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(tmp_path / "t.db", isolation_level=None, check_same_thread=False)
    conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY)")
    return conn


def rows(db: sqlite3.Connection) -> list[str]:
    return [r[0] for r in db.execute("SELECT k FROM t ORDER BY k")]


def test_commits_on_success(db: sqlite3.Connection) -> None:
    with write_transaction(db, threading.Lock(), "store x") as tx:
        tx.execute("INSERT INTO t VALUES ('a')")
    assert rows(db) == ["a"]


def test_sqlite_error_rolls_back_and_names_the_store(db: sqlite3.Connection) -> None:
    lock = threading.Lock()
    failing = pytest.raises(BackendError, match=r"^store x: UNIQUE constraint failed")
    with failing, write_transaction(db, lock, "store x") as tx:
        tx.execute("INSERT INTO t VALUES ('a')")
        tx.execute("INSERT INTO t VALUES ('a')")
    assert rows(db) == []  # the first insert went too
    with write_transaction(db, lock, "store x") as tx:  # no transaction left open
        tx.execute("INSERT INTO t VALUES ('b')")
    assert rows(db) == ["b"]


def test_any_other_error_rolls_back_and_passes_through(db: sqlite3.Connection) -> None:
    with pytest.raises(KeyError), write_transaction(db, threading.Lock(), "store x") as tx:
        tx.execute("INSERT INTO t VALUES ('a')")
        raise KeyError("boom")
    assert rows(db) == []


def test_a_write_lock_held_elsewhere_past_the_timeout_is_one_line(
    db: sqlite3.Connection, tmp_path: Path
) -> None:
    other = sqlite3.connect(tmp_path / "t.db", isolation_level=None, timeout=0.05)
    other.execute("BEGIN IMMEDIATE")
    db.execute("PRAGMA busy_timeout = 50")
    try:
        locked = pytest.raises(BackendError, match=r"^store x: database is locked$")
        with locked, write_transaction(db, threading.Lock(), "store x"):
            pass
    finally:
        other.execute("ROLLBACK")
