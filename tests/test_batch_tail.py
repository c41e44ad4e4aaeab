"""A batch's tail (collector.fetch.tail): a retry waiting inline beside other work is retried in
the batch; once it is all that is left, it goes back to the queue, due when its wait ends, and
is never asked again before its Retry-After."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from collector.config import load_source
from collector.fetch.engine import FetchEngine, FetchResult
from collector.fetch.tail import MIN_HANDBACK_S, BatchTail
from collector.frontier.base import ClaimedItem
from collector.policy.retry import RetryBudget
from collector.run.collection import Collection
from tests.helpers import drain_in_process, sink_lines, write_source
from tests.servers import ThreadedSite


class RetryAfterSite(ThreadedSite):
    """``/ra/<n>``: 429 with ``Retry-After: <retry_after>`` the first time, then 200;
    ``/item/<n>``: 200; ``/hold``: 200 once some ``/ra/`` page was asked a second time (or 20 s
    later: ``held_for_retry`` says which)."""

    def __init__(self, retry_after: int) -> None:
        super().__init__()
        self.retry_after = retry_after
        self.asked: dict[str, list[float]] = defaultdict(list)
        self.retried = threading.Event()
        self.held_for_retry: bool | None = None
        self._lock = threading.Lock()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        path = handler.path
        with self._lock:
            self.asked[path].append(time.monotonic())
            times = len(self.asked[path])
        if path == "/hold":
            self.held_for_retry = self.retried.wait(20)
        if path.startswith("/ra/") and times == 1:
            handler.send_response(429)
            handler.send_header("Retry-After", str(self.retry_after))
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        if path.startswith("/ra/"):
            self.retried.set()
        body = json.dumps({"id": path}).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)


def _fetch(tmp_path: Path, site: RetryAfterSite, paths: list[str]) -> list[FetchResult]:
    source = load_source(
        write_source(
            tmp_path,
            seeds={"urls": [site.url(p) for p in paths]},
            retry={"base_s": 0.01, "cap_s": 0.05, "max_attempts": 5},
        )
    )

    async def go() -> list[FetchResult]:
        async with FetchEngine.for_source(source) as engine:
            items = [ClaimedItem(site.url(p), 0, None, 0.0) for p in paths]
            return await engine.fetch_batch(items, budget=RetryBudget(ratio=1.0, min_retries=10))

    return asyncio.run(go())


def test_a_wait_left_alone_goes_back_to_the_queue_due_when_it_ends(tmp_path: Path) -> None:
    with RetryAfterSite(retry_after=2) as site:
        results = _fetch(tmp_path, site, ["/ra/1", *(f"/item/{i}" for i in range(5))])
        ra = results[0]
        assert [r.status for r in results[1:]] == ["ok"] * 5
        assert ra.status == "failed" and ra.decision is not None, ra
        assert ra.decision.action == "later", ra.decision
        assert MIN_HANDBACK_S <= ra.decision.delay_s <= 2.0, ra.decision  # the rest of the wait
        assert len(site.asked["/ra/1"]) == 1  # not asked again before its time


def test_a_wait_beside_other_work_is_retried_in_the_batch(tmp_path: Path) -> None:
    """``/hold`` answers only after the retry arrived: while it is in flight the batch has
    work, so the waiting page is retried inline (handing it back would leave /hold held)."""
    with RetryAfterSite(retry_after=1) as site:
        results = _fetch(tmp_path, site, ["/ra/1", "/hold"])
        assert [r.status for r in results] == ["ok", "ok"], results
        assert site.held_for_retry is True
        assert len(site.asked["/ra/1"]) == 2


def test_a_short_remainder_is_slept_out() -> None:
    """Left alone with less than MIN_HANDBACK_S to go, a wait ends in the batch; with more, it
    comes back with what is left (the check can fail: a tail that never hands back, or always
    does, fails one of the two)."""

    async def scenario(wait_s: float) -> float:
        tail = BatchTail(2)

        async def other() -> None:
            await asyncio.sleep(0.05)
            tail.finished()

        worker = asyncio.create_task(other())
        left = await tail.wait_out(wait_s)
        await worker
        return left

    assert asyncio.run(scenario(0.1)) == 0.0
    left = asyncio.run(scenario(30))  # 30 s, not 1.5: a starved loop cannot eat the remainder
    assert MIN_HANDBACK_S < left < 30, left


def test_a_run_honours_every_retry_after_and_stores_everything_once(tmp_path: Path) -> None:
    """Whole run, batches of 6: the 429 pages go back to the queue and come back when due;
    each is asked exactly twice, the second time no sooner than its Retry-After."""
    paths = [f"/ra/{i}" for i in range(8)] + [f"/item/{i}" for i in range(16)]
    with RetryAfterSite(retry_after=1) as site:
        path = write_source(
            tmp_path,
            seeds={"urls": [site.url(p) for p in paths]},
            record={"key": "id"},
            retry={"base_s": 0.01, "cap_s": 0.05, "max_attempts": 5},
        )

        async def run() -> None:
            with Collection(load_source(path), run_id="tail") as collection:
                collection.plan()
                await drain_in_process(collection, batch_size=6)
                collection.finish()
                summary = collection.summary()
                assert summary.balanced, summary.problems
                assert summary.stored == len(paths), summary

        asyncio.run(run())
        for i in range(8):
            first, second = site.asked[f"/ra/{i}"]  # exactly twice
            assert second - first >= 1.0 - 0.01, (i, second - first)
        assert len(sink_lines(tmp_path / "out")) == len(paths)
