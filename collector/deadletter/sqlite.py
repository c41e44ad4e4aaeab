"""SQLite dead-letter store (embedded default) with its append-only JSONL archive.

The store holds the current state of each entry; the archive gets one line per ``put`` and per
resolution, never rewritten, so the history survives even a deleted database.
"""

from __future__ import annotations

import builtins
import json
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from collector.deadletter.base import DeadLetter
from collector.errors import BackendError

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
"""

_COLUMNS = (
    "id, source, url, stage, error_class, message, attempts, first_seen, last_seen, record_key,"
    " payload, failed_expectations, flow_run_id, status, resolution"
)


class JsonlArchive:
    """Append-only JSONL history of dead letters."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def append(self, event: str, rows: Sequence[dict[str, Any]]) -> None:
        if not rows:
            return
        now = time.time()
        data = b"".join(_dumps({"event": event, "at": now, **row}) + b"\n" for row in rows)
        with self._lock, self.path.open("ab") as handle:
            handle.write(data)


def _row_to_entry(row: tuple[Any, ...]) -> DeadLetter:
    (eid, source, url, stage, error_class, message, attempts, first, last, key, payload,
     failed, run_id, status, resolution) = row  # fmt: skip
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
        payload=orjson.loads(payload) if payload is not None else None,
        failed_expectations=orjson.loads(failed) if failed else [],
        flow_run_id=run_id,
        status=status,
        resolution=resolution,
    )


def _dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value, default=str)
    except orjson.JSONEncodeError:  # e.g. integers beyond 64 bits
        return json.dumps(value, default=str).encode()


def _entry_to_row(e: DeadLetter) -> tuple[Any, ...]:
    payload = _dumps(e.payload) if e.payload is not None else None
    failed = _dumps(e.failed_expectations)
    return (
        *(e.id, e.source, e.url, e.stage, e.error_class, e.message, e.attempts),
        *(e.first_seen, e.last_seen, e.record_key, payload, failed),
        *(e.flow_run_id, e.status, e.resolution),
    )


class SqliteDeadLetterStore:
    def __init__(self, path: str | Path, *, archive: str | Path | None = None) -> None:
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
        except sqlite3.Error as exc:
            raise BackendError(f"dead letters {self.path}: cannot open SQLite: {exc}") from exc
        self.archive = JsonlArchive(archive) if archive else None
        self._lock = threading.Lock()

    def location(self) -> str:
        return self.path

    def put(self, entries: Sequence[DeadLetter]) -> int:
        if not entries:
            return 0
        rows = [_entry_to_row(e) for e in entries]
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                ids = [e.id for e in entries]
                existing = {
                    r[0]
                    for r in self._db.execute(
                        f"SELECT id FROM deadletters WHERE id IN ({','.join('?' * len(ids))})",
                        ids,
                    )
                }
                self._db.executemany(
                    f"INSERT INTO deadletters ({_COLUMNS}) VALUES ({','.join('?' * 15)})"
                    " ON CONFLICT (id) DO UPDATE SET message = excluded.message,"
                    " attempts = MAX(deadletters.attempts, excluded.attempts),"
                    " last_seen = excluded.last_seen, payload = excluded.payload,"
                    " failed_expectations = excluded.failed_expectations,"
                    " flow_run_id = excluded.flow_run_id,"
                    " status = CASE WHEN deadletters.status = 'resolved' THEN 'open'"
                    "               ELSE deadletters.status END,"
                    " resolution = CASE WHEN deadletters.status = 'resolved' THEN NULL"
                    "                   ELSE deadletters.resolution END",
                    rows,
                )
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._db.execute("ROLLBACK")
                raise BackendError(f"dead letters {self.path}: {exc}") from exc
        if self.archive is not None:
            self.archive.append("quarantined", [e.to_dict() for e in entries])
        return len({e.id for e in entries} - existing)

    def get(self, entry_id: str) -> DeadLetter | None:
        with self._lock:
            row = self._db.execute(
                f"SELECT {_COLUMNS} FROM deadletters WHERE id = ?", (entry_id,)
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
    ) -> builtins.list[DeadLetter]:
        where, params = ["1 = 1"], []
        for column, value in (("source", source), ("stage", stage), ("status", status)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if error_class is not None:
            # exact, or as the last part of a compound class ("retries_exhausted:http_500")
            where.append("(error_class = ? OR substr(error_class, -length(?)) = ?)")
            params += [error_class, f":{error_class}", f":{error_class}"]
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM deadletters WHERE {' AND '.join(where)}"
                " ORDER BY last_seen DESC LIMIT ?",
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
        params: list[str] = [source]
        if status is not None:
            sql += " AND status = ?"
            params.append(status)
        with self._lock:
            return dict(self._db.execute(sql + " GROUP BY 1 ORDER BY 2 DESC", params).fetchall())

    def resolve(self, entry_id: str, resolution: str) -> bool:
        with self._lock:
            changed = self._db.execute(
                "UPDATE deadletters SET status = 'resolved', resolution = ?"
                " WHERE id = ? AND status != 'resolved'",
                (resolution, entry_id),
            ).rowcount
        if changed and self.archive is not None:
            self.archive.append("resolved", [{"id": entry_id, "resolution": resolution}])
        return bool(changed)

    def close(self) -> None:
        with self._lock:
            self._db.close()
