"""The run loop without Prefect: a whole Collection on SQLite + JSONL against the local fault
site, fetched through ``Collection.fetch`` (what the flow does through its task).

Fast (no Prefect server, no subprocess) and exact: each test reads the end state back from the
frontier and the sink, not only from the run's own counts.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from collector.config import load_source
from collector.demo.site import FaultSite
from collector.fetch.engine import FetchResult
from collector.frontier import Completed, Lease, StateCounts
from collector.frontier.base import Holder
from collector.run.collection import Collection
from collector.run.drain import DrainEnd, DrainPolicy, drain
from collector.run.stop import StopRequest
from collector.run.summary import RunSummary
from tests.helpers import duplicate_keys, sink_lines, write_source

ITEMS = 60


def _source(folder: Path, site: FaultSite, *, delay_s: float = 0.0, items: int = ITEMS) -> Path:
    knob = f"?delay={delay_s}" if delay_s else ""
    urls = [site.url(f"/items/{i}.json{knob}") for i in range(items)]
    return write_source(
        folder,
        name="drain",
        seeds={"urls": urls},
        limits={"concurrency": 4, "per_domain_concurrency": 4},
        ttl={"lease_s": 600},
    )


@dataclass
class Ran:
    """What a test reads back after the run: its summary, how it ended, the frontier's state."""

    summary: RunSummary
    end: DrainEnd
    counts: StateCounts
    holders: list[Holder]


async def _run(
    path: Path,
    *,
    policy: DrainPolicy,
    stop: StopRequest | None = None,
    run_id: str = "run-1",
    plan: bool = True,
    interrupted: str | None = None,
) -> Ran:
    with Collection(load_source(path), run_id=run_id) as run:
        if plan:
            run.plan()
        async with run.engine() as engine:

            async def fetch(lease: Lease) -> list[FetchResult]:
                return await run.fetch(engine, lease)

            try:
                end = await drain(run, fetch, policy, stop=stop)
            finally:
                await run.aclose()
        run.finish(planned=plan)
        return Ran(
            run.summary(interrupted=interrupted),
            end,
            run.frontier.counts(run.source.name),
            run.frontier.holders(run.source.name),
        )


def test_a_whole_run_drains_and_balances_without_prefect(tmp_path: Path) -> None:
    with FaultSite() as site:
        path = _source(tmp_path, site)
        ran = asyncio.run(_run(path, policy=DrainPolicy(batch_size=16)))
    assert ran.end.ending == "drained"
    summary = ran.summary
    assert summary.balanced, summary.problems
    assert (summary.stored, summary.queued, summary.held_by_others) == (ITEMS, 0, 0)
    rows = sink_lines(tmp_path / "out")
    assert len(rows) == ITEMS and duplicate_keys(rows) == []
    assert ran.holders == []  # the run forgot its heartbeat at the end
    # the loop's own time and CPU (what bench/throughput.py rates collector by), within the run's
    timings = summary.timings_s
    assert 0 < timings["drain"] <= summary.seconds and timings["drain_cpu"] > 0


@pytest.mark.parametrize("ahead", [1, 2], ids=["one-batch-at-a-time", "fetching-ahead"])
def test_a_stop_request_settles_what_was_fetched_and_returns_the_rest_unchanged(
    tmp_path: Path, ahead: int
) -> None:
    stop = StopRequest()

    async def stop_soon(path: Path) -> Ran:
        async def once_a_batch_is_stored() -> None:  # not after a time: a loaded box is slow
            out = tmp_path / "out"
            while not any(f.stat().st_size for f in out.glob("*.jsonl")):
                await asyncio.sleep(0.05)
            stop.request("SIGINT")

        stopper = asyncio.create_task(once_a_batch_is_stored())
        try:
            return await _run(
                path,
                policy=DrainPolicy(batch_size=8, fetch_ahead=ahead),
                stop=stop,
                interrupted="SIGINT",
            )
        finally:
            stopper.cancel()

    with FaultSite() as site:
        path = _source(tmp_path, site, delay_s=0.2)
        began = time.monotonic()
        ran = asyncio.run(stop_soon(path))
        took = time.monotonic() - began
        assert ran.end.ending == "stopped" and ran.end.stop_reason == "SIGINT"
        summary = ran.summary
        assert summary.balanced, summary.problems
        assert 0 < summary.stored < ITEMS
        assert summary.queued == ITEMS - summary.stored and summary.held_by_others == 0
        assert summary.retried == 0 and summary.dead_lettered == 0  # a stop is not an attempt
        assert ran.counts.leased == 0 and ran.counts.queued == ITEMS - summary.stored
        print(f"stopped {took:.1f} s after the start (a batch stored, 2 s grace at most)")

        rerun = asyncio.run(_run(path, policy=DrainPolicy(batch_size=32), run_id="run-2"))
    assert rerun.summary.balanced, rerun.summary.problems
    rows = sink_lines(tmp_path / "out")
    assert len(rows) == ITEMS and duplicate_keys(rows) == []


