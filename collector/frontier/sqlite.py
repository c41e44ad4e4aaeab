"""SQLite frontier: the embedded default, one file per source folder, safe across processes.

Each public method is one transaction (``BEGIN IMMEDIATE``), so a claim cannot interleave with
another process's claim and a process killed mid-way leaves the file as it was before that
step (a plan is one transaction per chunk of 2,000 URLs: each URL's decision stands alone). WAL
mode lets readers (``collector status``) run beside a worker. The fencing token is a row in
``meta`` incremented inside the claim transaction, so it only ever grows.

Layout (schema version 6, ``PRAGMA user_version``): one rowid table ``items`` whose indexes
point at the 8-byte rowid, not at the URL. A URL is found through ``items_url`` on ``(src, h)``,
``h`` its 64-bit :func:`~collector.frontier.url_key.url_key` (a shared ``h`` is told apart by
comparing the URL itself), which keeps the URLs of a template range in order in that index, so a
plan writes it like appends. Sources and runs are small integers (``sources``, ``runs``) and
states are numbers (1 queued, 2 leased, 3 done, 4 dead, 5 expired, 6 retired, as ``STATES``).
The indexes are partial where only one state needs them: the queue (rank, then URL for ties, as
Redis orders them) and the queue TTL over queued items, the due index over done items by
``fresh_until`` and one over expired items (what :meth:`adopt` reads), leases over leased ones.
There is no index by run: ``run_counts`` (once, when a run closes its ledger) reads the source's
rows, which costs less than keeping a fifth index on every write of every item. ~185 bytes a
queued URL against ~390 for version 1 (URL, text state and run id repeated in four indexes).
``counts`` holds how many items of each source are in each state, moved by every method that
moves items in the same transaction (one upsert of a few rows per call, not a trigger per row:
a trigger doubled the CPU of an offer), so :meth:`~SqliteFrontier.counts` reads a few rows, not
the source's; :meth:`~SqliteFrontier.scan_counts` is the plain count it is tested against.
Older files are migrated when opened, in one transaction: version 1 rewritten, version 2 (the
same layout, ``h`` the first 64 bits of the URL's SHA-1) re-keyed, version 3 given the two
validator columns (``etag``, ``last_modified``: NULL, none known, so the next fetch of each page
is a plain one), version 4 the ``history`` column (:class:`~collector.frontier.base.PageHistory`
as its text; NULL: none yet), version 5 the ``counts`` table. Every migration counts the items
again, so a file that older code (which keeps no counts, and sets the version back) wrote is
counted afresh when it is next opened here.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from itertools import islice
from pathlib import Path
from typing import TypeVar

from collector._closing import Closing
from collector.errors import BackendError
from collector.frontier.base import (
    STATES,
    AckResult,
    ClaimedItem,
    Completed,
    DeadLettered,
    FreshFor,
    Holder,
    Lease,
    Offer,
    OfferResult,
    Outcome,
    PageHistory,
    RankFor,
    RetryLater,
    StateCounts,
    StoredRow,
    SweepResult,
    plan_decision,
)
from collector.frontier.url_key import url_key
from collector.sqlite_tx import open_target, write_transaction

__all__ = ["SqliteFrontier", "url_key"]

_T = TypeVar("_T")

SCHEMA_VERSION = 6
# state numbers (the position in STATES, from 1); written into the SQL as literals so that the
# partial indexes apply (SQLite matches an index's WHERE only against literal terms)
Q, L, D, X, E, R = 1, 2, 3, 4, 5, 6

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS sources (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY, run_id TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS plans (src INTEGER PRIMARY KEY, mark TEXT);
CREATE TABLE IF NOT EXISTS items (
    id INTEGER PRIMARY KEY,
    src INTEGER NOT NULL,
    h INTEGER NOT NULL,
    url TEXT NOT NULL,
    state INTEGER NOT NULL,
    run INTEGER,
    rank REAL NOT NULL,
    enqueued_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    not_before REAL NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    first_attempt_at REAL,
    lease_token INTEGER,
    lease_expires REAL,
    fresh_until REAL,
    last_fetched_at REAL,
    cost REAL NOT NULL DEFAULT 0,
    last_error TEXT,
    gone INTEGER,
    etag TEXT,
    last_modified TEXT,
    history TEXT
);
CREATE INDEX IF NOT EXISTS items_url ON items (src, h);
CREATE INDEX IF NOT EXISTS items_queue ON items (src, rank DESC, url) WHERE state = {Q};
CREATE INDEX IF NOT EXISTS items_expiry ON items (src, expires_at) WHERE state = {Q};
CREATE INDEX IF NOT EXISTS items_lease ON items (src, lease_token) WHERE state = {L};
CREATE INDEX IF NOT EXISTS items_due ON items (src, fresh_until) WHERE state = {D};
CREATE INDEX IF NOT EXISTS items_expired ON items (src) WHERE state = {E};
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
CREATE TABLE IF NOT EXISTS counts (
    src INTEGER NOT NULL,
    state INTEGER NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (src, state)
) WITHOUT ROWID;
INSERT OR IGNORE INTO meta (key, value) VALUES ('fencing_token', 0);
"""

