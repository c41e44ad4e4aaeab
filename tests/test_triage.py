"""The triage engine over real stores (SQLite and Redis), a real frontier, sink and GX suite.

Each test builds dead letters the way a collect run leaves them (entries in the store, their
URLs dead in the frontier) and checks what triage did in every place it touches: the store's
statuses and resolutions, the sink's files, the frontier's states, the balance.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.config import Source, load_source
from collector.deadletter.archive import JsonlArchive
from collector.deadletter.base import DeadLetter, DeadLetters, ResolutionKind
from collector.deadletter.sqlite import SqliteDeadLetterStore
from collector.frontier import DeadLettered, Offer
from collector.frontier.sqlite import SqliteFrontier
from collector.recovery.triage import Triage, is_recoverable_class, kind_of, tally
from collector.run.ledger import LedgerBook, compensate
from collector.settle.validation import SuiteValidator
from collector.sinks.base import SinkRecord
from collector.sinks.jsonl import JsonlSink
from tests.helpers import duplicate_keys, sink_lines, write_source

NOW = 1_800_000_000.0
SUITE = {
    "name": "items",
    "expectations": [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "name"}},
        {
            "type": "expect_column_values_to_be_between",
            "kwargs": {"column": "price", "min_value": 0, "max_value": 1000},
        },
        {
            "type": "expect_column_values_to_be_of_type",
            "kwargs": {"column": "price", "type_": "float"},
        },
    ],
}
BASE = "http://shop.test"


@pytest.fixture(scope="module")
def validator(tmp_path_factory: pytest.TempPathFactory) -> SuiteValidator:
    path = tmp_path_factory.mktemp("suite") / "suite.json"
    path.write_text(json.dumps(SUITE), encoding="utf-8")
    return SuiteValidator(path)


@pytest.fixture
def source(tmp_path: Path) -> Source:
    (tmp_path / "suite.json").write_text(json.dumps(SUITE), encoding="utf-8")
    path = write_source(
        tmp_path,
        seeds={"urls": [f"{BASE}/seed"]},
        validation={"suite": "suite.json"},
        repair={
            "rename": {"Name": "name", "ID": "id"},
            "trim": ["name"],
            "coerce": {"price": "float"},
        },
        retry={"base_s": 10, "cap_s": 60},
    )
    return load_source(path)


@pytest.fixture(params=["sqlite", "redis"])
def store(request: pytest.FixtureRequest, source: Source) -> Iterator[DeadLetters]:
    if request.param == "sqlite":
        s: DeadLetters = SqliteDeadLetterStore(
            source.deadletter_path, archive=source.deadletter_archive_path
        )
    else:
        from collector.deadletter.redis import RedisDeadLetterStore

        url = request.getfixturevalue("redis_url")
        s = RedisDeadLetterStore(url, archive=source.deadletter_archive_path)
    yield s
    s.close()


@pytest.fixture
def frontier(source: Source) -> Iterator[SqliteFrontier]:
    f = SqliteFrontier(source.frontier_path)
    yield f
    f.close()


def make_dead(frontier: SqliteFrontier, source: Source, urls: list[str]) -> None:
    """Leave ``urls`` dead in the frontier, as a collect run that dead-lettered them does."""
    frontier.offer(
        source.name,
        [Offer(u, 3600) for u in urls],
        now=NOW - 1000,
        queue_ttl_s=36_000,
        rank_for=lambda url, age, fresh: 1.0,
        run_id="collect-1",
    )
    lease = frontier.claim(source.name, len(urls), now=NOW - 999, lease_s=60)
    frontier.ack(lease, [DeadLettered(u, 1, "x") for u in urls], now=NOW - 998)


def record_letter(
    source: Source, n: int, record: dict[str, Any], failed: list[str] | None = None
) -> DeadLetter:
    return DeadLetter(
        source=source.name,
        url=f"{BASE}/items/{n}.json",
        stage="validate",
        error_class="schema",
        message="failed",
        attempts=1,
        first_seen=NOW - 500,
        last_seen=NOW - 500,
        record_key=str(record.get("id", "")),
        payload=record,
        failed_expectations=[{"expectation": name, "column": "price"} for name in failed or []],
        flow_run_id="collect-1",
    )


def fetch_letter(
    source: Source, path: str, error_class: str, *, seen: float = NOW - 500, cause: str = ""
) -> DeadLetter:
    return DeadLetter(
        source=source.name,
        url=f"{BASE}{path}",
        stage="fetch" if error_class != "parse_error" else "parse",
        error_class=error_class,
        message=error_class,
        attempts=3,
        first_seen=seen,
        last_seen=seen,
        flow_run_id="collect-1",
        cause=cause,
    )


def archive(source: Source) -> JsonlArchive:
    return JsonlArchive(source.deadletter_archive_path)


def terms(balance: Any) -> dict[str, Any]:
    """The balance's terms and verdict (without the id lists, empty when balanced)."""
    data = balance.as_dict()
    return {k: data[k] for k in (*KEYS, "balanced")}


