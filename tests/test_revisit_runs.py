"""Whole runs (no Prefect) against a local site whose pages change or not: each settled page's
history is kept (a 304 and an unchanged record are "not changed"), ``ttl.revisit: adaptive``
puts its next due time within the bounds from the budget, the ledger balances, and switching
back to fixed keeps the history and the rules' TTL."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path

import pytest

from collector.backends import open_frontier
from collector.config import load_source
from collector.run.collection import Collection
from collector.run.summary import RunSummary
from tests.change_site import ChangeSite
from tests.helpers import drain_in_process, write_source

HOUR = 3_600.0
GAP = 5 * HOUR  # between runs: longer than max_fresh_s, so every page is due at each


async def _run(path: Path, run_id: str, offset_s: float) -> RunSummary:
    with Collection(load_source(path), run_id=run_id, clock=lambda: time.time() + offset_s) as run:
        run.plan()
        await drain_in_process(run, batch_size=5)
        run.finish()
        return run.summary()


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_histories_are_kept_and_adaptive_intervals_stay_in_bounds(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """The same runs on either frontier; the intervals are read from SQLite's file."""
    store = (
        {"type": "redis", "url": request.getfixturevalue("redis_url")} if backend == "redis" else {}
    )
    with ChangeSite() as site:
        kinds = {f"fast{i}": "strong" for i in range(4)}
        kinds |= {f"still{i}": "strong" for i in range(4)}  # answered 304
        kinds |= {f"plain{i}": "none" for i in range(4)}  # no validators: records unchanged
        for n, (name, mode) in enumerate(kinds.items()):
            site.set(name, json.dumps({"id": n, "v": 0}).encode(), mode)
        ttl = {
            "default_fresh_s": HOUR,
            "revisit": "adaptive",
            "budget_per_hour": 4,
            "min_fresh_s": 600,
            "max_fresh_s": 4 * HOUR,
        }
        urls = [site.url(name) for name in kinds]
        path = write_source(tmp_path, name="learn", seeds={"urls": urls}, ttl=ttl, frontier=store)
        runs = 4
        for r in range(runs):
            if r:
                for n, name in enumerate(kinds):
                    if name.startswith("fast"):
                        site.set(name, json.dumps({"id": n, "v": r}).encode())
            summary = asyncio.run(_run(path, f"r{r}", r * GAP))
            assert summary.balanced, summary.problems
            assert summary.discovered == 12, summary
            if r:
                assert (summary.stored, summary.not_modified) == (8, 4), summary
                assert (summary.records_written, summary.records_unchanged) == (4, 4), summary
        with open_frontier(load_source(path)) as opened:
            histories = dict(opened.histories("learn"))
        assert len(histories) == 12
        for name in kinds:
            h = histories[site.url(name)]
            assert (h.fetches, h.observed) == (runs, runs - 1), (name, h)
            want = runs - 1 if name.startswith("fast") else 0
            assert h.changes == want, (name, h)
            assert h.rate > 0
        fast = histories[site.url("fast0")].rate
        assert all(histories[site.url(f"still{i}")].rate < fast for i in range(4))
        sqlite = backend == "sqlite"  # fresh_until is not in the protocol: read from its file
        if sqlite:
            intervals = _intervals(path)
            assert all(600 - 1 <= i <= 4 * HOUR + 1 for i in intervals.values()), intervals
            assert len({round(i) for i in intervals.values()}) > 1, intervals  # learned

        # back to the fixed rules: the history goes on, the TTL is the rule's again
        fixed = write_source(
            tmp_path,
            name="learn",
            seeds={"urls": urls},
            ttl={"default_fresh_s": HOUR},
            frontier=store,
        )
        summary = asyncio.run(_run(fixed, "fixed", runs * GAP))
        assert summary.balanced and summary.discovered == 12, summary
        with open_frontier(load_source(fixed)) as opened:
            after = dict(opened.histories("learn"))
        assert {h.fetches for h in after.values()} == {runs + 1}
        assert {h.observed for h in after.values()} == {runs}
        if sqlite:
            assert set(_intervals(fixed).values()) == {HOUR}


def _intervals(path: Path) -> dict[str, float]:
    """Each page's freshness after its last fetch: fresh_until - last_fetched_at."""
    source = load_source(path)
    with sqlite3.connect(source.frontier_path) as db:
        rows = db.execute("SELECT url, fresh_until, last_fetched_at FROM items").fetchall()
    return {url: until - fetched for url, until, fetched in rows}
