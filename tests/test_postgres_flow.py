"""The collect flow writing into Postgres: real Prefect flow runs, the real fault site, a
throwaway Postgres cluster. Counts are checked against the table itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from collector.demo.scenario import DEMO_ITEMS, EXPECTED, write_demo_source
from collector.demo.site import FaultSite
from collector.sinks.base import SinkRecord
from collector.sinks.postgres import PostgresSink
from flows.collect import collect
from tests.helpers import summary_of, write_source
from tests.servers import PostgresServer, free_port

TERMINAL = ("discovered", "stored", "fresh_skipped", "expired", "dead_lettered", "queued")


def _postgres_source(folder: Path, dsn: str, **sections: Any) -> Path:
    """A test source (tests.helpers.write_source) whose sink is the Postgres DSN."""
    path = write_source(folder, **sections)
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    document["sink"] = {"type": "postgres", "dsn": dsn}
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def _rows(dsn: str, source: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT key, token, batch_id, record FROM collector_records WHERE source = %s "
            "ORDER BY key",
            [source],
        ).fetchall()


@pytest.mark.usefixtures("prefect_api")
async def test_demo_into_postgres_balances_and_a_rerun_writes_nothing(
    tmp_path: Path, site: FaultSite, postgres_dsn: str
) -> None:
    source_path = write_demo_source(tmp_path, site.base_url)
    document = yaml.safe_load(source_path.read_text(encoding="utf-8"))
    document["sink"] = {"type": "postgres", "dsn": postgres_dsn}
    source_path.write_text(yaml.safe_dump(document), encoding="utf-8")

    first = summary_of(await collect(source=str(source_path), batch_size=50))
    assert {name: first[name] for name in TERMINAL} == EXPECTED and first["balanced"]
    rows = _rows(postgres_dsn, document["name"])
    assert len(rows) == EXPECTED["stored"] == first["records_in_sink"] == first["records_written"]
    assert {int(key) for key, *_ in rows} == set(range(DEMO_ITEMS)) | {1001, 1002, 1003, 2008}
    assert first["sink"].endswith("table collector_records")
    assert first["stale_writes"] == 0
    assert not (tmp_path / "out").exists()  # nothing went to files

    second = summary_of(await collect(source=str(source_path), batch_size=50))
    # unchanged seed list, every page fresh: an incremental plan with nothing due
    assert second["plan"] == "incremental" and second["discovered"] == 0
    assert second["stored"] == 0
    assert second["records_written"] == 0 and second["balanced"]
    assert _rows(postgres_dsn, document["name"]) == rows


@pytest.mark.usefixtures("prefect_api")
async def test_refetched_items_with_unchanged_records_write_nothing_but_move_the_fence(
    tmp_path: Path, site: FaultSite, postgres_dsn: str
) -> None:
    source_path = _postgres_source(
        tmp_path,
        postgres_dsn,
        seeds={"template": site.url("/items/{i}.json"), "range": [0, 30]},
        ttl={"default_fresh_s": 0},
    )
    first = summary_of(await collect(source=str(source_path), batch_size=10))
    assert first["records_written"] == 30 and first["balanced"]
    before = _rows(postgres_dsn, "test-items")

    again = summary_of(await collect(source=str(source_path), batch_size=10))
    assert again["stored"] == 30 and again["requests"] == 30  # every item fetched again
    assert again["records_written"] == 0 and again["records_unchanged"] == 30
    after = _rows(postgres_dsn, "test-items")
    assert len(after) == 30 == again["records_in_sink"]
    for (key, old_token, old_batch, old_record), (_, token, batch, record) in zip(
        before, after, strict=True
    ):
        assert (record, batch) == (old_record, old_batch), key  # same row, same writer
        assert token > old_token, key  # but the newer lease now fences the key


@pytest.mark.usefixtures("prefect_api")
async def test_writes_fenced_off_by_a_newer_worker_are_refused_and_counted(
    tmp_path: Path, site: FaultSite, postgres_dsn: str
) -> None:
    # Another worker, holding newer leases (higher tokens), already stored these keys.
    newer = PostgresSink(postgres_dsn, source="test-items")
    records = [SinkRecord(str(i), {"id": i, "by": "newer"}, f"u{i}") for i in range(10)]
    newer.write(records, token=10**12, batch_id="other-worker")
    newer.close()
    source_path = _postgres_source(
        tmp_path, postgres_dsn, seeds={"template": site.url("/items/{i}.json"), "range": [0, 12]}
    )
    summary = summary_of(await collect(source=str(source_path), batch_size=6))
    assert summary["stale_writes"] == 10  # the fence refused them, and the summary says so
    assert summary["records_written"] == 2  # keys 10 and 11 were nobody else's
    rows = _rows(postgres_dsn, "test-items")
    assert len(rows) == 12
    kept = {key: record for key, _, _, record in rows if record.get("by") == "newer"}
    assert set(kept) == {str(i) for i in range(10)}


def test_an_unreachable_postgres_stops_the_run_at_once_with_one_line(tmp_path: Path) -> None:
    port = free_port()
    source_path = _postgres_source(
        tmp_path,
        f"postgresql://app:hunter2@127.0.0.1:{port}/db",
        seeds={"urls": ["http://127.0.0.1:9/x.json"]},
    )
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", str(source_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(
        f"collector: {source_path}: sink.dsn postgresql://app@127.0.0.1:{port}/db table "
        "collector_records: "
        "cannot connect: "
    ), line
    assert "hunter2" not in done.stderr
    assert "Traceback" not in done.stderr


def test_collector_run_json_into_postgres(
    tmp_path: Path,
    site: FaultSite,
    postgres_server: PostgresServer,
    postgres_dsn: str,
    prefect_api: str,
) -> None:
    import json
    import os

    dsn = postgres_dsn.replace("postgres@", "postgres:${env:COLLECTOR_TEST_PG_PASSWORD}@", 1)
    source_path = _postgres_source(
        tmp_path, dsn, seeds={"template": site.url("/items/{i}.json"), "range": [0, 15]}
    )
    env = {
        **os.environ,
        "PREFECT_API_URL": prefect_api,
        "COLLECTOR_TEST_PG_PASSWORD": "pw-never-printed",
    }
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", str(source_path), "--json"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["stored"] == summary["records_written"] == summary["records_in_sink"] == 15
    assert summary["stale_writes"] == 0 and summary["balanced"]
    assert summary["sink"] == (
        f"postgresql://postgres@127.0.0.1:{postgres_server.port}/collector_tests "
        "table collector_records"
    )
    assert "pw-never-printed" not in done.stdout + done.stderr
