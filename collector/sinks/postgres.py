"""Postgres sink: one row per (source, key) in a table that every worker shares.

Why it exists beside the JSONL sink: several workers (processes, machines) can write the same
table at once, and fencing then has to hold *between* them, which only the database can decide.
So the token comparison happens inside Postgres, under the row lock, in one statement per batch:

1. ``held``: the existing rows of the batch's keys are found one by one through the primary key
   (a ``LATERAL`` lookup, so the plan does not depend on table statistics) and locked
   (``FOR UPDATE``, in key order, the order the keys are sent in), which in READ COMMITTED
   returns each row as it is now, not as the statement's snapshot saw it;
2. ``updated``: each held row whose token is not newer than this write's is updated (found by
   its ``ctid``): its content replaced when it changed, or only its token raised when the
   content is the same (so a later write with an older token is still refused);
3. ``inserted``: keys that were not there are inserted with ``ON CONFLICT DO NOTHING``.

The statement returns, per key, what it found (token, hash), whether it inserted, and whether an
update it meant to make found nothing, and Python derives ``written`` / ``unchanged`` / ``stale``
from that, exactly as the JSONL sink counts (see ``tests/sinks/conformance.py``). Two races send
a key to a second statement, which sees the newer row and decides again: another writer inserted
it after our snapshot was taken (neither held nor inserted), or updated it after our snapshot
(locked at its new version, which the snapshot-bound update cannot see). Each statement is its
own transaction (autocommit), so a write is one round trip and durable when it returns; a
deadlock between writers aborts the statement, which then changed nothing and is run again.
Parameters go as binary arrays (psycopg dumps text arrays ~50x slower).

Compensation (``remove_batch``) deletes the rows whose current version the batch wrote, like the
JSONL sink: a key the batch overwrote is removed, not rolled back to its previous version (the
frontier refetches the item, which writes it again).

Records are stored as ``json`` (the text Collector serialised), not ``jsonb``: ``jsonb`` rewrites
numbers (``1e300`` comes back as a 301-digit integer) and refuses ``\\u0000``, so a record would
not always read back as it was written. Cast with ``record::jsonb`` to use jsonb operators.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.numeric import Int8

from collector import _json
from collector._closing import Closing
from collector.errors import BackendError
from collector.ops.scrub import Scrubber
from collector.sinks._encode import digest, dumps
from collector.sinks._names import DEFAULT_TABLE, check_table_name
from collector.sinks.base import BatchSummary, SinkRecord, WriteResult

__all__ = ["DEFAULT_TABLE", "PostgresSink", "check_table_name", "describe_dsn"]

_COLUMNS = {"source", "key", "record", "token", "batch_id", "url", "digest", "stored_at"}
_DDL_LOCK = 0x636F6C6C  # pg_advisory_xact_lock key: one DDL at a time across workers
_RACE_ROUNDS = 20  # statements per write for keys others inserted or changed under our feet
_DEADLOCK_RETRIES = 5
_CONNECT_TIMEOUT_S = 5

T = TypeVar("T")


def describe_dsn(dsn: str) -> str:
    """``postgresql://user@host:port/dbname``: where a DSN points, without its password."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "postgresql://(invalid DSN)"
    host = str(params.get("host") or params.get("hostaddr") or "localhost")
    user = f"{params['user']}@" if params.get("user") else ""
    port = f":{params['port']}" if params.get("port") else ""
    return f"postgresql://{user}{host}{port}/{params.get('dbname', '')}"


def _one_line(exc: BaseException, scrub: Scrubber) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return scrub.text(text)[:300]


