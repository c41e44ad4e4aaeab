"""Fetching ahead (collector.run.drain): the next batch starts while the current one's last
requests are in flight, within every per-host limit, and everything ends as one batch at a time
would end it.

Against a real local server (aiohttp, in a thread of its own) that counts the requests in flight
per host and logs each request's interval; the run is a whole Collection on SQLite + JSONL,
fetched through ``Collection.fetch`` as the flow's task does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector import defaults
from collector.config import load_source
from collector.demo.site import record
from collector.fetch.engine import FetchResult
from collector.frontier import Lease, StateCounts
from collector.run.account import END_TERMS, INTAKE_TERMS
from collector.run.collection import Collection
from collector.run.drain import DrainEnd, DrainPolicy, drain
from collector.run.stop import StopRequest
from collector.run.summary import RunSummary
from tests.helpers import duplicate_keys, sink_lines, write_source
from tests.servers import free_port

HOSTS = ("127.0.0.1", "127.0.0.2")  # two hosts on the loopback, one server


class CountingSite:
    """``/items/<i>.json`` on two loopback hosts, with FaultSite's knobs ``delay``, ``status``,
    ``times`` (default 1 with a status, -1 always) and ``retry_after``; counts each host's
    requests in flight (``peak``) and logs each request as (host, path, began, ended)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.in_flight: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.log: list[tuple[str, str, float, float]] = []
        self.seen: Counter[str] = Counter()
        self.delays = True  # False: ``delay`` is ignored (a rerun after a stop, at full speed)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    def url(self, host: str, i: int, **knobs: object) -> str:
        query = "&".join(f"{k}={v}" for k, v in knobs.items())
        return f"http://{host}:{self.port}/items/{i}.json" + (f"?{query}" if query else "")

    def __enter__(self) -> CountingSite:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/items/{i}.json", self._item)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        for host in HOSTS:
            await web.TCPSite(self._runner, host, self.port, reuse_address=True).start()

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        # answers still sleeping (a page cut off by a stop) end here, not with the loop
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _item(self, request: web.Request) -> web.Response:
        host = request.host.rsplit(":", 1)[0]
        began = time.monotonic()
        self.in_flight[host] += 1
        self.peak[host] = max(self.peak[host], self.in_flight[host])
        try:
            query = request.query
            n = self.seen[request.path_qs]
            self.seen[request.path_qs] += 1
            status = int(query.get("status", 200))
            times = int(query.get("times", 1 if "status" in query else -1))
            faulty = times < 0 or n < times
            if "delay" in query and (faulty or "times" not in query) and self.delays:
                await asyncio.sleep(float(query["delay"]))
            if status != 200 and faulty:
                headers = {"Retry-After": query["retry_after"]} if "retry_after" in query else {}
                return web.json_response({"error": status}, status=status, headers=headers)
            return web.json_response(record(int(request.match_info["i"])))
        finally:
            self.in_flight[host] -= 1
            self.log.append((host, request.path_qs, began, time.monotonic()))


def _source(folder: Path, urls: list[str], **sections: Any) -> Path:
    return write_source(
        folder,
        **{
            "name": "ahead",
            "seeds": {"urls": urls},
            "limits": {"concurrency": 8, "per_domain_concurrency": 2},
            "ttl": {"lease_s": 600},
            **sections,
        },
    )


@dataclass
class Ran:
    summary: RunSummary
    end: DrainEnd | None
    counts: StateCounts
    letters: list[tuple[str, str]]
    batch_of: dict[str, int] = field(default_factory=dict)  # URL -> the claim it was fetched in
    error: BaseException | None = None


FetchWrap = Callable[[Lease, Callable[[], Awaitable[list[FetchResult]]]], Awaitable[Any]]