KEYS = ("quarantined", "repaired", "reenqueued", "escalated", "discarded", "open", "other")


def triage(
    source: Source,
    store: DeadLetters,
    frontier: SqliteFrontier,
    validator: SuiteValidator,
    run_id: str = "t1",
    **kwargs: Any,
) -> Any:
    sink = JsonlSink(source.sink_path, source=source.name)
    try:
        engine = Triage(
            source,
            store=store,
            archive=archive(source),
            frontier=frontier,
            sink=sink,
            run_id=run_id,
            validator=validator,
            clock=kwargs.pop("clock", lambda: NOW),
        )
        return engine.run(**kwargs)
    finally:
        sink.close()


def test_every_kind_of_entry_ends_where_the_rules_say(
    source: Source, store: DeadLetters, frontier: SqliteFrontier, validator: SuiteValidator
) -> None:
    fixable = record_letter(source, 1, {"id": 1, "Name": "  Lamp ", "price": "12.5"}, ["x"])
    valid_now = record_letter(source, 2, {"id": 2, "name": "Desk", "price": 80.0})
    hopeless = record_letter(source, 3, {"id": 3, "name": "Chair", "price": -1.0}, ["between"])
    keyless = record_letter(source, 4, {"name": "No id", "price": 1.0})
    renamed_key = record_letter(source, 5, {"ID": 5, "name": "Rug", "price": "7"})
    timeout = fetch_letter(source, "/slow", "timeout", cause="retries_exhausted")
    fresh_503 = fetch_letter(source, "/busy", "http_503", seen=NOW - 1)  # backoff not passed
    missing = fetch_letter(source, "/gone", "http_404")
    broken = fetch_letter(source, "/broken", "parse_error")
    letters = [
        fixable,
        valid_now,
        hopeless,
        keyless,
        renamed_key,
        timeout,
        fresh_503,
        missing,
        broken,
    ]
    store.put(letters)
    make_dead(frontier, source, [e.url for e in letters])

    report = triage(source, store, frontier, validator)

    by_id = {e.id: e for e in report.entries}
    assert {name: by_id[e.id].outcome for name, e in {
        "fixable": fixable, "valid_now": valid_now, "hopeless": hopeless, "keyless": keyless,
        "renamed_key": renamed_key, "timeout": timeout, "fresh_503": fresh_503,
        "missing": missing, "broken": broken,
    }.items()} == {
        "fixable": "repaired", "valid_now": "repaired", "hopeless": "escalated",
        "keyless": "escalated", "renamed_key": "repaired", "timeout": "reenqueued",
        "fresh_503": "open", "missing": "escalated", "broken": "escalated",
    }  # fmt: skip
    assert by_id[fixable.id].changes == [
        "renamed Name -> name",
        "trimmed name",
        "coerced price to float",
    ]
    assert by_id[hopeless.id].failed_after == ["expect_column_values_to_be_between(price)"]
    assert report.counts() == {
        "seen": 9, "repaired": 3, "reenqueued": 1, "escalated": 4, "discarded": 0,
        "open": 1, "skipped": 0,
    }  # fmt: skip
    assert (report.records_written, report.records_unchanged) == (3, 0)

    # the sink holds exactly the repaired records, under the replay batch
    rows = sink_lines(source.sink_path)
    assert sorted(r["id"] for r in rows) == [1, 2, 5]
    assert {r["_collector"]["batch"] for r in rows} == {"triage:t1"}
    assert next(r for r in rows if r["id"] == 1)["name"] == "Lamp"
    assert next(r for r in rows if r["id"] == 1)["price"] == 12.5
    # the timeout went back to the queue; the repaired records' pages are done again, fresh for
    # their TTL; the 404 and the rest stay dead
    counts = frontier.counts(source.name)
    assert (counts.queued, counts.done, counts.dead) == (1, 3, len(letters) - 4)
    assert report.pages_revived == 3
    # the store: statuses, resolutions, the balance
    assert store.counts(source.name) == {"open": 1, "review": 4, "resolved": 4}
    got = store.get(timeout.id)
    assert got is not None and got.requeues == 1
    assert got.resolution_kind == "reenqueued"
    assert got.resolution == "recoverable timeout, re-enqueue #1"
    balance = tally(store, source.name, archive(source))
    assert balance.as_dict() == {
        "quarantined": 9, "repaired": 3, "reenqueued": 1, "escalated": 4, "discarded": 0,
        "open": 1, "other": 0, "lost_count": 0, "unknown_count": 0, "lost": [], "unknown": [],
        "balanced": True, "difference": "",
    }  # fmt: skip
    assert report.balance == balance
    assert report.expectation_rows() == [
        {"expectation": "between(price)", "before": 1, "after": 0},
        {"expectation": "expect_column_values_to_be_between(price)", "before": 0, "after": 1},
        {"expectation": "x(price)", "before": 1, "after": 0},
    ]
    assert "| repaired | 3 |" in report.markdown()

    # a second run: nothing left to do but the one waiting for its backoff
    again = triage(source, store, frontier, validator, run_id="t2")
    assert again.counts() == {
        "seen": 1, "repaired": 0, "reenqueued": 0, "escalated": 0, "discarded": 0,
        "open": 1, "skipped": 0,
    }  # fmt: skip
    later = triage(source, store, frontier, validator, run_id="t3", clock=lambda: NOW + 120)
    assert later.reenqueued == 1
    assert tally(store, source.name, archive(source)).open == 0


