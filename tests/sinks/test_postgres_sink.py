"""Postgres sink: the conformance suites (one worker, and several sharing a table) plus what only
a shared database has: the table's layout, writers in other processes, configuration errors."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from collector.errors import BackendError
from collector.sinks.base import Sink
from collector.sinks.postgres import PostgresSink, describe_dsn
from tests.servers import PostgresServer, free_port

from .conformance import SharedSinkConformance, SinkConformance, rec, result

SOURCE = "items"


class TestPostgresSink(SinkConformance, SharedSinkConformance):
    @pytest.fixture
    def opened(self, postgres_dsn: str) -> Iterator[Callable[[], Sink]]:
        instances: list[PostgresSink] = []

        def open_sink() -> Sink:
            instances.append(PostgresSink(postgres_dsn, source=SOURCE))
            return instances[-1]

        yield open_sink
        for instance in instances:
            instance.close()

    @pytest.fixture
    def sink(self, opened: Callable[[], Sink]) -> Sink:
        return opened()

    @pytest.fixture
    def reopen(self, opened: Callable[[], Sink], sink: Sink) -> Callable[[], Sink]:
        def close_and_open() -> Sink:
            instances_closed = sink  # the first instance; later ones are closed at teardown
            instances_closed.close()
            return opened()

        return close_and_open

    @pytest.fixture
    def another(self, opened: Callable[[], Sink], sink: Sink) -> Sink:
        return opened()


# --- the table -----------------------------------------------------------------------------------
def test_table_layout_and_row_metadata(postgres_dsn: str) -> None:
    sink = PostgresSink(postgres_dsn, source=SOURCE, table="my_records")
    try:
        sink.write([rec("a", v=1), rec("b", v=2)], token=7, batch_id="run:7")
        sink.write([rec("a", v=1)], token=9, batch_id="run:9")  # unchanged: only the fence moves
        with psycopg.connect(postgres_dsn) as conn:
            columns: dict[str, str] = dict(
                conn.execute(
                    "SELECT column_name, data_type FROM information_schema.columns "
                    "WHERE table_name = 'my_records'"
                ).fetchall()
            )
            rows = conn.execute(
                "SELECT source, key, record, token, batch_id, url, length(digest), stored_at "
                "FROM my_records ORDER BY key"
            ).fetchall()
            indexes = [r[0] for r in conn.execute("SELECT indexdef FROM pg_indexes").fetchall()]
        assert columns == {
            "source": "text", "key": "text", "record": "json", "token": "bigint",
            "batch_id": "text", "url": "text", "digest": "bytea",
            "stored_at": "timestamp with time zone",
        }  # fmt: skip
        assert [row[:7] for row in rows] == [
            ("items", "a", {"id": "a", "v": 1}, 9, "run:7", "https://example.test/a", 16),
            ("items", "b", {"id": "b", "v": 2}, 7, "run:7", "https://example.test/b", 16),
        ]
        assert all(isinstance(row[7], datetime.datetime) for row in rows)
        assert any("(source, key)" in d for d in indexes)
        assert any("(source, batch_id)" in d for d in indexes)
    finally:
        sink.close()


def test_sources_share_a_table_without_seeing_each_other(postgres_dsn: str) -> None:
    a = PostgresSink(postgres_dsn, source="items")
    b = PostgresSink(postgres_dsn, source="items-extra")
    try:
        a.write([rec("k", who="a"), rec("only-a", v=1)], token=1, batch_id="shared")
        b.write([rec("k", who="b")], token=9, batch_id="shared")
        assert (a.count(), b.count()) == (2, 1)
        assert a.get("k") == {"id": "k", "who": "a"}
        assert b.get("only-a") is None
        # the fence is per source: b's token 9 does not refuse a's token 2
        assert a.write([rec("k", who="a2")], token=2, batch_id="x") == result(written=1)
        assert b.remove_batch("shared") == 1
        assert a.count() == 2
    finally:
        a.close()
        b.close()


def test_schema_qualified_table(postgres_dsn: str) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS elsewhere")
    sink = PostgresSink(postgres_dsn, source=SOURCE, table="elsewhere.records")
    try:
        sink.write([rec("a", v=1)], token=1, batch_id="b")
        with psycopg.connect(postgres_dsn) as conn:
            assert conn.execute("SELECT count(*) FROM elsewhere.records").fetchone() == (1,)
        assert "table elsewhere.records" in sink.location()
    finally:
        sink.close()
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute("DROP SCHEMA elsewhere CASCADE")


@pytest.mark.parametrize(
    "table", ["1abc", "a-b", "a;drop table x", "a.b.c", '"quoted"', "x" * 49, ""]
)
def test_table_name_must_be_an_identifier(postgres_dsn: str, table: str) -> None:
    with pytest.raises(BackendError, match="is not a table name"):
        PostgresSink(postgres_dsn, source=SOURCE, table=table)


def test_a_table_that_is_not_a_sink_table_is_refused(postgres_dsn: str) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE people (key text PRIMARY KEY, name text)")
    with pytest.raises(BackendError, match=r"not a Collector sink table \(no column batch_id, "):
        PostgresSink(postgres_dsn, source=SOURCE, table="people")


def test_location_names_the_server_without_the_password(postgres_server: PostgresServer) -> None:
    dsn = postgres_server.dsn("collector_tests", password="hunter2-secret")
    sink = PostgresSink(dsn, source=SOURCE)
    try:
        where = sink.location()
        assert where == (
            f"postgresql://postgres@127.0.0.1:{postgres_server.port}/collector_tests "
            "table collector_records"
        )
        assert "hunter2" not in where
    finally:
        sink.close()
    assert describe_dsn("host=db.internal port=5433 dbname=x user=u password=pw") == (
        "postgresql://u@db.internal:5433/x"
    )


def test_unreachable_server_is_one_line_without_the_password() -> None:
    dsn = f"postgresql://collector:s3cret-pw@127.0.0.1:{free_port()}/nowhere"
    with pytest.raises(BackendError) as caught:
        PostgresSink(dsn, source=SOURCE)
    message = str(caught.value)
    port = dsn.split(":")[3].split("/")[0]
    assert message.startswith(
        f"sink postgresql://collector@127.0.0.1:{port}/nowhere table collector_records: "
        "cannot connect: "
    ), message
    assert "s3cret" not in message
    assert "\n" not in message


def test_an_invalid_dsn_is_one_line() -> None:
    with pytest.raises(BackendError, match="invalid DSN") as caught:
        PostgresSink("host=x password=abc123 = oops", source=SOURCE)
    assert "abc123" not in str(caught.value)


def test_a_connection_lost_between_writes_is_reopened(
    postgres_dsn: str, postgres_server: PostgresServer
) -> None:
    sink = PostgresSink(postgres_dsn, source=SOURCE)
    try:
        sink.write([rec("a", v=1)], token=1, batch_id="b1")
        with psycopg.connect(postgres_server.dsn("collector_tests"), autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'collector' AND pid <> pg_backend_pid()"
            )
        with pytest.raises(BackendError, match="count failed"):
            sink.count()  # the call that finds the connection dead fails, with one line
        assert sink.count() == 1  # the next one reconnects
        assert sink.write([rec("a", v=2)], token=2, batch_id="b2") == result(written=1)
    finally:
        sink.close()


# --- writers in other processes ------------------------------------------------------------------
_WRITER = textwrap.dedent(
    """
    import json, random, sys
    from collector.sinks.base import SinkRecord
    from collector.sinks.postgres import PostgresSink

    dsn, worker, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    sink = PostgresSink(dsn, source="items")  # both open at once: the table is created once
    print("ready", flush=True)
    sys.stdin.readline()
    rng = random.Random(worker)
    tokens = [2 * n + worker for n in range(1, batches + 1)]
    rng.shuffle(tokens)  # tokens in any order: late writers with old leases, on purpose
    for n, token in enumerate(tokens):
        keys = rng.sample([f"k{i}" for i in range(12)], 6)
        records = [SinkRecord(k, {"w": worker, "t": token, "n": n}, f"u/{k}") for k in keys]
        got = sink.write(records, token=token, batch_id=f"w{worker}-{token}")
        print(json.dumps({"token": token, "keys": keys, "written": got.written,
                          "unchanged": got.unchanged, "stale": got.stale_keys}), flush=True)
    sink.close()
    """
)


def test_concurrent_writers_never_let_a_lower_token_win(tmp_path: Path, postgres_dsn: str) -> None:
    script = tmp_path / "writer.py"
    script.write_text(_WRITER, encoding="utf-8")
    batches = 100
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), postgres_dsn, str(worker), str(batches)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for worker in (0, 1)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
        # Every row update is audited by a trigger, so "never lower" is checked at every step,
        # not only at the end.
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(_AUDIT)
        outputs = []
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in procs:
            out, _ = proc.communicate(timeout=180)
            assert proc.returncode == 0
            outputs.append([json.loads(line) for line in out.splitlines()])
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=30)

    highest: dict[str, int] = {}
    written = stale = 0
    for lines in outputs:
        assert len(lines) == batches
        for line in lines:
            assert line["unchanged"] == 0  # every write has new content
            assert line["written"] + len(line["stale"]) == len(line["keys"])
            written += line["written"]
            stale += len(line["stale"])
            for key in line["keys"]:
                highest[key] = max(highest.get(key, 0), line["token"])
    with psycopg.connect(postgres_dsn) as conn:
        rows = conn.execute("SELECT key, token, record FROM collector_records").fetchall()
        audit = conn.execute("SELECT key, old_token, new_token FROM audit").fetchall()
    assert stale > 0, "the writers never raced: the test proves nothing"
    assert [row for row in audit if row[2] < row[1]] == []
    # the highest token written to each key is what is stored, with that write's content
    assert {key: token for key, token, _ in rows} == highest
    for key, token, record in rows:
        assert record["t"] == token and record["w"] == token % 2, key
    # the writers' own counts agree with what the database did: one insert per key, then
    # one audited update per write reported as written
    assert written == len(rows) + len(audit)


_AUDIT = """
CREATE TABLE audit (key text, old_token bigint, new_token bigint);
CREATE FUNCTION audit_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO audit VALUES (NEW.key, OLD.token, NEW.token);
    RETURN NEW;
END $$;
CREATE TRIGGER audit_update BEFORE UPDATE ON collector_records
    FOR EACH ROW EXECUTE FUNCTION audit_update();
"""


def test_workers_starting_together_create_the_table_once(postgres_dsn: str) -> None:
    workers = 6
    start = threading.Barrier(workers)
    opened: list[PostgresSink] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        start.wait()
        try:
            opened.append(PostgresSink(postgres_dsn, source=SOURCE))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    try:
        assert errors == []
        assert len(opened) == workers
        opened[0].write([rec("a", v=1)], token=1, batch_id="b")
        assert all(sink.count() == 1 for sink in opened)
    finally:
        for sink in opened:
            sink.close()
