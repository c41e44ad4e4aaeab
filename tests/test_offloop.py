"""No store call blocks the event loop that carries the fetches (collector.offloop).

Real parts: a redis-server holds the frontier and the dead letters, a Postgres the sink, each
reached through a :class:`~tests.redis_proxy.SlowRelay` that holds every request for a while;
the pages come from the local fault site, with a steady share of pages that fail for good (404,
malformed JSON: dead letters, so the dead-letter store is written during the run too). The run
is the run as the flow makes it, without Prefect: ``Run.open`` (its stores opened and closed
off the loop), the plan on the frontier's lane, ``drain``, then ``Run.end`` (the books closed
and the summary's counts read on the stores' lanes).

* **asyncio's debug mode** (``slow_callback_duration`` 20 ms) with the stores 30 ms away: a store
  call made on the loop would be a slow callback by construction. A sampler thread reads the
  loop thread's stack every 2 ms from the moment the stores are opened until they are closed
  (the summary read between); the run must have no sample inside a store backend, hence no
  slow callback from one (the fast lane). A control at the end makes one store call on the
  loop on purpose and checks that both the sampler and asyncio see it.
* **deadlines**: the stores 500 ms away, pages answering in 50 ms under a 1.5 s request deadline
  (slack for a loaded box; a settle made on the loop takes 1.5 s), with a GX suite (its worker
  answers while the next batch is fetched, so settles run beside fetches, as in a real run):
  every URL is requested exactly once (a timed-out request would be asked again) and the ledger
  balances. The circuit breakers are off here: shared through
  the same slow Redis, their own (async) round trips would hold each request long before it
  is sent, and the test would measure them instead.

Mutation seen failing (both tests): ``Lane.run`` calling the store on the loop, as main did
(the debug run: ~560 samples in store code and ~20 slow callbacks from them; the deadlines: ~10
pages asked again).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from types import FrameType

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.backends import open_frontier
from collector.config import load_source
from collector.demo.scenario import SUITE
from collector.demo.site import FaultSite
from collector.offloop import Lane
from collector.run.collection import Run
from collector.run.drain import DrainPolicy, drain
from collector.run.ledger import Ledger
from tests.helpers import write_source
from tests.redis_proxy import SlowRelay
from tests.servers import PostgresServer, RedisServer

PAGES = 200
BATCH = 25
SLOW_CALLBACK_S = 0.02
# Pages answer in 50 ms; a request's deadline is 30 pages long, slack for a loaded box. With the
# stores STORE_AWAY_S away, a settle made on the loop (sink write, dead letters, ack: three round
# trips, 1.5 s) outlasts it.
DEADLINE_S = 1.5
STORE_AWAY_S = 0.5
# The backends' own files: a frame of one of these on the loop thread is a store call there.
STORE_FILES = tuple(
    str(Path(__file__).resolve().parents[1] / "collector" / name)
    for name in (
        "frontier/redis.py",
        "frontier/sqlite.py",
        "sinks/postgres.py",
        "sinks/jsonl.py",
        "deadletter/redis.py",
        "deadletter/sqlite.py",
        "sqlite_tx.py",
    )
)


class StoreSampler:
    """Reads one thread's stack every ``every_s``; keeps the samples that are inside a store."""

    def __init__(self, thread_id: int, every_s: float = 0.002) -> None:
        self.thread_id = thread_id
        self.every_s = every_s
        self.samples = 0
        self.hits: list[tuple[float, str]] = []  # (time.time(), "file:function") in store code
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="store-sampler", daemon=True)

    def __enter__(self) -> StoreSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            frame = sys._current_frames().get(self.thread_id)
            self.samples += 1
            if (where := _store_frame(frame)) is not None:
                self.hits.append((time.time(), where))


def _store_frame(frame: FrameType | None) -> str | None:
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(STORE_FILES):
            return f"{Path(path).parent.name}/{Path(path).name}:{frame.f_code.co_name}"
        frame = frame.f_back
    return None


