"""A run that loses its footing (a lease, its heartbeat, its source lock) stops and says so.

Each test takes the footing away with real parts (a SQLite frontier whose leases another holder
revokes, as one does after a clock jump made this run look dead; a frontier closed under the
heartbeat's thread; a Prefect lease released by id, as a waiter that judged the run dead does)
and checks that the run ends with :class:`LostFooting` naming what was lost, leaves nothing
leased, and that a rerun ends exact with nothing stored twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prefect.client.schemas.objects import State

from collector._redis import script_text
from collector.config import load_source
from collector.demo.site import FaultSite
from collector.fetch.engine import FetchResult
from collector.frontier import Lease, StateCounts
from collector.frontier.sqlite import SqliteFrontier
from collector.run.collection import Collection
from collector.run.drain import DrainPolicy, drain
from collector.run.heartbeat import Heartbeat, dead_holders
from collector.run.stop import LostFooting, process_footing
from collector.run.summary import RunSummary
from tests.helpers import duplicate_keys, sink_lines, summary_of, write_source
from tests.redis_proxy import ReplyLoser
from tests.servers import RedisServer

FRONTIER = "collector.frontier"

ITEMS = 24


def _source(folder: Path, site: FaultSite, **sections: object) -> Path:
    urls = [site.url(f"/items/{i}.json") for i in range(ITEMS)]
    return write_source(
        folder,
        **sections,
        name="footing",
        seeds={"urls": urls},
        limits={"concurrency": 4, "per_domain_concurrency": 4},
        # renewed every second: the renewal meets the revoked lease while the batch is fetched
        ttl={"http_timeout_s": 1, "request_deadline_s": 1, "batch_timeout_s": 2, "lease_s": 3},
    )


class _Clock:
    """A run's wall clock that can jump ahead (an NTP step, a VM resumed after an hour)."""

    def __init__(self) -> None:
        self.ahead_s = 0.0

    def __call__(self) -> float:
        return time.time() + self.ahead_s


async def _drain(
    path: Path,
    run_id: str,
    *,
    revoke_first: bool = False,
    slow_first: bool = False,
    jump_first: bool = False,
    beat_raises: bool = False,
) -> tuple[RunSummary | None, object]:
    """Plan and drain; with ``revoke_first`` the first batch's leases are revoked before it is
    fetched by a holder whose clock jumped an hour ahead (this run looks dead to it); with
    ``jump_first`` this run's own clock jumps an hour ahead then; with ``beat_raises`` its
    heartbeat thread raises at its first beat. With any, the first fetch lasts past two
    renewals."""
    clock = _Clock()
    with Collection(load_source(path), run_id=run_id, clock=clock) as run:
        run.plan()
        if beat_raises:
            run.heartbeat = _raising_heartbeat(run)  # type: ignore[method-assign]
        revoked = False
        async with run.engine() as engine:

            async def fetch(lease: Lease) -> list[FetchResult]:
                nonlocal revoked
                if (revoke_first or slow_first or jump_first or beat_raises) and not revoked:
                    revoked = True
                    if revoke_first:
                        await run.stores.frontier.lane.run(_revoke_as_jumped_clock, run)
                    if jump_first:
                        clock.ahead_s = 3600.0  # past every lease this run holds
                    renewals_before = run.source.ttl.renew_every_s * 2
                    await asyncio.sleep(renewals_before)  # a slow fetch: a renewal comes first
                return await run.fetch(engine, lease)

            try:
                outcome: object = await drain(run, fetch, DrainPolicy(batch_size=6))
            except LostFooting as lost:
                outcome = lost
            finally:
                await run.aclose()
        if isinstance(outcome, LostFooting):  # the flow ends here: no account is published
            return None, outcome
        run.finish(planned=True)
        return run.summary(), outcome


def _counts(path: Path) -> StateCounts:
    """The source's frontier as it is now, read by a process of its own."""
    with Collection(load_source(path), run_id="reader") as reader:
        return reader.frontier.counts(reader.source.name)