async def _run(
    path: Path,
    policy: DrainPolicy,
    *,
    stop: StopRequest | None = None,
    wrap: FetchWrap | None = None,
    run_id: str = "run-1",
) -> Ran:
    """Plan and drain the source; ``wrap`` sees each fetch (to stop, or fail, on the way)."""
    batch_of: dict[str, int] = {}
    with Collection(load_source(path), run_id=run_id) as run:
        run.plan()
        error: BaseException | None = None
        end = None
        async with run.engine() as engine:

            async def fetch(lease: Lease) -> list[FetchResult]:
                for item in lease.items:
                    batch_of[item.url] = lease.token

                async def plain() -> list[FetchResult]:
                    return await run.fetch(engine, lease)

                return await (wrap(lease, plain) if wrap is not None else plain())

            try:
                end = await drain(run, fetch, policy, stop=stop)
            except Exception as exc:
                error = exc
            finally:
                await run.aclose()
        run.finish()
        letters = sorted(
            (d.url, d.reason) for d in run.deadletters.list(source=run.source.name, limit=10_000)
        )
        return Ran(
            run.summary(interrupted=stop.reason if stop else None),
            end,
            run.frontier.counts(run.source.name),
            letters,
            batch_of,
            error,
        )


def _cross_batch_overlaps(site: CountingSite, batch_of: dict[str, int]) -> int:
    """Requests that were in flight while a request of another batch was."""
    spans = [(batch_of[f"http://{h}:{site.port}{p}"], b, e) for h, p, b, e in site.log]
    return sum(
        1
        for i, (bi, b0, e0) in enumerate(spans)
        if any(bj != bi and b1 < e0 and b0 < e1 for j, (bj, b1, e1) in enumerate(spans) if j != i)
    )


# --- politeness: never above a host's limit, and the slots busier ------------------------------


def test_fetching_ahead_keeps_every_host_within_its_limit_and_overlaps_batches(
    tmp_path: Path,
) -> None:
    """The fleet's shape (batch 3 on 2 slots per host, slow pages) on two hosts: both ways no
    host ever has more than 2 requests in flight; one batch at a time never has requests of two
    batches in flight at once, fetching ahead does (the slot a batch's tail leaves idle)."""
    peaks, overlaps = {}, {}
    for ahead in (1, 2):
        folder = tmp_path / f"ahead-{ahead}"
        folder.mkdir()
        with CountingSite() as site:
            urls = [site.url(HOSTS[i % 2], i, delay=0.3) for i in range(24)]
            ran = asyncio.run(
                _run(_source(folder, urls), DrainPolicy(batch_size=3, fetch_ahead=ahead))
            )
            assert ran.error is None and ran.summary.balanced, ran.summary.problems
            assert ran.summary.stored == 24
            # the fetch time is the time any batch was fetching: overlapping batches are not
            # counted twice, so it never exceeds the loop's own wall time
            timings = ran.summary.timings_s
            assert 0 < timings["fetch"] <= timings["drain"] + 0.002, timings
            peaks[ahead] = dict(site.peak)
            overlaps[ahead] = _cross_batch_overlaps(site, ran.batch_of)
    for ahead, peak in peaks.items():
        assert set(peak) == set(HOSTS) and max(peak.values()) <= 2, (ahead, peak)
    assert overlaps[1] == 0, overlaps
    assert overlaps[2] > 0, overlaps


# --- the plain reference: one batch at a time ends everything the same -------------------------

KINDS = ("ok", "slow", "missing", "retry_later", "failing", "throttled")


def _url(site: CountingSite, i: int, kind: str) -> str:
    host = HOSTS[i % 2]
    if kind == "slow":
        return site.url(host, i, delay=0.3)
    if kind == "missing":
        return site.url(host, i, status=404)
    if kind == "retry_later":  # 503 twice, then the page
        return site.url(host, i, status=503, times=2)
    if kind == "failing":  # 500 always: dead after its attempts
        return site.url(host, i, status=500, times=-1)
    if kind == "throttled":  # 429 once with Retry-After, then the page
        return site.url(host, i, status=429, retry_after=0.2)
    return site.url(host, i)


