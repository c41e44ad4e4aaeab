"""A repaired record's page returns to the frontier's normal life (issue 20, item 1).

Through the real ``collect`` and ``triage`` flows: a page whose record fails the suite is
dead-lettered, triage repairs and replays the record and the page becomes done, fresh for its
TTL; once that passes, the next run fetches the page again and stores its new version once; a
later version that fails again reopens the same dead letter, which triage repairs again. The run
ledgers and the dead-letter balance (archive against store) are exact at every step.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from collector.config import load_source
from collector.deadletter import JsonlArchive, SqliteDeadLetterStore
from collector.frontier.sqlite import SqliteFrontier
from collector.recovery.triage import tally
from flows.collect import collect
from flows.triage import triage
from tests.helpers import duplicate_keys, sink_lines, summary_of, write_source

pytestmark = [pytest.mark.usefixtures("prefect_api"), pytest.mark.slow]

FRESH_S = 4.0
SUITE = {
    "name": "items",
    "expectations": [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "name"}},
        {
            "type": "expect_column_values_to_be_of_type",
            "kwargs": {"column": "price", "type_": "float"},
        },
    ],
}


class Site:
    """Two JSON pages; ``/item.json`` changes when the test says so; requests are counted."""

    def __init__(self) -> None:
        self.item: dict[str, Any] = {}
        self.requests: dict[str, int] = {}
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's name
                site.requests[self.path] = site.requests.get(self.path, 0) + 1
                record = site.item if self.path == "/item.json" else {"id": 2, "name": "Desk",
                                                                      "price": 80.0}  # fmt: skip
                body = json.dumps(record).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_port}{path}"

    def __enter__(self) -> Site:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def site() -> Iterator[Site]:
    with Site() as s:
        yield s


def balance(path: Path) -> dict[str, Any]:
    source = load_source(path)
    with SqliteDeadLetterStore(source.deadletter_path) as store:
        found = tally(store, source.name, JsonlArchive(source.deadletter_archive_path))
    assert found.balanced, found.difference()
    return {k: v for k, v in found.as_dict().items() if type(v) is int and v}


def frontier_states(path: Path) -> dict[str, int]:
    source = load_source(path)
    with SqliteFrontier(source.frontier_path) as frontier:
        counts = frontier.counts(source.name)
    states = ("queued", "leased", "done", "dead", "expired")
    return {name: getattr(counts, name) for name in states if getattr(counts, name)}


async def run(path: Path) -> dict[str, Any]:
    summary = summary_of(await collect(source=str(path), batch_size=10, drain_wait_s=2))
    assert summary["balanced"] is True, summary["problems"]
    return summary


async def test_a_repaired_page_is_fetched_again_when_its_freshness_passes(
    tmp_path: Path, site: Site
) -> None:
    (tmp_path / "suite.json").write_text(json.dumps(SUITE), encoding="utf-8")
    path = write_source(
        tmp_path,
        seeds={"urls": [site.url("/item.json"), site.url("/desk.json")]},
        validation={"suite": "suite.json"},
        repair={"trim": ["name"], "coerce": {"price": "float"}},
        ttl={"default_fresh_s": FRESH_S},
    )

    # 1. the item's record fails the suite: a dead letter, the page dead
    site.item = {"id": 1, "name": " Lamp ", "price": "12.5"}
    first = await run(path)
    assert (first["discovered"], first["stored"], first["dead_lettered"]) == (2, 1, 1)
    assert frontier_states(path) == {"done": 1, "dead": 1}
    assert balance(path) == {"quarantined": 1, "open": 1}

    # 2. triage repairs and replays it; the page comes back to life, fresh for its TTL
    report = await triage(source=str(path))
    assert (report["repaired"], report["records_written"], report["pages_revived"]) == (1, 1, 1)
    assert frontier_states(path) == {"done": 2}
    assert balance(path) == {"quarantined": 1, "repaired": 1}
    rows = {r["id"]: r for r in sink_lines(tmp_path / "out")}
    assert (rows[1]["name"], rows[1]["price"]) == ("Lamp", 12.5)

    # 3. its freshness runs out: the next run fetches it again and stores the new version once
    site.item = {"id": 1, "name": "Lamp", "price": 13.0}
    time.sleep(FRESH_S + 0.5)
    second = await run(path)
    assert (second["discovered"], second["stored"], second["dead_lettered"]) == (2, 2, 0)
    assert (second["records_written"], second["records_unchanged"]) == (1, 1)
    assert site.requests["/item.json"] == 2
    rows_list = sink_lines(tmp_path / "out")
    assert duplicate_keys(rows_list) == []
    assert {r["id"]: r["price"] for r in rows_list} == {1: 13.0, 2: 80.0}
    assert frontier_states(path) == {"done": 2}
    assert balance(path) == {"quarantined": 1, "repaired": 1}

    # 4. a later version fails again: the same dead letter reopens, triage repairs it again
    site.item = {"id": 1, "name": "Lamp ", "price": "14"}
    time.sleep(FRESH_S + 0.5)
    third = await run(path)
    assert (third["stored"], third["dead_lettered"]) == (1, 1)
    assert balance(path) == {"quarantined": 1, "open": 1}
    again = await triage(source=str(path))
    assert (again["repaired"], again["pages_revived"]) == (1, 1)
    assert frontier_states(path) == {"done": 2}
    assert balance(path) == {"quarantined": 1, "repaired": 1}
    assert {r["id"]: r["price"] for r in sink_lines(tmp_path / "out")} == {1: 14.0, 2: 80.0}
    assert site.requests["/item.json"] == 3
