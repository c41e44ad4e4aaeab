"""`collector review`: the real command on both stores, driven by flags and by a terminal.

Entries are escalated the way triage leaves them (in review, their pages dead in the frontier);
each test checks every place a decision touches: the store, the sink, the frontier, the balance.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import pytest

from collector.backends import open_archive, open_deadletters
from collector.config import Source, load_source
from collector.deadletter import DeadLetter
from collector.frontier import DeadLettered, Offer
from collector.frontier.sqlite import SqliteFrontier
from collector.recovery.triage import tally
from flows.cli import main
from tests.helpers import sink_lines, write_source

SUITE = {
    "name": "items",
    "expectations": [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "name"}},
        {
            "type": "expect_column_values_to_be_between",
            "kwargs": {"column": "price", "min_value": 0, "max_value": 1000},
        },
    ],
}
BASE = "http://127.0.0.1:9"


@pytest.fixture(params=["sqlite", "redis"])
def source(request: pytest.FixtureRequest, tmp_path: Path) -> Source:
    (tmp_path / "suite.json").write_text(json.dumps(SUITE), encoding="utf-8")
    sections: dict[str, Any] = {"validation": {"suite": "suite.json"}}
    if request.param == "redis":
        sections["deadletters"] = {"type": "redis", "url": request.getfixturevalue("redis_url")}
    return load_source(write_source(tmp_path, seeds={"urls": [f"{BASE}/seed"]}, **sections))


def path_of(source: Source) -> str:
    return str(source.base_dir / "source.yaml")


def escalated(source: Source, *records: dict[str, Any]) -> list[DeadLetter]:
    """One dead letter per record, escalated, its page dead in the frontier."""
    now = time.time()
    letters = [
        DeadLetter(source=source.name, url=f"{BASE}/items/{r['id']}.json", stage="validate",
                   error_class="schema", message="price out of range", attempts=1,
                   first_seen=now, last_seen=now, record_key=str(r["id"]), payload=r,
                   failed_expectations=[{"expectation": "between", "column": "price"}])
        for r in records
    ]  # fmt: skip
    with SqliteFrontier(source.frontier_path) as frontier:
        frontier.offer(source.name, [Offer(e.url, 60) for e in letters], now=now,
                       queue_ttl_s=600, rank_for=lambda *a: 1.0, run_id="r")  # fmt: skip
        lease = frontier.claim(source.name, len(letters), now=now, lease_s=60)
        frontier.ack(lease, [DeadLettered(e.url, 1, "validation") for e in letters], now=now)
    with open_deadletters(source) as store:
        store.put(letters)
        for entry in letters:
            assert store.escalate(entry.id, "still fails after repair")
    return letters


def state(source: Source, entry: DeadLetter) -> tuple[str, str | None, str | None]:
    with open_deadletters(source) as store:
        got = store.get(entry.id)
    assert got is not None
    return got.status, got.resolution_kind, got.resolution


def balance(source: Source) -> dict[str, Any]:
    with open_deadletters(source) as store:
        found = tally(store, source.name, open_archive(source))
    assert found.balanced, found.difference()
    return {k: v for k, v in found.as_dict().items() if type(v) is int and v}


def pages(source: Source) -> tuple[int, int]:
    with SqliteFrontier(source.frontier_path) as frontier:
        counts = frontier.counts(source.name)
    return counts.done, counts.dead


def test_list_shows_what_waits_in_review(
    source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = escalated(source, {"id": 1, "name": "a", "price": -1}, {"id": 2, "name": "b"})
    assert main(["review", path_of(source), "--list"]) == 0
    out = capsys.readouterr().out
    assert a.id[:12] in out and b.id[:12] in out and "2 in review" in out
    assert out.splitlines()[0].split()[:4] == ["ID", "STATUS", "STAGE", "ERROR"]  # one format
    assert "validate" in out and "schema" in out


@pytest.mark.usefixtures("prefect_api")  # an accept takes the source lock
def test_accepting_a_corrected_record_stores_it_and_revives_its_page(
    source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    (entry,) = escalated(source, {"id": 1, "name": "Lamp", "price": -12.5})
    record = json.dumps({"id": 1, "name": "Lamp", "price": 12.5})
    code = main(["review", path_of(source), "--reviewer", "alice", "--accept", record, "--json"])
    assert code == 0
    out = capsys.readouterr().out
    decision = json.loads(out.strip().splitlines()[-1])
    assert (decision["id"], decision["done"]) == (entry.id, True)
    assert '"price": -12.5' in out  # the entry was shown before the decision
    status, kind, detail = state(source, entry)
    assert (status, kind) == ("resolved", "reviewed")
    assert detail is not None and "alice" in detail
    (row,) = sink_lines(source.sink_path)
    assert (row["price"], row["_collector"]["batch"].startswith("review:alice:")) == (12.5, True)
    assert pages(source) == (1, 0)  # the page lives again
    assert balance(source) == {"quarantined": 1, "escalated": 1}
    assert main(["review", path_of(source), "--accept-as-is"]) == 0
    assert "nothing to review" in capsys.readouterr().out


async def test_an_accept_waits_for_the_source_lock_then_is_refused_and_put_back(
    source: Source, prefect_api: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run in progress counts the dead page: the accept that would revive it waits for the
    run's lock and, busy past locks.wait_s, changes nothing."""
    import asyncio

    from prefect.concurrency.asyncio import concurrency

    from collector.run.locks import source_lock_name
    from flows._locks import ensure_limit

    (entry,) = escalated(source, {"id": 1, "name": "Lamp", "price": -12.5})
    path = write_source(
        source.base_dir, seeds={"urls": [f"{BASE}/seed"]}, locks={"wait_s": 1},
        validation={"suite": "suite.json"},
        **({"deadletters": {"type": "redis", "url": source.deadletters.url}}
           if source.deadletters.type == "redis" else {}),
    )  # fmt: skip
    record = json.dumps({"id": 1, "name": "Lamp", "price": 12.5})
    await ensure_limit(source_lock_name(source.name), 1)
    async with concurrency(source_lock_name(source.name), occupy=1, strict=True,
                           lease_duration=60):  # fmt: skip
        code = await asyncio.to_thread(main, ["review", str(path), "--accept", record])
    assert code == 1
    out = capsys.readouterr().out
    assert f"refused, put back: busy: another run of {source.name!r}" in out
    assert out.rstrip().endswith("nothing changed")
    assert state(source, entry)[0] == "review"  # put back, not resolved
    assert sink_lines(source.sink_path) == [] and pages(source) == (0, 1)  # nothing changed