def _terminal(ran: Ran, folder: Path, port: int) -> dict[str, Any]:
    """What every item ended as (each run has a server, a port, of its own: not compared)."""
    summary = ran.summary.as_dict()
    rows = sorted(
        json.dumps({k: v for k, v in row.items() if k != "_collector"}, sort_keys=True)
        + row["_collector"]["url"].replace(f":{port}", "")
        for row in sink_lines(folder / "out")
    )
    terms = {t.name: summary[t.name] for t in (*INTAKE_TERMS, *END_TERMS)}
    return {
        "records": rows,
        "letters": [(url.replace(f":{port}", ""), why) for url, why in ran.letters],
        "terms": terms,
        "retried": summary["retried"],
        "requests": summary["requests"],
        "counts": ran.counts,
    }


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=16),
    batch_size=st.integers(1, 5),
)
def test_fetching_ahead_ends_every_item_as_one_batch_at_a_time_does(
    kinds: list[str], batch_size: int
) -> None:
    ends = []
    for ahead in (1, 2):
        with tempfile.TemporaryDirectory() as tmp, CountingSite() as site:
            folder = Path(tmp)
            urls = [_url(site, i, kind) for i, kind in enumerate(kinds)]
            path = _source(
                folder,
                urls,
                # every retry goes back to the queue (none waited inline, none refused by the
                # budget or a breaker): what an item ends as depends on its URL alone
                retry={"base_s": 0.05, "cap_s": 0.1, "max_attempts": 3,
                       "max_inline_delay_s": 0, "budget_min": 10_000},
                limits={"concurrency": 8, "per_domain_concurrency": 2,
                        "circuit": {"enabled": False}},
            )  # fmt: skip
            ran = asyncio.run(_run(path, DrainPolicy(batch_size=batch_size, fetch_ahead=ahead)))
            assert ran.error is None and ran.end is not None and ran.end.ending == "drained"
            assert ran.summary.balanced, ran.summary.problems
            ends.append(_terminal(ran, folder, site.port))
    assert ends[0] == ends[1]


# --- interruptions with two batches in flight --------------------------------------------------


def _two_in_flight(then: Callable[[], None]) -> FetchWrap:
    """A fetch step that calls ``then`` once two fetches run at once."""
    running = 0
    fired = False

    async def wrap(lease: Lease, plain: Callable[[], Awaitable[list[FetchResult]]]) -> Any:
        nonlocal running, fired
        running += 1
        try:
            if running == 2 and not fired:
                fired = True
                then()
            return await plain()
        finally:
            running -= 1

    return wrap


@pytest.mark.parametrize("delay_s", [0.5, 5.0], ids=["answered-in-the-grace", "cut-off"])
def test_a_stop_with_two_batches_in_flight_settles_both_and_gives_the_rest_back(
    tmp_path: Path, delay_s: float
) -> None:
    """Pages answered within the stop's grace are stored; pages that would take longer (5 s,
    past the 2 s grace and before the 3 s request deadline) are cut off in both batches and go
    back unchanged: nothing stored, nothing retried, all queued."""
    stop = StopRequest()
    with CountingSite() as site:
        urls = [site.url(HOSTS[i % 2], i, delay=delay_s) for i in range(40)]
        path = _source(tmp_path, urls)
        policy = DrainPolicy(batch_size=5)
        ran = asyncio.run(
            _run(path, policy, stop=stop, wrap=_two_in_flight(lambda: stop.request("SIGINT")))
        )
        assert ran.end is not None and ran.end.ending == "stopped", ran
        summary = ran.summary
        assert summary.balanced, summary.problems
        assert len(set(ran.batch_of.values())) == 2  # no claim after the stop
        assert (summary.stored > 0) is (delay_s < defaults.STOP_GRACE_S), summary.stored
        assert summary.queued == 40 - summary.stored
        assert summary.retried == 0 and summary.dead_lettered == 0  # a stop is not an attempt
        assert ran.counts.leased == 0 and ran.counts.queued == 40 - summary.stored

        site.delays = False
        rerun = asyncio.run(_run(path, DrainPolicy(batch_size=8), run_id="run-2"))
    assert rerun.summary.balanced, rerun.summary.problems
    rows = sink_lines(tmp_path / "out")
    assert len(rows) == 40 and duplicate_keys(rows) == []


class _Broken(Exception):
    pass


