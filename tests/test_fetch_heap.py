"""Engines keep the start-up heap out of the cyclic collector while they fetch
(collector.fetch.heap): frozen when the first opens, given back when the last closes, and no
garbage is lost to it."""

from __future__ import annotations

import gc
import weakref

from collector.fetch import heap
from collector.fetch.engine import FetchEngine
from collector.policy.retry import RetrySettings
from collector.policy.urls import HostPolicy


def _engine() -> FetchEngine:
    return FetchEngine(retry=RetrySettings(), host_policy=HostPolicy(allow_private_networks=True))


class _Cycle:
    def __init__(self) -> None:
        self.me = self


async def test_the_heap_is_frozen_while_any_engine_is_open() -> None:
    before = heap.open_engines()  # 0 unless an earlier test left one open
    async with _engine():
        assert heap.open_engines() == before + 1 and gc.get_freeze_count() > 0
        async with _engine():  # a second engine of the process: one freeze between them
            assert heap.open_engines() == before + 2
        assert heap.open_engines() == before + 1 and gc.get_freeze_count() > 0
    assert heap.open_engines() == before
    if before == 0:
        assert gc.get_freeze_count() == 0


async def test_an_engine_that_fails_inside_still_gives_the_heap_back() -> None:
    before = heap.open_engines()
    try:
        async with _engine():
            raise RuntimeError("a run that failed")
    except RuntimeError:
        pass
    assert heap.open_engines() == before


async def test_garbage_from_before_the_engine_is_collected_once_it_closes() -> None:
    cycle = _Cycle()
    gone = weakref.ref(cycle)
    del cycle  # a cycle: only the cyclic collector frees it
    async with _engine():
        made_inside = _Cycle()
        inside = weakref.ref(made_inside)
        del made_inside
        gc.collect()
        assert inside() is None  # made while fetching: collected as ever
        assert gone() is not None  # frozen with the start-up heap
    if heap.open_engines() == 0:
        gc.collect()
        assert gone() is None  # given back at close: collected