def test_a_record_that_still_fails_is_refused_and_put_back(
    source: Source, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (entry,) = escalated(source, {"id": 1, "name": "Lamp", "price": -12.5})
    (tmp_path / "fix.json").write_text('{"id": 1, "name": null, "price": 5}', encoding="utf-8")
    assert main(["review", path_of(source), "--accept", f"@{tmp_path / 'fix.json'}"]) == 1
    assert "refused, put back: the record fails" in capsys.readouterr().out
    assert main(["review", path_of(source), "--accept-as-is"]) == 1  # still out of range
    assert main(["review", path_of(source), "--accept", '{"name": "no key", "price": 1}']) == 1
    assert "no usable key" in capsys.readouterr().out
    assert state(source, entry)[0] == "review"
    assert sink_lines(source.sink_path) == []
    assert pages(source) == (0, 1)
    assert main(["review", path_of(source), "--accept", "{not json"]) == 2  # nothing taken
    assert "--accept: not JSON" in capsys.readouterr().err
    with open_deadletters(source) as store:  # put back: the next reviewer gets it
        ((_, got),) = store.take_for_review(source.name, "bob")
    assert got.id == entry.id


def test_discard_and_put_back(source: Source, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = escalated(source, {"id": 1, "name": "a"}, {"id": 2, "name": "b"})
    assert main(["review", path_of(source), "--put-back"]) == 0
    assert main(["review", path_of(source), "--reviewer", "bob", "--discard", "test data"]) == 0
    statuses = {e.id: state(source, e) for e in (first, second)}
    done = [eid for eid, (status, _, _) in statuses.items() if status == "resolved"]
    assert len(done) == 1
    assert statuses[done[0]][1:] == ("discarded", "test data (bob)")
    assert balance(source) == {"quarantined": 2, "escalated": 1, "discarded": 1}


def test_take_over_an_entry_held_by_a_reviewer_who_vanished(
    source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    (entry,) = escalated(source, {"id": 1, "name": "a", "price": -1})
    with open_deadletters(source) as store:
        assert store.take_for_review(source.name, "alice")  # then alice's laptop died
    assert main(["review", path_of(source), "--discard", "x"]) == 0
    assert "nothing to review" in capsys.readouterr().out  # held: not handed to bob
    args = ["review", path_of(source), "--take-over", "--idle", "15m", "--discard", "x"]
    assert main(args) == 0
    assert "nothing to review" in capsys.readouterr().out  # not idle long enough
    time.sleep(0.05)
    assert main([*args[:-4], "--idle", "0s", "--discard", "alice left"]) == 0
    assert state(source, entry)[:2] == ("resolved", "discarded")


@pytest.mark.usefixtures("prefect_api")  # an accept takes the source lock
def test_on_a_terminal_the_reviewer_is_asked(
    source: Source, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fixable, spam = escalated(source, {"id": 1, "name": "Lamp", "price": -3}, {"id": 2})

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    answers = [
        "x",  # not a choice: asked again
        "e",
        '{"id": 1, "name": "Lamp", "price": 3}',
        "d",
        "spam",
    ]
    monkeypatch.setattr("sys.stdin", Terminal("\n".join(answers) + "\n"))
    assert main(["review", path_of(source), "--reviewer", "carol"]) == 0
    assert "2 reviewed; nothing more to review" in capsys.readouterr().out
    assert state(source, fixable)[:2] == ("resolved", "reviewed")
    assert state(source, spam)[1:] == ("discarded", "spam (carol)")
    assert [r["id"] for r in sink_lines(source.sink_path)] == [1]


def test_ctrl_c_at_the_prompt_puts_the_entry_back(
    source: Source, monkeypatch: pytest.MonkeyPatch
) -> None:
    (entry,) = escalated(source, {"id": 1})

    class Interrupted(io.StringIO):
        def isatty(self) -> bool:
            return True

        # ignore: typeshed's _IOBase types readline as bytes; its own StringIO ignores it too
        def readline(self, *args: Any) -> str:  # type: ignore[override]
            raise KeyboardInterrupt

    monkeypatch.setattr("sys.stdin", Interrupted())
    monkeypatch.setattr("builtins.input", lambda prompt="": Interrupted().readline())
    assert main(["review", path_of(source)]) == 130
    with open_deadletters(source) as store:
        ((_, got),) = store.take_for_review(source.name, "dave")  # free again, not held
    assert got.id == entry.id


def test_without_a_terminal_a_decision_is_needed(
    source: Source, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (entry,) = escalated(source, {"id": 1})
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(["review", path_of(source)]) == 2
    assert "needs a terminal, or a decision" in capsys.readouterr().err
    assert state(source, entry)[0] == "review"
    with open_deadletters(source) as store:  # nothing was taken
        assert [e.id for _, e in store.take_for_review(source.name, "erin")] == [entry.id]


def test_put_back_lets_the_next_call_reach_the_next_entry(
    source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reviewer who puts an entry back is not handed it again at once (both stores)."""
    letters = escalated(source, {"id": 1}, {"id": 2}, {"id": 3})
    shown = []
    for _ in range(4):
        assert main(["review", path_of(source), "--put-back", "--json"]) == 0
        shown.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["id"])
    first, second, third = (e.id for e in letters)
    assert shown == [first, second, third, first]
    assert {state(source, e)[0] for e in letters} == {"review"}


def test_an_entry_is_picked_by_its_id(source: Source, capsys: pytest.CaptureFixture[str]) -> None:
    first, second, third = escalated(source, {"id": 1}, {"id": 2}, {"id": 3})
    path = path_of(source)
    assert main(["review", path, "--id", third.id[:8], "--discard", "dup", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["id"] == third.id
    assert state(source, third)[:2] == ("resolved", "discarded")
    assert [state(source, e)[0] for e in (first, second)] == ["review", "review"]
    # no longer waiting: one line, exit 2, nothing else touched
    assert main(["review", path, "--id", third.id, "--discard", "again"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"entry {third.id} is not waiting for review" in line and "resolved" in line, line
    assert main(["review", path, "--id", "ffffffffff", "--discard", "x"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "no dead letter with id 'ffffffffff'" in line, line
    # held by another reviewer: refused in one line, then taken over once idle
    with open_deadletters(source) as store:
        assert store.take_entry_for_review(source.name, second.id, "alice")
    assert main(["review", path, "--reviewer", "bob", "--id", second.id, "--discard", "x"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert f"entry {second.id} is held by another reviewer" in line, line
    time.sleep(0.05)
    args = ["review", path, "--reviewer", "bob", "--id", second.id, "--take-over", "--idle", "0s"]
    assert main([*args, "--discard", "alice left"]) == 0
    assert state(source, second)[2] == "alice left (bob)"
    assert state(source, first)[0] == "review"


def _interrupt_when(monkeypatch: pytest.MonkeyPatch, method: str, *, before: bool) -> None:
    """A real Ctrl-C (SIGINT to this process) right before or right after the store's
    ``method`` runs, on both stores: the moments where a signal could leave an entry held."""
    import os
    import signal

    from collector.deadletter.redis import RedisDeadLetterStore
    from collector.deadletter.sqlite import SqliteDeadLetterStore

    for cls in (SqliteDeadLetterStore, RedisDeadLetterStore):
        real = getattr(cls, method)

        def interrupted(self: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            if before:
                os.kill(os.getpid(), signal.SIGINT)
            result = _real(self, *args, **kwargs)
            if not before:
                os.kill(os.getpid(), signal.SIGINT)
            return result

        monkeypatch.setattr(cls, method, interrupted)


@pytest.mark.parametrize(
    ("method", "before", "decision"),
    [
        ("take_for_review", False, ["--discard", "x"]),  # just handed out
        ("put_back", True, ["--put-back"]),  # about to be handed back
        ("finish_review", False, ["--discard", "x"]),  # just decided
    ],
)
def test_ctrl_c_during_a_decision_leaves_the_entry_decided_or_in_review(
    source: Source, monkeypatch: pytest.MonkeyPatch, method: str, before: bool,
    decision: list[str],
) -> None:  # fmt: skip
    (entry,) = escalated(source, {"id": 1})
    _interrupt_when(monkeypatch, method, before=before)
    assert main(["review", path_of(source), "--reviewer", "carol", *decision]) == 130
    monkeypatch.undo()
    status, kind, _ = state(source, entry)
    if method == "finish_review":
        assert (status, kind) == ("resolved", "discarded")
        return
    assert status == "review"
    with open_deadletters(source) as store:  # back in the queue, not held by the gone command
        assert [e.id for _, e in store.take_for_review(source.name, "dave")] == [entry.id]
