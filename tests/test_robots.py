"""robots.txt (collector.fetch.robots): fetched once per host and TTL, obeyed for the User-Agent
the source sends, Crawl-delay as a pace floor, 404 = all allowed, 5xx = the host held back,
refused pages dead-lettered with cause ``robots`` and asked about again by a later plan; shared
through Redis. Against real local servers."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from protego import Protego

from collector.config import Source, load_source
from collector.fetch.engine import FetchEngine, FetchResult
from collector.fetch.robots import classify, origin_of
from collector.frontier.base import ClaimedItem
from collector.policy.retry import RetryBudget
from collector.run.collection import Collection
from collector.run.summary import RunSummary
from tests.helpers import drain_in_process, write_source
from tests.robots_site import RobotsSite

RULES = """
User-agent: *
Disallow: /p/private/
Disallow: /*.bak$
Allow: /p/private/open

User-agent: pickybot
Disallow: /p/
"""


def _source(tmp_path: Path, site: RobotsSite, paths: list[str], **politeness: Any) -> Path:
    return write_source(
        tmp_path,
        name="robots",
        seeds={"urls": [site.url(p) for p in paths]},
        politeness=politeness,
        limits={"concurrency": 8, "per_domain_concurrency": 8},
    )


async def _fetch(
    source: Source, paths: list[str], site: RobotsSite, **kw: Any
) -> list[FetchResult]:
    async with FetchEngine.for_source(source, **kw) as engine:
        items = [ClaimedItem(site.url(p), 0, None, 0.0) for p in paths]
        return await engine.fetch_batch(items, budget=RetryBudget(ratio=1.0, min_retries=10))


# --- the parts, plainly ------------------------------------------------------------------------
def test_what_each_answer_means() -> None:
    assert classify(200, b"Disallow: /", 1.0).kind == "rules"
    assert [classify(s, b"", 1.0).kind for s in (401, 403, 404, 410)] == ["allow_all"] * 4
    assert [classify(s, b"", 1.0).kind for s in (429, 500, 503)] == ["unreachable"] * 3
    assert classify(None, b"", 1.0).kind == "no_answer"
    assert origin_of("HTTP://User:pw@Example.ORG:8080/a?b#c") == "http://example.org:8080"


@settings(max_examples=25, deadline=None)
@given(
    paths=st.lists(
        st.tuples(
            st.sampled_from(["/p/", "/p/private/", "/p/private/open", "/x/"]),
            st.text(st.sampled_from("ab/*$=-"), max_size=8),
            st.sampled_from(["", ".bak", "?q=.bak", ".bak?x=1"]),
        ).map("".join),
        min_size=1,
        max_size=12,
    ),
    agent=st.sampled_from(["collector/0.1", "pickybot/2.0", "other"]),
)
def test_the_engine_obeys_what_protego_reads(paths: list[str], agent: str) -> None:
    """The engine's verdict per URL is Protego's own reading of the same file (the reference),
    and a refused page is never requested."""
    with RobotsSite() as site, tempfile.TemporaryDirectory(prefix="collector-robots-") as tmp:
        site.robots = (200, RULES)
        source = load_source(_source(Path(tmp), site, paths))
        headers = {"User-Agent": agent}
        source = source.model_copy(
            update={"limits": source.limits.model_copy(update={"headers": headers})}
        )
        results = asyncio.run(_fetch(source, paths, site))
        reference = Protego.parse(RULES)
        for path, result in zip(paths, results, strict=True):
            allowed = reference.can_fetch(site.url(path), agent)
            refused = result.error is not None and result.error.error_class == "robots"
            assert refused == (not allowed), (path, agent, result.error)
            if not allowed:
                assert result.error is not None and result.error.error_class == "robots"
                assert result.decision is not None and result.decision.cause == "robots"
        requested = {p for _, p, _, _ in site.log if p != "/robots.txt"}
        assert requested == {p for p in paths if reference.can_fetch(site.url(p), agent)}
        assert site.paths("/robots.txt") == ["/robots.txt"]  # once for the whole batch
        assert {a for _, p, a, _ in site.log if p.startswith("/p/")} <= {agent}


def test_no_robots_txt_costs_one_request_and_changes_nothing(tmp_path: Path) -> None:
    with RobotsSite() as site:
        paths = [f"/p/{i}" for i in range(40)]
        source = load_source(_source(tmp_path, site, paths))
        results = asyncio.run(_fetch(source, paths, site))
        assert [r.status for r in results] == ["ok"] * 40
        assert site.paths("/robots.txt") == ["/robots.txt"]
        assert len(site.paths("/p/")) == 40


def test_ignore_never_asks(tmp_path: Path) -> None:
    with RobotsSite() as site:
        site.robots = (200, "User-agent: *\nDisallow: /\n")
        source = load_source(_source(tmp_path, site, ["/p/1"], robots="ignore"))
        (result,) = asyncio.run(_fetch(source, ["/p/1"], site))
        assert result.status == "ok" and site.paths("/robots.txt") == []


def test_a_failing_robots_txt_holds_the_host_back(tmp_path: Path) -> None:
    with RobotsSite() as site:
        site.robots = (503, "busy")
        source = load_source(_source(tmp_path, site, ["/p/1", "/p/2"], robots_unreachable_s=60))
        results = asyncio.run(_fetch(source, ["/p/1", "/p/2"], site))
        for result in results:
            assert result.status == "failed" and result.decision is not None
            assert (result.decision.action, result.decision.reason) == (
                "later",
                "robots_unreachable",
            )
            assert 50 < result.decision.delay_s <= 60
            assert result.attempts == 0  # no page request: not an attempt
        assert site.paths("/p/") == [] and site.paths("/robots.txt") == ["/robots.txt"]


def test_crawl_delay_is_a_floor_under_the_pace(tmp_path: Path) -> None:
    with RobotsSite() as site:
        site.robots = (200, "User-agent: *\nCrawl-delay: 0.25\n")
        paths = [f"/p/{i}" for i in range(5)]
        source = load_source(_source(tmp_path, site, paths))
        results = asyncio.run(_fetch(source, paths, site))
        assert [r.status for r in results] == ["ok"] * 5
        sent = sorted(t for t, p, _, _ in site.log if p.startswith("/p/"))
        # arrival gaps: the send slots are 0.25 s apart; the server's clock may see them a
        # little closer (network jitter), never much closer
        assert all(b - a > 0.2 for a, b in pairwise(sent)), sent


def test_workers_share_one_fetch_through_redis(tmp_path: Path, redis_url: str) -> None:
    with RobotsSite() as site:
        site.robots = (200, "User-agent: *\nDisallow: /p/no\n")
        source = load_source(_source(tmp_path, site, ["/p/yes", "/p/no"]))
        for _ in range(3):  # three engines (workers), one robots.txt request
            results = asyncio.run(_fetch(source, ["/p/yes", "/p/no"], site,
                                         circuit_storage_uri=redis_url))  # fmt: skip
            assert [r.status for r in results] == ["ok", "failed"]
        assert site.paths("/robots.txt") == ["/robots.txt"]


# --- whole runs --------------------------------------------------------------------------------
async def _run(path: Path, run_id: str, clock: Callable[[], float]) -> RunSummary:
    with Collection(load_source(path), run_id=run_id, clock=clock) as run:
        run.plan()
        await drain_in_process(run, batch_size=6)
        run.finish()
        return run.summary()


def test_refused_pages_are_dead_letters_asked_about_again_later(tmp_path: Path) -> None:
    with RobotsSite() as site:
        site.robots = (200, RULES)
        paths = [f"/p/{i}" for i in range(15)] + ["/p/private/a", "/p/private/b", "/p/x.bak"]
        path = _source(tmp_path, site, paths, robots_ttl_s=3600)
        first = asyncio.run(_run(path, "r1", time.time))
        assert first.balanced, first.problems
        assert (first.stored, first.dead_lettered) == (15, 3)
        assert first.deadletter_reasons == {"fetch/robots:robots": 3}
        assert not set(site.paths("/p/")) & {"/p/private/a", "/p/private/b", "/p/x.bak"}

        _triage(path)  # leaves them open: not for a person, a plan asks robots.txt again

        soon = asyncio.run(_run(path, "r2", lambda: time.time() + 60))  # within the TTL
        assert soon.balanced and soon.discovered == 0  # nothing due, nothing asked again

        site.robots = (200, "User-agent: *\nDisallow: /p/private/b\n")  # the site changed
        later = asyncio.run(_run(path, "r3", lambda: time.time() + 7200))
        assert later.balanced, later.problems
        assert later.discovered == 18 and later.stored == 17  # 15 stale + 2 allowed now
        assert later.dead_lettered == 1  # still refused: the same entry, seen again
        assert later.deadletter_reasons == {"fetch/robots:robots": 1}
        assert "/p/private/a" in site.paths("/p/") and "/p/private/b" not in site.paths("/p/")


def _triage(path: Path) -> None:
    from collector.backends import open_deadletters, open_frontier
    from collector.deadletter.archive import JsonlArchive
    from collector.recovery.triage import Triage
    from collector.sinks.jsonl import JsonlSink

    source = load_source(path)
    with open_deadletters(source) as store, open_frontier(source) as frontier:
        sink = JsonlSink(source.sink_path, source=source.name)
        try:
            report = Triage(
                source,
                store=store,
                archive=JsonlArchive(source.deadletter_archive_path),
                frontier=frontier,
                sink=sink,
                run_id="triage-1",
            ).run()
        finally:
            sink.close()
        assert report.counts().get("escalated", 0) == 0
        assert store.counts(source.name).get("open") == 3


async def test_a_cancelled_fetch_does_not_fail_the_pages_waiting_for_it() -> None:
    """The first page of a host fetches robots.txt and the others wait for it; when that page's
    task is cancelled (a stop, the batch's cut-off), a waiting page fetches for itself."""
    from collector.fetch.robots import Robots

    calls: list[str] = []
    first_started = asyncio.Event()

    async def fetch(url: str) -> tuple[int | None, bytes]:
        calls.append(url)
        if len(calls) == 1:
            first_started.set()
            await asyncio.sleep(3600)  # never answers: cancelled below
        return 200, b"User-agent: *\nDisallow: /no\n"

    robots = Robots(user_agent="collector", ttl_s=60, unreachable_s=60, fetch=fetch)
    first = asyncio.create_task(robots.verdict("http://h/yes"))
    await first_started.wait()
    second = asyncio.create_task(robots.verdict("http://h/no"))
    await asyncio.sleep(0.01)
    first.cancel()
    verdict = await asyncio.wait_for(second, 5)
    assert not verdict.allowed and "disallowed" in verdict.why
    assert first.cancelled() and calls == ["http://h/robots.txt"] * 2
    assert (await robots.verdict("http://h/yes")).allowed and len(calls) == 2  # kept for the TTL
