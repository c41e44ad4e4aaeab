"""The seeds' TTL study: freshness TTL 30 / 60 / 120 s against backlog, memory and load.

    .venv/bin/python bench/ttl_study.py [--urls 300] [--capacity 5] [--minutes 20]

The seeds chose their TTL by running one site at TTL 30, 60 and 120 s and reading the backlog,
the queue's memory, the requests and the records refreshed per hour. This is the same study on
a local site (collector.demo.site.FaultSite: ``--urls`` item pages; every 20th answers 503 once,
every 10th is a record of another shape, every 25th is ~4 kB), with Collector's real parts: the
frontier (SQLite file and Redis on a throwaway redis-server, side by side), the plan
(``Frontier.offer`` of every seed, ranked by the planner's priority score with its aging: fresh
ones are skipped, stale ones queued again), claims,
the fetch engine over real HTTP, and acks that make each page fresh for the TTL.

**Simulated time.** The clock the frontier sees is simulated: it advances in ticks of
``--tick`` s (10); each tick plans, then fetches at most ``capacity x tick`` pages (``--capacity``
pages/s: the worker budget), really, as fast as the box goes. ``--minutes`` (20) of simulated
time take about ``requests / (pages/s of this box)`` of real time; hourly figures are the
simulated window's counts x 60 / minutes. A TTL whose demand (urls / TTL pages/s) exceeds the
capacity grows a backlog; one below it idles.

Per TTL and backend it prints: backlog (queued items: mean and at the end, sampled each tick
after fetching) and its bytes (``collector_source_backlog_bytes``' estimate: depth x mean URL
bytes), memory (Redis ``used_memory`` growth without the scripts' reply records, which are
shown apart: they live ``REPLAY_S`` = 600 s of *real* time, so a compressed window keeps all of
them where a real hour keeps the last 10 minutes'; the SQLite file's size), requests per hour,
records refreshed per hour (fetches of a page fetched before), and the mean staleness at
fetch (how long a page had been due when it was fetched again).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from collector.demo.site import FaultSite  # noqa: E402
from collector.fetch.engine import FetchEngine  # noqa: E402
from collector.frontier.base import (  # noqa: E402
    Completed,
    DeadLettered,
    Frontier,
    Offer,
    Outcome,
    RetryLater,
)
from collector.frontier.redis import RedisFrontier  # noqa: E402
from collector.frontier.sqlite import SqliteFrontier  # noqa: E402
from collector.policy.priority import PrioritySettings  # noqa: E402
from collector.policy.retry import RetryBudget, RetrySettings  # noqa: E402
from collector.policy.urls import HostPolicy  # noqa: E402
from tests.servers import RedisServer  # noqa: E402

SOURCE = "ttl-study"
T0 = 1_700_000_000.0
BATCH = 50
TTLS = (30.0, 60.0, 120.0)  # the seeds' three


def seeds(site: FaultSite, n: int) -> list[str]:
    """``n`` item pages with the mess of a real site at a steady share."""
    urls = []
    for i in range(n):
        knobs = []
        if i % 20 == 7:
            knobs.append("status=503&times=1")  # a transient failure, retried inline
        if i % 10 == 3:
            knobs.append("invalid=1")  # another record shape
        if i % 25 == 11:
            knobs.append("bytes=4000")  # a bigger page
        urls.append(site.url(f"/items/{i}.json" + ("?" + "&".join(knobs) if knobs else "")))
    return urls


async def study(
    frontier: Frontier, urls: list[str], *, ttl: float, capacity: float, minutes: float,
    tick: float,
) -> dict[str, Any]:  # fmt: skip
    """One TTL on one frontier, ``minutes`` of simulated time; the counts of the window."""
    retry = RetrySettings(max_attempts=3, base_s=0.01, cap_s=0.05)
    priority = PrioritySettings()  # the planner's score, with its anti-starvation aging
    budget = RetryBudget(ratio=0.5, min_retries=10)
    url_bytes = statistics.fmean(len(u.encode()) for u in urls)
    backlog: list[int] = []
    fetched_at: dict[str, float] = {}
    requests = refreshed = 0
    staleness: list[float] = []
    began = time.monotonic()
    async with FetchEngine(
        retry=retry, host_policy=HostPolicy(allow_private_networks=True), concurrency=16
    ) as engine:
        now = T0
        end = T0 + minutes * 60
        while now < end:

            def rank_for(url: str, age_s: float | None, fresh_s: float, at: float = now) -> float:
                return priority.rank_for(url, enqueued_at=at, age_s=age_s, fresh_s=fresh_s)

            frontier.offer(
                SOURCE, (Offer(u, ttl) for u in urls), now=now, queue_ttl_s=86_400.0,
                rank_for=rank_for, run_id=f"tick-{now:.0f}",
            )  # fmt: skip
            allowance = int(capacity * tick)
            while allowance > 0:
                lease = frontier.claim(SOURCE, min(BATCH, allowance), now=now, lease_s=600.0)
                if not lease.items:
                    break
                allowance -= len(lease.items)
                results = await engine.fetch_batch(list(lease.items), budget=budget)
                outcomes: list[Outcome] = []
                for result in results:
                    if result.status == "ok":
                        if result.url in fetched_at:
                            refreshed += 1
                            staleness.append(now - (fetched_at[result.url] + ttl))
                        fetched_at[result.url] = now
                        outcomes.append(Completed(result.url, now + ttl, now))
                    elif result.decision is not None and result.decision.action == "dead":
                        outcomes.append(DeadLettered(result.url, result.attempts, "dead"))
                    else:
                        outcomes.append(
                            RetryLater(result.url, now + 5.0, 0.0, result.attempts, now, "later")
                        )
                frontier.ack(lease, outcomes, now=now)
            requests = engine.requests_sent
            now += tick
            backlog.append(frontier.counts(SOURCE).queued)
    hour = 60.0 / minutes
    return {
        "ttl_s": ttl,
        "demand_per_s": round(len(urls) / ttl, 2),
        "backlog_mean": round(statistics.fmean(backlog), 1),
        "backlog_end": backlog[-1],
        "backlog_bytes_end": round(backlog[-1] * url_bytes),
        "requests_per_h": round(requests * hour),
        "refreshed_per_h": round(refreshed * hour),
        "staleness_s": round(statistics.fmean(staleness), 1) if staleness else 0.0,
        "real_s": round(time.monotonic() - began, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/ttl_study.py", description=__doc__.splitlines()[0])
    parser.add_argument("--urls", type=int, default=300, help="item pages of the site")
    parser.add_argument("--capacity", type=float, default=5.0, help="pages/s the workers fetch")
    parser.add_argument("--minutes", type=float, default=20.0, help="simulated minutes per TTL")
    parser.add_argument("--tick", type=float, default=10.0, help="simulated seconds per tick")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    with FaultSite() as site, RedisServer() as server, tempfile.TemporaryDirectory() as folder:
        client = redis.Redis.from_url(server.url)
        urls = seeds(site, args.urls)
        for ttl in TTLS:  # both backends per TTL, side by side
            path = Path(folder) / f"frontier-{ttl:.0f}.db"
            sqlite_frontier = SqliteFrontier(path)
            try:
                row = asyncio.run(
                    study(sqlite_frontier, urls, ttl=ttl, capacity=args.capacity,
                          minutes=args.minutes, tick=args.tick)
                )  # fmt: skip
            finally:
                sqlite_frontier.close()
            size = sum(p.stat().st_size for p in Path(folder).glob(f"frontier-{ttl:.0f}.db*"))
            rows.append({"backend": "sqlite", **row, "memory_bytes": size, "reply_bytes": 0})
            client.flushall()
            before = int(client.info("memory")["used_memory"])
            redis_frontier = RedisFrontier(server.url, prefix=f"ttl{ttl:.0f}")
            try:
                row = asyncio.run(
                    study(redis_frontier, urls, ttl=ttl, capacity=args.capacity,
                          minutes=args.minutes, tick=args.tick)
                )  # fmt: skip
                used = int(client.info("memory")["used_memory"]) - before
                replies = sum(
                    int(client.memory_usage(key) or 0)
                    for key in client.scan_iter(match=f"*ttl{ttl:.0f}*:req:*", count=1000)
                )
            finally:
                redis_frontier.close()
            rows.append({"backend": "redis", **row, "memory_bytes": used - replies,
                         "reply_bytes": replies})  # fmt: skip
        client.close()
    if args.json:
        print(json.dumps(rows))
        return 0
    print(
        f"{args.urls} URLs, capacity {args.capacity:g} pages/s, {args.minutes:g} simulated "
        f"minutes per TTL in ticks of {args.tick:g} s (pid {os.getpid()})"
    )
    print(
        "| TTL s | backend | demand pages/s | backlog mean / end | backlog bytes (end) |"
        " memory bytes (+ reply records) | requests/h | records refreshed/h |"
        " staleness at fetch s | real s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    for r in rows:
        print(f"| {r['ttl_s']:g} | {r['backend']} | {r['demand_per_s']} | {r['backlog_mean']} /"
              f" {r['backlog_end']} | {r['backlog_bytes_end']} | {r['memory_bytes']}"
              f" (+ {r['reply_bytes']}) |"
              f" {r['requests_per_h']} | {r['refreshed_per_h']} | {r['staleness_s']} |"
              f" {r['real_s']} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
