"""One write transaction on a SQLite connection shared by threads, as both SQLite stores use it.

``BEGIN IMMEDIATE`` takes the write lock at the start, so another process's transaction waits
(up to the connection's busy timeout) instead of interleaving with ours; the thread lock keeps
this process's threads from nesting transactions on the one connection. Any failure rolls back,
and SQLite's own errors become one-line :class:`~collector.errors.BackendError` naming the store
and its file (a full disk or a lock held past the timeout is an operator's problem, not a bug).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from collector.errors import BackendError

__all__ = ["open_target", "write_transaction"]


def open_target(path: str, *, existing_only: bool) -> tuple[str, bool]:
    """Where a SQLite store connects, and whether its file existed. ``existing_only`` (commands
    that only read, ``status``): a missing file is not made, nor its folder; the store connects
    to ``:memory:`` and reads as empty. Otherwise the folder is made for the file."""
    existed = path == ":memory:" or Path(path).exists()
    if existed:
        return path, True
    if existing_only:
        return ":memory:", False
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return path, False


@contextmanager
def write_transaction(
    db: sqlite3.Connection, lock: threading.Lock, where: str
) -> Iterator[sqlite3.Connection]:
    """``with write_transaction(db, lock, "frontier /path/f.db") as db: ...`` commits on exit."""
    with lock:
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise BackendError(f"{where}: {exc}") from exc
        try:
            yield db
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            db.execute("ROLLBACK")
            raise BackendError(f"{where}: {exc}") from exc
        except BaseException:
            db.execute("ROLLBACK")
            raise