def test_the_run_waits_for_a_live_helper_however_long_past_the_drain_wait(
    tmp_path: Path,
) -> None:
    """A helper that beats holds items for longer than drain_wait_s: the run waits (polling)
    and ends drained, with what the helper stored counted as stored_by_others."""
    with FaultSite() as site:
        path = _source(tmp_path, site, items=10)
        source = load_source(path)

        async def scenario() -> Ran:
            with Collection(source, run_id="run-1") as run:
                run.plan()
                helper_lease = run.frontier.claim("drain", 4, now=time.time(), lease_s=600,
                                                  holder="helper")  # fmt: skip
                run.frontier.beat("drain", "helper", now=time.time())

                async def helper_finishes_later() -> None:
                    for _ in range(6):  # 3 s > drain_wait_s, beating as a live helper does
                        await asyncio.sleep(0.5)
                        run.frontier.beat("drain", "helper", now=time.time())
                    done = [Completed(i.url, time.time() + 3600, time.time())
                            for i in helper_lease.items]  # fmt: skip
                    run.frontier.ack(helper_lease, done, now=time.time())

                helper = asyncio.create_task(helper_finishes_later())
                async with run.engine() as engine:

                    async def fetch(lease: Lease) -> list[FetchResult]:
                        return await run.fetch(engine, lease)

                    policy = DrainPolicy(batch_size=3, drain_wait_s=0.5, poll_s=0.2)
                    end = await drain(run, fetch, policy)
                    await run.aclose()
                await helper
                run.finish()
                return Ran(run.summary(), end, run.frontier.counts("drain"), [])

        ran = asyncio.run(scenario())
    assert ran.end.ending == "drained", ran.end
    summary = ran.summary
    assert summary.balanced, summary.problems
    assert (summary.stored, summary.stored_by_others, summary.queued) == (6, 4, 0)
    assert summary.held_by_others == 0


def test_a_dead_holders_leases_are_revoked_and_finished_by_the_run(tmp_path: Path) -> None:
    with FaultSite() as site:
        path = _source(tmp_path, site, items=10)
        source = load_source(path)
        with Collection(source, run_id="dead-run") as dead:
            dead.plan()
            dead.frontier.beat("drain", "dead-run", now=time.time() - 120)  # silent 2 minutes
            dead.frontier.claim("drain", 7, now=time.time(), lease_s=600, holder="dead-run")
        ran = asyncio.run(_run(path, policy=DrainPolicy(batch_size=5), run_id="run-2"))
    summary = ran.summary
    assert summary.balanced, summary.problems
    assert summary.leases_reclaimed == 7  # revoked at once, not after lease_s (600 s)
    assert (summary.stored, summary.queued, summary.held_by_others) == (10, 0, 0)


@pytest.mark.parametrize("dead_after_s", [30.0])
def test_a_live_holder_is_never_revoked(tmp_path: Path, dead_after_s: float) -> None:
    with FaultSite() as site:
        path = _source(tmp_path, site, items=4)
        source = load_source(path)
        with Collection(source, run_id="run-1") as run:
            run.plan()
            run.frontier.beat("drain", "alive", now=time.time())
            run.frontier.claim("drain", 2, now=time.time(), lease_s=600, holder="alive")
            from collector.run.heartbeat import dead_holders

            now = time.time()
            assert dead_holders(run.frontier, "drain", now=now, dead_after_s=dead_after_s) == []
            later = now + dead_after_s + 1
            assert dead_holders(run.frontier, "drain", now=later) == ["alive"]
