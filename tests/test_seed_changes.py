"""A source edited while items of its old seed list are still queued (issue 10).

Real runs of the collect flow (real Prefect API, the local fault site, SQLite and Redis
frontiers): a run cut short by ``max_items``, then the URL template changes, then a rerun. The
rerun must succeed, balance, and account for every item the old list left queued: retired by
default, or collected once more with ``seeds.on_removed: collect``. The sink ends with every
expected record exactly once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from collector.backends import open_frontier
from collector.config import load_source
from collector.demo.site import FaultSite
from collector.frontier.base import StateCounts
from flows.collect import collect
from tests.helpers import duplicate_keys, sink_lines, summary_of, write_source

pytestmark = pytest.mark.usefixtures("prefect_api")

OLD, NEW = 60, 30  # the old list: items 0..59; the new list: items 100..129, another URL form


@pytest.fixture(params=["sqlite", "redis"])
def frontier(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The source's ``frontier`` section: the embedded SQLite default, or a real Redis."""
    if request.param == "redis":
        return {"frontier": {"type": "redis", "url": request.getfixturevalue("redis_url")}}
    return {}


def _source(
    folder: Path, site: FaultSite, frontier: dict[str, Any], template: str, first: int, **seeds: Any
) -> Path:
    """Write (or rewrite) the source: ``template`` over ``first .. first + count``."""
    count = OLD if first == 0 else NEW
    return write_source(
        folder,
        seeds={"template": site.base_url + template, "range": [first, first + count], **seeds},
        limits={"concurrency": 8, "per_domain_concurrency": 8, "per_domain_rate": "1000/second"},
        state_dir=".collector",
        **frontier,
    )


def _ids(folder: Path) -> list[int]:
    return sorted(int(row["id"]) for row in sink_lines(folder / "out"))


async def _cut_short_then_edit(
    tmp_path: Path, site: FaultSite, frontier: dict[str, Any], **seeds: Any
) -> tuple[list[int], int, dict[str, Any]]:
    """Run 1 stops after 20 items; the template changes; run 2. Returns the ids run 1 stored,
    how many requests the site had seen before run 2, and run 2's summary."""
    path = _source(tmp_path, site, frontier, "/items/{i}.json", 0, **seeds)
    first = summary_of(await collect(source=str(path), batch_size=10, max_items=20))
    assert first["balanced"] and first["stored"] == 20 and first["queued"] == OLD - 20
    stored_first = _ids(tmp_path)
    assert len(stored_first) == 20
    _source(tmp_path, site, frontier, "/items/{i}.json?v=2", 100, **seeds)  # template edited
    before = len(site.requests)
    return stored_first, before, summary_of(await collect(source=str(path), batch_size=10))


async def test_removed_items_are_retired_by_default(
    tmp_path: Path, site: FaultSite, frontier: dict[str, Any]
) -> None:
    stored_first, before, second = await _cut_short_then_edit(tmp_path, site, frontier)
    assert second["balanced"], second["problems"]
    assert second["plan"] == "full"
    assert second["discovered"] == NEW and second["stored"] == NEW
    assert second["retired"] == OLD - 20 and second["carried_over"] == 0
    assert second["queued"] == 0
    assert _ids(tmp_path) == stored_first + list(range(100, 100 + NEW))
    assert duplicate_keys(sink_lines(tmp_path / "out")) == []
    # run 2 asked the site for the new URLs only, each once
    paths = sorted(r.path for r in site.requests[before:] if r.path != "/robots.txt")
    assert paths == sorted(f"/items/{i}.json?v=2" for i in range(100, 100 + NEW))
    # the frontier agrees: the retired items are there, in their own state, never fetched
    source = load_source(tmp_path / "source.yaml")
    store = open_frontier(source)
    try:
        assert store.counts(source.name) == StateCounts(done=20 + NEW, retired=OLD - 20)
    finally:
        store.close()

    # an unchanged rerun has nothing due, and the retired items stay retired
    third = summary_of(await collect(source=str(tmp_path / "source.yaml"), batch_size=10))
    assert third["balanced"] and third["plan"] == "incremental"
    assert (third["discovered"], third["stored"], third["retired"]) == (0, 0, 0)


async def test_removed_items_are_collected_with_on_removed_collect(
    tmp_path: Path, site: FaultSite, frontier: dict[str, Any]
) -> None:
    _, _, second = await _cut_short_then_edit(tmp_path, site, frontier, on_removed="collect")
    assert second["balanced"], second["problems"]
    assert second["discovered"] == NEW and second["carried_over"] == OLD - 20
    assert second["stored"] == NEW + OLD - 20 and second["retired"] == 0
    assert _ids(tmp_path) == list(range(OLD)) + list(range(100, 100 + NEW))
    assert duplicate_keys(sink_lines(tmp_path / "out")) == []
    # once collected, an unlisted item is not planned again when its freshness runs out
    third = summary_of(await collect(source=str(tmp_path / "source.yaml"), batch_size=10))
    assert third["balanced"] and third["discovered"] == 0


async def test_listing_a_retired_url_again_queues_it(
    tmp_path: Path, site: FaultSite, frontier: dict[str, Any]
) -> None:
    await _cut_short_then_edit(tmp_path, site, frontier)
    path = _source(tmp_path, site, frontier, "/items/{i}.json", 0)  # back to the old template
    third = summary_of(await collect(source=str(path), batch_size=10))
    assert third["balanced"], third["problems"]
    assert third["plan"] == "full" and third["discovered"] == OLD
    assert third["fresh_skipped"] == 20 and third["stored"] == OLD - 20
    assert third["retired"] == 0  # the v=2 items are done, not queued: nothing to retire
    assert _ids(tmp_path) == list(range(OLD)) + list(range(100, 100 + NEW))


async def test_leftovers_past_their_queue_ttl_are_asked_for_again_not_expired(
    tmp_path: Path, site: FaultSite, frontier: dict[str, Any]
) -> None:
    """A run stopped by max_items leaves items queued; the next run comes after their queue TTL
    (a daily schedule, a 6 h TTL). Its plan asks for them again: fetched, none expired."""
    path = write_source(
        tmp_path,
        seeds={"template": site.base_url + "/items/{i}.json", "range": [0, 30]},
        limits={"concurrency": 8, "per_domain_concurrency": 8, "per_domain_rate": "1000/second"},
        ttl={"queue_ttl_s": 3, "batch_timeout_s": 2, "request_deadline_s": 1, "http_timeout_s": 1},
        state_dir=".collector",
        **frontier,
    )
    first = summary_of(await collect(source=str(path), batch_size=10, max_items=10))
    assert (first["stored"], first["queued"]) == (10, 20)
    await asyncio.sleep(3.5)  # the leftovers' queue TTL runs out before the next run
    second = summary_of(await collect(source=str(path), batch_size=10))
    assert second["balanced"], second["problems"]
    assert (second["renewed"], second["expired"], second["stored"]) == (20, 0, 20)
    assert duplicate_keys(sink_lines(tmp_path / "out")) == []