class SlowCallbacks(logging.Handler):
    """asyncio's debug warnings ``Executing <handle> took N seconds``, as (start, end) times."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.windows: list[tuple[float, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == "Executing %s took %.3f seconds":
            assert isinstance(record.args, tuple)
            took = record.args[1]
            assert isinstance(took, float)
            self.windows.append((record.created - took, record.created))

    def from_stores(self, hits: list[tuple[float, str]]) -> list[str]:
        """The slow callbacks during which the loop thread was sampled in store code."""
        found = []
        for start, end in self.windows:
            inside = sorted({where for at, where in hits if start <= at <= end})
            if inside:
                found.append(f"{end - start:.3f} s in {', '.join(inside)}")
        return found


def _source(
    folder: Path,
    site: FaultSite,
    redis_url: str,
    dsn: str,
    *,
    suite: bool = False,
    pages: int = PAGES,
) -> Path:
    """The pages (5 % not found, 5 % malformed, 5 % breaking the suite when there is one)."""
    urls = []
    for i in range(pages):
        if i % 20 == 7:  # not found, for good
            urls.append(site.url(f"/items/{i}.json?status=404&times=-1&delay=0.05"))
        elif i % 20 == 13:  # a page that does not parse
            urls.append(site.url(f"/items/{i}.json?malformed=1&delay=0.05"))
        elif i % 20 == 17 and suite:  # a record the suite refuses
            urls.append(site.url(f"/items/{i}.json?invalid=1&delay=0.05"))
        else:
            urls.append(site.url(f"/items/{i}.json?delay=0.05"))
    path = write_source(
        folder,
        seeds={"urls": urls},
        frontier={"type": "redis", "url": redis_url},
        deadletters={"type": "redis", "url": redis_url},
        limits={"concurrency": 16, "per_domain_concurrency": 16, "circuit": False},
        validation={"suite": SUITE} if suite else {},
        ttl={
            "http_timeout_s": DEADLINE_S,
            "request_deadline_s": DEADLINE_S,
            "batch_timeout_s": 30,
            "lease_s": 60,
        },
    )
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    document["sink"] = {"type": "postgres", "dsn": dsn}
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


async def _run(source_path: Path, sampler: list[StoreSampler]) -> tuple[Ledger, list[str]]:
    """The run as the flow makes it, sampled from opening its stores to closing them: open,
    plan, drain, close the books, read the summary, close; returns the ledger and the
    control's store hits."""
    asyncio.get_running_loop().slow_callback_duration = SLOW_CALLBACK_S
    loop_thread = threading.get_ident()
    with StoreSampler(loop_thread) as watching:
        sampler.append(watching)
        async with Run.open(load_source(source_path), run_id=str(uuid.uuid4())) as run:
            await run.stores.frontier.lane.run(run.plan)
            async with run.engine() as engine:
                try:
                    await drain(
                        run,
                        lambda lease: run.fetch(engine, lease),
                        DrainPolicy(batch_size=BATCH, drain_wait_s=5.0),
                    )
                finally:
                    await run.aclose()
            summary = await run.end()
    assert summary.records_in_sink > 0 and summary.deadletter_reasons  # read, off the loop
    # control: one store call on the loop on purpose, seen by a sampler and by asyncio
    with open_frontier(run.source) as frontier, StoreSampler(loop_thread) as control:
        await asyncio.sleep(0)  # the call below is one callback of its own
        frontier.counts(run.source.name)
        await asyncio.sleep(0)
    return run.ledger, [where for _, where in control.hits]


def _servers(
    redis_server: RedisServer, postgres_server: PostgresServer, dsn: str, delay: float
) -> tuple[SlowRelay, SlowRelay, str]:
    """A relay to each server, and the DSN through the Postgres one."""
    redis_relay = SlowRelay(redis_server.port, delay_s=delay)
    pg_relay = SlowRelay(postgres_server.port, delay_s=delay)
    return redis_relay, pg_relay, dsn.replace(f":{postgres_server.port}/", f":{pg_relay.port}/")