@pytest.mark.parametrize("failing", [1, 2])
def test_a_fetch_that_raises_gives_back_both_batches_in_flight(
    tmp_path: Path, failing: int
) -> None:
    """The first or the second of two batches in flight raises: the run raises it, both leases
    are given back (nothing leased, every item queued or settled), a rerun ends exact."""
    fetches = 0

    async def wrap(lease: Lease, plain: Callable[[], Awaitable[list[FetchResult]]]) -> Any:
        nonlocal fetches
        fetches += 1
        mine = fetches
        if mine != failing:
            return await plain()
        fetching = asyncio.ensure_future(plain())  # its requests go out (the next is claimed)
        try:
            while fetches < 2:  # fails once the other batch is in flight (a backend gave up)
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            raise _Broken(f"batch {mine}")
        finally:
            fetching.cancel()
            await asyncio.gather(fetching, return_exceptions=True)

    with CountingSite() as site:
        urls = [site.url(HOSTS[i % 2], i, delay=0.5) for i in range(20)]
        path = _source(tmp_path, urls)
        ran = asyncio.run(_run(path, DrainPolicy(batch_size=5), wrap=wrap))
        assert isinstance(ran.error, _Broken) and str(ran.error) == f"batch {failing}"
        assert ran.counts.leased == 0
        assert ran.counts.queued + ran.summary.stored == 20
        assert ran.summary.balanced, ran.summary.problems
        rerun = asyncio.run(_run(path, DrainPolicy(batch_size=8), run_id="run-2"))
    assert rerun.summary.balanced, rerun.summary.problems
    rows = sink_lines(tmp_path / "out")
    assert len(rows) == 20 and duplicate_keys(rows) == []


def test_fetch_ahead_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="fetch_ahead must be at least 1"):
        DrainPolicy(fetch_ahead=0)


def test_the_settle_order_is_the_claim_order_when_the_later_batch_is_fetched_first(
    tmp_path: Path,
) -> None:
    """A batch whose pages are slow and the next one quick: the later batch is fetched first,
    but settled (stored and acked) after the earlier one."""
    fetched: list[int] = []
    settled: list[int] = []

    async def wrap(
        lease: Lease, plain: Callable[[], Awaitable[list[FetchResult]]]
    ) -> list[FetchResult]:
        results = await plain()
        fetched.append(lease.token)
        return results

    with CountingSite() as site:
        # the first claim takes items 0 and 2 (host 127.0.0.1's first two): those are slow
        urls = [site.url(HOSTS[i % 2], i, delay=0.6 if i in (0, 2) else 0) for i in range(8)]
        path = _source(tmp_path, urls, limits={"concurrency": 8, "per_domain_concurrency": 4})

        async def scenario() -> None:
            with Collection(load_source(path), run_id="run-1") as run:
                run.plan()
                async with run.engine() as engine:

                    async def fetch(lease: Lease) -> list[FetchResult]:
                        return await wrap(lease, lambda: run.fetch(engine, lease))

                    def listen(event: str, data: dict[str, Any]) -> None:
                        if event == "batch":
                            settled.append(data["report"].token)

                    await drain(run, fetch, DrainPolicy(batch_size=2), listener=listen)
                    await run.aclose()
                run.finish()
                assert run.summary().balanced

        asyncio.run(scenario())
    assert fetched != sorted(fetched), fetched  # a later batch was fetched first
    assert settled == sorted(settled) and len(settled) == 4, settled
    assert len(sink_lines(tmp_path / "out")) == 8


# --- the flow: two fetch-batch tasks at once, through Prefect ----------------------------------


