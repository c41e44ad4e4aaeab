"""The seeds' TTL study: freshness TTL 30 / 60 / 120 s against pile-up, backlog, memory, load.

    .venv/bin/python bench/ttl_study.py [--urls 300] [--loads 0.5,1,1.5,2,2.5,3,4] [--minutes 20]

The seeds chose their TTL by running one site at TTL 30, 60 and 120 s and reading the backlog,
the queue's memory, the requests and the records refreshed per hour. This is the same study on
a local site (collector.demo.site.FaultSite: ``--urls`` item pages; every 20th answers 503 once,
every 10th is a record of another shape, every 25th is ~4 kB), with Collector's real parts: the
frontier (SQLite file and Redis on a throwaway redis-server, side by side), the plan
(``Frontier.offer`` of every seed, ranked by the planner's priority score with its aging: fresh
ones are skipped, stale ones queued again), claims,
the fetch engine over real HTTP, and acks that make each page fresh for the TTL.

**Simulated time.** The clock the frontier sees is simulated: it advances in ticks of
``--tick`` s (10); each tick plans, then fetches at most ``capacity x tick`` pages (the worker
budget), really, as fast as the box goes. **Load against capacity is swept**: each of
``--loads`` is TTL 60's demand over the capacity (``urls / 60`` pages/s over ``capacity``), so
load 2 gives TTL 30 four times the capacity's demand, TTL 60 twice and TTL 120 once.
``--minutes`` (20) of simulated time take about ``requests / (pages/s of this box)`` of real
time; hourly figures are the simulated window's counts x 60 / minutes. A TTL whose demand
(urls / TTL pages/s) exceeds the capacity grows a backlog; one below it idles.

**Pile-up** (the seeds' figure, see :func:`pile_up`): of the items due at a tick's plan (queued
after it), the share still queued when the next tick comes, summed over the ticks after the
first TTL (the cold start, when every page is new, is left out).

Per load, TTL and backend it prints: pile-up, backlog (queued items: mean and at the end, sampled
each tick after fetching) and its bytes (``collector_source_backlog_bytes``' estimate: depth x mean
URL bytes), memory (Redis ``used_memory`` growth without the scripts' reply records, which are
shown apart: they live ``REPLAY_S`` = 600 s of *real* time, so a compressed window keeps all of
them where a real hour keeps the last 10 minutes'; the SQLite file's size), requests per hour,
records refreshed per hour (fetches of a page fetched before), and the mean staleness at fetch (how
long a page had been due when it was fetched again).

Then the seed's line beside ours per load: differences in points, ratios, and the shape.
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
# Seed 000 (sections 2.5 and 4.4), as quoted in the project's issue tracker (the seed documents
# are not on this machine): the share of work piled up at TTL 30 / 60 / 120 s.
SEED_PILE_UP = {30.0: 0.824, 60.0: 0.411, 120.0: 0.186}


def pile_up(ticks: Sequence[tuple[int, int]]) -> float:
    """The seeds' pile-up over ``(due, left)`` per tick: the work due at a tick's plan that is
    still queued when the next tick comes, over the work due (0 when nothing was due)."""
    due = sum(d for d, _ in ticks)
    return sum(left for _, left in ticks) / due if due else 0.0


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
    ticks: list[tuple[int, int]] = []  # (due after the plan, still queued at the next tick)
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
            due = frontier.counts(SOURCE).queued
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
            left = frontier.counts(SOURCE).queued  # nothing changes it before the next plan
            if now >= T0 + ttl:  # past the cold start
                ticks.append((due, left))
            now += tick
            backlog.append(left)
    hour = 60.0 / minutes
    return {
        "ttl_s": ttl,
        "capacity_per_s": round(capacity, 3),
        "demand_per_s": round(len(urls) / ttl, 2),
        "pile_up": round(pile_up(ticks), 4),
        "ticks": ticks,
        "backlog_mean": round(statistics.fmean(backlog), 1),
        "backlog_end": backlog[-1],
        "backlog_bytes_end": round(backlog[-1] * url_bytes),
        "requests_per_h": round(requests * hour),
        "refreshed_per_h": round(refreshed * hour),
        "staleness_s": round(statistics.fmean(staleness), 1) if staleness else 0.0,
        "real_s": round(time.monotonic() - began, 1),
    }


def run_cell(
    backend: str, where: str, urls: list[str], *, ttl: float, capacity: float, minutes: float,
    tick: float, client: redis.Redis | None, tag: str,
) -> dict[str, Any]:  # fmt: skip
    """One TTL at one capacity on one backend, with the memory it took."""
    if backend == "sqlite":
        path = Path(where) / f"frontier-{tag}.db"
        sqlite_frontier = SqliteFrontier(path)
        try:
            row = asyncio.run(study(sqlite_frontier, urls, ttl=ttl, capacity=capacity,
                                    minutes=minutes, tick=tick))  # fmt: skip
        finally:
            sqlite_frontier.close()
        size = sum(p.stat().st_size for p in Path(where).glob(f"frontier-{tag}.db*"))
        return {"backend": "sqlite", **row, "memory_bytes": size, "reply_bytes": 0}
    assert client is not None
    client.flushall()
    before = int(client.info("memory")["used_memory"])
    redis_frontier = RedisFrontier(where, prefix=f"ttl{tag}")
    try:
        row = asyncio.run(study(redis_frontier, urls, ttl=ttl, capacity=capacity,
                                minutes=minutes, tick=tick))  # fmt: skip
        used = int(client.info("memory")["used_memory"]) - before
        replies = sum(
            int(client.memory_usage(key) or 0)
            for key in client.scan_iter(match=f"*ttl{tag}*:req:*", count=1000)
        )
    finally:
        redis_frontier.close()
    return {"backend": "redis", **row, "memory_bytes": used - replies, "reply_bytes": replies}


def seed_table(rows: list[dict[str, Any]]) -> list[str]:
    """Per load, pile-up at TTL 30 / 60 / 120 beside the seed's line: differences in
    percentage points, ratios to the seed's, and the shape (30 over 60, 60 over 120)."""
    lines = [
        "| load (TTL 60 demand / capacity) | backend | pile-up % at TTL 30 / 60 / 120 |"
        " minus the seed's, points | over the seed's | TTL 30/60, 60/120 (seed 2.00, 2.21) |",
        "|---|---|---|---|---|---|",
    ]
    seed = [SEED_PILE_UP[t] for t in TTLS]
    lines.append(f"| seed 000 | - | {' / '.join(f'{v * 100:.1f}' for v in seed)} | - | - |"
                 f" {seed[0] / seed[1]:.2f}, {seed[1] / seed[2]:.2f} |")  # fmt: skip
    cells = {(r["load"], r["backend"], r["ttl_s"]): r["pile_up"] for r in rows}
    for load, backend in dict.fromkeys((r["load"], r["backend"]) for r in rows):
        ours = [cells[(load, backend, t)] for t in TTLS]

        def ratio(a: float, b: float) -> str:
            return f"{a / b:.2f}" if b else "-"

        lines.append(
            f"| {load:g} | {backend} | {' / '.join(f'{v * 100:.1f}' for v in ours)} |"
            f" {' / '.join(f'{(v - w) * 100:+.1f}' for v, w in zip(ours, seed, strict=True))} |"
            f" {' / '.join(ratio(v, w) for v, w in zip(ours, seed, strict=True))} |"
            f" {ratio(ours[0], ours[1])}, {ratio(ours[1], ours[2])} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/ttl_study.py", description=__doc__.splitlines()[0])
    parser.add_argument("--urls", type=int, default=300, help="item pages of the site")
    parser.add_argument(
        "--loads", default="0.5,1,1.5,2,2.5,3,4", help="TTL 60's demand (urls / 60) over capacity"
    )
    parser.add_argument("--minutes", type=float, default=20.0, help="simulated minutes per TTL")
    parser.add_argument("--tick", type=float, default=10.0, help="simulated seconds per tick")
    parser.add_argument("--backends", default="sqlite,redis")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    loads = [float(x) for x in args.loads.split(",")]
    backends = args.backends.split(",")
    if bad := [b for b in backends if b not in ("sqlite", "redis")]:
        parser.error(f"--backends: {bad[0]!r} is not sqlite or redis")
    rows: list[dict[str, Any]] = []
    began = time.monotonic()
    load_avg = os.getloadavg()
    with FaultSite() as site, RedisServer() as server, tempfile.TemporaryDirectory() as folder:
        client = redis.Redis.from_url(server.url)
        urls = seeds(site, args.urls)
        for load in loads:
            capacity = args.urls / 60.0 / load
            for ttl in TTLS:  # the backends side by side per cell
                for backend in backends:
                    tag = f"{load:g}-{ttl:.0f}"
                    row = run_cell(
                        backend, folder if backend == "sqlite" else server.url, urls, ttl=ttl,
                        capacity=capacity, minutes=args.minutes, tick=args.tick, client=client,
                        tag=tag,
                    )  # fmt: skip
                    rows.append({"load": load, **row})
        client.close()
    if args.json:
        print(json.dumps(rows))
        return 0
    print(
        f"{args.urls} URLs, loads {args.loads} (TTL 60's demand over capacity), {args.minutes:g}"
        f" simulated minutes per cell in ticks of {args.tick:g} s; {time.monotonic() - began:.0f}"
        f" s, load average {load_avg[0]:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    print(
        "| load | TTL s | backend | capacity / demand pages/s | pile-up % | backlog mean / end |"
        " backlog bytes (end) | memory bytes (+ reply records) | requests/h |"
        " records refreshed/h | staleness at fetch s | real s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    for r in rows:
        print(f"| {r['load']:g} | {r['ttl_s']:g} | {r['backend']} | {r['capacity_per_s']:g} /"
              f" {r['demand_per_s']:g} | {r['pile_up'] * 100:.1f} | {r['backlog_mean']} /"
              f" {r['backlog_end']} | {r['backlog_bytes_end']} | {r['memory_bytes']}"
              f" (+ {r['reply_bytes']}) |"
              f" {r['requests_per_h']} | {r['refreshed_per_h']} | {r['staleness_s']} |"
              f" {r['real_s']} |")  # fmt: skip
    print()
    print("\n".join(seed_table(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
