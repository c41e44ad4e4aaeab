"""`collector audit` after real collect flow runs: a suite that gained a table-level expectation
finds exactly one written batch bad, and exactly that batch is undone and recorded, once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from collector.config import load_source
from collector.demo.site import FaultSite, record
from collector.run.ledger import LedgerBook
from flows.cli import main
from flows.collect import collect
from tests.helpers import sink_lines, summary_of, write_source

pytestmark = [pytest.mark.usefixtures("prefect_api"), pytest.mark.slow]

TERMINAL = ("discovered", "stored", "fresh_skipped", "expired", "dead_lettered", "queued")
NOT_NULL = {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "name"}}
# Item prices are 1 + (i * 37 % 1000) / 10: items 0..7 cost at most 26.9, item 8 costs 30.6.
PRICE_MAX_30 = {
    "type": "expect_column_max_to_be_between",
    "kwargs": {"column": "price", "max_value": 30},
}


def write_suite(folder: Path, *expectations: dict[str, Any]) -> None:
    suite = {"name": "items", "expectations": list(expectations)}
    (folder / "suite.json").write_text(json.dumps(suite), encoding="utf-8")


async def test_audit_compensates_exactly_the_batch_the_new_suite_rejects(
    tmp_path: Path, site: FaultSite, capsys: pytest.CaptureFixture[str]
) -> None:
    assert [record(i)["price"] > 30 for i in range(9)] == [False] * 8 + [True]
    write_suite(tmp_path, NOT_NULL)
    path = write_source(
        tmp_path,
        seeds={"template": site.url("/items/{i}.json"), "range": [0, 9]},
        validation={"suite": "suite.json"},
    )
    summary = summary_of(await collect(source=str(path), batch_size=3))
    assert summary["stored"] == 9 and summary["balanced"] is True
    before = {row["id"]: row for row in sink_lines(tmp_path / "out")}
    batch_of = {i: row["_collector"]["batch"] for i, row in before.items()}
    assert len(set(batch_of.values())) == 3  # three batches of three
    bad = batch_of[8]
    doomed = {i for i, batch in batch_of.items() if batch == bad}
    assert len(doomed) == 3

    write_suite(tmp_path, NOT_NULL, PRICE_MAX_30)  # the suite gains a table-level expectation
    assert main(["audit", str(path), "--dry-run"]) == 1  # found, not removed
    assert len(sink_lines(tmp_path / "out")) == 9
    capsys.readouterr()

    assert main(["audit", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (report["audited"], report["failed"], report["removed"]) == (3, 1, 3)
    (failing,) = [b for b in report["batches"] if b["failed"]]
    assert failing["batch_id"] == bad
    assert [f["expectation"] for f in failing["failed"]] == ["expect_column_max_to_be_between"]

    after = {row["id"]: row for row in sink_lines(tmp_path / "out")}
    assert set(after) == set(range(9)) - doomed
    assert all(after[i] == before[i] for i in after)  # the others untouched, byte for byte
    source = load_source(path)
    (entry,) = LedgerBook(source.ledger_path).compensations(source.name)
    assert (entry.batch_id, entry.removed) == (bad, 3)
    assert "expect_column_max_to_be_between" in entry.reason

    assert main(["audit", str(path), "--json"]) == 0  # twice: nothing more to do
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (second["audited"], second["failed"], second["removed"]) == (2, 0, 0)
    assert len(LedgerBook(source.ledger_path).compensations(source.name)) == 1
    assert main(["audit", str(path), "--batch", bad]) == 1
    assert "already compensated" in capsys.readouterr().err
    assert set(r["id"] for r in sink_lines(tmp_path / "out")) == set(range(9)) - doomed

    # The pages of the removed records lost their freshness: the next run fetches exactly them
    # again, and its suite (now with the new expectation) decides again before writing.
    site.reset()
    rerun = summary_of(await collect(source=str(path), batch_size=3))
    # An incremental plan (the seed list is unchanged): only the 3 stale pages are due.
    assert {k: rerun[k] for k in TERMINAL} == {
        "discovered": 3, "stored": 0, "fresh_skipped": 0,
        "expired": 0, "dead_lettered": 3, "queued": 0,
    }  # fmt: skip
    assert (rerun["records_quarantined"], rerun["balanced"]) == (3, True)
    assert sorted(site.request_count(f"/items/{i}.json") for i in range(9)) == [0] * 6 + [1] * 3
    assert all(site.request_count(f"/items/{i}.json") == 1 for i in doomed)
    assert set(r["id"] for r in sink_lines(tmp_path / "out")) == set(range(9)) - doomed
