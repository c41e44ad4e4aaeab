"""Compensation with replacement records: only what passes the suite is written, the rest waits
for a person; interrupted anywhere and run again, nothing is undone twice and nothing is lost.
Then the ``compensate`` and ``audit`` flows themselves: the commands run them, named and tagged
by source and role, with their reports as artifacts."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from collector.config import Source, load_source
from collector.deadletter.archive import JsonlArchive
from collector.deadletter.sqlite import SqliteDeadLetterStore
from collector.errors import ConfigError
from collector.frontier.sqlite import SqliteFrontier
from collector.recovery.compensation import CompensationReport, compensate_batch
from collector.recovery.triage import tally
from collector.run.ledger import Compensation, LedgerBook
from collector.settle.validation import SuiteValidator
from collector.sinks.base import SinkRecord
from collector.sinks.jsonl import JsonlSink
from flows.cli import main
from tests.helpers import sink_lines, write_source

PRICE_BELOW_50 = {
    "type": "expect_column_values_to_be_between",
    "kwargs": {"column": "price", "min_value": 0, "max_value": 50},
}
FIXED = [{"id": "b", "price": 20.0}, {"id": "c", "price": 999.0}]  # b passes, c fails


class Killed(Exception):
    """The process dying at that point (nothing after it runs)."""


@pytest.fixture
def source(tmp_path: Path) -> Source:
    suite = {"name": "s", "expectations": [PRICE_BELOW_50]}
    (tmp_path / "suite.json").write_text(json.dumps(suite), encoding="utf-8")
    path = write_source(
        tmp_path, seeds={"urls": ["http://h.example/0"]}, validation={"suite": "suite.json"}
    )
    loaded = load_source(path)
    sink = JsonlSink(loaded.sink_path, source=loaded.name)
    try:  # r:1 holds a, b, c (b and c with bad prices); r:2 holds d
        sink.write([SinkRecord(k, {"id": k, "price": p}, f"http://h.example/{k}")
                    for k, p in (("a", 1.0), ("b", 200.0), ("c", 300.0))],
                   token=1, batch_id="r:1")  # fmt: skip
        sink.write([SinkRecord("d", {"id": "d", "price": 4.0}, "http://h.example/d")],
                   token=2, batch_id="r:2")  # fmt: skip
    finally:
        sink.close()
    return loaded


def run(
    source: Source,
    *,
    sink: JsonlSink | None = None,
    book: LedgerBook | None = None,
    replacements: list[Any] = FIXED,
    dry_run: bool = False,
) -> CompensationReport:
    """One compensation of r:1 over the source's real stores (a sink or ledger given may die)."""
    sink = sink or JsonlSink(source.sink_path, source=source.name)
    store = SqliteDeadLetterStore(source.deadletter_path, archive=source.deadletter_archive_path)
    frontier = SqliteFrontier(source.frontier_path)
    assert source.suite_path is not None
    try:
        return compensate_batch(
            source,
            sink=sink,
            book=book or LedgerBook(source.ledger_path),
            deadletters=store,
            frontier=frontier,
            validator=SuiteValidator(source.suite_path),
            batch_id="r:1",
            reason="bad prices",
            by="alice",
            run_id="run-1",
            replacements=replacements,
            dry_run=dry_run,
        )
    finally:
        for closing in (sink.close, store.close, frontier.close):
            closing()


def stored(source: Source) -> dict[str, tuple[float, str]]:
    """key -> (price, batch) as the sink's files hold them."""
    return {r["id"]: (r["price"], r["_collector"]["batch"]) for r in sink_lines(source.sink_path)}


def in_review(source: Source) -> list[dict[str, Any]]:
    store = SqliteDeadLetterStore(source.deadletter_path, archive=source.deadletter_archive_path)
    try:
        entries = store.list(source=source.name, status="review")
        balance = tally(store, source.name, JsonlArchive(source.deadletter_archive_path))
        assert balance.balanced, balance.difference()
        return [
            {"key": e.record_key, "url": e.url, "payload": e.payload, "class": e.error_class,
             "failed": [f["expectation"] for f in e.failed_expectations], "message": e.message}
            for e in entries
        ]  # fmt: skip
    finally:
        store.close()


AFTER = {"b": (20.0, "compensate:r:1"), "d": (4.0, "r:2")}  # a and c removed, b replaced


