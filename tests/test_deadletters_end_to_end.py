"""Bad inputs of every kind through the real `collect` flow, then the real `triage` flow.

Nothing is lost: every bad page or record ends as a dead letter or a repaired record, and after
each triage run ``quarantined = repaired + reenqueued + escalated + discarded + open`` holds
exactly: the archive's quarantined entries against the store's entries by state. A 1 GB body
is cut off by the size cap while streaming.
Compensation then removes exactly the replay batch's records.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from collector.config import load_source
from collector.deadletter import JsonlArchive, SqliteDeadLetterStore
from collector.recovery.triage import tally
from collector.run.ledger import LedgerBook
from flows.cli import main
from flows.collect import collect
from flows.triage import triage
from tests.helpers import duplicate_keys, sink_lines, summary_of
from tests.hostile_site import GIB, HOSTILE, PAGES, HostileSite

pytestmark = [pytest.mark.usefixtures("prefect_api"), pytest.mark.slow]

SUITE = {
    "name": "hostile",
    "expectations": [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "name"}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "price"}},
        {
            "type": "expect_column_values_to_be_between",
            "kwargs": {"column": "price", "min_value": 0, "max_value": 1000},
        },
        {
            "type": "expect_column_values_to_be_of_type",
            "kwargs": {"column": "price", "type_": "float"},
        },
        {
            "type": "expect_column_value_lengths_to_be_between",
            "kwargs": {"column": "name", "min_value": 1, "max_value": 1000},
        },
        {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "id"}},
    ],
}


def write_hostile_source(folder: Path, site: HostileSite) -> Path:
    import yaml

    (folder / "suite.json").write_text(json.dumps(SUITE), encoding="utf-8")
    source = {
        "name": "hostile",
        "seeds": {"urls": [site.url(p) for p in [*PAGES, HOSTILE]]},
        "record": {"key": "id"},
        "sink": {"type": "jsonl", "path": "out"},
        "validation": {"suite": "suite.json"},
        "repair": {"trim": ["name"], "coerce": {"price": "float"}},
        "allow_private_networks": True,
        "ttl": {
            "http_timeout_s": 5,
            "request_deadline_s": 10,
            "batch_timeout_s": 60,
            "lease_s": 120,
        },
        "retry": {"base_s": 0.05, "cap_s": 0.2, "max_attempts": 3},
        "limits": {"max_response_bytes": 1_000_000},
    }
    path = folder / "hostile.yaml"
    path.write_text(yaml.safe_dump(source, sort_keys=False), encoding="utf-8")
    return path


def balance(source_path: Path) -> dict[str, Any]:
    source = load_source(source_path)
    store = SqliteDeadLetterStore(source.deadletter_path)
    try:
        found = tally(store, source.name, JsonlArchive(source.deadletter_archive_path)).as_dict()
    finally:
        store.close()
    keys = ("quarantined", "repaired", "reenqueued", "escalated", "discarded", "open", "other")
    return {k: found[k] for k in (*keys, "balanced")}


def http_statuses(source_path: Path) -> dict[str, Any]:
    """url path -> the ``http_status`` a fetch-stage dead letter keeps in its payload."""
    source = load_source(source_path)
    store = SqliteDeadLetterStore(source.deadletter_path)
    try:
        return {
            "/" + e.url.split("/", 3)[3]: e.payload["http_status"]
            for e in store.list(source=source.name, stage="fetch", status=None)
        }
    finally:
        store.close()


def reasons(source_path: Path) -> dict[str, str]:
    """url path -> stage/error_class of every dead letter, whatever its status."""
    source = load_source(source_path)
    store = SqliteDeadLetterStore(source.deadletter_path)
    try:
        return {
            "/" + e.url.split("/", 3)[3]: f"{e.stage}/{e.error_class}"
            + (f" ({e.cause})" if e.cause else "")
            for e in store.list(source=source.name, status=None)
        }
    finally:
        store.close()


async def wait_for_event(name: str, run_id: str) -> Any:
    """The one event ``name`` whose payload names ``run_id`` (the server persists events
    asynchronously, so look until it is there, for up to a minute)."""
    import asyncio
    import datetime
    import time

    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter

    since = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
    deadline = time.monotonic() + 60
    found: list[Any] = []
    async with get_client() as client:
        while not found and time.monotonic() < deadline:
            page = await client.read_events(
                EventFilter(
                    event=EventNameFilter(name=[name]), occurred=EventOccurredFilter(since=since)
                ),
                limit=50,
            )
            found = [e for e in page.events if e.payload.get("run_id") == run_id]
            if not found:
                await asyncio.sleep(0.5)
    assert len(found) == 1, f"{len(found)} {name} events for run {run_id}"
    return found[0]


async def assert_published(report: dict[str, Any]) -> None:
    """The triage run's artifacts and its ``collector.triage.completed`` event are in the API."""
    import uuid

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async with get_client() as client:
        artifacts = await client.read_artifacts(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[uuid.UUID(report["run_id"])]))
        )
    by_key = {a.key: a for a in artifacts}
    assert "Balance: quarantined 9 = repaired 2" in str(by_key["collector-hostile-triage"].data)
    assert "collector-hostile-triage-expectations" in by_key
    event = await wait_for_event("collector.triage.completed", report["run_id"])
    assert event.resource.id == "collector.source.hostile"
    assert (event.payload["reenqueued"], event.payload["balance"]["balanced"]) == (1, True)


