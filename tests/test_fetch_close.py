"""Closing the engine while a fetch is in flight, on the real local fault site.

A CI log showed ``Task exception was never retrieved ... assert engine._lendable is not None``
after "Connector is closed": an item's task outlived its batch (the batch's caller was
cancelled) and the engine's close, then failed on the closed pool and again when it gave its
client back. Closing must end such tasks while their clients are open, hand each item back
once (as at a halt: skipped, its attempts as claimed), and let no exception escape.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from collector.demo.site import FaultSite
from collector.fetch.engine import FetchEngine
from collector.fetch.transport import TransportKind
from collector.frontier.base import ClaimedItem
from collector.policy.retry import RetryBudget, RetrySettings
from collector.policy.urls import HostPolicy

HELD = "/items/7.json?delay=20"  # the site holds the answer far longer than the test waits


@pytest.fixture(params=["aiohttp", "httpx"])
def transport(request: pytest.FixtureRequest) -> TransportKind:
    kind: TransportKind = request.param
    return kind


@pytest.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """What reaches the event loop's exception handler ("Task exception was never retrieved"
    among others) while the test runs."""
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    before = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    yield seen
    loop.set_exception_handler(before)


def _engine(transport: TransportKind) -> FetchEngine:
    return FetchEngine(
        transport=transport,
        retry=RetrySettings(base_s=0.01, cap_s=0.05, max_attempts=3, max_inline_delay_s=2),
        host_policy=HostPolicy(allow_private_networks=True),
        http_timeout_s=30.0,
        request_deadline_s=30.0,
        concurrency=4,
        per_domain_concurrency=4,
    )


def _arrived(site: FaultSite) -> int:
    """Requests for HELD the site has begun to answer (its log has them only once answered)."""
    with site._state.lock:
        return site._state.counters.get(HELD, 0)


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(1_000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the site never saw the request")


async def _held_at_the_site(
    engine: FetchEngine, site: FaultSite, item: ClaimedItem
) -> asyncio.Task[Any]:
    """A batch of ``item`` started, once its request is at the site (held there, unanswered)."""
    batch = asyncio.create_task(
        engine.fetch_batch([item], budget=RetryBudget(ratio=1.0, min_retries=100))
    )
    await _until(lambda: _arrived(site) == 1)
    return batch


async def _settled(errors: list[dict[str, Any]]) -> None:
    """Give any task left behind the time to fail, then collect it (an unretrieved exception
    is reported when its task is collected)."""
    await asyncio.sleep(0.5)
    gc.collect()
    await asyncio.sleep(0)
    assert errors == [], [str(e.get("exception") or e.get("message")) for e in errors]


async def test_a_close_mid_fetch_hands_the_item_back_once(
    site: FaultSite, transport: TransportKind, loop_errors: list[dict[str, Any]]
) -> None:
    engine = _engine(transport)
    item = ClaimedItem(site.url(HELD), 1, None, 0.0)
    async with engine:
        batch = await _held_at_the_site(engine, site, item)
    (result,) = await batch  # no exception: the close cut the attempt off, as a halt does
    assert (result.url, result.status, result.attempts) == (item.url, "skipped", 1)
    await _settled(loop_errors)
    assert _arrived(site) == 1  # sent once, not again after the close


async def test_a_fetch_whose_batch_was_cancelled_ends_with_the_engine(
    site: FaultSite, transport: TransportKind, loop_errors: list[dict[str, Any]]
) -> None:
    engine = _engine(transport)
    item = ClaimedItem(site.url(HELD), 0, None, 0.0)
    async with engine:
        batch = await _held_at_the_site(engine, site, item)
        batch.cancel()  # as Prefect's task timeout or a stop cancels the batch's caller
        with pytest.raises(asyncio.CancelledError):
            await batch
    assert not engine._orphans  # the item's task ended with the close, not after it
    await _settled(loop_errors)
    assert _arrived(site) == 1