def test_replacements_passing_the_suite_are_written_and_failing_ones_go_to_review(
    source: Source,
) -> None:
    dry = run(source, dry_run=True)
    assert (dry.written, [r.key for r in dry.review], dry.removed) == (["b"], ["c"], 2)
    assert stored(source)["b"] == (200.0, "r:1") and in_review(source) == []  # nothing changed

    report = run(source)

    assert (report.status, report.held, report.written, report.removed) == (
        "compensated", 3, ["b"], 2)  # fmt: skip
    assert stored(source) == AFTER  # c's replacement never reached the sink
    (entry,) = in_review(source)
    assert (entry["key"], entry["url"], entry["class"]) == ("c", "http://h.example/c", "schema")
    assert entry["payload"] == {"id": "c", "price": 999.0}
    assert entry["failed"] == ["expect_column_values_to_be_between"]
    assert "999" in entry["message"]  # GX's words for what failed
    (line,) = LedgerBook(source.ledger_path).compensations(source.name)
    assert (line.batch_id, line.removed, line.by) == ("r:1", 2, "alice")
    assert line.reason.startswith("bad prices (replacements: 1 written to compensate:r:1")

    again = run(source)
    assert (again.status, again.earlier) == ("already", line.reason)
    assert stored(source) == AFTER and len(in_review(source)) == 1


def test_a_table_level_failure_sends_every_replacement_to_review(source: Source) -> None:
    suite = {"name": "s", "expectations": [PRICE_BELOW_50, {
        "type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 3}}]}  # fmt: skip
    assert source.suite_path is not None
    source.suite_path.write_text(json.dumps(suite), encoding="utf-8")
    report = run(source, replacements=[{"id": "b", "price": 20.0}])
    assert (report.written, [r.key for r in report.review], report.removed) == ([], ["b"], 3)
    assert stored(source) == {"d": (4.0, "r:2")}
    (entry,) = in_review(source)
    assert entry["class"] == "table_expectation"


@pytest.mark.parametrize(
    "bad",
    [[{"id": "z", "price": 1.0}], [{"price": 1.0}], [FIXED[0], FIXED[0]], ["not a record"]],
    ids=["key-not-in-batch", "no-key", "key-twice", "not-an-object"],
)
def test_a_replacement_naming_no_record_of_the_batch_changes_nothing(
    source: Source, bad: list[Any]
) -> None:
    before = stored(source)
    with pytest.raises(ConfigError, match=r"replacement [12]:"):
        run(source, replacements=bad)
    assert stored(source) == before and in_review(source) == []
    assert LedgerBook(source.ledger_path).compensations() == []


class DiesOnce(JsonlSink):
    """A real JSONL sink whose process dies at ``step`` (``write`` or ``remove_batch``)."""

    def __init__(self, source: Source, step: str) -> None:
        super().__init__(source.sink_path, source=source.name)
        self.step = step

    def write(self, records: Any, *, token: int, batch_id: str) -> Any:
        if self.step == "write":
            raise Killed
        return super().write(records, token=token, batch_id=batch_id)

    def remove_batch(self, batch_id: str) -> int:
        if self.step == "remove_batch":
            raise Killed
        return super().remove_batch(batch_id)


class ForgetsTheLine(LedgerBook):
    """A ledger whose process dies as the line is about to be written."""

    def record(self, entry: Compensation) -> None:
        raise Killed


@pytest.mark.parametrize("step", ["write", "remove_batch", "ledger"])
def test_an_interrupted_compensation_run_again_ends_as_if_never_interrupted(
    source: Source, step: str
) -> None:
    with pytest.raises(Killed):
        if step == "ledger":
            run(source, book=ForgetsTheLine(source.ledger_path))
        else:
            run(source, sink=DiesOnce(source, step))
    assert len(in_review(source)) == 1  # the failing replacement is safe before anything else

    rerun = run(source)

    assert rerun.status == "compensated"
    assert stored(source) == AFTER  # nothing lost, nothing left of r:1
    (entry,) = in_review(source)  # one entry, escalated once
    assert entry["key"] == "c"
    (line,) = LedgerBook(source.ledger_path).compensations(source.name)  # recorded once
    # the line, written before the removal, says what went; b is new unless written already
    expected = {"write": (["b"], []), "remove_batch": ([], ["b"]), "ledger": ([], ["b"])}
    assert (rerun.written, rerun.unchanged) == expected[step]
    assert (rerun.removed, line.removed) == (2, 2)
    assert run(source).status == "already"  # and a third run changes nothing
    assert stored(source) == AFTER and len(in_review(source)) == 1


# --- the flows, run by the commands ------------------------------------------------------------
async def _runs_and_artifacts(flow_name: str, tag: str) -> tuple[list[Any], list[Any]]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterTags,
    )

    async with get_client() as client:
        runs = await client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])),
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[tag])),
        )
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[r.id for r in runs])
            )
        )
    return runs, artifacts


