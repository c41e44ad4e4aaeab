"""The SQLite frontier's kept counts (``counts``) against the plain count of its rows.

:meth:`SqliteFrontier.counts` reads a table of counts that every state-changing method moves in
its own transaction; :meth:`SqliteFrontier.scan_counts` counts the rows. Random sequences of
every call that moves items (and reopenings, rolled-back and killed transactions, migrations)
must leave the two equal for every source.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.frontier.base import (
    Completed,
    DeadLettered,
    Lease,
    Offer,
    Outcome,
    RetryLater,
    StateCounts,
)
from collector.frontier.sqlite import SCHEMA_VERSION, SqliteFrontier

from .conformance import FRESH, T0, url

SOURCES = ("a", "b")
URLS = [url(i) for i in range(10)]
RUNS = ("r1", "r2")


def _rank(u: str, age_s: float | None, fresh_s: float) -> float:
    return float(URLS.index(u)) if u in URLS else 0.0


def _kept_equals_scanned(frontier: SqliteFrontier) -> None:
    for source in SOURCES:
        assert frontier.counts(source) == frontier.scan_counts(source), source


KINDS = st.sampled_from(["done", "stale-done", "retry", "dead", "dead", "skip"])
SOURCE = st.sampled_from(SOURCES)
PICKS = st.lists(st.sampled_from(URLS), max_size=8)
RUN = st.sampled_from(RUNS)
HOLDER = st.sampled_from(["", "h1", "h2"])
# one call (or two: a claim and the ack of its lease) as a tuple: its name first
STEP = st.one_of(
    st.tuples(st.just("offer"), SOURCE, PICKS, RUN, st.booleans(), st.sampled_from([5.0, 1e3])),
    st.tuples(
        st.just("claim"), SOURCE, st.integers(0, 4), st.sampled_from([3.0, 60.0]), HOLDER,
        st.none() | st.lists(KINDS, min_size=4, max_size=4),
    ),
    st.tuples(st.just("ack"), st.integers(0, 5), st.lists(KINDS, min_size=4, max_size=4)),
    st.tuples(st.sampled_from(["renew", "release"]), st.integers(0, 5)),
    st.tuples(st.just("revoke"), SOURCE, st.sampled_from(["h1", "h2"])),
    st.tuples(st.sampled_from(["requeue", "revive", "make_stale"]), SOURCE, PICKS),
    st.tuples(st.sampled_from(["sweep", "unlist"]), SOURCE, RUN, st.booleans(), PICKS),
    st.tuples(st.just("plan"), SOURCE, RUN),
    st.tuples(st.just("rolled back"), SOURCE, st.integers(0, 5)),
    st.tuples(st.just("time"), st.sampled_from([1.0, 4.0, 10.0, 70.0, 4_000.0])),
    st.tuples(st.just("reopen")),
)  # fmt: skip


class _Steps:
    """Runs the steps on one file; nothing is predicted but the counts."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.frontier = SqliteFrontier(path)
        self.now = T0
        self.leases: list[Lease] = []
        self.dead: dict[str, list[str]] = {s: [] for s in SOURCES}  # acked dead: for triage

    def ack(self, lease: Lease, kinds: list[str]) -> None:
        outcomes: list[Outcome] = []
        for item, kind in zip(lease.items, kinds, strict=False):
            if kind == "done":
                outcomes.append(Completed(item.url, self.now + FRESH, self.now))
            elif kind == "stale-done":  # done, but due again at once
                outcomes.append(Completed(item.url, self.now, self.now))
            elif kind == "retry":
                outcomes.append(RetryLater(item.url, self.now + 2, 1.0, 1, self.now, "e"))
            elif kind == "dead":
                outcomes.append(DeadLettered(item.url, 3, "gone"))
        stale = self.frontier.ack(lease, outcomes, now=self.now).stale
        self.dead[lease.source] += [
            o.url for o in outcomes if isinstance(o, DeadLettered) and o.url not in stale
        ]

    def lease(self, back: int) -> Lease | None:
        return self.leases[-1 - back] if back < len(self.leases) else None

    def step(self, name: str, *args: Any) -> None:
        f, now = self.frontier, self.now
        if name == "offer":
            source, picks, run, once, ttl = args
            offers = [Offer(u, FRESH) for u in picks]
            f.offer(source, offers, now=now, queue_ttl_s=ttl, rank_for=_rank, run_id=run,
                    once_per_run=once)  # fmt: skip
        elif name == "claim":
            source, limit, lease_s, holder, kinds = args
            lease = f.claim(source, limit, now=now, lease_s=lease_s, holder=holder)
            if lease.items:
                self.leases.append(lease)
                if kinds is not None:
                    self.ack(lease, kinds)
        elif name == "ack":
            if (earlier := self.lease(args[0])) is not None:
                self.ack(earlier, args[1])
        elif name in ("renew", "release"):
            if (earlier := self.lease(args[0])) is not None:
                if name == "renew":
                    f.renew(earlier, now=now, lease_s=30.0)
                else:
                    f.release(earlier, now=now)
        elif name == "revoke":
            source, holder = args
            f.beat(source, holder, now=now)
            f.revoke(source, holder, now=now)
        elif name in ("requeue", "revive"):
            source, picks = args
            picks = [*picks, *self.dead[source][-len(picks) :]]  # dead ones too, as triage's
            if name == "requeue":
                f.requeue(source, picks, now=now, queue_ttl_s=50.0)
            else:
                f.revive(source, [Completed(u, now + FRESH, now) for u in picks])
        elif name == "make_stale":
            f.make_stale(args[0], args[1])
        elif name == "sweep":
            f.sweep(args[0], args[1], retire=args[2])
        elif name == "unlist":
            f.unlist(args[0], args[3], args[1], retire=args[2])
        elif name == "plan":  # what an incremental plan does
            source, run = args
            f.renew_queue_ttl(source, now=now, queue_ttl_s=20.0)
            f.adopt(source, run, now=now, queue_ttl_s=20.0, rank_for=_rank,
                    fresh_for=lambda u: FRESH)  # fmt: skip
        elif name == "rolled back":  # a planner that fails part-way: nothing is left behind
            source, at = args
            new = [url(f"n{now}-{i}") for i in range(6)]

            def failing(u: str, age_s: float | None, fresh_s: float) -> float:
                if u == new[at]:
                    raise RuntimeError("the planner failed")
                return 1.0

            with pytest.raises(RuntimeError):
                f.offer(source, [Offer(u, FRESH) for u in URLS + new], now=now,
                        queue_ttl_s=1e3, rank_for=failing, run_id="r1")  # fmt: skip
        elif name == "time":
            self.now += args[0]
        else:
            f.close()
            self.frontier = SqliteFrontier(self.path)