@pytest.mark.parametrize("shared", [False, True], ids=["own-slots", "shared-domain-limits"])
async def test_the_collect_flow_fetches_ahead_through_its_prefect_tasks(
    tmp_path: Path, prefect_api: str, shared: bool
) -> None:
    """The engine's signal reaches it through the ``fetch-batch`` task (two task runs at once):
    requests of two batches are in flight together, never more than 2 per host. With shared
    domain limits (a ``domain:<host>`` limit of 2, made anew) each batch holds its own slots:
    the grants together stay within the limit, and everything is stored exactly once."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectNotFound

    from collector.run.locks import domain_lock_name
    from flows import _locks
    from flows.collect import collect
    from tests.helpers import summary_of

    hosts = HOSTS[1:] if shared else HOSTS
    names = [domain_lock_name(h) for h in hosts] if shared else []
    async with get_client() as client:
        for name in names:
            with contextlib.suppress(ObjectNotFound):
                await client.delete_global_concurrency_limit_by_name(name)
            await client.create_global_concurrency_limit(
                GlobalConcurrencyLimitCreate(name=name, limit=2)
            )
    _locks._limits_seen.clear()
    try:
        with CountingSite() as site:
            urls = [site.url(hosts[i % len(hosts)], i, delay=0.3) for i in range(12)]
            limits: dict[str, Any] = {"concurrency": 8, "per_domain_concurrency": 2}
            if shared:
                limits["shared_domain_concurrency"] = True
            path = _source(tmp_path, urls, limits=limits)
            summary = summary_of(await collect(source=str(path), batch_size=3))
            assert summary["balanced"] and summary["stored"] == 12, summary
            rows = sink_lines(tmp_path / "out")
            assert len(rows) == 12 and duplicate_keys(rows) == []
            batch_of = {r["_collector"]["url"]: r["_collector"]["token"] for r in rows}
            assert max(site.peak.values()) <= 2, site.peak
            if not shared:  # with one host's 2 slots shared, the next batch waits for them
                assert _cross_batch_overlaps(site, batch_of) > 0
    finally:
        async with get_client() as client:
            for name in names:
                await client.delete_global_concurrency_limit_by_name(name)


def test_a_lease_lost_with_two_batches_in_flight_ends_the_run_with_nothing_leased(
    tmp_path: Path,
) -> None:
    """Another holder revokes this run's leases while two batches are fetched (its clock an hour
    ahead): the renewals find them gone, the run stops as for a stop and raises LostFooting;
    nothing stays leased, and a rerun stores every item once."""
    from collector.run.stop import LostFooting
    from tests.test_lost_footing import _revoke_as_jumped_clock

    revoked = False

    async def wrap(lease: Lease, plain: Callable[[], Awaitable[list[FetchResult]]]) -> Any:
        nonlocal revoked
        fetching = asyncio.ensure_future(plain())
        if lease.token == 2 and not revoked:  # the second batch: the first is in flight
            revoked = True
            await asyncio.to_thread(_revoke_as_jumped_clock, holder[0])
        return await fetching

    holder: list[Collection] = []
    with CountingSite() as site:
        urls = [site.url(HOSTS[i % 2], i, delay=0.8) for i in range(20)]
        path = _source(
            tmp_path,
            urls,
            # renewed every second: a renewal meets the revoked leases while they are fetched
            ttl={"http_timeout_s": 1, "request_deadline_s": 1, "batch_timeout_s": 2.5,
                 "lease_s": 3},
        )  # fmt: skip

        async def scenario() -> tuple[BaseException | None, StateCounts]:
            with Collection(load_source(path), run_id="run-1") as run:
                holder.append(run)
                run.plan()
                async with run.engine() as engine:

                    async def fetch(lease: Lease) -> list[FetchResult]:
                        return await wrap(lease, lambda: run.fetch(engine, lease))  # type: ignore[no-any-return]

                    error: BaseException | None = None
                    try:
                        await drain(run, fetch, DrainPolicy(batch_size=5))
                    except LostFooting as lost:
                        error = lost
                    finally:
                        await run.aclose()
                return error, run.frontier.counts(run.source.name)

        error, counts = asyncio.run(scenario())
        assert isinstance(error, LostFooting), error
        assert counts.leased == 0, counts
        site.delays = False
        rerun = asyncio.run(_run(path, DrainPolicy(batch_size=8), run_id="run-2"))
    assert rerun.summary.balanced, rerun.summary.problems
    rows = sink_lines(tmp_path / "out")
    assert len({r["id"] for r in rows}) == 20 and duplicate_keys(rows) == []