async def test_bad_inputs_end_as_dead_letters_or_repaired_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with HostileSite() as site:
        path = write_hostile_source(tmp_path, site)
        first = summary_of(await collect(source=str(path), batch_size=50, drain_wait_s=5))

        assert first["balanced"] is True
        assert (first["discovered"], first["stored"], first["dead_lettered"]) == (15, 6, 9)
        assert first["records_quarantined"] == 5  # wrong types, nulls, 2 duplicates, huge field
        # the 1 GB body was cut off while streaming: the server sent a sliver of it
        assert site.requests[HOSTILE] == 1
        assert site.hostile_bytes_sent < 64 * 1024 * 1024 < GIB
        assert reasons(path) == {
            "/malformed.json": "parse/parse_error",
            "/bad-utf8.json": "parse/parse_error",
            "/wrong-types.json": "validate/schema",
            "/nulls.json": "validate/schema",
            "/duplicates.json": "validate/schema",
            "/huge-field.json": "validate/schema",
            HOSTILE: "fetch/too_large",
            "/missing.json": "fetch/http_404",
            "/flaky.json": "fetch/http_503 (retries_exhausted)",
        }
        # what the server answered is kept: the 1 GB body came with a 200 (the cap is ours)
        assert http_statuses(path) == {HOSTILE: 200, "/missing.json": 404, "/flaky.json": 503}
        rows = {row["id"]: row for row in sink_lines(tmp_path / "out")}
        assert sorted(rows) == [0, 1, 2, 3, 4, 105]
        assert rows[105]["name"] == json.loads(PAGES["/unicode.json"][1])["name"]  # exact

        quarantined = await wait_for_event("collector.deadletter.quarantined", first["run_id"])
        assert quarantined.payload["source_path"] == str(path.resolve())
        assert (quarantined.payload["items"], quarantined.payload["records"]) == (9, 5)

        # --- triage 1 ------------------------------------------------------------------------
        report = await triage(source=str(path))
        assert {k: report["balance"][k] for k in balance(path)} == balance(path)
        assert balance(path) == {
            "quarantined": 9, "repaired": 2, "reenqueued": 1, "escalated": 6, "discarded": 0,
            "open": 0, "other": 0, "balanced": True,
        }  # fmt: skip
        assert (report["records_written"], report["records_unchanged"]) == (2, 0)
        outcomes = {e["url"].split("/", 3)[3]: e["outcome"] for e in report["entries"]}
        assert outcomes == {
            "malformed.json": "escalated", "bad-utf8.json": "escalated",
            "wrong-types.json": "repaired", "nulls.json": "escalated",
            "duplicates.json": "repaired", "huge-field.json": "escalated",
            HOSTILE[1:]: "escalated", "missing.json": "escalated", "flaky.json": "reenqueued",
        }  # fmt: skip
        rows = {row["id"]: row for row in sink_lines(tmp_path / "out")}
        assert sorted(rows) == [0, 1, 2, 3, 4, 101, 103, 105]
        assert (rows[101]["name"], rows[101]["price"]) == ("Lamp", 12.5)
        replay_batch = report["replay_batch"]
        assert {rows[k]["_collector"]["batch"] for k in (101, 103)} == {replay_batch}
        expectations = {r["expectation"]: r for r in report["expectations"]}
        assert expectations["expect_column_values_to_not_be_null(name)"]["after"] == 1

        # an operator discards the hostile page's entry, with a reason
        hostile_id = next(e["id"] for e in report["entries"] if e["url"].endswith(HOSTILE))
        code = main(["deadletters", "discard", str(path), hostile_id, "--reason", "hostile host"])
        assert code == 0

        # --- the next collect run: the re-enqueued page fails again ---------------------------
        second = summary_of(await collect(source=str(path), batch_size=50, drain_wait_s=5))
        assert second["balanced"] is True
        assert site.requests["/flaky.json"] == 6  # 3 attempts per run
        assert site.requests[HOSTILE] == 1  # dead stays dead
        assert balance(path)["open"] == 1

        # --- triage 2 ------------------------------------------------------------------------
        again = await triage(source=str(path))
        assert (again["seen"], again["reenqueued"], again["records_written"]) == (1, 1, 0)
        assert balance(path) == {
            "quarantined": 9, "repaired": 2, "reenqueued": 1, "escalated": 5, "discarded": 1,
            "open": 0, "other": 0, "balanced": True,
        }  # fmt: skip

    await assert_published(again)

    # a reviewer settles an escalated entry: it stays counted as escalated
    source = load_source(path)
    store = SqliteDeadLetterStore(source.deadletter_path)
    try:
        ((message, entry),) = store.take_for_review(source.name, "alice")
        assert store.finish_review(message, entry.id, "reviewed", "upstream told")
        after = tally(store, source.name, JsonlArchive(source.deadletter_archive_path))
        assert (after.escalated, after.balanced) == (5, True)
    finally:
        store.close()

    # compensation removes exactly the replay batch's records, once, and records it
    capsys.readouterr()
    assert main(["compensate", str(path), "--batch", replay_batch, "--reason", "bad repair"]) == 0
    stored = sink_lines(tmp_path / "out")
    assert sorted(row["id"] for row in stored) == [0, 1, 2, 3, 4, 105]
    assert duplicate_keys(stored) == []
    (record,) = LedgerBook(source.ledger_path).compensations(source.name)
    assert (record.batch_id, record.removed) == (replay_batch, 2)
