"""bench/ttl_study.py's pile-up: the study on the real frontier and engine against a plain model.

The model is the seeds' definition by hand: items become due one TTL after their fetch, each
tick fetches at most its allowance of the due ones, and a tick's pile-up is the due work still
queued when the next tick comes. The bench counts it from the frontier's queue instead.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.ttl_study import T0, pile_up, seeds, study
from collector.demo.site import FaultSite
from collector.frontier.base import Frontier
from collector.frontier.redis import RedisFrontier
from collector.frontier.sqlite import SqliteFrontier


def model(n: int, per_tick: int, ttl: float, tick: float, minutes: float) -> list[tuple[int, int]]:
    """(due, left) per tick after the first TTL, for ``n`` pages that never fail."""
    due_at = [T0] * n
    ticks = []
    now = T0
    while now < T0 + minutes * 60:
        due = [i for i in range(n) if due_at[i] <= now]
        for i in due[:per_tick]:
            due_at[i] = now + ttl
        if now >= T0 + ttl:
            ticks.append((len(due), len(due) - min(per_tick, len(due))))
        now += tick
    return ticks


@pytest.fixture(scope="module")
def fault_site() -> Iterator[FaultSite]:
    with FaultSite() as running:
        yield running


def run(frontier: Frontier, urls: list[str], per_tick: int, ttl: float) -> list[tuple[int, int]]:
    row = asyncio.run(
        study(frontier, urls, ttl=ttl, capacity=per_tick / 10.0, minutes=3.0, tick=10.0)
    )
    ticks: list[tuple[int, int]] = row["ticks"]
    assert row["pile_up"] == round(pile_up(ticks), 4)
    return ticks


def test_pile_up_is_the_left_work_over_the_due_work() -> None:
    assert pile_up([(6, 4), (4, 2), (4, 2)]) == pytest.approx(8 / 14)
    assert pile_up([]) == 0.0
    assert pile_up([(0, 0), (3, 0)]) == 0.0


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(1, 7),  # up to 7: no page of the fault site's 503-once kind
    per_tick=st.integers(1, 4),
    ttl_ticks=st.integers(1, 5),
)
def test_the_study_s_pile_up_is_the_plain_model_s(
    fault_site: FaultSite, n: int, per_tick: int, ttl_ticks: int
) -> None:
    urls = seeds(fault_site, n)
    ttl = 10.0 * ttl_ticks
    with tempfile.TemporaryDirectory() as folder:
        frontier = SqliteFrontier(Path(folder) / "f.db")
        try:
            assert run(frontier, urls, per_tick, ttl) == model(n, per_tick, ttl, 10.0, 3.0)
        finally:
            frontier.close()


def test_the_redis_frontier_piles_up_as_the_model(fault_site: FaultSite, redis_url: str) -> None:
    urls = seeds(fault_site, 7)
    frontier = RedisFrontier(redis_url, prefix="ttl-test")
    try:
        ticks = run(frontier, urls, 2, 30.0)
    finally:
        frontier.close()
    assert ticks == model(7, 2, 30.0, 10.0, 3.0)
    assert pile_up(ticks) > 0  # TTL 30 asks 7 pages per 3 ticks of 2: one waits
