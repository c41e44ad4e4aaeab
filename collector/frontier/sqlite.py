"""SQLite frontier: the embedded default, one file per source folder, safe across processes.

Each public method is one transaction (``BEGIN IMMEDIATE``), so a claim cannot interleave with
another process's claim and a process killed mid-way leaves the file as it was before that
step. WAL mode lets readers (``collector status``) run beside a worker. The fencing token is a
row in ``meta`` incremented inside the claim transaction, so it only ever grows.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from itertools import islice
from pathlib import Path

from collector._closing import Closing
from collector.errors import BackendError
from collector.frontier.base import (
    AckResult,
    ClaimedItem,
    Completed,
    DeadLettered,
    Holder,
    Lease,
    Offer,
    OfferResult,
    Outcome,
    RankFor,
    RetryLater,
    StateCounts,
    StoredRow,
    plan_decision,
)
from collector.sqlite_tx import write_transaction

__all__ = ["SqliteFrontier"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS items (
    source TEXT NOT NULL,
    url TEXT NOT NULL,
    state TEXT NOT NULL,
    rank REAL NOT NULL,
    enqueued_at REAL NOT NULL,
    not_before REAL NOT NULL DEFAULT 0,
    expires_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    first_attempt_at REAL,
    lease_token INTEGER,
    lease_expires REAL,
    fresh_until REAL,
    last_fetched_at REAL,
    cost REAL NOT NULL DEFAULT 0,
    last_error TEXT,
    run_id TEXT,
    PRIMARY KEY (source, url)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS items_queue ON items (source, state, rank DESC);
CREATE INDEX IF NOT EXISTS items_lease ON items (source, lease_token) WHERE state = 'leased';
CREATE INDEX IF NOT EXISTS items_run ON items (source, run_id, state);
CREATE INDEX IF NOT EXISTS items_expiry ON items (source, state, expires_at);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS leases (
    token INTEGER PRIMARY KEY,
    source TEXT NOT NULL,
    holder TEXT NOT NULL,
    claimed_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS leases_holder ON leases (source, holder);
CREATE TABLE IF NOT EXISTS holders (
    source TEXT NOT NULL,
    holder TEXT NOT NULL,
    beat_at REAL NOT NULL,
    PRIMARY KEY (source, holder)
) WITHOUT ROWID;
INSERT OR IGNORE INTO meta (key, value) VALUES ('fencing_token', 0);
"""

_LEASE_ROWS_KEPT_S = 86_400.0  # holder rows of old leases are pruned after a day
_CHUNK = 500  # SQLite's default limit on bound parameters is generous, but keep statements small


def _chunks(items: Iterable[Offer], size: int) -> Iterator[list[Offer]]:
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