class PostgresSink(Closing):
    """Records of one source in a Postgres table shared by every worker.

    ``dsn`` is a libpq connection string (``postgresql://user:pw@host:5432/db`` or
    ``host=... dbname=...``). The table (default ``collector_records``) is created when missing;
    opening connects at once, so an unreachable server fails here with one line.
    """

    def __init__(self, dsn: str, *, source: str, table: str = DEFAULT_TABLE) -> None:
        self.source = source
        self.table = table
        self._where = describe_dsn(dsn)
        try:
            params = conninfo_to_dict(dsn)
        except psycopg.ProgrammingError:
            raise BackendError(
                f"sink {self._where}: invalid DSN (want postgresql://user@host:port/dbname "
                "or key=value pairs)"
            ) from None
        password = str(params.get("password") or "")
        self._scrub = Scrubber([password] if password else [])
        try:
            parts = check_table_name(table)
        except ValueError as exc:
            raise BackendError(f"sink {self._where}: {exc}") from None
        self._table = sql.Identifier(*parts)
        self._index = sql.Identifier(f"{parts[-1]}_batch_idx")
        self._conninfo = make_conninfo(
            "", **{"connect_timeout": _CONNECT_TIMEOUT_S, "application_name": "collector", **params}
        )
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._write_sql = self._build_write_sql()
        try:
            self._run("open", self._prepare_table)
        except BackendError:
            self.close()
            raise

    # --- plumbing ------------------------------------------------------------------------------
    def location(self) -> str:
        return f"{self._where} table {self.table}"

    def __repr__(self) -> str:
        return f"PostgresSink({self._where!r}, table={self.table!r}, source={self.source!r})"

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            try:
                self._conn = psycopg.connect(self._conninfo, autocommit=True)
            except psycopg.Error as exc:
                raise BackendError(
                    f"sink {self.location()}: cannot connect: {_one_line(exc, self._scrub)}"
                ) from exc
        return self._conn

    def _run(self, what: str, step: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``step`` on the (re)opened connection; psycopg errors become one-line
        BackendErrors. The connection is in autocommit mode: each statement is its own
        transaction, so a write is one round trip and durable when it returns."""
        with self._lock:
            conn = self._connection()
            try:
                return step(conn)
            except psycopg.Error as exc:
                raise BackendError(
                    f"sink {self.location()}: {what} failed: {_one_line(exc, self._scrub)}"
                ) from exc

    def _prepare_table(self, conn: psycopg.Connection[Any]) -> None:
        with conn.transaction():  # the advisory lock below lasts until this commits
            self._create_table(conn)

    def _create_table(self, conn: psycopg.Connection[Any]) -> None:
        name = self._table.as_string(conn)
        if conn.execute("SELECT to_regclass(%s)", [name]).fetchone() == (None,):
            # Several workers may start at once; CREATE ... IF NOT EXISTS alone can still race
            # on the catalog, so the DDL runs under a transaction-scoped advisory lock.
            conn.execute("SELECT pg_advisory_xact_lock(%s)", [_DDL_LOCK])
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {t} ("
                    " source text NOT NULL,"
                    " key text NOT NULL,"
                    " record json NOT NULL,"
                    " token bigint NOT NULL,"
                    " batch_id text NOT NULL,"
                    " url text NOT NULL,"
                    " digest bytea NOT NULL,"
                    " stored_at timestamptz NOT NULL,"
                    " PRIMARY KEY (source, key))"
                ).format(t=self._table)
            )
            conn.execute(
                sql.SQL("CREATE INDEX IF NOT EXISTS {i} ON {t} (source, batch_id)").format(
                    i=self._index, t=self._table
                )
            )
        rows = conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) "
            "AND attnum > 0 AND NOT attisdropped",
            [name],
        ).fetchall()
        missing = _COLUMNS - {row[0] for row in rows}
        if missing:
            raise BackendError(
                f"sink {self.location()}: the table exists but is not a Collector sink table "
                f"(no column {', '.join(sorted(missing))}); choose another sink.table"
            )

    # --- writing -------------------------------------------------------------------------------
    def _build_write_sql(self) -> sql.Composed:
        return sql.SQL(
            """
            WITH input AS (
                SELECT * FROM unnest(%(keys)b::text[], %(records)b::text[], %(urls)b::text[],
                                     %(digests)b::bytea[], %(firsts)b::bytea[], %(same)b::bool[])
                    AS i(key, record, url, digest, first_digest, all_same)
            ),
            held AS (
                SELECT h.* FROM input i CROSS JOIN LATERAL (
                    SELECT t.ctid AS row_id, t.key, t.token, t.digest FROM {t} t
                    WHERE t.source = %(source)b AND t.key = i.key
                    FOR UPDATE
                ) h
            ),
            todo AS (
                SELECT i.*, h.row_id, (i.all_same AND i.first_digest = h.digest) AS same_content
                FROM input i JOIN held h ON h.key = i.key
                WHERE h.token < %(token)b
                   OR (h.token = %(token)b AND NOT (i.all_same AND i.first_digest = h.digest))
            ),
            updated AS (
                UPDATE {t} t SET
                    token = %(token)b,
                    record = CASE WHEN p.same_content THEN t.record ELSE p.record::json END,
                    digest = CASE WHEN p.same_content THEN t.digest ELSE p.digest END,
                    url = CASE WHEN p.same_content THEN t.url ELSE p.url END,
                    batch_id = CASE WHEN p.same_content THEN t.batch_id ELSE %(batch)b END,
                    stored_at = CASE WHEN p.same_content THEN t.stored_at ELSE now() END
                FROM todo p
                WHERE t.ctid = p.row_id
                RETURNING t.key
            ),
            inserted AS (
                INSERT INTO {t} (source, key, record, token, batch_id, url, digest, stored_at)
                SELECT %(source)b, i.key, i.record::json, %(token)b, %(batch)b, i.url, i.digest,
                       now()
                FROM input i WHERE NOT EXISTS (SELECT 1 FROM held h WHERE h.key = i.key)
                ORDER BY i.key
                ON CONFLICT (source, key) DO NOTHING
                RETURNING key
            )
            SELECT i.key, h.token, h.digest, n.key IS NOT NULL,
                   d.key IS NOT NULL AND u.key IS NULL
            FROM input i
            LEFT JOIN held h ON h.key = i.key
            LEFT JOIN inserted n ON n.key = i.key
            LEFT JOIN todo d ON d.key = i.key
            LEFT JOIN updated u ON u.key = i.key
            """
        ).format(t=self._table)

    def _execute_write(
        self, conn: psycopg.Connection[Any], params: dict[str, Any]
    ) -> list[tuple[Any, ...]]:
        """One write statement; again if a deadlock aborted it (it then changed nothing)."""
        for attempt in range(_DEADLOCK_RETRIES + 1):
            try:
                return conn.execute(self._write_sql, params, prepare=True).fetchall()
            except psycopg.errors.DeadlockDetected:
                if attempt == _DEADLOCK_RETRIES:
                    raise
        raise AssertionError("unreachable")

    def write(self, records: Sequence[SinkRecord], *, token: int, batch_id: str) -> WriteResult:
        if not records:
            return WriteResult()
        # One row per key: the last occurrence is what ends up stored; the first one's hash
        # decides whether that occurrence was new (the others are compared in-batch below).
        digests = [digest(item.record) for item in records]
        last: dict[str, int] = {}
        first: dict[str, int] = {}
        same: dict[str, bool] = {}
        for position, item in enumerate(records):
            if item.key in first:
                same[item.key] = same[item.key] and digests[position] == digests[first[item.key]]
            else:
                first[item.key], same[item.key] = position, True
            last[item.key] = position
        encoded = {key: dumps(records[at].record).decode() for key, at in last.items()}

        def store(conn: psycopg.Connection[Any]) -> dict[str, tuple[int | None, bytes | None]]:
            found: dict[str, tuple[int | None, bytes | None]] = {}
            pending = sorted(last)
            for _ in range(_RACE_ROUNDS):
                rows = self._execute_write(
                    conn,
                    {
                        "source": self.source,
                        "token": Int8(token),
                        "batch": batch_id,
                        "keys": pending,
                        "records": [encoded[key] for key in pending],
                        "urls": [records[last[key]].url for key in pending],
                        "digests": [digests[last[key]] for key in pending],
                        "firsts": [digests[first[key]] for key in pending],
                        "same": [same[key] for key in pending],
                    },
                )
                pending = []
                for key, held_token, held_digest, inserted, missed in rows:
                    if inserted:
                        found[key] = (None, None)
                    elif held_token is None or missed:
                        # Another writer inserted or changed the row after this statement's
                        # snapshot: the next statement sees it (and decides again).
                        pending.append(key)
                    else:
                        found[key] = (int(held_token), bytes(held_digest))
                if not pending:
                    return found
                pending.sort()
            raise BackendError(
                f"sink {self.location()}: keys kept changing under the write: {pending[:3]}"
            )

        found = self._run("write", store)
        result = WriteResult()
        previous: dict[str, bytes | None] = {}
        for position, item in enumerate(records):
            held_token, held_digest = found[item.key]
            if held_token is not None and token < held_token:
                result.stale += 1
                result.stale_keys.append(item.key)
                continue
            before = previous.get(item.key, held_digest)
            if before is not None and before == digests[position]:
                result.unchanged += 1
            else:
                result.written += 1
                result.written_urls.add(item.url)
            previous[item.key] = digests[position]
        return result

    # --- reading and compensation --------------------------------------------------------------
    def get(self, key: str) -> dict[str, Any] | None:
        query = sql.SQL("SELECT record::text FROM {t} WHERE source = %s AND key = %s").format(
            t=self._table
        )
        row = self._run("get", lambda conn: conn.execute(query, [self.source, key]).fetchone())
        if row is None:
            return None
        record: dict[str, Any] = _json.loads(row[0])
        return record

    def count(self) -> int:
        query = sql.SQL("SELECT count(*) FROM {t} WHERE source = %s").format(t=self._table)
        row = self._run("count", lambda conn: conn.execute(query, [self.source]).fetchone())
        return int(row[0]) if row else 0

    def batches(self) -> list[str]:
        query = sql.SQL(
            "SELECT batch_id FROM {t} WHERE source = %s"
            ' GROUP BY batch_id ORDER BY batch_id COLLATE "C"'
        ).format(t=self._table)
        rows = self._run("batches", lambda conn: conn.execute(query, [self.source]).fetchall())
        return [str(row[0]) for row in rows]

    def batch_summaries(self) -> list[BatchSummary]:
        query = sql.SQL(
            "SELECT batch_id, count(*), extract(epoch FROM max(stored_at))::float8 FROM {t}"
            ' WHERE source = %s GROUP BY batch_id ORDER BY batch_id COLLATE "C"'
        ).format(t=self._table)
        rows = self._run(
            "batch_summaries", lambda conn: conn.execute(query, [self.source]).fetchall()
        )
        return [BatchSummary(str(batch), int(n), float(at)) for batch, n, at in rows]

    def records(self, batch_id: str) -> list[SinkRecord]:
        query = sql.SQL(
            "SELECT key, record::text, url FROM {t} WHERE source = %s AND batch_id = %s"
            ' ORDER BY key COLLATE "C"'
        ).format(t=self._table)
        rows = self._run(
            "records", lambda conn: conn.execute(query, [self.source, batch_id]).fetchall()
        )
        return [SinkRecord(key, _json.loads(record), url) for key, record, url in rows]

    def remove_batch(self, batch_id: str) -> int:
        query = sql.SQL("DELETE FROM {t} WHERE source = %s AND batch_id = %s").format(t=self._table)
        return self._run(
            "remove_batch", lambda conn: conn.execute(query, [self.source, batch_id]).rowcount
        )

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