@pytest.mark.usefixtures("prefect_api")
async def test_collector_compensate_and_audit_run_named_tagged_flows_with_artifacts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = {"name": "s", "expectations": [PRICE_BELOW_50]}
    (tmp_path / "suite.json").write_text(json.dumps(suite), encoding="utf-8")
    name = f"comp-{tmp_path.name[-20:]}".lower().replace("_", "-")
    path = write_source(tmp_path, name=name, seeds={"urls": ["http://h.example/0"]},
                        validation={"suite": "suite.json"})  # fmt: skip
    loaded = load_source(path)
    sink = JsonlSink(loaded.sink_path, source=loaded.name)
    try:
        sink.write([SinkRecord(k, {"id": k, "price": p}, f"http://h.example/{k}")
                    for k, p in (("a", 1.0), ("b", 200.0), ("c", 300.0))],
                   token=1, batch_id="r:1")  # fmt: skip
    finally:
        sink.close()
    fixed = tmp_path / "fixed.jsonl"
    fixed.write_text("\n".join(json.dumps(r) for r in FIXED) + "\n", encoding="utf-8")

    code = await _in_thread(lambda: main(
        ["compensate", str(path), "--batch", "r:1", "--reason", "bad prices",
         "--replace", str(fixed)]))  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"compensated batch r:1: 2 records removed from {loaded.sink_path}" in out
    assert (
        "replacements: wrote 1 to batch compensate:r:1; 1 failing the suite sent to review" in out
    )
    assert f"collector review {path}" in out
    runs, artifacts = await _runs_and_artifacts("compensate", f"source:{name}")
    (run_,) = runs
    assert run_.name == f"compensate-{name}-r:1" and run_.state_name == "Completed"
    assert {"collector", "compensate", f"source:{name}"} <= set(run_.tags)
    keys = {a.key: a for a in artifacts}
    report = keys[f"collector-{name}-compensate"].data
    assert "records the batch held: 3" in report and "sent to review: 1" in report
    rows = keys[f"collector-{name}-compensate-records"].data
    rows = json.loads(rows) if isinstance(rows, str) else rows
    assert [(r["key"], r["outcome"]) for r in rows] == [("b", "written"), ("c", "review")]

    assert await _in_thread(lambda: main(["audit", str(path)])) == 0
    assert f"audit of {name}: 1 batch checked" in capsys.readouterr().out
    runs, artifacts = await _runs_and_artifacts("audit", f"source:{name}")
    (run_,) = runs
    assert run_.name == f"audit-{name}" and {"audit", f"source:{name}"} <= set(run_.tags)
    assert {a.key for a in artifacts} == {f"collector-{name}-audit",
                                          f"collector-{name}-audit-batches"}  # fmt: skip


async def _in_thread(call: Callable[[], int]) -> int:
    """A command (it runs its own event loop) from this async test."""
    import asyncio

    return await asyncio.to_thread(call)


@pytest.mark.parametrize(
    ("name", "parameters"),
    [("compensate", {"source", "batch", "reason", "replacements", "dry_run", "by"}),
     ("audit", {"source", "batches", "dry_run", "by"})],
)  # fmt: skip
def test_the_recovery_flows_are_deployed_from_prefect_yaml(name: str, parameters: set[str]) -> None:
    """Each has a deployment a UI form can start: its flow loads from the entrypoint, with the
    parameters the form shows (the deploy end-to-end test deploys every entry for real)."""
    import yaml
    from prefect.flows import load_flow_from_entrypoint
    from prefect.utilities.callables import parameter_schema

    root = Path(__file__).resolve().parents[1]
    shipped = yaml.safe_load((root / "deployments/prefect.yaml").read_text(encoding="utf-8"))
    (entry,) = [d for d in shipped["deployments"] if d["name"] == name]
    assert name in entry["tags"] and not entry.get("triggers")
    flow: Any = load_flow_from_entrypoint(str(root / entry["entrypoint"]))
    assert flow.name == name
    assert set(parameter_schema(flow.fn).properties) == parameters