class SqliteFrontier(Closing):
    """Frontier in one SQLite file (``":memory:"`` for a throwaway in-process queue)."""

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 30.0) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(
                self.path,
                timeout=busy_timeout_s,
                isolation_level=None,  # we issue BEGIN IMMEDIATE ourselves
                check_same_thread=False,
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise BackendError(f"frontier {self.path}: cannot open SQLite database: {exc}") from exc
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SqliteFrontier({self.path!r})"

    def location(self) -> str:
        return self.path

    def _transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        return write_transaction(self._db, self._lock, f"frontier {self.path}")

    # --- planning --------------------------------------------------------------------------
    def offer(
        self,
        source: str,
        offers: Iterable[Offer],
        *,
        now: float,
        queue_ttl_s: float,
        rank_for: RankFor,
        run_id: str,
    ) -> OfferResult:
        result = OfferResult()
        seen: set[str] = set()  # a URL offered twice in one call is queued once
        for chunk in _chunks(offers, _CHUNK):
            with self._transaction() as db:
                marks = ",".join("?" * len(chunk))
                rows = {
                    url: StoredRow(state, fresh_until, fetched)
                    for url, state, fresh_until, fetched in db.execute(
                        "SELECT url, state, fresh_until, last_fetched_at FROM items "
                        f"WHERE source = ? AND url IN ({marks})",
                        [source, *(o.url for o in chunk)],
                    )
                }
                inserts, requeues, tags = [], [], []
                planned = seen
                for o in chunk:
                    row = rows.get(o.url)
                    action = "already_queued" if o.url in planned else plan_decision(row, now)
                    planned.add(o.url)
                    if action == "enqueue":
                        result.enqueued += 1
                        rank = rank_for(o.url, None, o.fresh_s)
                        inserts.append((source, o.url, rank, now, now + queue_ttl_s, run_id))
                    elif action == "requeue":
                        result.enqueued += 1
                        fetched = row.last_fetched_at if row else None
                        age = None if fetched is None else now - fetched
                        rank = rank_for(o.url, age, o.fresh_s)
                        requeues.append((rank, now, now + queue_ttl_s, run_id, source, o.url))
                    else:
                        if action == "fresh":
                            result.fresh_skipped += 1
                        elif action == "already_queued":
                            result.already_queued += 1
                        else:
                            result.already_dead += 1
                        tags.append((run_id, source, o.url))
                db.executemany(
                    "INSERT INTO items (source, url, state, rank, enqueued_at, expires_at, run_id)"
                    " VALUES (?, ?, 'queued', ?, ?, ?, ?)",
                    inserts,
                )
                db.executemany(
                    "UPDATE items SET state = 'queued', rank = ?, enqueued_at = ?, not_before = 0,"
                    " expires_at = ?, attempts = 0, first_attempt_at = NULL, lease_token = NULL,"
                    " lease_expires = NULL, last_error = NULL, run_id = ?"
                    " WHERE source = ? AND url = ?",
                    requeues,
                )
                db.executemany("UPDATE items SET run_id = ? WHERE source = ? AND url = ?", tags)
        return result

    # --- claiming --------------------------------------------------------------------------
    def claim(
        self, source: str, limit: int, *, now: float, lease_s: float, holder: str = ""
    ) -> Lease:
        with self._transaction() as db:
            reclaimed = db.execute(
                "UPDATE items SET state = 'queued', lease_token = NULL, lease_expires = NULL"
                " WHERE source = ? AND state = 'leased' AND lease_expires <= ?",
                (source, now),
            ).rowcount
            expired = db.execute(
                "UPDATE items SET state = 'expired', last_error = 'queue_ttl_expired'"
                " WHERE source = ? AND state = 'queued' AND expires_at <= ?",
                (source, now),
            ).rowcount
            (token,) = db.execute(
                "UPDATE meta SET value = value + 1 WHERE key = 'fencing_token' RETURNING value"
            ).fetchone()
            expires_at = now + lease_s
            rows = db.execute(
                "UPDATE items SET state = 'leased', lease_token = ?, lease_expires = ?"
                " WHERE source = ? AND url IN ("
                "   SELECT url FROM items WHERE source = ? AND state = 'queued'"
                "   AND not_before <= ? ORDER BY rank DESC LIMIT ?)"
                " RETURNING url, attempts, first_attempt_at, enqueued_at, rank",
                (token, expires_at, source, source, now, limit),
            ).fetchall()
            if holder and rows:
                db.execute(
                    "INSERT INTO leases (token, source, holder, claimed_at) VALUES (?, ?, ?, ?)",
                    (token, source, holder, now),
                )
        rows.sort(key=lambda r: -r[4])
        items = tuple(ClaimedItem(url, att, first, enq) for url, att, first, enq, _ in rows)
        return Lease(
            source, token, expires_at, items, expired=expired, reclaimed=reclaimed, holder=holder
        )

    def beat(self, source: str, holder: str, *, now: float) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT INTO holders (source, holder, beat_at) VALUES (?, ?, ?)"
                " ON CONFLICT (source, holder) DO UPDATE SET beat_at = excluded.beat_at",
                (source, holder, now),
            )
            db.execute(
                "DELETE FROM leases WHERE source = ? AND claimed_at < ?",
                (source, now - _LEASE_ROWS_KEPT_S),
            )

    def holders(self, source: str) -> list[Holder]:
        with self._lock:
            rows = self._db.execute(
                "SELECT COALESCE(l.holder, ''), COUNT(*), h.beat_at FROM items i"
                " LEFT JOIN leases l ON l.token = i.lease_token"
                " LEFT JOIN holders h ON h.source = i.source AND h.holder = l.holder"
                " WHERE i.source = ? AND i.state = 'leased'"
                " GROUP BY l.holder",
                (source,),
            ).fetchall()
        return [Holder(holder, leased, beat_at) for holder, leased, beat_at in rows]

    def revoke(self, source: str, holder: str, *, now: float) -> int:
        with self._transaction() as db:
            revoked = db.execute(
                "UPDATE items SET state = 'queued', lease_token = NULL, lease_expires = NULL"
                " WHERE source = ? AND state = 'leased' AND lease_token IN ("
                "   SELECT token FROM leases WHERE source = ? AND holder = ?)",
                (source, source, holder),
            ).rowcount
            db.execute("DELETE FROM leases WHERE source = ? AND holder = ?", (source, holder))
            db.execute("DELETE FROM holders WHERE source = ? AND holder = ?", (source, holder))
        return revoked

    def renew(self, lease: Lease, *, now: float, lease_s: float) -> int:
        with self._transaction() as db:
            return db.execute(
                "UPDATE items SET lease_expires = ? WHERE source = ? AND state = 'leased'"
                " AND lease_token = ?",
                (now + lease_s, lease.source, lease.token),
            ).rowcount

    def ack(self, lease: Lease, outcomes: Sequence[Outcome], *, now: float) -> AckResult:
        result = AckResult()
        held = "source = ? AND url = ? AND state = 'leased' AND lease_token = ?"
        with self._transaction() as db:
            for outcome in outcomes:
                if isinstance(outcome, Completed):
                    changed = db.execute(
                        "UPDATE items SET state = 'done', fresh_until = ?, last_fetched_at = ?,"
                        " cost = ?, attempts = 0, first_attempt_at = NULL, lease_token = NULL,"
                        f" lease_expires = NULL, last_error = NULL WHERE {held}",
                        (
                            outcome.fresh_until,
                            outcome.fetched_at,
                            outcome.cost,
                            lease.source,
                            outcome.url,
                            lease.token,
                        ),
                    ).rowcount
                elif isinstance(outcome, RetryLater):
                    changed = db.execute(
                        "UPDATE items SET state = 'queued', not_before = ?, rank = ?,"
                        " attempts = ?, first_attempt_at = ?, last_error = ?,"
                        " expires_at = MAX(expires_at, ? + (expires_at - enqueued_at)),"
                        f" lease_token = NULL, lease_expires = NULL WHERE {held}",
                        (
                            outcome.not_before,
                            outcome.rank,
                            outcome.attempts,
                            outcome.first_attempt_at,
                            outcome.error,
                            outcome.not_before,
                            lease.source,
                            outcome.url,
                            lease.token,
                        ),
                    ).rowcount
                elif isinstance(outcome, DeadLettered):
                    changed = db.execute(
                        "UPDATE items SET state = 'dead', attempts = ?, last_error = ?,"
                        f" lease_token = NULL, lease_expires = NULL WHERE {held}",
                        (outcome.attempts, outcome.error, lease.source, outcome.url, lease.token),
                    ).rowcount
                else:  # pragma: no cover - the type union is closed
                    raise TypeError(f"unknown outcome {outcome!r}")
                if changed:
                    result.accepted += 1
                else:
                    result.stale.append(outcome.url)
        return result

    def release(self, lease: Lease, *, now: float) -> int:
        with self._transaction() as db:
            return db.execute(
                "UPDATE items SET state = 'queued', lease_token = NULL, lease_expires = NULL"
                " WHERE source = ? AND state = 'leased' AND lease_token = ?",
                (lease.source, lease.token),
            ).rowcount

    def requeue(self, source: str, urls: Sequence[str], *, now: float, queue_ttl_s: float) -> int:
        with self._transaction() as db:
            return sum(
                db.execute(
                    "UPDATE items SET state = 'queued', not_before = 0, attempts = 0,"
                    " first_attempt_at = NULL, enqueued_at = ?, expires_at = ?, last_error = NULL"
                    " WHERE source = ? AND url = ? AND state IN ('dead', 'expired')",
                    (now, now + queue_ttl_s, source, url),
                ).rowcount
                for url in urls
            )

    def revive(self, source: str, pages: Sequence[Completed]) -> int:
        with self._transaction() as db:
            return sum(
                db.execute(
                    "UPDATE items SET state = 'done', fresh_until = ?, last_fetched_at = ?,"
                    " cost = ?, attempts = 0, first_attempt_at = NULL, not_before = 0,"
                    " last_error = NULL WHERE source = ? AND url = ? AND state = 'dead'",
                    (page.fresh_until, page.fetched_at, page.cost, source, page.url),
                ).rowcount
                for page in pages
            )

    def make_stale(self, source: str, urls: Sequence[str]) -> int:
        with self._transaction() as db:
            return sum(
                db.execute(
                    "UPDATE items SET fresh_until = NULL"
                    " WHERE source = ? AND url = ? AND state = 'done'",
                    (source, url),
                ).rowcount
                for url in urls
            )

    # --- reading ---------------------------------------------------------------------------
    def _count(self, where: str, params: tuple[str, ...]) -> StateCounts:
        counts = StateCounts()
        with self._lock:
            for state, n in self._db.execute(
                f"SELECT state, COUNT(*) FROM items WHERE {where} GROUP BY state", params
            ):
                setattr(counts, state, n)
        return counts

    def counts(self, source: str) -> StateCounts:
        return self._count("source = ?", (source,))

    def run_counts(self, source: str, run_id: str) -> StateCounts:
        return self._count("source = ? AND run_id = ?", (source, run_id))

    def next_event_at(self, source: str, *, now: float) -> float | None:
        with self._lock:
            (due,) = self._db.execute(
                "SELECT MIN(CASE WHEN state = 'queued' THEN not_before ELSE lease_expires END)"
                " FROM items WHERE source = ? AND state IN ('queued', 'leased')",
                (source,),
            ).fetchone()
        return None if due is None else float(due)

    def close(self) -> None:
        with self._lock:
            self._db.close()