# --- the lanes themselves (fast) -------------------------------------------------------------
_SPAN: contextvars.ContextVar[str] = contextvars.ContextVar("span", default="")


def test_a_lane_runs_calls_in_order_on_its_own_thread_while_the_loop_runs_on() -> None:
    lane, slow_lane = Lane("a"), Lane("b")
    done: list[tuple[int, int]] = []
    held = threading.Event()

    def call(n: int) -> int:
        done.append((n, threading.get_ident()))
        return n * n

    def span() -> str:
        return _SPAN.get()

    async def main() -> tuple[list[int], int]:
        stuck = asyncio.ensure_future(slow_lane.run(held.wait))  # a store that does not answer
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        ticker = asyncio.ensure_future(tick())
        results = await asyncio.gather(*(lane.run(call, n) for n in range(50)))
        ticker.cancel()
        held.set()
        await stuck
        _SPAN.set("batch 7")
        assert await lane.run(span) == "batch 7"  # the caller's context goes with the call
        return results, ticks

    results, ticks = asyncio.run(main())
    lane.close()
    slow_lane.close()
    assert results == [n * n for n in range(50)]
    assert [n for n, _ in done] == list(range(50))  # in the order they were awaited
    assert len({thread for _, thread in done}) == 1 != threading.get_ident()
    assert ticks > 0  # the loop ran meanwhile, and the other lane's stuck call held nothing up


# (task, lane, yields before the call): tasks interleave at random, over three lanes
_schedules = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(0, 3)), min_size=1, max_size=60
)


