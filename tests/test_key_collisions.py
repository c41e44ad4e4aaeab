"""Records of one run that share a key: the sink keeps one per key, the run counts the rest.

Two listing pages of the local fault site that overlap (``/items?start=0&count=10`` and
``start=5``) yield five records with the same keys. The sink's idempotent upsert is unchanged
(one record per key, a rerun writes nothing); what changes is that the run says so: the summary
counts ``key_collisions`` and one warning line names a key and both pages. A whole Collection on
SQLite + JSONL, drained without Prefect, read back from the sink.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from collector.config import load_source
from collector.demo.site import FaultSite
from collector.run import collection as collection_module
from collector.run.collection import Collection
from collector.run.summary import RunSummary
from tests.helpers import drain_in_process, duplicate_keys, sink_lines, write_source


def _run(path: Path, run_id: str, batch_size: int) -> RunSummary:
    async def go() -> RunSummary:
        with Collection(load_source(path), run_id=run_id) as run:
            run.plan()
            await drain_in_process(run, batch_size=batch_size)
            run.finish()
            return run.summary()

    return asyncio.run(go())


@pytest.mark.parametrize("batch_size", [1, 10], ids=["pages-in-batches-of-their-own", "one-batch"])
def test_overlapping_pages_are_counted_as_key_collisions_and_named_once(
    tmp_path: Path, site: FaultSite, caplog: pytest.LogCaptureFixture, batch_size: int
) -> None:
    first, overlapping = site.url("/items?start=0&count=10"), site.url("/items?start=5&count=10")
    path = write_source(
        tmp_path,
        seeds={"urls": [first, overlapping, site.url("/items?start=20&count=3")]},
        record={"key": "id", "records_path": "items"},
        ttl={"default_fresh_s": 0},  # every page is due again at the next run
    )
    with caplog.at_level(logging.WARNING, logger="collector.run.collection"):
        summary = _run(path, "run-1", batch_size)
    assert summary.balanced and summary.stored == 3
    assert summary.key_collisions == 5  # ids 5..9, listed by both pages
    assert summary.records_written == 18 and summary.records_in_sink == 18
    key, pages = summary.key_collision["key"], summary.key_collision
    assert key in {str(i) for i in range(5, 10)}
    assert {pages["first_url"], pages["later_url"]} == {first, overlapping}
    warnings = [r.getMessage() for r in caplog.records if "same key" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert (
        f"5 records replaced an earlier record of this run with the same key (e.g. key "
        f"'{key}' from {pages['first_url']}, then from {pages['later_url']})" in warnings[0]
    )

    # The sink is as idempotent as before: one record per key, and a rerun writes nothing. The
    # count is per run: the rerun's pages overlap again, counted again.
    rows = sink_lines(tmp_path / "out")
    assert duplicate_keys(rows) == [] and len(rows) == 18
    again = _run(path, "run-2", batch_size)
    assert (again.records_written, again.records_unchanged) == (0, 23)
    assert again.key_collisions == 5
    assert len(sink_lines(tmp_path / "out")) == 18


def test_a_run_without_shared_keys_counts_none(tmp_path: Path, site: FaultSite) -> None:
    urls = [site.url("/items?start=0&count=5"), site.url("/items?start=5&count=5")]
    path = write_source(
        tmp_path, seeds={"urls": urls}, record={"key": "id", "records_path": "items"}
    )
    summary = _run(path, "run-1", 1)
    assert (summary.key_collisions, summary.key_collision) == (0, {})
    assert summary.records_in_sink == 10


def test_a_run_remembers_a_bounded_number_of_keys_and_says_so(
    tmp_path: Path,
    site: FaultSite,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Memory stays bounded for runs of millions of records: past KEYS_REMEMBERED distinct
    keys, new keys are checked against the remembered ones but not kept, and the warning says
    the count is against those."""
    monkeypatch.setattr(collection_module, "KEYS_REMEMBERED", 10)
    first, overlapping = site.url("/items?start=0&count=10"), site.url("/items?start=5&count=10")
    later = site.url("/items?start=40&count=5")
    path = write_source(
        tmp_path,
        seeds={"urls": [first, overlapping, later, site.url("/items?start=40&count=5&again=1")]},
        record={"key": "id", "records_path": "items"},
    )
    with caplog.at_level(logging.WARNING, logger="collector.run.collection"):
        summary = _run(path, "run-1", 1)
    assert summary.balanced
    # the first page's 10 keys are remembered: the overlap (5) counts; keys 40-44 came after
    # the memory was full, so their second page is not counted
    assert summary.key_collisions == 5
    (line,) = [r.getMessage() for r in caplog.records if "records replaced" in r.getMessage()]
    assert "counted against the first 10 keys of the run" in line
