"""SQLite dead-letter store (embedded default); its history goes to a :class:`JsonlArchive`.

The store holds the current state of each entry; the archive
(:mod:`collector.deadletter.archive`) gets one line per ``put``, per escalation and per
resolution, never rewritten, so the history survives even a deleted database.

The manual-review queue is a table of review messages (``reviews``), one per escalation, with
the same semantics as the Redis store's consumer group: a message is held by one reviewer at a
time, can be taken over once its holder has been idle for ``idle_ms``, and disappears when the
review finishes or the entry is resolved another way. Messages are handed out in ``msg_id``
order; a put-back review gets a new message, so it goes behind the ones waiting.

Layout versions (``PRAGMA user_version``), migrated on open in one transaction:
1 (0 in files written before versions were kept): the failure's cause was encoded in the class
(``retries_exhausted:http_500``) and a resolution's kind in its text (``repaired: trimmed``);
2: ``cause`` and ``resolution_kind`` are columns of their own, ``trace_id`` is kept, and review
messages name their source.
"""

from __future__ import annotations

import builtins
import sqlite3
import threading
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from collector import _json, defaults
from collector._closing import Closing
from collector.deadletter.archive import JsonlArchive, dumps
from collector.deadletter.base import (
    CAUSES,
    RESOLUTION_KINDS,
    Census,
    DeadLetter,
    ResolutionKind,
    check_kind,
    count_status_kinds,
)
from collector.errors import BackendError
from collector.sqlite_tx import open_target, write_transaction

__all__ = ["JsonlArchive", "SqliteDeadLetterStore", "split_legacy"]

