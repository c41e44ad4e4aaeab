"""SQLite dead-letter store (embedded default) with its append-only JSONL archive.

The store holds the current state of each entry; the archive gets one line per ``put``, per
escalation and per resolution, never rewritten, so the history survives even a deleted database.
The archive is rotated by size: past ``max_bytes`` the file is renamed to the next free
``<stem>.NNNNN<suffix>`` and a new one started (rotated files are never touched again).

The manual-review queue is a table of review messages (``reviews``), one per escalation, with
the same semantics as the Redis store's consumer group: a message is held by one reviewer at a
time, can be taken over once its holder has been idle for ``idle_ms``, and disappears when the
review finishes or the entry is resolved another way.
"""

from __future__ import annotations

import builtins
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from collector import _json, defaults
from collector.deadletter.base import DeadLetter, count_status_kinds
from collector.errors import BackendError
from collector.sqlite_tx import write_transaction

__all__ = ["JsonlArchive", "SqliteDeadLetterStore"]

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

# Added after the first release: (column, type) added to an existing table when missing.
_LATER_COLUMNS = (
    ("claimed_by", "TEXT"),  # triage claim owner (open entries only)
    ("claim_expires", "REAL"),
    ("review_msg", "INTEGER"),  # the entry's current review message while in review
    ("review_reason", "TEXT"),
    ("requeues", "INTEGER NOT NULL DEFAULT 0"),
)
_POLL_S = 0.05  # take_for_review(block_ms=...) looks for new messages this often

_COLUMNS = (
    "id, source, url, stage, error_class, message, attempts, first_seen, last_seen, record_key,"
    " payload, failed_expectations, flow_run_id, status, resolution"
)
_READ = _COLUMNS + ", requeues"  # requeues is the store's own count, never written by put


class JsonlArchive:
    """Append-only JSONL history of dead letters, rotated by size.

    A write that would take the file past ``max_bytes`` first moves the file aside to the next
    ``<stem>.NNNNN<suffix>`` (numbers only grow, so the rotated files sort oldest first); one
    write is never split across files, so a single event larger than ``max_bytes`` still lands
    whole in a file of its own.
    """

    def __init__(self, path: str | Path, *, max_bytes: int = defaults.DEADLETTER_ARCHIVE_BYTES):
        if max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def rotated(self) -> builtins.list[Path]:
        """The rotated files, oldest first (the live file is :attr:`path`)."""
        found = []
        for candidate in self.path.parent.glob(f"{self.path.stem}.*{self.path.suffix}"):
            middle = candidate.name[
                len(self.path.stem) + 1 : len(candidate.name) - len(self.path.suffix)
            ]
            if middle.isdigit():
                found.append((int(middle), candidate))
        return [path for _, path in sorted(found)]

    def files(self) -> builtins.list[Path]:
        """Every archive file, oldest first."""
        return [*self.rotated(), *([self.path] if self.path.exists() else [])]

    def _rotate(self) -> None:
        existing = self.rotated()
        number = 1
        if existing:
            last = existing[-1].name[len(self.path.stem) + 1 :].split(".")[0]
            number = int(last) + 1
        target = self.path.with_name(f"{self.path.stem}.{number:05d}{self.path.suffix}")
        os.replace(self.path, target)

    def append(self, event: str, rows: Sequence[dict[str, Any]]) -> None:
        if not rows:
            return
        now = time.time()
        data = b"".join(_dumps({"event": event, "at": now, **row}) + b"\n" for row in rows)
        with self._lock:
            try:
                size = self.path.stat().st_size
            except FileNotFoundError:
                size = 0
            if size and size + len(data) > self.max_bytes:
                self._rotate()
            with self.path.open("ab") as handle:
                handle.write(data)


def _row_to_entry(row: tuple[Any, ...]) -> DeadLetter:
    (eid, source, url, stage, error_class, message, attempts, first, last, key, payload,
     failed, run_id, status, resolution, requeues) = row  # fmt: skip
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
    )


def _dumps(value: Any) -> bytes:
    return _json.dumps(value)


def _entry_to_row(e: DeadLetter) -> tuple[Any, ...]:
    payload = _dumps(e.payload) if e.payload is not None else None
    failed = _dumps(e.failed_expectations)
    return (
        *(e.id, e.source, e.url, e.stage, e.error_class, e.message, e.attempts),
        *(e.first_seen, e.last_seen, e.record_key, payload, failed),
        *(e.flow_run_id, e.status, e.resolution),
    )