@settings(max_examples=60, deadline=None)
@given(_schedules)
def test_each_lane_runs_its_calls_in_the_order_they_were_made_whatever_the_interleaving(
    schedule: list[tuple[int, int, int]],
) -> None:
    """The reference is the plain order in which the loop made each lane's calls: what a store
    saw when the loop called it directly. Each awaiter gets its own call's answer."""
    lanes = [Lane(f"l{n}") for n in range(3)]
    made: list[list[int]] = [[], [], []]
    ran: list[list[tuple[int, int]]] = [[], [], []]

    def call(lane: int, n: int) -> int:
        ran[lane].append((n, threading.get_ident()))
        return n

    async def task(steps: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
        answers = []
        for n, lane, yields in steps:
            for _ in range(yields):
                await asyncio.sleep(0)
            made[lane].append(n)  # no await between this and the call being made
            answers.append((n, await lanes[lane].run(call, lane, n)))
        return answers

    async def main() -> list[list[tuple[int, int]]]:
        plans: dict[int, list[tuple[int, int, int]]] = {}
        for n, (who, lane, yields) in enumerate(schedule):
            plans.setdefault(who, []).append((n, lane, yields))
        return await asyncio.gather(*(task(steps) for steps in plans.values()))

    answers = asyncio.run(main())
    for each in lanes:
        each.close()
    assert all(n == got for per_task in answers for n, got in per_task)
    for lane in range(3):
        assert [n for n, _ in ran[lane]] == made[lane]
        assert len({thread for _, thread in ran[lane]}) <= 1


def test_a_call_made_runs_to_its_end_even_if_its_awaiter_is_cancelled() -> None:
    """An ack is never taken back half-way nor dropped from the queue; close waits for both."""
    lane = Lane("frontier")
    ran: list[str] = []
    started = threading.Event()

    def ack(name: str, seconds: float) -> None:
        started.set()
        time.sleep(seconds)
        ran.append(name)

    async def main() -> None:
        first = asyncio.ensure_future(lane.run(ack, "running", 0.2))
        queued = asyncio.ensure_future(lane.run(ack, "queued", 0.0))
        await asyncio.to_thread(started.wait)
        first.cancel()
        queued.cancel()  # not started yet: still not taken back
        for awaiting in (first, queued):
            with pytest.raises(asyncio.CancelledError):
                await awaiting
        assert ran == []  # the awaiters are gone, the calls are not

    asyncio.run(main())
    lane.close()  # waits for every call made
    assert ran == ["running", "queued"]


def test_a_failing_call_raises_in_its_awaiter_and_the_lane_goes_on() -> None:
    lane = Lane("sink")

    def fail() -> None:
        raise ValueError("the store said no")

    async def main() -> int:
        with pytest.raises(ValueError, match="the store said no"):
            await lane.run(fail)
        return await lane.run(len, "abc")

    assert asyncio.run(main()) == 3
    lane.close()


# --- on real stores ----------------------------------------------------------------------------
DEBUG_PAGES = 80  # the fast lane's run: four batches, every store written, each 30 ms away


def test_a_run_on_redis_and_postgres_has_no_slow_callback_from_a_store(
    tmp_path: Path,
    site: FaultSite,
    redis_server: RedisServer,
    redis_url: str,
    postgres_server: PostgresServer,
    postgres_dsn: str,
) -> None:
    redis_relay, pg_relay, dsn = _servers(redis_server, postgres_server, postgres_dsn, 0.03)
    slow = SlowCallbacks()
    logging.getLogger("asyncio").addHandler(slow)
    sampled: list[StoreSampler] = []
    try:
        with redis_relay, pg_relay:
            url = f"redis://127.0.0.1:{redis_relay.port}/0"
            source = _source(tmp_path, site, url, dsn, pages=DEBUG_PAGES)
            ledger, control = asyncio.run(_run(source, sampled), debug=True)
    finally:
        logging.getLogger("asyncio").removeHandler(slow)

    assert ledger.balanced, ledger.problems
    assert ledger.stored == DEBUG_PAGES * 18 // 20 and ledger.dead_lettered == DEBUG_PAGES // 10
    (run,) = sampled
    assert run.samples > 100  # the sampler was reading the loop's stack all along
    hits = Counter(where for _, where in run.hits)
    from_stores = slow.from_stores(run.hits)
    print(  # the figures for the closing note (-s)
        f"slow callbacks (> {SLOW_CALLBACK_S * 1e3:.0f} ms): {len(slow.windows)}, "
        f"from stores: {len(from_stores)}; loop samples: {run.samples}, in stores: {len(hits)}"
    )
    assert not hits, f"store calls on the event loop: {dict(hits)}"
    assert not from_stores, from_stores
    # the control: a store call made on the loop is seen by both
    assert control and any("redis.py" in where for where in control), control
    assert slow.windows, "asyncio reported no slow callback for the control's store call"


@pytest.mark.slow
def test_a_store_500_ms_away_costs_no_fetch_its_deadline(
    tmp_path: Path,
    site: FaultSite,
    redis_server: RedisServer,
    redis_url: str,
    postgres_server: PostgresServer,
    postgres_dsn: str,
) -> None:
    redis_relay, pg_relay, dsn = _servers(redis_server, postgres_server, postgres_dsn, STORE_AWAY_S)
    sampled: list[StoreSampler] = []
    with redis_relay, pg_relay:
        url = f"redis://127.0.0.1:{redis_relay.port}/0"
        ledger, _ = asyncio.run(_run(_source(tmp_path, site, url, dsn, suite=True), sampled))
        relayed = redis_relay.requests + pg_relay.requests

    asked = Counter(r.path for r in site.requests if r.path.startswith("/items/"))
    again = {path: n for path, n in asked.items() if n > 1}
    assert len(asked) == PAGES
    assert not again, f"{len(again)} pages asked again (a deadline ran out): {sorted(again)[:5]}"
    assert ledger.balanced, ledger.problems
    assert ledger.stored == PAGES * 17 // 20 and ledger.retried == 0
    assert relayed > 2 * PAGES // BATCH  # the stores were really 500 ms away, every batch