# the kept counts, moved by a delta per state; and counted afresh from the rows (a migration)
_MOVE_COUNT = (
    "INSERT INTO counts (src, state, n) VALUES (?, ?, ?)"
    " ON CONFLICT (src, state) DO UPDATE SET n = n + excluded.n"
)
_RECOUNT = """
DELETE FROM counts;
INSERT INTO counts (src, state, n) SELECT src, state, COUNT(*) FROM items GROUP BY src, state
"""

# version 1: one WITHOUT ROWID table keyed by (source, url), text states and run ids
_MIGRATE_V1 = f"""
ALTER TABLE items RENAME TO items_v1;
DROP INDEX IF EXISTS items_queue;
DROP INDEX IF EXISTS items_lease;
DROP INDEX IF EXISTS items_run;
DROP INDEX IF EXISTS items_expiry;
{_SCHEMA}
INSERT OR IGNORE INTO sources (name) SELECT DISTINCT source FROM items_v1;
INSERT OR IGNORE INTO runs (run_id) SELECT DISTINCT run_id FROM items_v1 WHERE run_id IS NOT NULL;
INSERT INTO items (src, h, url, state, run, rank, enqueued_at, expires_at, not_before, attempts,
    first_attempt_at, lease_token, lease_expires, fresh_until, last_fetched_at, cost, last_error)
SELECT (SELECT id FROM sources WHERE name = v.source), url_key(v.url), v.url,
    CASE v.state WHEN 'queued' THEN {Q} WHEN 'leased' THEN {L} WHEN 'done' THEN {D}
        WHEN 'dead' THEN {X} ELSE {E} END,
    (SELECT id FROM runs WHERE run_id = v.run_id), v.rank, v.enqueued_at, v.expires_at,
    v.not_before, v.attempts, v.first_attempt_at, v.lease_token, v.lease_expires, v.fresh_until,
    v.last_fetched_at, v.cost, v.last_error
FROM items_v1 AS v;
DROP TABLE items_v1;
"""

# version 2: the same layout, h the first 64 bits of SHA-1(url)
_REKEY_V2 = """
DROP INDEX items_url;
UPDATE items SET h = url_key(url);
CREATE INDEX items_url ON items (src, h);
"""

# versions 2 and 3 have no validators (ETag, Last-Modified), 2 to 4 no history: NULL columns
# added, none known
_ADDED_COLUMNS = ("etag", "last_modified", "history")

_LEASE_ROWS_KEPT_S = 86_400.0  # holder rows of old leases are pruned after a day
_CHUNK = 500  # rows per step of adopt (each a transaction of its own)
_OFFER_CHUNK = 2_000  # URLs per offer transaction: fewer commits, bounded statement size
# page cache: a list of unrelated URLs writes the URL index at random places, and below this a
# plan of such a list re-reads index pages; twice as much only adds to a plan's peak RSS
_CACHE_KIB = 32_768
# pages of a new file: fewer per URL (~1.3 bytes less a queued URL than 4,096, and the plan ~4 %
# faster); an existing file keeps its own (a WAL file cannot change it)
_PAGE_BYTES = 8_192


def _chunks(items: Iterable[_T], size: int) -> Iterator[list[_T]]:
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


def _key_filter(keys: list[int]) -> tuple[str, list[int]]:
    """The WHERE term (and its parameters) that finds the rows of these URL keys: one range read
    when they form a run (a template range), else a list. A range may bring other rows too."""
    low, high = min(keys), max(keys)
    if high - low <= 4 * len(keys):
        return "h BETWEEN ? AND ?", [low, high]
    return f"h IN ({','.join('?' * len(keys))})", keys