class SqliteDeadLetterStore:
    def __init__(
        self,
        path: str | Path,
        *,
        archive: str | Path | None = None,
        archive_max_bytes: int = defaults.DEADLETTER_ARCHIVE_BYTES,
    ) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(
                self.path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            have = {row[1] for row in self._db.execute("PRAGMA table_info(deadletters)")}
            for column, kind in _LATER_COLUMNS:
                if column not in have:
                    self._db.execute(f"ALTER TABLE deadletters ADD COLUMN {column} {kind}")
        except sqlite3.Error as exc:
            raise BackendError(f"dead letters {self.path}: cannot open SQLite: {exc}") from exc
        self.archive = JsonlArchive(archive, max_bytes=archive_max_bytes) if archive else None
        self._lock = threading.Lock()

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
                f"INSERT INTO deadletters ({_COLUMNS}) VALUES ({','.join('?' * 15)})"
                " ON CONFLICT (id) DO UPDATE SET message = excluded.message,"
                " attempts = MAX(deadletters.attempts, excluded.attempts),"
                " last_seen = excluded.last_seen, payload = excluded.payload,"
                " failed_expectations = excluded.failed_expectations,"
                " flow_run_id = excluded.flow_run_id,"
                " claimed_by = CASE WHEN deadletters.status = 'resolved' THEN NULL"
                "                   ELSE deadletters.claimed_by END,"
                " status = CASE WHEN deadletters.status = 'resolved' THEN 'open'"
                "               ELSE deadletters.status END,"
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
        for column, value in (("source", source), ("stage", stage), ("status", status)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if error_class is not None:
            # exact, or as the last part of a compound class ("retries_exhausted:http_500")
            where.append("(error_class = ? OR substr(error_class, -length(?)) = ?)")
            params += [error_class, f":{error_class}", f":{error_class}"]
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
        sql = "SELECT stage || '/' || error_class, COUNT(*) FROM deadletters WHERE source = ?"
        params: builtins.list[str] = [source]
        if status is not None:
            sql += " AND status = ?"
            params.append(status)
        with self._lock:
            return dict(self._db.execute(sql + " GROUP BY 1 ORDER BY 2 DESC", params).fetchall())

    def status_kinds(self, source: str) -> dict[str, int]:
        # One statement, so one snapshot; the prefix is grouped here and stripped in Python
        # (SQL's trim() knows only spaces).
        sql = (
            "SELECT status, CASE WHEN status = 'resolved' THEN"
            " substr(coalesce(resolution, ''), 1,"
            " instr(coalesce(resolution, '') || ':', ':') - 1) ELSE '' END, COUNT(*)"
            " FROM deadletters WHERE source = ? GROUP BY 1, 2"
        )
        with self._lock:
            found = self._db.execute(sql, (source,)).fetchall()
        return count_status_kinds(found)

    def resolve(self, entry_id: str, resolution: str, *, requeued: bool = False) -> bool:
        with self._transaction() as db:
            row = db.execute(
                "SELECT review_msg FROM deadletters WHERE id = ? AND status != 'resolved'",
                (entry_id,),
            ).fetchone()
            if row is not None:
                db.execute(
                    "UPDATE deadletters SET status = 'resolved', resolution = ?,"
                    " claimed_by = NULL, claim_expires = NULL, review_msg = NULL,"
                    " review_reason = NULL, requeues = requeues + ? WHERE id = ?",
                    (resolution, int(requeued), entry_id),
                )
                if row[0] is not None:  # a pending review of it is moot
                    db.execute("DELETE FROM reviews WHERE msg_id = ?", (row[0],))
        if row is not None:
            self._archive("resolved", [{"id": entry_id, "resolution": resolution}])
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
                "SELECT 1 FROM deadletters WHERE id = ? AND status = 'open'", (entry_id,)
            ).fetchone()
            if opened is None:
                return False
            msg = db.execute(
                "INSERT INTO reviews (entry_id, reason, created_at) VALUES (?, ?, ?)",
                (entry_id, reason, time.time()),
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
        self, reviewer: str, *, count: int = 1, block_ms: int = 0
    ) -> builtins.list[tuple[str, DeadLetter]]:
        if not reviewer:
            raise ValueError("reviewer must be a non-empty name")
        if count < 1:
            return []
        deadline = time.monotonic() + max(block_ms, 0) / 1000
        taken: builtins.list[tuple[str, DeadLetter]] = []
        while True:
            taken += self._hand_out(reviewer, count - len(taken), "reviewer IS NULL", ())
            if len(taken) >= count or time.monotonic() >= deadline:
                return taken
            if taken:
                return taken
            time.sleep(min(_POLL_S, max(deadline - time.monotonic(), 0)))

    def claim_stale_reviews(
        self, reviewer: str, *, idle_ms: int, count: int = 100
    ) -> builtins.list[tuple[str, DeadLetter]]:
        if not reviewer:
            raise ValueError("reviewer must be a non-empty name")
        if count < 1:
            return []
        cutoff = time.time() - max(idle_ms, 0) / 1000
        return self._hand_out(reviewer, count, "reviewer IS NOT NULL AND taken_at <= ?", (cutoff,))

    def finish_review(self, message_id: str, entry_id: str, resolution: str) -> bool:
        try:
            msg = int(message_id)
        except ValueError:
            return False
        with self._transaction() as db:
            found = db.execute("SELECT entry_id FROM reviews WHERE msg_id = ?", (msg,)).fetchone()
            if found is not None and found[0] != entry_id:
                raise ValueError(
                    f"review message {message_id} is for entry {found[0]}, not {entry_id}"
                )
            db.execute("DELETE FROM reviews WHERE msg_id = ?", (msg,))
            done = bool(
                db.execute(
                    "UPDATE deadletters SET status = 'resolved', resolution = ?,"
                    " review_msg = NULL, review_reason = NULL"
                    " WHERE id = ? AND status = 'review' AND review_msg = ?",
                    (resolution, entry_id, msg),
                ).rowcount
            )
        if done:
            row = {"id": entry_id, "resolution": resolution, "review_message": message_id}
            self._archive("resolved", [row])
        return done

    def close(self) -> None:
        with self._lock:
            self._db.close()