def _raising_heartbeat(run: Collection) -> Callable[..., Heartbeat]:
    """The run's heartbeat, its thread's clock failing at its first beat after the one on entry
    (anything the thread raises: a store driver's bug, a clock gone wrong)."""

    def heartbeat(
        *, every_s: float, dead_after_s: float, on_lost: Callable[[str], None]
    ) -> Heartbeat:
        ticks = iter([time.time()])
        return Heartbeat(
            run.frontier, run.source.name, run.run_id, every_s=0.2, dead_after_s=dead_after_s,
            on_lost=on_lost, clock=lambda: next(ticks),
        )  # fmt: skip

    return heartbeat


def _revoke_as_jumped_clock(run: Collection) -> None:
    """Another holder, its clock an hour ahead, finds this run silent and revokes its leases."""
    later = time.time() + 3600
    for dead in dead_holders(run.frontier, run.source.name, now=later):
        run.frontier.revoke(run.source.name, dead, now=later)


def test_a_lease_taken_back_stops_the_run_which_says_so_and_a_rerun_is_exact(
    tmp_path: Path,
) -> None:
    with FaultSite() as site:
        path = _source(tmp_path, site)
        _, outcome = asyncio.run(_drain(path, "run-1", revoke_first=True))
        counts = _counts(path)
        assert isinstance(outcome, LostFooting), outcome
        print(f"collector: {outcome}")
        assert "lease of batch" in str(outcome) and "took its 6 items back" in str(outcome)
        assert counts.leased == 0  # settled or given back: nothing left held
        assert counts.queued > 0  # it stopped claiming at once: the rest waits for a rerun

        _rerun_is_exact(path, tmp_path / "out")