class SqliteFrontier(Closing):
    """Frontier in one SQLite file (``":memory:"`` for a throwaway in-process queue)."""

    def __init__(
        self, path: str | Path, *, busy_timeout_s: float = 30.0, existing_only: bool = False
    ) -> None:
        """``existing_only``: for commands that only read (``status``). A file that does not
        exist is then neither made nor its folder: the frontier reads as empty (an in-memory
        one) and :attr:`existed` is False, so the source "has not run here yet"."""
        self.path = str(path)
        opened, self.existed = open_target(self.path, existing_only=existing_only)
        self._lock = threading.Lock()
        self._sources: dict[str, int] = {}
        self._runs: dict[str, int] = {}
        try:
            self._db = sqlite3.connect(
                opened,
                timeout=busy_timeout_s,
                isolation_level=None,  # we issue BEGIN IMMEDIATE ourselves
                check_same_thread=False,
            )
            self._db.create_function("url_key", 1, url_key, deterministic=True)
            self._db.execute(f"PRAGMA page_size = {_PAGE_BYTES}")  # only for a new file
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(f"PRAGMA cache_size = -{_CACHE_KIB}")
            self._open_schema()
        except sqlite3.Error as exc:
            raise BackendError(f"frontier {self.path}: cannot open SQLite database: {exc}") from exc

    def _open_schema(self) -> None:
        """Create the tables, or migrate an older file (one transaction; a crash keeps it as it
        was)."""
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        if version == SCHEMA_VERSION:
            return
        with self._transaction() as db:
            (version,) = db.execute("PRAGMA user_version").fetchone()  # another process?
            if version == SCHEMA_VERSION:
                return
            columns = {row[1] for row in db.execute("PRAGMA table_info(items)")}
            if "source" in columns:
                script = _MIGRATE_V1
            elif version == 2:
                script = _REKEY_V2 + ";" + _SCHEMA
            else:  # a new file, or versions 3 to 5: the tables (and indexes) they lack
                script = _SCHEMA
            for statement in _statements(script):
                db.execute(statement)
            have = {row[1] for row in db.execute("PRAGMA table_info(items)")}
            for column in _ADDED_COLUMNS:
                if column not in have:
                    db.execute(f"ALTER TABLE items ADD COLUMN {column} TEXT")
            for statement in _statements(_RECOUNT):
                db.execute(statement)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def __repr__(self) -> str:
        return f"SqliteFrontier({self.path!r})"

    def location(self) -> str:
        return self.path

    def _transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        return write_transaction(self._db, self._lock, f"frontier {self.path}")

    # --- small integers for names ------------------------------------------------------------
    def _src(self, db: sqlite3.Connection, source: str) -> int:
        """The source's number, created if new (inside a write transaction)."""
        number = self._sources.get(source)
        if number is None:
            db.execute("INSERT OR IGNORE INTO sources (name) VALUES (?)", (source,))
            (number,) = db.execute("SELECT id FROM sources WHERE name = ?", (source,)).fetchone()
            self._sources[source] = number
        return number

    def _known_src(self, source: str) -> int | None:
        """The source's number for reading, or None when the file has never seen it."""
        number = self._sources.get(source)
        if number is None:
            row = self._db.execute("SELECT id FROM sources WHERE name = ?", (source,)).fetchone()
            if row is None:
                return None
            number = self._sources[source] = row[0]
        return number

    def _run(self, db: sqlite3.Connection, run_id: str) -> int:
        number = self._runs.get(run_id)
        if number is None:
            db.execute("INSERT OR IGNORE INTO runs (run_id) VALUES (?)", (run_id,))
            (number,) = db.execute("SELECT id FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            self._runs[run_id] = number
        return number

    @staticmethod
    def _move(db: sqlite3.Connection, src: int, *moves: tuple[int, int, int]) -> None:
        """Keep ``counts`` in step: each move is ``(n, from_state, to_state)``, 0 for a new item
        (inside the write transaction that moved the items)."""
        delta: dict[int, int] = {}
        for n, old, new in moves:
            if n:
                if old:
                    delta[old] = delta.get(old, 0) - n
                delta[new] = delta.get(new, 0) + n
        db.executemany(_MOVE_COUNT, [(src, state, n) for state, n in delta.items() if n])

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
        once_per_run: bool = False,
    ) -> OfferResult:
        result = OfferResult()
        # a URL offered twice in one call is queued once; with once_per_run the run tag says so
        seen: set[str] = set()
        expires_at = now + queue_ttl_s
        for chunk in _chunks(offers, _OFFER_CHUNK):
            hashes = [url_key(o.url) for o in chunk]
            where, keys = _key_filter(hashes)
            with self._transaction() as db:
                src, run = self._src(db, source), self._run(db, run_id)
                # the stored rows of the chunk's URLs (a range read may bring others: unused)
                rows = {
                    url: (rowid, item_run, state, fresh_until, fetched)
                    for rowid, url, item_run, state, fresh_until, fetched in db.execute(
                        "SELECT id, url, run, state, fresh_until, last_fetched_at FROM items "
                        f"WHERE src = ? AND {where}",
                        [src, *keys],
                    )
                }
                planned = set() if once_per_run else seen
                inserts, requeues, tags = [], [], []
                requeued: dict[int, int] = {}  # requeues by the state they leave
                if not rows:  # all new (a new seed list): plan_decision(None) is "enqueue"
                    for o, h in zip(chunk, hashes, strict=True):
                        if o.url in planned:
                            if once_per_run:
                                result.duplicates += 1
                            else:
                                result.already_queued += 1
                            continue
                        planned.add(o.url)
                        rank = rank_for(o.url, None, o.fresh_s)
                        inserts.append((src, h, o.url, run, rank, now, expires_at))
                    result.enqueued += len(inserts)
                else:  # some are known: plan_decision for each
                    for o, h in zip(chunk, hashes, strict=True):
                        found = rows.get(o.url)
                        if o.url in planned:
                            if once_per_run:
                                result.duplicates += 1
                            else:
                                result.already_queued += 1
                            continue
                        planned.add(o.url)
                        if once_per_run and found is not None and found[1] == run:
                            result.duplicates += 1
                            continue
                        row = None if found is None else StoredRow(STATES[found[2] - 1], *found[3:])
                        action = plan_decision(row, now)
                        if action == "enqueue":
                            result.enqueued += 1
                            rank = rank_for(o.url, None, o.fresh_s)
                            inserts.append((src, h, o.url, run, rank, now, expires_at))
                        elif action == "requeue":
                            assert found is not None and row is not None
                            result.enqueued += 1
                            fetched = row.last_fetched_at
                            age = None if fetched is None else now - fetched
                            rank = rank_for(o.url, age, o.fresh_s)
                            requeues.append((rank, now, expires_at, run, found[0]))
                            requeued[found[2]] = requeued.get(found[2], 0) + 1
                        else:
                            assert found is not None
                            if action == "fresh":
                                result.fresh_skipped += 1
                            elif action == "already_queued":
                                result.already_queued += 1
                            else:
                                result.already_dead += 1
                            tags.append((run, found[0]))
                db.executemany(
                    "INSERT INTO items (src, h, url, state, run, rank, enqueued_at, expires_at)"
                    f" VALUES (?, ?, ?, {Q}, ?, ?, ?, ?)",
                    inserts,
                )
                db.executemany(
                    f"UPDATE items SET state = {Q}, rank = ?, enqueued_at = ?, not_before = 0,"
                    " expires_at = ?, attempts = 0, first_attempt_at = NULL, lease_token = NULL,"
                    " lease_expires = NULL, last_error = NULL, run = ?, gone = NULL"
                    " WHERE id = ?",
                    requeues,
                )
                db.executemany("UPDATE items SET run = ?, gone = NULL WHERE id = ?", tags)
                moves = [(n, old, Q) for old, n in requeued.items()]
                self._move(db, src, (len(inserts), 0, Q), *moves)
        return result

    def sweep(self, source: str, run_id: str, *, retire: bool) -> SweepResult:
        result = SweepResult()
        with self._transaction() as db:
            src, run = self._src(db, source), self._run(db, run_id)
            result.carried = db.execute(
                f"UPDATE items SET run = ?, gone = 1 WHERE src = ? AND state = {L}"
                " AND run IS NOT ?",
                (run, src, run),
            ).rowcount
            queued = (
                f"UPDATE items SET state = {R}, run = ?, gone = 1, lease_token = NULL"
                if retire
                else "UPDATE items SET run = ?, gone = 1"
            )
            moved = db.execute(
                f"{queued} WHERE src = ? AND state = {Q} AND run IS NOT ?", (run, src, run)
            ).rowcount
            if retire:
                result.retired = moved
                self._move(db, src, (moved, Q, R))
            else:
                result.carried += moved
            # done and expired items the list no longer names are not this run's business,
            # but an unchanged plan later must not queue them again when they fall due
            for state in (D, E):
                db.execute(
                    f"UPDATE items SET gone = 1 WHERE src = ? AND state = {state}"
                    " AND run IS NOT ? AND gone IS NULL",
                    (src, run),
                )
        return result

    def renew_queue_ttl(self, source: str, *, now: float, queue_ttl_s: float) -> int:
        with self._transaction() as db:
            return int(
                db.execute(
                    f"UPDATE items SET expires_at = ? WHERE src = ? AND state = {Q}"
                    " AND expires_at <= ?",
                    (now + queue_ttl_s, self._src(db, source), now),
                ).rowcount
            )

    def unlist(self, source: str, urls: Iterable[str], run_id: str, *, retire: bool) -> SweepResult:
        result = SweepResult()
        for chunk in _chunks(urls, _OFFER_CHUNK):
            wanted = set(chunk)
            where, keys = _key_filter([url_key(u) for u in chunk])
            with self._transaction() as db:
                src, run = self._src(db, source), self._run(db, run_id)
                carry, drop, mark = [], [], []
                for rowid, url, state, item_run, gone in db.execute(
                    f"SELECT id, url, state, run, gone FROM items WHERE src = ? AND {where}",
                    [src, *keys],
                ):
                    if url not in wanted or item_run == run:
                        continue
                    if state == L or (state == Q and not retire):
                        carry.append((run, rowid))
                    elif state == Q:
                        drop.append((run, rowid))
                    elif state in (D, E) and gone is None:
                        mark.append((rowid,))
                db.executemany("UPDATE items SET run = ?, gone = 1 WHERE id = ?", carry)
                retired = db.executemany(
                    f"UPDATE items SET state = {R}, run = ?, gone = 1, lease_token = NULL"
                    " WHERE id = ?",
                    drop,
                ).rowcount
                self._move(db, src, (retired, Q, R))
                db.executemany("UPDATE items SET gone = 1 WHERE id = ?", mark)
            result.carried += len(carry)
            result.retired += len(drop)
        return result

    def adopt(
        self,
        source: str,
        run_id: str,
        *,
        now: float,
        queue_ttl_s: float,
        rank_for: RankFor,
        fresh_for: FreshFor,
    ) -> OfferResult:
        result = OfferResult()
        with self._transaction() as db:
            src, run = self._src(db, source), self._run(db, run_id)
            for state in (Q, L):
                result.already_queued += db.execute(
                    f"UPDATE items SET run = ? WHERE src = ? AND state = {state} AND run IS NOT ?",
                    (run, src, run),
                ).rowcount
        # listed items that are due and not the run's already (those it has counted); done ones
        # in two range reads of the due index (with an OR of the two, SQLite reads every entry)
        head = "SELECT id, url, last_fetched_at FROM items WHERE src = ? AND state = "
        tail = " AND gone IS NULL AND run IS NOT ? LIMIT ?"
        due = (
            (E, f"{head}{E}{tail}", ()),
            (D, f"{head}{D} AND fresh_until IS NULL{tail}", ()),
            (D, f"{head}{D} AND fresh_until <= ?{tail}", (now,)),
        )
        for state, query, bounds in due:
            while True:
                with self._transaction() as db:
                    src = self._src(db, source)
                    params = (src, *bounds, run, _CHUNK)
                    rows = db.execute(query, params).fetchall()
                    requeues = []
                    for rowid, url, fetched in rows:
                        age = None if fetched is None else now - fetched
                        rank = rank_for(url, age, fresh_for(url))
                        requeues.append((rank, now, now + queue_ttl_s, run, rowid))
                    moved = db.executemany(
                        f"UPDATE items SET state = {Q}, rank = ?, enqueued_at = ?,"
                        " not_before = 0, expires_at = ?, attempts = 0, first_attempt_at = NULL,"
                        " lease_token = NULL, lease_expires = NULL, last_error = NULL, run = ?"
                        " WHERE id = ?",
                        requeues,
                    ).rowcount
                    self._move(db, src, (moved, state, Q))
                result.enqueued += len(rows)
                if len(rows) < _CHUNK:
                    break
        return result

    def plan_mark(self, source: str) -> str | None:
        with self._lock:
            src = self._known_src(source)
            if src is None:
                return None
            row = self._db.execute("SELECT mark FROM plans WHERE src = ?", (src,)).fetchone()
        return None if row is None else row[0]

    def set_plan_mark(self, source: str, mark: str | None) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT INTO plans (src, mark) VALUES (?, ?)"
                " ON CONFLICT (src) DO UPDATE SET mark = excluded.mark",
                (self._src(db, source), mark),
            )

    # --- claiming --------------------------------------------------------------------------
    def claim(
        self, source: str, limit: int, *, now: float, lease_s: float, holder: str = ""
    ) -> Lease:
        with self._transaction() as db:
            src = self._src(db, source)
            reclaimed = db.execute(
                f"UPDATE items SET state = {Q}, lease_token = NULL, lease_expires = NULL"
                f" WHERE src = ? AND state = {L} AND lease_expires <= ?",
                (src, now),
            ).rowcount
            expired = db.execute(
                f"UPDATE items SET state = {E}, last_error = 'queue_ttl_expired'"
                f" WHERE src = ? AND state = {Q} AND expires_at <= ?",
                (src, now),
            ).rowcount
            (token,) = db.execute(
                "UPDATE meta SET value = value + 1 WHERE key = 'fencing_token' RETURNING value"
            ).fetchone()
            expires_at = now + lease_s
            rows = db.execute(
                f"UPDATE items SET state = {L}, lease_token = ?, lease_expires = ?"
                " WHERE id IN ("
                f"   SELECT id FROM items WHERE src = ? AND state = {Q}"
                "   AND not_before <= ? ORDER BY rank DESC, url LIMIT ?)"
                " RETURNING url, attempts, first_attempt_at, enqueued_at, rank, etag,"
                " last_modified, history",
                (token, expires_at, src, now, limit),
            ).fetchall()
            if holder and rows:
                db.execute(
                    "INSERT INTO leases (token, source, holder, claimed_at) VALUES (?, ?, ?, ?)",
                    (token, source, holder, now),
                )
            self._move(db, src, (reclaimed, L, Q), (expired, Q, E), (len(rows), Q, L))
        rows.sort(key=lambda r: (-r[4], r[0]))
        items = tuple(
            ClaimedItem(url, att, first, enq, etag, modified, PageHistory.decode(history))
            for url, att, first, enq, _, etag, modified, history in rows
        )
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
            src = self._known_src(source)
            if src is None:
                return []
            rows = self._db.execute(
                "SELECT COALESCE(l.holder, ''), COUNT(*), h.beat_at FROM items i"
                " LEFT JOIN leases l ON l.token = i.lease_token"
                " LEFT JOIN holders h ON h.source = ? AND h.holder = l.holder"
                f" WHERE i.src = ? AND i.state = {L}"
                " GROUP BY l.holder",
                (source, src),
            ).fetchall()
        return [Holder(holder, leased, beat_at) for holder, leased, beat_at in rows]

    def revoke(self, source: str, holder: str, *, now: float) -> int:
        with self._transaction() as db:
            src = self._src(db, source)
            revoked = db.execute(
                f"UPDATE items SET state = {Q}, lease_token = NULL, lease_expires = NULL"
                f" WHERE src = ? AND state = {L} AND lease_token IN ("
                "   SELECT token FROM leases WHERE source = ? AND holder = ?)",
                (src, source, holder),
            ).rowcount
            self._move(db, src, (revoked, L, Q))
            db.execute("DELETE FROM leases WHERE source = ? AND holder = ?", (source, holder))
            db.execute("DELETE FROM holders WHERE source = ? AND holder = ?", (source, holder))
        return revoked

    def renew(self, lease: Lease, *, now: float, lease_s: float) -> int:
        with self._transaction() as db:
            return db.execute(
                f"UPDATE items SET lease_expires = ? WHERE src = ? AND state = {L}"
                " AND lease_token = ?",
                (now + lease_s, self._src(db, lease.source), lease.token),
            ).rowcount

    def ack(self, lease: Lease, outcomes: Sequence[Outcome], *, now: float) -> AckResult:
        result = AckResult()
        settled = {D: 0, Q: 0, X: 0}  # accepted outcomes by the state they move to
        # Found through the URL hash: left to itself SQLite picks items_lease (src, lease_token)
        # and scans the batch's leased rows for every item, O(batch^2) per ack (~25 us a page
        # at batch 500). The unary + keeps state and token out of the index choice.
        held = f"src = ? AND h = ? AND url = ? AND +state = {L} AND +lease_token = ?"
        with self._transaction() as db:
            src = self._src(db, lease.source)
            for outcome in outcomes:
                where = (src, url_key(outcome.url), outcome.url, lease.token)
                if isinstance(outcome, Completed):
                    state = D
                    changed = db.execute(
                        f"UPDATE items SET state = {D}, fresh_until = ?, last_fetched_at = ?,"
                        " cost = ?, attempts = 0, first_attempt_at = NULL, lease_token = NULL,"
                        " lease_expires = NULL, last_error = NULL, etag = ?, last_modified = ?,"
                        f" history = COALESCE(?, history) WHERE {held}",
                        (
                            outcome.fresh_until,
                            outcome.fetched_at,
                            outcome.cost,
                            outcome.etag,
                            outcome.last_modified,
                            None if outcome.history is None else outcome.history.encode(),
                            *where,
                        ),
                    ).rowcount
                elif isinstance(outcome, RetryLater):
                    state = Q
                    changed = db.execute(
                        f"UPDATE items SET state = {Q}, not_before = ?, rank = ?,"
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
                            *where,
                        ),
                    ).rowcount
                elif isinstance(outcome, DeadLettered):
                    state = X
                    changed = db.execute(
                        f"UPDATE items SET state = {X}, attempts = ?, last_error = ?,"
                        f" lease_token = NULL, lease_expires = NULL WHERE {held}",
                        (outcome.attempts, outcome.error, *where),
                    ).rowcount
                else:  # pragma: no cover - the type union is closed
                    raise TypeError(f"unknown outcome {outcome!r}")
                if changed:
                    result.accepted += 1
                    settled[state] += 1
                else:
                    result.stale.append(outcome.url)
            self._move(db, src, *((n, L, state) for state, n in settled.items()))
        return result

    def release(self, lease: Lease, *, now: float) -> int:
        with self._transaction() as db:
            src = self._src(db, lease.source)
            released = int(
                db.execute(
                    f"UPDATE items SET state = {Q}, lease_token = NULL, lease_expires = NULL"
                    f" WHERE src = ? AND state = {L} AND lease_token = ?",
                    (src, lease.token),
                ).rowcount
            )
            self._move(db, src, (released, L, Q))
        return released

    def requeue(self, source: str, urls: Sequence[str], *, now: float, queue_ttl_s: float) -> int:
        with self._transaction() as db:
            src = self._src(db, source)
            requeued = {X: 0, E: 0}
            for url in urls:
                for state in requeued:  # one state per item: the count knows which it left
                    moved = db.execute(
                        f"UPDATE items SET state = {Q}, not_before = 0, attempts = 0,"
                        " first_attempt_at = NULL, enqueued_at = ?, expires_at = ?,"
                        " last_error = NULL WHERE src = ? AND h = ? AND url = ? AND state = ?",
                        (now, now + queue_ttl_s, src, url_key(url), url, state),
                    ).rowcount
                    requeued[state] += moved
                    if moved:
                        break
            self._move(db, src, *((n, state, Q) for state, n in requeued.items()))
        return sum(requeued.values())

    def revive(self, source: str, pages: Sequence[Completed]) -> int:
        with self._transaction() as db:
            src = self._src(db, source)
            revived = 0
            for page in pages:
                where = (src, url_key(page.url), page.url)
                revived += db.execute(
                    f"UPDATE items SET state = {D}, fresh_until = ?, last_fetched_at = ?,"
                    " cost = ?, attempts = 0, first_attempt_at = NULL, not_before = 0,"
                    " last_error = NULL, etag = NULL, last_modified = NULL"
                    f" WHERE src = ? AND h = ? AND url = ? AND state = {X}",
                    (page.fresh_until, page.fetched_at, page.cost, *where),
                ).rowcount
            self._move(db, src, (revived, X, D))
        return revived

    def make_stale(self, source: str, urls: Sequence[str]) -> int:
        with self._transaction() as db:
            src = self._src(db, source)
            return sum(
                db.execute(
                    "UPDATE items SET fresh_until = NULL, etag = NULL, last_modified = NULL"
                    f" WHERE src = ? AND h = ? AND url = ? AND state = {D}",
                    (src, url_key(url), url),
                ).rowcount
                for url in urls
            )

    # --- reading ---------------------------------------------------------------------------
    def histories(self, source: str) -> Iterator[tuple[str, PageHistory]]:
        with self._lock:
            src = self._known_src(source)
            if src is None:
                return
            rows = self._db.execute(
                "SELECT url, history FROM items WHERE src = ? AND history IS NOT NULL", (src,)
            ).fetchall()
        for url, text in rows:
            history = PageHistory.decode(text)
            if history is not None:
                yield url, history

    def _count(self, source: str, run_id: str | None) -> StateCounts:
        """Count the source's rows (all, or the run's) by state: a read of every one."""
        counts = StateCounts()
        with self._lock:
            src = self._known_src(source)
            if src is None:
                return counts
            params: tuple[int, ...]
            if run_id is None:
                query, params = "src = ?", (src,)
            else:
                row = self._db.execute("SELECT id FROM runs WHERE run_id = ?", (run_id,)).fetchone()
                if row is None:
                    return counts
                query, params = "src = ? AND run = ?", (src, row[0])
            for state, n in self._db.execute(
                f"SELECT state, COUNT(*) FROM items WHERE {query} GROUP BY state", params
            ):
                setattr(counts, STATES[state - 1], n)
        return counts

    def counts(self, source: str) -> StateCounts:
        counts = StateCounts()
        with self._lock:
            src = self._known_src(source)
            if src is None:
                return counts
            for state, n in self._db.execute("SELECT state, n FROM counts WHERE src = ?", (src,)):
                setattr(counts, STATES[state - 1], n)
        return counts

    def scan_counts(self, source: str) -> StateCounts:
        """:meth:`counts` the plain way, from every row of the source (the reference the kept
        counts are tested against)."""
        return self._count(source, None)

    def recount(self) -> None:
        """Count every source's items afresh, for a file whose rows were changed by hand."""
        with self._transaction() as db:
            for statement in _statements(_RECOUNT):
                db.execute(statement)

    def run_counts(self, source: str, run_id: str) -> StateCounts:
        return self._count(source, run_id)

    def due_count(self, source: str, *, now: float) -> int:
        with self._lock:
            src = self._known_src(source)
            if src is None:
                return 0
            # the kept count of queued items, and adopt's reads of the due index, counted
            (due,) = self._db.execute(
                f"SELECT (SELECT COALESCE(SUM(n), 0) FROM counts WHERE src = ?1 AND state = {Q})"
                f" + (SELECT COUNT(*) FROM items WHERE src = ?1 AND state = {E} AND gone IS NULL)"
                f" + (SELECT COUNT(*) FROM items WHERE src = ?1 AND state = {D}"
                "     AND fresh_until IS NULL AND gone IS NULL)"
                f" + (SELECT COUNT(*) FROM items WHERE src = ?1 AND state = {D}"
                "     AND fresh_until <= ?2 AND gone IS NULL)",
                (src, now),
            ).fetchone()
        return int(due)

    def next_event_at(self, source: str, *, now: float) -> float | None:
        with self._lock:
            src = self._known_src(source)
            if src is None:
                return None
            (queued,) = self._db.execute(
                f"SELECT MIN(not_before) FROM items WHERE src = ? AND state = {Q}", (src,)
            ).fetchone()
            (leased,) = self._db.execute(
                f"SELECT MIN(lease_expires) FROM items WHERE src = ? AND state = {L}", (src,)
            ).fetchone()
        due = [float(t) for t in (queued, leased) if t is not None]
        return min(due) if due else None

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _statements(script: str) -> list[str]:
    """A script's statements, so they run inside the caller's transaction (executescript
    would commit it first)."""
    return [part.strip() for part in script.split(";") if part.strip()]
