"""`collector deadletters retry|discard`, the age filter and `collector compensate`."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from collector.config import Source, load_source
from collector.deadletter import DeadLetter, SqliteDeadLetterStore
from collector.deadletter.base import Stage
from collector.demo.site import FaultSite
from collector.frontier import Completed, DeadLettered, Offer
from collector.frontier.sqlite import SqliteFrontier
from collector.run.ledger import LedgerBook
from collector.sinks.base import SinkRecord
from collector.sinks.jsonl import JsonlSink
from flows.cli import main, parse_age
from tests.helpers import sink_lines, write_source

DAY = 86400.0


@pytest.fixture
def source(tmp_path: Path) -> Source:
    return load_source(write_source(tmp_path, seeds={"urls": ["http://127.0.0.1:9/a.json"]}))


def put(source: Source, letters: list[DeadLetter]) -> None:
    store = SqliteDeadLetterStore(source.deadletter_path, archive=source.deadletter_archive_path)
    try:
        store.put(letters)
    finally:
        store.close()


def entries(source: Source) -> dict[str, DeadLetter]:
    store = SqliteDeadLetterStore(source.deadletter_path)
    try:
        return {e.url: e for e in store.list(source=source.name, status=None)}
    finally:
        store.close()


def letter(
    source: Source, url: str, error: str, age_s: float, stage: Stage = "fetch"
) -> DeadLetter:
    seen = time.time() - age_s
    return DeadLetter(source.name, url, stage, error, error, 1, seen, seen)


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("90s", 90), ("15m", 900), ("2h", 7200), ("1.5d", 129600)]
)
def test_parse_age(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds


def test_list_older_than(source: Source, capsys: pytest.CaptureFixture[str]) -> None:
    put(source, [letter(source, "http://h/old", "http_404", 3 * DAY),
                 letter(source, "http://h/new", "http_404", 60)])  # fmt: skip
    assert main(["deadletters", "list", str(source.path(Path("source.yaml"))), "--older-than",
                 "2d", "--json"]) == 0  # fmt: skip
    assert [e["url"] for e in json.loads(capsys.readouterr().out)] == ["http://h/old"]
    with pytest.raises(SystemExit):
        main(["deadletters", "list", str(source.base_dir / "source.yaml"), "--older-than", "2x"])


def test_discard_needs_a_reason_when_not_interactive(
    source: Source, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = letter(source, "http://h/a", "http_404", 10)
    put(source, [entry])
    path = str(source.base_dir / "source.yaml")
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # not a terminal
    assert main(["deadletters", "discard", path, entry.id]) == 2
    assert "needs a reason" in capsys.readouterr().err
    assert entries(source)["http://h/a"].status == "open"
    assert main(["deadletters", "discard", path, entry.id, "--reason", "page removed"]) == 0
    got = entries(source)["http://h/a"]
    assert (got.status, got.resolution_kind, got.resolution) == (
        "resolved",
        "discarded",
        "page removed",
    )
    assert main(["deadletters", "discard", path, entry.id, "--reason", "again"]) == 0
    assert "discarded 0 of 1" in capsys.readouterr().out
    assert entries(source)["http://h/a"].resolution == "page removed"  # kept once
    archive = source.deadletter_archive_path.read_text().splitlines()
    assert [json.loads(line)["event"] for line in archive] == ["quarantined", "resolved"]


def test_discard_asks_for_the_reason_on_a_terminal(
    source: Source, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    put(source, [letter(source, "http://h/a", "http_404", 10),
                 letter(source, "http://h/b", "parse_error", 10, stage="parse")])  # fmt: skip

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stdin", Terminal("duplicate of another feed\n"))
    path = str(source.base_dir / "source.yaml")
    assert main(["deadletters", "discard", path, "--stage", "fetch"]) == 0
    got = entries(source)
    assert got["http://h/a"].resolution == "duplicate of another feed"
    assert got["http://h/b"].status == "open"  # not selected
    assert main(["deadletters", "discard", path]) == 2  # no ids and no filter: refused
    assert "--all" in capsys.readouterr().err


@pytest.mark.usefixtures("prefect_api")  # retry takes the source lock
def test_retry_puts_dead_urls_back_in_the_queue(
    source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    dead, unknown = "http://127.0.0.1:9/dead", "http://127.0.0.1:9/never-seen"
    frontier = SqliteFrontier(source.frontier_path)
    try:
        now = time.time()
        frontier.offer(source.name, [Offer(dead, 60)], now=now, queue_ttl_s=600,
                       rank_for=lambda *a: 1.0, run_id="r")  # fmt: skip
        lease = frontier.claim(source.name, 1, now=now, lease_s=60)
        frontier.ack(lease, [DeadLettered(dead, 3, "timeout")], now=now)
    finally:
        frontier.close()
    a, b = letter(source, dead, "timeout", 10), letter(source, unknown, "timeout", 10)
    put(source, [a, b])
    path = str(source.base_dir / "source.yaml")
    assert main(["deadletters", "retry", path, a.id]) == 0
    got = entries(source)[dead]
    assert (got.status, got.requeues) == ("resolved", 1)
    assert (got.resolution_kind, got.resolution) == ("reenqueued", "operator retry")
    frontier = SqliteFrontier(source.frontier_path)
    try:
        assert frontier.counts(source.name).queued == 1
    finally:
        frontier.close()
    assert main(["deadletters", "retry", path, b.id]) == 1  # not in the frontier: said, kept open
    assert "not re-enqueued" in capsys.readouterr().err
    assert entries(source)[unknown].status == "open"
    assert main(["deadletters", "retry", path, "nope"]) == 2


@pytest.mark.usefixtures("prefect_api")  # compensate runs its flow
def test_compensate_removes_exactly_one_batch_and_records_it(
    source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    sink = JsonlSink(source.sink_path, source=source.name)
    try:
        sink.write([SinkRecord(str(n), {"id": n}, "u") for n in range(3)], token=1, batch_id="r:1")
        sink.write(
            [SinkRecord(str(n), {"id": n}, "u") for n in range(3, 7)], token=2, batch_id="r:2"
        )
        sink.write([SinkRecord("7", {"id": 7}, "u")], token=3, batch_id="r:3")
    finally:
        sink.close()
    path = str(source.base_dir / "source.yaml")
    assert main(["compensate", path, "--batch", "r:2", "--reason", "table check failed"]) == 0
    assert "4 records removed" in capsys.readouterr().out
    assert sorted(r["id"] for r in sink_lines(source.sink_path)) == [0, 1, 2, 7]
    (record,) = LedgerBook(source.ledger_path).compensations(source.name)
    assert (record.batch_id, record.removed, record.reason) == ("r:2", 4, "table check failed")
    assert main(["compensate", path, "--batch", "r:2"]) == 1  # once only
    assert "already compensated" in capsys.readouterr().err
    assert main(["compensate", path, "--batch", "never", "--reason", "x"]) == 1  # said so
    assert "not in" in capsys.readouterr().err
    assert sorted(r["id"] for r in sink_lines(source.sink_path)) == [0, 1, 2, 7]


@pytest.mark.usefixtures("prefect_api")  # compensate runs its flow
def test_compensate_makes_the_removed_records_pages_fetchable_again(source: Source) -> None:
    pages = {n: f"http://127.0.0.1:9/{n}.json" for n in "ab"}
    frontier = SqliteFrontier(source.frontier_path)
    try:
        now = time.time()
        frontier.offer(source.name, [Offer(u, DAY) for u in pages.values()], now=now,
                       queue_ttl_s=600, rank_for=lambda *a: 1.0, run_id="r")  # fmt: skip
        lease = frontier.claim(source.name, 2, now=now, lease_s=60)
        frontier.ack(lease, [Completed(u, now + DAY, now) for u in pages.values()], now=now)
    finally:
        frontier.close()
    sink = JsonlSink(source.sink_path, source=source.name)
    try:
        sink.write([SinkRecord("a", {"id": "a"}, pages["a"])], token=1, batch_id="r:1")
        sink.write([SinkRecord("b", {"id": "b"}, pages["b"])], token=2, batch_id="r:2")
    finally:
        sink.close()
    path = str(source.base_dir / "source.yaml")
    assert main(["compensate", path, "--batch", "r:1", "--reason", "bad batch"]) == 0
    frontier = SqliteFrontier(source.frontier_path)
    try:
        planned = frontier.offer(source.name, [Offer(u, DAY) for u in pages.values()],
                                 now=time.time(), queue_ttl_s=600, rank_for=lambda *a: 1.0,
                                 run_id="r2")  # fmt: skip
        assert (planned.enqueued, planned.fresh_skipped) == (1, 1)  # a again; b still fresh
        lease = frontier.claim(source.name, 2, now=time.time(), lease_s=60)
        assert [item.url for item in lease.items] == [pages["a"]]
    finally:
        frontier.close()


@pytest.mark.usefixtures("prefect_api")
def test_triage_command_runs_the_flow(source: Source, capsys: pytest.CaptureFixture[str]) -> None:
    gone, busy = (
        letter(source, "http://h/gone", "http_404", 10),
        letter(source, "http://h/busy", "timeout", 10),
    )
    put(source, [gone, busy])
    path = str(source.base_dir / "source.yaml")
    assert main(["triage", path, "--dry-run", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (report["dry_run"], report["escalated"], report["reenqueued"]) == (True, 1, 1)
    assert entries(source)["http://h/gone"].status == "open"  # a dry run changes nothing
    assert main(["triage", path]) == 0
    out = capsys.readouterr().out
    assert "escalated 2" in out  # the timeout's URL is not dead in the frontier: a person looks
    assert "balance: quarantined 2 = repaired 0 + re-enqueued 0 + escalated 2" in out
    assert {e.status for e in entries(source).values()} == {"review"}


@pytest.mark.usefixtures("prefect_api")  # retry takes the source lock
def test_retry_works_on_a_resolved_entry_whose_page_is_dead(
    source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    """A repaired entry whose page was left dead (before triage revived pages) can be
    retried; a resolved entry whose page is not dead says so and exits 1."""
    dead = "http://127.0.0.1:9/dead"
    frontier = SqliteFrontier(source.frontier_path)
    try:
        now = time.time()
        frontier.offer(source.name, [Offer(dead, 60)], now=now, queue_ttl_s=600,
                       rank_for=lambda *a: 1.0, run_id="r")  # fmt: skip
        lease = frontier.claim(source.name, 1, now=now, lease_s=60)
        frontier.ack(lease, [DeadLettered(dead, 1, "validation")], now=now)
    finally:
        frontier.close()
    entry = letter(source, dead, "schema", 10, stage="validate")
    put(source, [entry])
    store = SqliteDeadLetterStore(source.deadletter_path, archive=source.deadletter_archive_path)
    try:
        assert store.resolve(entry.id, "repaired", "trimmed name")
    finally:
        store.close()
    path = str(source.base_dir / "source.yaml")
    assert main(["deadletters", "retry", path, entry.id]) == 0
    assert "re-enqueued 1 of 1" in capsys.readouterr().out
    got = entries(source)[dead]
    assert (got.resolution_kind, got.requeues) == ("repaired", 0)  # resolved once, kept
    frontier = SqliteFrontier(source.frontier_path)
    try:
        assert frontier.counts(source.name).queued == 1
    finally:
        frontier.close()
    assert main(["deadletters", "retry", path, entry.id]) == 1  # queued now, not dead
    captured = capsys.readouterr()
    assert "re-enqueued none of 1 dead letter: nothing to fetch again" in captured.out
    assert "resolved already (repaired)" in captured.err  # not "the next run fetches them"
    assert "nothing to re-enqueue" in captured.err


def test_show_prints_the_trace_id(source: Source, capsys: pytest.CaptureFixture[str]) -> None:
    seen = time.time()
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    entry = DeadLetter(source.name, "http://h/t", "fetch", "http_500", "boom", 3, seen, seen,
                       cause="retries_exhausted", trace_id=trace)  # fmt: skip
    put(source, [entry])
    assert main(["deadletters", "show", str(source.base_dir / "source.yaml"), entry.id]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["trace_id"] == trace
    assert (shown["error_class"], shown["cause"]) == ("http_500", "retries_exhausted")


@pytest.mark.usefixtures("prefect_api")
def test_triage_command_exits_1_and_names_the_ids_when_the_balance_fails(
    source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    import sqlite3

    gone, lost = (
        letter(source, "http://h/gone", "http_404", 10),
        letter(source, "http://h/lost", "http_404", 10),
    )
    put(source, [gone, lost])
    with sqlite3.connect(source.deadletter_path) as db:  # lost behind the store's back
        db.execute("DELETE FROM deadletters WHERE id = ?", (lost.id,))
    assert main(["triage", str(source.base_dir / "source.yaml")]) == 1
    captured = capsys.readouterr()
    assert f"1 lost by the store: {lost.id}" in captured.err
    assert "do not balance" in captured.err


def test_the_error_class_hint_names_values_the_filter_accepts(
    source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown --error-class lists the classes to try: each must select its entries, in the
    ERROR column's form and in the demo's ``cause:class`` form; the status hint does not
    suggest the status the user already chose."""
    seen = time.time()
    put(source, [
        DeadLetter(source.name, "http://h/c", "fetch", "connect_error", "refused", 3, seen, seen,
                   cause="retries_exhausted"),
        DeadLetter(source.name, "http://h/g", "fetch", "http_404", "gone", 1, seen, seen),
        DeadLetter(source.name, "http://h/r", "fetch", "http_410", "gone", 1, seen, seen),
    ])  # fmt: skip
    store = SqliteDeadLetterStore(source.deadletter_path)
    try:
        rev = next(e for e in store.list(source=source.name) if e.url == "http://h/r")
        assert store.resolve(rev.id, "discarded", "not ours")
    finally:
        store.close()
    path = str(source.base_dir / "source.yaml")

    assert main(["deadletters", "list", path, "--error-class", "nope", "--status", "open"]) == 0
    err = capsys.readouterr().err
    assert "--status open" not in err, err  # already chosen
    assert "--status resolved" in err, err
    hint = next(line for line in err.splitlines() if line.startswith("error classes of open"))
    known = hint.rsplit(": ", 1)[-1].split(", ")
    assert known == ["connect_error", "http_404"], hint
    for error_class, url in zip(known, ["http://h/c", "http://h/g"], strict=True):
        assert main(["deadletters", "list", path, "--error-class", error_class, "--json"]) == 0
        assert [e["url"] for e in json.loads(capsys.readouterr().out)] == [url]

    # the label the demo prints (``-> dead letter: retries_exhausted:http_500``) selects too
    for label, urls in (("retries_exhausted:connect_error", ["http://h/c"]),
                        ("max_total_exceeded:connect_error", [])):  # fmt: skip
        assert main(["deadletters", "list", path, "--error-class", label, "--json"]) == 0
        assert [e["url"] for e in json.loads(capsys.readouterr().out)] == urls


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_tries_grow_when_a_retried_page_fails_again(
    tmp_path: Path, site: FaultSite, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 27 item 12: a real run dead-letters a page (404, one try), `deadletters retry`
    queues it again, the next real run fails it again: the listing's TRIES says 2, not 1, and
    there is still one entry (open again)."""
    path = str(
        write_source(tmp_path, seeds={"urls": [site.url("/items/7.json?status=404&times=-1")]})
    )
    assert main(["run", path]) == 0
    capsys.readouterr()
    assert main(["deadletters", "list", path, "--json"]) == 0
    (first,) = json.loads(capsys.readouterr().out)
    assert (first["attempts"], first["error_class"]) == (1, "http_404")
    assert main(["deadletters", "retry", path, first["id"]]) == 0
    assert main(["run", path]) == 0
    capsys.readouterr()
    assert main(["deadletters", "list", path]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert len(rows) == 1, rows
    column = header.index("TRIES")  # the table's columns are aligned under the header
    assert rows[0][column:].split()[0] == "2"
    assert rows[0].split()[1] == "open"