def test_redis_away_longer_than_the_lease_stops_the_run_and_a_rerun_is_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis goes away (a relay stops it at the run's first lease renewal) for longer than the
    lease: the renewal is retried while the lease runs, then the run stops, saying which lease
    it lost and why; once Redis is back a rerun ends exact, nothing stored twice."""
    monkeypatch.setenv("COLLECTOR_REDIS_RECONNECT_S", "1")  # each call fails after 1 s
    with FaultSite() as site, RedisServer(persistent=True) as server:
        with ReplyLoser(server, down_s=8) as relay:
            path = _source(tmp_path, site, frontier={"type": "redis", "url": relay.url})
            renew = hashlib.sha1(script_text(FRONTIER, "prelude", "renew").encode()).hexdigest()
            relay.lose(renew, ran=False)
            _, outcome = asyncio.run(_drain(path, "run-1", slow_first=True))
            relay.wait()
        assert isinstance(outcome, LostFooting), outcome
        print(f"collector: {outcome}")
        assert "the lease of batch" in str(outcome) and "not renewed for 3s" in str(outcome)
        path = _source(tmp_path, site, frontier={"type": "redis", "url": server.url})
        _rerun_is_exact(path, tmp_path / "out")


@pytest.mark.parametrize("fault", ["jump_first", "beat_raises"])
def test_a_clock_jump_or_a_raising_beat_thread_ends_exact_after_a_rerun(
    tmp_path: Path, fault: str
) -> None:
    """The run's own wall clock jumps an hour ahead mid-batch (past every lease it holds), or
    its heartbeat thread raises: whatever the run says, it leaves nothing leased, and a rerun
    ends exact with nothing stored twice."""
    with FaultSite() as site:
        path = _source(tmp_path, site)
        first, outcome = asyncio.run(_drain(path, "run-1", **{fault: True}))
        counts = _counts(path)
        said = f"collector: {outcome}" if isinstance(outcome, LostFooting) else "completed"
        print(f"{fault}: {said}; {counts}")
        assert counts.leased == 0  # settled or given back: nothing left held
        if fault == "beat_raises":
            assert isinstance(outcome, LostFooting), outcome
            said_as = "stopped: lost its heartbeat: the beat thread raised StopIteration;"
            assert str(outcome).startswith(said_as), outcome
        else:
            assert first is not None or isinstance(outcome, LostFooting), outcome
            assert first is None or first.balanced, first.problems

        _rerun_is_exact(path, tmp_path / "out")


def _rerun_is_exact(path: Path, out: Path) -> None:
    """A rerun ends balanced with nothing held or queued, every item stored once."""
    summary, ended = asyncio.run(_drain(path, "run-2"))
    counts = _counts(path)
    assert summary is not None, ended
    assert summary.balanced, summary.problems
    assert counts.leased == counts.queued == 0
    rows = sink_lines(out)
    assert len({row["id"] for row in rows}) == ITEMS and duplicate_keys(rows) == []


def _told(beat_kwargs: dict[str, object], frontier: SqliteFrontier, *, close: bool) -> list[str]:
    lost: list[str] = []
    told = threading.Event()

    def on_lost(what: str) -> None:
        lost.append(what)
        told.set()

    with Heartbeat(frontier, "footing", "run-1", on_lost=on_lost, **beat_kwargs):  # type: ignore[arg-type]
        if close:
            frontier.close()
        assert told.wait(60), "the holder was never told it lost its heartbeat"
    return lost


def test_a_heartbeat_that_no_longer_goes_through_tells_the_holder(tmp_path: Path) -> None:
    """The store refuses every beat (closed under it): retried while others would still call
    the holder alive, then the holder is told (it used to warn forever, unheard)."""
    frontier = SqliteFrontier(tmp_path / "frontier.db")
    lost = _told({"every_s": 0.05, "dead_after_s": 0.5}, frontier, close=True)
    assert len(lost) == 1 and lost[0].startswith("its heartbeat: no beat went through for")


def test_a_heartbeat_thread_that_raises_tells_the_holder(tmp_path: Path) -> None:
    """Anything else the beat thread raises (here its clock) ends the beat: the holder is told
    (it used to end the beat at debug level, after which others revoke its leases unseen)."""
    ticks = iter([time.time()])  # the first beat, then the clock fails

    def clock() -> float:
        return next(ticks)  # StopIteration on the thread's first beat

    with SqliteFrontier(tmp_path / "frontier.db") as frontier:
        lost = _told({"every_s": 0.05, "clock": clock}, frontier, close=False)
    assert len(lost) == 1 and lost[0].startswith("its heartbeat: the beat thread raised")


@pytest.mark.slow
async def test_a_lost_source_lock_is_said_to_the_run(
    tmp_path: Path, prefect_api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter that judged the run dead releases its lease by id: the next renewal finds it
    gone (Prefect answers 404/410) and the run is told, once, through ``process_footing``."""
    from uuid import UUID

    from prefect.client.orchestration import get_client

    from collector import defaults
    from flows._locks import read_beat, source_lock

    monkeypatch.setattr(defaults, "HEARTBEAT_S", 0.2)
    source = load_source(
        write_source(tmp_path, name="footing-lock", seeds={"urls": ["http://h.example/0"]})
    )
    async with source_lock(source, holder="footing", on_busy="wait", wait_s=0) as held:
        assert held
        _, beat = await read_beat(source)
        assert beat is not None and beat.lease_id
        async with get_client() as client:
            await client.release_concurrency_slots_with_lease(UUID(beat.lease_id))
        deadline = time.monotonic() + 120  # renewed every lease_s / 4 (15 s): seen within it
        while process_footing.reason is None and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        said = process_footing.reason
    assert said is not None, "the run was never told it lost its source lock"
    assert "source lock 'source:footing-lock'" in said and "no longer has its lease" in said
    assert process_footing.reason is None  # forgotten once the lock is released


async def test_a_source_lock_beat_thread_that_raises_tells_the_run(
    tmp_path: Path, prefect_api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock's beat thread dying of anything unforeseen is a lost lock, said to the run: a
    beat that stopped silently would let a waiter judge the run dead and take the lock."""
    from flows import _locks

    def broken(self: object, client: object) -> None:
        raise RuntimeError("the beat broke")

    monkeypatch.setattr(_locks._LockBeater, "_beat_and_renew", broken)
    source = load_source(
        write_source(tmp_path, name="footing-beat", seeds={"urls": ["http://h.example/0"]})
    )
    async with _locks.source_lock(source, holder="footing", on_busy="wait", wait_s=0) as held:
        assert held
        deadline = time.monotonic() + 30
        while process_footing.reason is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        said = process_footing.reason
    assert said == (
        "its source lock 'source:footing-beat': its beat thread raised RuntimeError: the beat broke"
    ), said


async def test_a_dead_runs_unended_task_runs_are_crashed_with_it(prefect_api: str) -> None:
    """A run found dead had a ``fetch-batch`` task run in flight: it is marked Crashed with the
    flow run (it stayed RUNNING for good when only the flow run was marked)."""
    from prefect import task
    from prefect.client.orchestration import get_client
    from prefect.states import Completed, Running

    from flows._dead_runs import mark_crashed
    from flows.collect import collect

    @task(name="fetch-batch[dead]")
    def fetch_batch() -> None: ...

    async with get_client() as client:
        flow_run = await client.create_flow_run(
            collect, parameters={"source": "dead.yaml"}, state=Running()
        )
        in_flight = await client.create_task_run(fetch_batch, flow_run.id, "0", state=Running())
        done = await client.create_task_run(fetch_batch, flow_run.id, "1", state=Completed())
        assert await mark_crashed(client, str(flow_run.id), "no heartbeat from this run: test")
        crashed = (await client.read_task_run(in_flight.id)).state
        kept = (await client.read_task_run(done.id)).state
    assert crashed is not None and crashed.type.value == "CRASHED", crashed
    assert "no heartbeat" in (crashed.message or "")
    assert kept is not None and kept.type.value == "COMPLETED", kept  # an ended one keeps its own


async def test_a_flow_that_lost_its_footing_ends_failed_and_raises_it(prefect_api: str) -> None:
    """Prefect keeps the loss as it was raised: the flow run ends Failed with the one line, and
    an in-process caller (the CLI, which exits 4 on it) gets LostFooting back."""
    from prefect import flow

    @flow(name="lost-footing")
    async def lost() -> None:
        raise LostFooting("its source lock 'source:x': the server no longer has its lease")

    state = await lost(return_state=True)
    assert state.is_failed() and "stopped: lost its source lock" in (state.message or "")
    with pytest.raises(LostFooting) as raised:
        await state.result()  # type: ignore[misc]
    assert raised.value.lost.startswith("its source lock 'source:x'")


async def test_a_flow_that_lost_its_footing_publishes_what_it_settled(
    tmp_path: Path, prefect_api: str
) -> None:
    """The source lock is said lost (as flows/_locks.py says it) once the first batch settled:
    the flow stops claiming, publishes the account of what it settled (the ledger artifact, its
    books closed), then ends Failed with LostFooting; a rerun finishes the rest exactly."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.collect import collect, listening

    def lose_the_lock(event: str, data: dict[str, object]) -> None:
        if event == "batch":
            process_footing.request("its source lock 'source:footing': test")

    with FaultSite() as site:
        # Every page answers after 1.5 s (its first request only), four at a time: the first
        # batch settles while at least 16 items are still unfetched however slow the box is,
        # so the stop always leaves some queued (with instant pages, a busy box once fetched
        # all 24 before the first settle ended, and the run had nothing left to stop).
        path = write_source(
            tmp_path,
            name="footing",
            seeds={"urls": [site.url(f"/items/{i}.json?delay=1.5&times=1") for i in range(ITEMS)]},
            limits={"concurrency": 4, "per_domain_concurrency": 4},
            ttl={"http_timeout_s": 10, "request_deadline_s": 12},
        )
        try:
            with listening(lose_the_lock):
                state = await collect(str(path), batch_size=6, return_state=True)
        finally:
            process_footing.reset()
        assert isinstance(state, State) and state.is_failed(), state
        assert isinstance(await state.aresult(raise_on_failure=False), LostFooting)
        async with get_client() as client:
            found = await client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    key=ArtifactFilterKey(any_=["collector-footing-summary"])
                )
            )
        table = max(found, key=lambda a: a.created or 0).data
        rows = {row["count"]: row["value"] for row in json.loads(str(table))}
        print(f"published: {rows}")
        assert rows["ended"] == "lost (its source lock 'source:footing': test)"
        assert rows["balanced"] is True
        assert 0 < rows["stored"] < ITEMS and rows["queued"] == ITEMS - rows["stored"]
        settled = rows["stored"]

        rerun = summary_of(await collect(str(path), batch_size=6))
    assert rerun["balanced"] and rerun["stored"] == ITEMS - settled
    rows_in_sink = sink_lines(tmp_path / "out")
    assert len({row["id"] for row in rows_in_sink}) == ITEMS and duplicate_keys(rows_in_sink) == []