def test_replaying_twice_writes_nothing_the_second_time(
    source: Source, store: DeadLetters, frontier: SqliteFrontier, validator: SuiteValidator
) -> None:
    letters = [
        record_letter(source, n, {"id": n, "name": f" n{n} ", "price": str(n)}) for n in range(5)
    ]
    store.put(letters)
    first = triage(source, store, frontier, validator, run_id="r1")
    assert (first.repaired, first.records_written) == (5, 5)
    before = sink_lines(source.sink_path)
    store.put(letters)  # the same failures come back (a rerun): open again
    assert tally(store, source.name, archive(source)).open == 5
    second = triage(source, store, frontier, validator, run_id="r2")
    assert (second.repaired, second.records_written, second.records_unchanged) == (5, 0, 5)
    assert sink_lines(source.sink_path) == before
    # compensating the second replay removes nothing: it wrote nothing
    book = LedgerBook(source.ledger_path)
    sink = JsonlSink(source.sink_path, source=source.name)
    try:
        assert (
            compensate(sink, book, source=source.name, batch_id="triage:r2", reason="t").removed
            == 0
        )
        undone = compensate(sink, book, source=source.name, batch_id="triage:r1", reason="bad fix")
        assert undone.removed == 5
        assert sink.count() == 0
    finally:
        sink.close()
    assert [(c.batch_id, c.removed, c.reason) for c in book.compensations(source.name)] == [
        ("triage:r2", 0, "t"),
        ("triage:r1", 5, "bad fix"),
    ]
    assert book.compensated(source.name, "triage:r1") is not None
    assert book.compensated(source.name, "triage:r2") is None


