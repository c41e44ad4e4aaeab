"""A run says what it skipped as fresh, whatever its plan: an incremental plan reads only what
is due, so the fresh items it left alone are counted apart (``fresh_uncounted``) and named in
the summary, instead of a ``fresh_skipped 0`` beside pages that were skipped."""

from __future__ import annotations

import asyncio
from pathlib import Path

from collector.demo.site import FaultSite
from collector.run.ledger import Ledger
from collector.run.summary import RunSummary
from flows.cli.running import ledger_rows
from flows.collect import collect
from tests.helpers import summary_of, write_source
from tests.test_cli_terminal import collector


def test_a_rerun_after_max_items_says_how_many_it_left_fresh(
    tmp_path: Path, site: FaultSite, prefect_api: str
) -> None:
    path = write_source(tmp_path, seeds={"template": site.url("/items/{i}.json"), "range": [0, 30]})
    # the first two runs in this process (the flow `collector run --json` prints the summary
    # of): only the third is about what the command prints, so only it pays a process's imports
    first = summary_of(asyncio.run(collect(source=str(path), max_items=10, batch_size=10)))
    assert first["stored"] == 10, first
    summary = summary_of(asyncio.run(collect(source=str(path))))
    assert summary["plan"] == "incremental", summary
    # the 20 still queued were due; the 10 stored by the first run were skipped as fresh
    assert (summary["discovered"], summary["stored"]) == (20, 20), summary
    assert (summary["fresh_skipped"], summary["fresh_uncounted"]) == (0, 10), summary
    assert summary["balanced"], summary["problems"]
    # the text summary of a run with nothing due says it too, in its table and below it
    third = collector("run", str(path), api=prefect_api, COLUMNS="200")
    assert third.returncode == 0, third.stderr[-2000:]
    out = third.stdout
    assert "incremental plan: 30 fresh not counted" in out, out
    assert "fresh:        30 items are still fresh from earlier runs and were not fetched" in out
    assert "no page is queued or past its freshness (30 still fresh)" in out, out


def test_the_fresh_row_names_what_an_incremental_plan_left_out() -> None:
    ledger = Ledger()
    ledger.planned("incremental", discovered=3358, fresh_uncounted=18)
    summary = RunSummary(source="s", run_id="r", **ledger.values())
    rows = {row[0]: row for row in ledger_rows(summary) if row}
    assert rows["fresh_skipped"] == (
        "fresh_skipped", "0", "incremental plan: 18 fresh not counted (see below)"
    )  # fmt: skip
    plain = RunSummary(source="s", run_id="r", plan="full")
    assert {row[0]: row for row in ledger_rows(plain) if row}["fresh_skipped"][2] == ""