@settings(max_examples=100, deadline=None)
@given(steps=st.lists(STEP, min_size=25, max_size=60))
def test_kept_counts_equal_the_rows_counts_after_any_sequence(
    steps: list[tuple[Any, ...]],
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        run = _Steps(Path(folder) / "f.db")
        try:
            for name, *args in steps:
                run.step(name, *args)
                _kept_equals_scanned(run.frontier)
        finally:
            run.frontier.close()


def test_a_check_that_can_fail_a_count_changed_by_hand_is_seen(tmp_path: Path) -> None:
    """The comparison above notices a wrong count; ``recount`` puts it right."""
    with SqliteFrontier(tmp_path / "f.db") as frontier:
        frontier.offer(
            "a", [Offer(u, FRESH) for u in URLS], now=T0, queue_ttl_s=1e4, rank_for=_rank,
            run_id="r1",
        )  # fmt: skip
        frontier._db.execute(f"UPDATE items SET state = 3 WHERE url = '{URLS[0]}'")
        assert frontier.counts("a") == StateCounts(queued=10)
        assert frontier.scan_counts("a") == StateCounts(queued=9, done=1)
        frontier.recount()
        assert frontier.counts("a") == StateCounts(queued=9, done=1)


def _older_file(path: Path, kind: str) -> StateCounts:
    """A file as schema 5 code leaves it: no counts table (``missing``), or the counts this
    code kept and rows moved since by code that keeps none (``stale``)."""
    with SqliteFrontier(path) as frontier:
        frontier.offer(
            "a", [Offer(u, FRESH) for u in URLS], now=T0, queue_ttl_s=1e4, rank_for=_rank,
            run_id="r1",
        )  # fmt: skip
        lease = frontier.claim("a", 4, now=T0, lease_s=60.0)
        done = [Completed(i.url, T0 + FRESH, T0) for i in lease.items[:3]]
        frontier.ack(lease, done, now=T0)
        expected = frontier.scan_counts("a")
    assert expected == StateCounts(queued=6, leased=1, done=3)
    db = sqlite3.connect(path)
    if kind == "missing":
        db.execute("DROP TABLE counts")
    else:
        db.execute("UPDATE items SET state = 5 WHERE state = 1")
        expected = StateCounts(leased=1, done=3, expired=6)
    db.execute("PRAGMA user_version = 5")
    db.commit()
    db.close()
    return expected


@pytest.mark.parametrize("kind", ["missing", "stale"])
def test_a_schema_5_file_is_counted_when_opened(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "f.db"
    expected = _older_file(path, kind)
    with SqliteFrontier(path) as frontier:
        assert frontier.counts("a") == expected == frontier.scan_counts("a")
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    check.close()


def _churn(path: str, ready: Any) -> None:
    """Offer, claim and ack in a loop until killed (in a spawned process)."""
    frontier = SqliteFrontier(path)
    now, n = T0, 0
    while True:
        urls = [url(f"k{n + i}") for i in range(300)]
        n += 300
        frontier.offer("a", [Offer(u, FRESH) for u in urls], now=now, queue_ttl_s=1e4,
                       rank_for=_rank, run_id="r1")  # fmt: skip
        lease = frontier.claim("a", 200, now=now, lease_s=60.0)
        frontier.ack(lease, [Completed(i.url, now + FRESH, now) for i in lease.items], now=now)
        ready.set()


def test_a_writer_killed_mid_way_leaves_counts_that_match_the_rows(tmp_path: Path) -> None:
    """SIGKILL between or inside transactions: the counts moved with the rows, or neither."""
    path = tmp_path / "f.db"
    SqliteFrontier(path).close()
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_churn, args=(str(path), ready))
    proc.start()
    try:
        assert ready.wait(60), "the writer did not get going"
        time.sleep(0.2)  # a few more transactions, then the kill lands wherever it lands
    finally:
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
    with SqliteFrontier(path) as frontier:
        kept = frontier.counts("a")
        assert kept.total > 0
        assert kept == frontier.scan_counts("a")