def test_dry_run_changes_nothing(
    source: Source, store: DeadLetters, frontier: SqliteFrontier, validator: SuiteValidator
) -> None:
    letters = [
        record_letter(source, 1, {"id": 1, "name": "a", "price": "1"}),
        fetch_letter(source, "/slow", "timeout"),
        fetch_letter(source, "/gone", "http_404"),
    ]
    store.put(letters)
    make_dead(frontier, source, [e.url for e in letters])
    report = triage(source, store, frontier, validator, dry_run=True)
    assert (report.repaired, report.reenqueued, report.escalated) == (1, 1, 1)
    assert store.counts(source.name) == {"open": 3, "review": 0, "resolved": 0}
    assert frontier.counts(source.name).dead == 3
    assert sink_lines(source.sink_path) == []


def test_a_recoverable_failure_is_requeued_a_bounded_number_of_times(
    source: Source, store: DeadLetters, frontier: SqliteFrontier, validator: SuiteValidator
) -> None:
    entry = fetch_letter(source, "/flaky", "http_500")
    clock = NOW
    for n in range(3):  # TRIAGE_MAX_REQUEUES
        store.put([fetch_letter(source, "/flaky", "http_500", seen=clock)])
        make_dead(frontier, source, [entry.url])
        clock += source.retry.ceiling(n + 1)
        early = triage(
            source, store, frontier, validator, run_id=f"e{n}", clock=lambda c=clock: c - 0.5
        )
        assert early.open == 1  # the n-th backoff has not passed yet
        done = triage(source, store, frontier, validator, run_id=f"d{n}", clock=lambda c=clock: c)
        assert done.reenqueued == 1
    store.put([fetch_letter(source, "/flaky", "http_500", seen=clock)])
    make_dead(frontier, source, [entry.url])
    final = triage(source, store, frontier, validator, run_id="final", clock=lambda: clock + 1e6)
    assert final.escalated == 1
    got = store.get(entry.id)
    assert got is not None and (got.status, got.requeues) == ("review", 3)