LAYOUT = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS deadletters (
    id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    url TEXT NOT NULL,
    stage TEXT NOT NULL,
    error_class TEXT NOT NULL,
    message TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    first_seen REAL NOT NULL,
    last_seen REAL NOT NULL,
    record_key TEXT NOT NULL DEFAULT '',
    payload BLOB,
    failed_expectations BLOB,
    flow_run_id TEXT,
    status TEXT NOT NULL DEFAULT 'open',
    resolution TEXT
);
CREATE INDEX IF NOT EXISTS deadletters_source ON deadletters (source, status, stage);
CREATE TABLE IF NOT EXISTS reviews (
    msg_id INTEGER PRIMARY KEY AUTOINCREMENT,
    entry_id TEXT NOT NULL,
    reason TEXT NOT NULL,
    created_at REAL NOT NULL,
    reviewer TEXT,
    taken_at REAL
);
CREATE INDEX IF NOT EXISTS reviews_free ON reviews (reviewer, msg_id);
"""

# Added after the first release: (table, column, type) added to an existing table when missing.
_LATER_COLUMNS = (
    ("deadletters", "claimed_by", "TEXT"),  # triage claim owner (open entries only)
    ("deadletters", "claim_expires", "REAL"),
    ("deadletters", "review_msg", "INTEGER"),  # the entry's current review message
    ("deadletters", "review_reason", "TEXT"),
    ("deadletters", "requeues", "INTEGER NOT NULL DEFAULT 0"),
    ("deadletters", "cause", "TEXT NOT NULL DEFAULT ''"),  # layout 2
    ("deadletters", "resolution_kind", "TEXT"),  # layout 2
    ("deadletters", "trace_id", "TEXT NOT NULL DEFAULT ''"),  # layout 2
    ("deadletters", "url_digest", "TEXT NOT NULL DEFAULT ''"),  # '' in entries written before
    ("deadletters", "span_id", "TEXT NOT NULL DEFAULT ''"),  # '' in entries written before
    # attempts of the cycles that ended in a resolution (base.py: attempts across cycles)
    ("deadletters", "earlier_attempts", "INTEGER NOT NULL DEFAULT 0"),
    ("reviews", "source", "TEXT NOT NULL DEFAULT ''"),  # layout 2
)
_POLL_S = 0.05  # take_for_review(block_ms=...) looks for new messages this often

_COLUMNS = (
    "id, source, url, stage, error_class, message, attempts, first_seen, last_seen, record_key,"
    " payload, failed_expectations, flow_run_id, status, resolution, cause, resolution_kind,"
    " trace_id, url_digest, span_id"
)
_READ = _COLUMNS + ", requeues"  # requeues is the store's own count, never written by put


def split_legacy(error_class: str, resolution: str | None, status: str) -> tuple[str, str, Any]:
    """Layout 1's encoded strings as layout 2's fields: (error_class, cause, (kind, detail)).

    The one place the old encodings are read; only migrations call it.
    """
    cause, _, final = error_class.rpartition(":")
    kind_detail: tuple[str | None, str | None] = (None, resolution)
    if status == "resolved" and resolution is not None:
        prefix, colon, rest = resolution.partition(":")
        if colon and prefix.strip() in RESOLUTION_KINDS:
            kind_detail = (prefix.strip(), rest.strip())
    return final, cause if cause in CAUSES else "", kind_detail


def _row_to_entry(row: tuple[Any, ...]) -> DeadLetter:
    (eid, source, url, stage, error_class, message, attempts, first, last, key, payload,
     failed, run_id, status, resolution, cause, kind, trace_id, digest, span_id,
     requeues) = row  # fmt: skip
    return DeadLetter(
        id=eid,
        source=source,
        url=url,
        stage=stage,
        error_class=error_class,
        message=message,
        attempts=attempts,
        first_seen=first,
        last_seen=last,
        record_key=key,
        payload=_json.loads(payload) if payload is not None else None,
        failed_expectations=_json.loads(failed) if failed else [],
        flow_run_id=run_id,
        status=status,
        resolution=resolution,
        requeues=requeues or 0,
        cause=cause or "",
        resolution_kind=kind,
        trace_id=trace_id or "",
        url_digest=digest or "",
        span_id=span_id or "",
    )


def _dumps(value: Any) -> bytes:
    return _json.dumps(value)


def _entry_to_row(e: DeadLetter) -> tuple[Any, ...]:
    payload = dumps(e.payload) if e.payload is not None else None
    failed = dumps(e.failed_expectations)
    return (
        *(e.id, e.source, e.url, e.stage, e.error_class, e.message, e.attempts),
        *(e.first_seen, e.last_seen, e.record_key, payload, failed),
        *(e.flow_run_id, e.status, e.resolution, e.cause, e.resolution_kind, e.trace_id),
        e.url_digest,
        e.span_id,
    )


def _migrate(db: sqlite3.Connection) -> None:
    """Bring a store to :data:`LAYOUT` (idempotent; runs in the caller's transaction)."""
    for table, column, kind in _LATER_COLUMNS:
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if column not in have:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
    (version,) = db.execute("PRAGMA user_version").fetchone()
    if version >= LAYOUT:
        return
    rows = db.execute(
        "SELECT id, error_class, resolution, status FROM deadletters"
        " WHERE instr(error_class, ':') > 0"
        " OR (status = 'resolved' AND resolution_kind IS NULL)"
    ).fetchall()
    for eid, error_class, resolution, status in rows:
        final, cause, (kind, detail) = split_legacy(error_class, resolution, status)
        db.execute(
            "UPDATE deadletters SET error_class = ?, cause = ?, resolution_kind = ?,"
            " resolution = ? WHERE id = ?",
            (final, cause, kind, detail, eid),
        )
    db.execute(
        "UPDATE reviews SET source = coalesce((SELECT source FROM deadletters"
        " WHERE deadletters.id = reviews.entry_id), '') WHERE source = ''"
    )
    db.execute("CREATE INDEX IF NOT EXISTS reviews_source ON reviews (source, reviewer, msg_id)")
    db.execute(f"PRAGMA user_version = {LAYOUT}")


class SqliteDeadLetterStore(Closing):
    """Dead letters in one SQLite file (WAL); ``archive`` adds the append-only JSONL history."""

    def __init__(
        self,
        path: str | Path,
        *,
        archive: str | Path | None = None,
        archive_max_bytes: int = defaults.DEADLETTER_ARCHIVE_BYTES,
        existing_only: bool = False,
    ) -> None:
        """``existing_only``: for commands that only read (``status``). A file that does not
        exist is then not made (nor its folder, nor the archive): the store reads as empty."""
        self.path = str(path)
        opened, self.existed = open_target(self.path, existing_only=existing_only)
        if existing_only and archive is not None and not Path(archive).exists():
            archive = None  # its folder would be made; nothing was archived there yet
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(
                opened, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise BackendError(f"dead letters {self.path}: cannot open SQLite: {exc}") from exc
        with self._transaction() as db:
            _migrate(db)
        self.archive = JsonlArchive(archive, max_bytes=archive_max_bytes) if archive else None

    def location(self) -> str:
        return self.path

    def _archive(self, event: str, rows: builtins.list[dict[str, Any]]) -> None:
        if self.archive is not None and rows:
            self.archive.append(event, rows)

    def _transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        return write_transaction(self._db, self._lock, f"dead letters {self.path}")

    def put(self, entries: Sequence[DeadLetter]) -> int:
        if not entries:
            return 0
        rows = [_entry_to_row(e) for e in entries]
        with self._transaction() as db:
            ids = [e.id for e in entries]
            existing = {
                r[0]
                for r in db.execute(
                    f"SELECT id FROM deadletters WHERE id IN ({','.join('?' * len(ids))})", ids
                )
            }
            db.executemany(
                f"INSERT INTO deadletters ({_COLUMNS}) VALUES ({','.join('?' * 20)})"
                " ON CONFLICT (id) DO UPDATE SET message = excluded.message,"
                " earlier_attempts = CASE WHEN deadletters.status = 'resolved'"
                "   THEN deadletters.attempts ELSE deadletters.earlier_attempts END,"
                " attempts = MAX(deadletters.attempts, excluded.attempts + CASE"
                "   WHEN deadletters.status = 'resolved' THEN deadletters.attempts"
                "   ELSE deadletters.earlier_attempts END),"
                " last_seen = excluded.last_seen, payload = excluded.payload,"
                " failed_expectations = excluded.failed_expectations,"
                " flow_run_id = excluded.flow_run_id, cause = excluded.cause,"
                " trace_id = excluded.trace_id, url_digest = excluded.url_digest,"
                " span_id = excluded.span_id,"
                " claimed_by = CASE WHEN deadletters.status = 'resolved' THEN NULL"
                "                   ELSE deadletters.claimed_by END,"
                " status = CASE WHEN deadletters.status = 'resolved' THEN 'open'"
                "               ELSE deadletters.status END,"
                " resolution_kind = CASE WHEN deadletters.status = 'resolved' THEN NULL"
                "                   ELSE deadletters.resolution_kind END,"
                " resolution = CASE WHEN deadletters.status = 'resolved' THEN NULL"
                "                   ELSE deadletters.resolution END",
                rows,
            )
        self._archive("quarantined", [e.to_dict() for e in entries])
        return len({e.id for e in entries} - existing)

    def get(self, entry_id: str) -> DeadLetter | None:
        with self._lock:
            row = self._db.execute(
                f"SELECT {_READ} FROM deadletters WHERE id = ?", (entry_id,)
            ).fetchone()
        return _row_to_entry(row) if row else None

    def list(
        self,
        *,
        source: str | None = None,
        stage: str | None = None,
        error_class: str | None = None,
        status: str | None = "open",
        limit: int = 100,
        first_seen_before: float | None = None,
    ) -> builtins.list[DeadLetter]:
        where: builtins.list[str] = ["1 = 1"]
        params: builtins.list[Any] = []
        for column, value in (
            ("source", source),
            ("stage", stage),
            ("status", status),
            ("error_class", error_class),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if first_seen_before is not None:
            where.append("first_seen < ?")
            params.append(first_seen_before)
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_READ} FROM deadletters WHERE {' AND '.join(where)}"
                " ORDER BY last_seen DESC, id DESC LIMIT ?",
                [*params, limit],
            ).fetchall()
        return [_row_to_entry(r) for r in rows]

    def counts(self, source: str | None = None) -> dict[str, int]:
        sql = "SELECT status, COUNT(*) FROM deadletters"
        params: tuple[str, ...] = ()
        if source is not None:
            sql += " WHERE source = ?"
            params = (source,)
        with self._lock:
            found = dict(self._db.execute(sql + " GROUP BY status", params).fetchall())
        return {status: found.get(status, 0) for status in ("open", "review", "resolved")}

    def reasons(self, source: str, *, status: str | None = "open") -> dict[str, int]:
        sql = (
            "SELECT stage || '/' || CASE WHEN cause != '' THEN cause || ':' ELSE '' END"
            " || error_class, COUNT(*) FROM deadletters WHERE source = ?"
        )
        params: builtins.list[str] = [source]
        if status is not None:
            sql += " AND status = ?"
            params.append(status)
        with self._lock:
            return dict(self._db.execute(sql + " GROUP BY 1 ORDER BY 2 DESC", params).fetchall())

    def census(self, source: str) -> Census:
        with self._lock:  # one statement: one snapshot
            rows = self._db.execute(
                "SELECT id, status, resolution_kind FROM deadletters WHERE source = ?", (source,)
            ).fetchall()
        return Census(
            counts=count_status_kinds((status, kind, 1) for _, status, kind in rows),
            ids=frozenset(eid for eid, _, _ in rows),
        )

    def resolve(
        self, entry_id: str, kind: ResolutionKind, detail: str, *, requeued: bool = False
    ) -> bool:
        check_kind(kind)
        with self._transaction() as db:
            row = db.execute(
                "SELECT review_msg FROM deadletters WHERE id = ? AND status != 'resolved'",
                (entry_id,),
            ).fetchone()
            if row is not None:
                db.execute(
                    "UPDATE deadletters SET status = 'resolved', resolution_kind = ?,"
                    " resolution = ?, claimed_by = NULL, claim_expires = NULL,"
                    " review_msg = NULL, review_reason = NULL, requeues = requeues + ?"
                    " WHERE id = ?",
                    (kind, detail, int(requeued), entry_id),
                )
                if row[0] is not None:  # a pending review of it is moot
                    db.execute("DELETE FROM reviews WHERE msg_id = ?", (row[0],))
        if row is not None:
            self._archive("resolved", [{"id": entry_id, "kind": kind, "resolution": detail}])
        return row is not None

    # --- triage claims -------------------------------------------------------------------
    def claim_for_triage(self, entry_id: str, owner: str, *, now: float, lease_s: float) -> bool:
        if not owner:
            raise ValueError("owner must be a non-empty name")
        with self._transaction() as db:
            return bool(
                db.execute(
                    "UPDATE deadletters SET claimed_by = ?, claim_expires = ?"
                    " WHERE id = ? AND status = 'open'"
                    " AND (claimed_by IS NULL OR claimed_by = ? OR claim_expires <= ?)",
                    (owner, now + lease_s, entry_id, owner, now),
                ).rowcount
            )

    def release_claim(self, entry_id: str, owner: str) -> bool:
        with self._transaction() as db:
            return bool(
                db.execute(
                    "UPDATE deadletters SET claimed_by = NULL, claim_expires = NULL"
                    " WHERE id = ? AND claimed_by = ?",
                    (entry_id, owner),
                ).rowcount
            )

    # --- manual-review queue -------------------------------------------------------------
    def escalate(self, entry_id: str, reason: str) -> bool:
        with self._transaction() as db:
            opened = db.execute(
                "SELECT source FROM deadletters WHERE id = ? AND status = 'open'", (entry_id,)
            ).fetchone()
            if opened is None:
                return False
            msg = db.execute(
                "INSERT INTO reviews (entry_id, source, reason, created_at) VALUES (?, ?, ?, ?)",
                (entry_id, opened[0], reason, time.time()),
            ).lastrowid
            db.execute(
                "UPDATE deadletters SET status = 'review', review_msg = ?, review_reason = ?,"
                " claimed_by = NULL, claim_expires = NULL WHERE id = ?",
                (msg, reason, entry_id),
            )
        self._archive("escalated", [{"id": entry_id, "reason": reason, "review_message": str(msg)}])
        return True

    def _hand_out(
        self, reviewer: str, count: int, where: str, params: tuple[Any, ...]
    ) -> builtins.list[tuple[str, DeadLetter]]:
        """Give ``reviewer`` up to ``count`` messages matching ``where``; drop moot ones."""
        out: builtins.list[tuple[str, DeadLetter]] = []
        with self._transaction() as db:
            messages = db.execute(
                f"SELECT msg_id, entry_id FROM reviews WHERE {where} ORDER BY msg_id LIMIT ?",
                (*params, count),
            ).fetchall()
            now = time.time()
            for msg, entry_id in messages:
                row = db.execute(
                    f"SELECT {_READ} FROM deadletters"
                    " WHERE id = ? AND status = 'review' AND review_msg = ?",
                    (entry_id, msg),
                ).fetchone()
                if row is None:  # resolved or re-escalated since: nobody should get it
                    db.execute("DELETE FROM reviews WHERE msg_id = ?", (msg,))
                    continue
                db.execute(
                    "UPDATE reviews SET reviewer = ?, taken_at = ? WHERE msg_id = ?",
                    (reviewer, now, msg),
                )
                out.append((str(msg), _row_to_entry(row)))
        return out

    def take_for_review(
        self, source: str, reviewer: str, *, count: int = 1, block_ms: int = 0
    ) -> builtins.list[tuple[str, DeadLetter]]:
        if not reviewer:
            raise ValueError("reviewer must be a non-empty name")
        if count < 1:
            return []
        deadline = time.monotonic() + max(block_ms, 0) / 1000
        taken: builtins.list[tuple[str, DeadLetter]] = []
        while True:
            taken += self._hand_out(
                reviewer, count - len(taken), "source = ? AND reviewer IS NULL", (source,)
            )
            if taken or time.monotonic() >= deadline:
                return taken
            time.sleep(min(_POLL_S, max(deadline - time.monotonic(), 0)))

    def claim_stale_reviews(
        self, source: str, reviewer: str, *, idle_ms: int, count: int = 100
    ) -> builtins.list[tuple[str, DeadLetter]]:
        if not reviewer:
            raise ValueError("reviewer must be a non-empty name")
        if count < 1:
            return []
        cutoff = time.time() - max(idle_ms, 0) / 1000
        return self._hand_out(
            reviewer,
            count,
            "source = ? AND reviewer IS NOT NULL AND taken_at <= ?",
            (source, cutoff),
        )

    def _message(self, message_id: str) -> int | None:
        try:
            return int(message_id)
        except ValueError:
            return None

    def _check_message(self, db: sqlite3.Connection, msg: int, entry_id: str) -> None:
        found = db.execute("SELECT entry_id FROM reviews WHERE msg_id = ?", (msg,)).fetchone()
        if found is not None and found[0] != entry_id:
            raise ValueError(f"review message {msg} is for entry {found[0]}, not {entry_id}")

    def take_entry_for_review(
        self, source: str, entry_id: str, reviewer: str, *, idle_ms: int | None = None
    ) -> builtins.list[tuple[str, DeadLetter]]:
        if not reviewer:
            raise ValueError("reviewer must be a non-empty name")
        where = (
            "source = ? AND msg_id = (SELECT review_msg FROM deadletters"
            " WHERE id = ? AND status = 'review') AND (reviewer IS NULL OR reviewer = ?"
        )
        params: tuple[Any, ...] = (source, entry_id, reviewer)
        if idle_ms is not None:
            where += " OR taken_at <= ?"
            params += (time.time() - max(idle_ms, 0) / 1000,)
        return self._hand_out(reviewer, 1, where + ")", params)

    def put_back(self, message_id: str, entry_id: str) -> bool:
        """A new message at the end of the queue replaces the held one (as on Redis, where a
        consumer group cannot un-deliver a message): handed out by message order, the entry
        comes after the others that wait, not again at once."""
        msg = self._message(message_id)
        if msg is None:
            return False
        with self._transaction() as db:
            self._check_message(db, msg, entry_id)
            held = db.execute(
                "SELECT r.source, r.reason, r.created_at FROM reviews r JOIN deadletters d"
                " ON d.id = r.entry_id AND d.status = 'review' AND d.review_msg = r.msg_id"
                " WHERE r.msg_id = ? AND r.entry_id = ?",
                (msg, entry_id),
            ).fetchone()
            if held is None:
                return False
            new = db.execute(
                "INSERT INTO reviews (entry_id, source, reason, created_at) VALUES (?, ?, ?, ?)",
                (entry_id, *held),
            ).lastrowid
            db.execute("DELETE FROM reviews WHERE msg_id = ?", (msg,))
            db.execute("UPDATE deadletters SET review_msg = ? WHERE id = ?", (new, entry_id))
        return True

    def finish_review(
        self, message_id: str, entry_id: str, kind: ResolutionKind, detail: str
    ) -> bool:
        check_kind(kind)
        msg = self._message(message_id)
        if msg is None:
            return False
        with self._transaction() as db:
            self._check_message(db, msg, entry_id)
            db.execute("DELETE FROM reviews WHERE msg_id = ?", (msg,))
            done = bool(
                db.execute(
                    "UPDATE deadletters SET status = 'resolved', resolution_kind = ?,"
                    " resolution = ?, review_msg = NULL, review_reason = NULL"
                    " WHERE id = ? AND status = 'review' AND review_msg = ?",
                    (kind, detail, entry_id, msg),
                ).rowcount
            )
        if done:
            row = {"id": entry_id, "kind": kind, "resolution": detail, "review_message": message_id}
            self._archive("resolved", [row])
        return done

    def close(self) -> None:
        with self._lock:
            self._db.close()