def test_two_overlapping_triage_runs_settle_each_entry_exactly_once(
    source: Source, store: DeadLetters, frontier: SqliteFrontier, validator: SuiteValidator
) -> None:
    records = [
        record_letter(source, n, {"id": n, "name": f"n{n}", "price": str(n)}) for n in range(40)
    ]
    fetches = [fetch_letter(source, f"/f{n}", "timeout") for n in range(20)]
    hopeless = [fetch_letter(source, f"/g{n}", "http_404") for n in range(20)]
    letters = records + fetches + hopeless
    store.put(letters)
    make_dead(frontier, source, [e.url for e in letters])
    # a second connection to the same store and frontier, as a second worker would have
    if isinstance(store, SqliteDeadLetterStore):
        other_store: DeadLetters = SqliteDeadLetterStore(
            source.deadletter_path, archive=source.deadletter_archive_path
        )
    else:
        from collector.deadletter.redis import RedisDeadLetterStore

        assert isinstance(store, RedisDeadLetterStore)  # the fixture's other backend
        other_store = RedisDeadLetterStore(
            store.url,
            archive=source.deadletter_archive_path,
        )
    other_frontier = SqliteFrontier(source.frontier_path)
    barrier = threading.Barrier(2)
    reports: dict[str, Any] = {}
    raised: dict[str, BaseException] = {}

    def run(name: str, s: DeadLetters, f: SqliteFrontier) -> None:
        barrier.wait()
        try:
            reports[name] = triage(source, s, f, validator, run_id=name)
        except BaseException as exc:  # said in the test's failure, not as a thread warning
            raised[name] = exc

    threads = [
        threading.Thread(target=run, args=("a", store, frontier)),
        threading.Thread(target=run, args=("b", other_store, other_frontier)),
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        other_frontier.close()
        other_store.close()
    assert not raised, {name: repr(exc) for name, exc in raised.items()}
    settled: dict[str, str] = {}
    for report in reports.values():
        for e in report.entries:
            if e.outcome != "skipped":
                assert e.id not in settled, f"{e.id} settled by both runs"
                settled[e.id] = e.outcome
    assert sorted(settled) == sorted(e.id for e in letters)
    total = {
        k: reports["a"].counts()[k] + reports["b"].counts()[k]
        for k in ("repaired", "reenqueued", "escalated")
    }
    assert total == {"repaired": 40, "reenqueued": 20, "escalated": 20}
    # the sink holds each record once; the frontier requeued each recoverable URL once
    rows = sink_lines(source.sink_path)
    assert len(rows) == 40 and duplicate_keys(rows) == []
    assert frontier.counts(source.name).queued == 20
    # the archive saw one resolution or escalation per entry
    events = [json.loads(line) for line in source.deadletter_archive_path.read_text().splitlines()]
    settled_events = [e["id"] for e in events if e["event"] in ("resolved", "escalated")]
    assert sorted(settled_events) == sorted(e.id for e in letters)
    balance = tally(store, source.name, archive(source))
    assert balance.balanced and (balance.repaired, balance.reenqueued, balance.escalated) == (
        40,
        20,
        20,
    )


def test_recoverable_classes() -> None:
    for name in ("timeout", "http_503", "http_429", "connect_error", "http_408"):
        assert is_recoverable_class(name), name
    for name in ("http_404", "parse_error", "too_large", "refused_url", "http_5000", "schema",
                 "retries_exhausted:timeout"):  # fmt: skip
        assert not is_recoverable_class(name), name


def test_kind_of_reads_the_resolution() -> None:
    base: dict[str, Any] = dict(source="s", url="u", stage="fetch", error_class="x", message="m",
                                attempts=1, first_seen=1.0, last_seen=1.0)  # fmt: skip
    assert kind_of(DeadLetter(**base)) == "open"
    assert kind_of(DeadLetter(**base, status="review")) == "escalated"
    cases: tuple[tuple[ResolutionKind | None, str], ...]
    cases = (("repaired", "repaired"), ("reviewed", "escalated"), ("discarded", "discarded"),
             (None, "other"))  # fmt: skip
    for stored, kind in cases:
        entry = DeadLetter(**base, status="resolved", resolution="x", resolution_kind=stored)
        assert kind_of(entry) == kind


def test_an_entry_held_by_another_run_is_skipped_until_its_claim_expires(
    source: Source, store: DeadLetters, frontier: SqliteFrontier, validator: SuiteValidator
) -> None:
    held = record_letter(source, 1, {"id": 1, "name": "a", "price": 1.0})
    free = record_letter(source, 2, {"id": 2, "name": "b", "price": 2.0})
    store.put([held, free])
    assert store.claim_for_triage(held.id, "triage:other", now=NOW, lease_s=300)
    report = triage(source, store, frontier, validator, run_id="mine")
    assert {e.id: e.outcome for e in report.entries} == {held.id: "skipped", free.id: "repaired"}
    assert [r["id"] for r in sink_lines(source.sink_path)] == [2]
    assert tally(store, source.name, archive(source)).open == 1
    # the other run vanished: after its claim expires, the entry is triaged
    late = triage(source, store, frontier, validator, run_id="late", clock=lambda: NOW + 301)
    assert {e.id: e.outcome for e in late.entries} == {held.id: "repaired"}
    assert tally(store, source.name, archive(source)).as_dict()["repaired"] == 2


def test_replay_into_postgres_is_fenced_idempotent_and_compensable(
    source: Source, frontier: SqliteFrontier, validator: SuiteValidator, postgres_dsn: str
) -> None:
    from collector.sinks.postgres import PostgresSink

    store = SqliteDeadLetterStore(source.deadletter_path)
    sink = PostgresSink(postgres_dsn, source=source.name)
    try:
        sink.write([SinkRecord("0", {"id": 0, "name": "kept", "price": 1.0}, "u")], token=1,
                   batch_id="collect:1")  # fmt: skip
        letters = [
            record_letter(source, n, {"id": n, "name": f" n{n} ", "price": str(n)})
            for n in range(1, 4)
        ]
        store.put(letters)

        def run(run_id: str) -> Any:
            return Triage(source, store=store, archive=archive(source), frontier=frontier,
                          sink=sink, run_id=run_id, validator=validator,
                          clock=lambda: NOW).run()  # fmt: skip

        first = run("p1")
        assert (first.repaired, first.records_written) == (3, 3)
        assert sink.count() == 4
        assert sink.get("2") == {"id": 2, "name": "n2", "price": 2.0}
        store.put(letters)  # seen again: replaying again writes nothing
        second = run("p2")
        assert (second.repaired, second.records_written, second.records_unchanged) == (3, 0, 3)
        book = LedgerBook(source.ledger_path)
        done = compensate(sink, book, source=source.name, batch_id="triage:p1", reason="undo")
        assert done.removed == 3
        assert sink.count() == 1 and sink.get("0") is not None
    finally:
        sink.close()
        store.close()


def test_tally_from_counts_equals_kind_of_entry_by_entry(tmp_path: Path) -> None:
    """The balance read from the store's counts is the one kind_of gives per entry."""
    log = tmp_path / "dl.jsonl"
    store = SqliteDeadLetterStore(tmp_path / "dl.db", archive=log)
    urls = [f"https://example.test/{n}" for n in range(9)]
    entries = [
        DeadLetter(source="s", url=url, stage="fetch", error_class="http_500", message="x",
                   attempts=1, first_seen=1.0, last_seen=1.0)
        for url in urls
    ]  # fmt: skip
    store.put(entries)
    kinds: list[ResolutionKind]
    kinds = ["repaired", "reenqueued", "discarded", "reviewed", "repaired", "discarded"]
    for entry, kind in zip(entries, kinds, strict=False):
        store.resolve(entry.id, kind, "why")
    store.escalate(entries[6].id, "look")
    by_entry: dict[str, int] = {}
    for entry in store.list(source="s", status=None, limit=100):
        by_entry[kind_of(entry)] = by_entry.get(kind_of(entry), 0) + 1
    counted = terms(tally(store, "s", JsonlArchive(log)))
    assert counted["quarantined"] == 9 and counted["balanced"]
    assert {k: v for k, v in counted.items() if k not in ("quarantined", "balanced") and v} == (
        by_entry
    )


def test_a_stop_request_ends_triage_between_entries_and_leaves_the_rest_open(
    source: Source, store: DeadLetters, frontier: SqliteFrontier, validator: SuiteValidator
) -> None:
    """Ctrl-C during `collector triage` (collector.run.stop): entries claimed before the stop
    are settled, the others stay open and unclaimed for the next triage; the balance holds."""
    from collector.run.stop import StopRequest

    letters = [fetch_letter(source, f"/gone-{i}", "http_404") for i in range(5)]
    store.put(letters)
    make_dead(frontier, source, [e.url for e in letters])
    stop = StopRequest()
    settled: list[str] = []
    original = store.claim_for_triage

    def claim_then_stop(entry_id: str, *args: Any, **kwargs: Any) -> bool:
        settled.append(entry_id)
        if len(settled) == 2:
            stop.request("SIGINT")  # arrives while the second entry is being settled
        return original(entry_id, *args, **kwargs)

    store.claim_for_triage = claim_then_stop  # type: ignore[method-assign]  # a stop mid-run
    report = triage(source, store, frontier, validator, stop=stop)
    assert report.interrupted == "SIGINT"
    assert (report.seen, report.escalated) == (2, 2)
    assert store.counts(source.name)["open"] == 3
    assert report.balance.balanced, report.balance.difference()
    again = triage(source, store, frontier, validator, run_id="t2")
    assert again.interrupted is None and again.escalated == 3
