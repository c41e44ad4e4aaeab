"""Freshness per request: fixed TTLs, a Nutch-style adaptive schedule and Collector's
``ttl.revisit: adaptive`` (collector.policy.revisit_budget), for one request budget, simulated.

A site of PAGES pages whose pages change at different rates: hourly and daily (Poisson), never,
and bursty (quiet for days, then changing every few minutes for a couple of hours). Each policy
fetches at most BUDGET pages an hour, the most overdue first; a fetch copies the live version.
Every hour of simulated time the share of pages whose copy is the live version is sampled; the
figure is its mean over the run, and freshness per request is that mean over the requests sent
per page and day. Fetches of a page that had not changed are what a conditional request turns
into a 304: counted, with the bytes a 304 saves (headers only, measured against nginx:
docs/revisits.md).

Policies:
- fixed: every page every PAGES / BUDGET hours (what ttl.default_fresh_s does);
- nutch: Nutch's AdaptiveFetchSchedule (interval x 1.4 when unchanged, x 0.8 when changed,
  within [MIN_S, MAX_S]);
- collector: ``ttl.revisit: adaptive`` as a run settles a page: the same
  ``RevisitSchedule.settled`` the settle step calls (collector.settle.outcomes.scheduled), with
  the source's TTL and priority settings (a priority rule per weight), fed each fetch's time and
  whether the page changed; the interval it returns is the page's until its next fetch.

    .venv/bin/python bench/freshness.py [--pages 10000] [--days 14] [--budget 420]
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collector.frontier.base import PageHistory
from collector.policy.priority import PriorityRule, PrioritySettings
from collector.policy.revisit_budget import RevisitSchedule
from collector.policy.ttl import TTLSettings

HOUR, DAY = 3_600.0, 86_400.0
MIN_S, MAX_S = 600.0, 7 * DAY
BODY_BYTES, HEADER_BYTES, NOT_MODIFIED_BYTES = 2_000, 238, 174  # nginx: 200 = headers + body
FIXED_SHARES = (1.0, 0.75, 0.5, 0.35)  # the fixed TTL at these shares of the budget: its curve


@dataclass
class Page:
    kind: str
    weight: float
    changes: list[float]  # change times (simulated seconds)
    stored: int = -1  # version held (number of changes up to the fetch), -1: never fetched
    last_fetch: float | None = None
    interval: float = DAY
    due: float = 0.0
    url: str = ""
    history: PageHistory | None = None

    def version(self, t: float) -> int:
        return bisect.bisect_right(self.changes, t)


def make_site(pages: int, days: int, rng: random.Random) -> list[Page]:
    horizon = days * DAY
    site: list[Page] = []
    for _ in range(pages):
        roll = rng.random()
        changes: list[float] = []
        if roll < 0.2:
            kind, rate = "hourly", 1 / HOUR
        elif roll < 0.5:
            kind, rate = "daily", 1 / DAY
        elif roll < 0.8:
            kind, rate = "never", 0.0
        else:
            kind, rate = "bursty", 0.0
        if rate:
            t = rng.expovariate(rate)
            while t < horizon:
                changes.append(t)
                t += rng.expovariate(rate)
        elif kind == "bursty":
            t = rng.expovariate(1 / (2 * DAY))
            while t < horizon:
                end = t + rng.expovariate(1 / (2 * HOUR))
                while t < min(end, horizon):
                    changes.append(t)
                    t += rng.expovariate(1 / 600)
                t = end + rng.expovariate(1 / (2 * DAY))
        weight = rng.randint(1, 10)
        page = Page(kind, float(weight), changes, url=f"https://site.test/w{weight}/{len(site)}")
        page.due = rng.uniform(0, 1e-3)  # all due at once, in a random order
        site.append(page)
    return site


@dataclass
class Result:
    freshness: float
    requests: int
    unchanged_fetches: int
    weighted_freshness: float

    def per_request(self, pages: int, days: int) -> float:
        per_page_day = self.requests / pages / days
        return self.freshness / per_page_day if per_page_day else 0.0


def simulate(
    site: list[Page],
    *,
    days: int,
    budget_per_h: int,
    after_fetch: Callable[[Page, float, float | None, bool], None],
) -> Result:
    horizon = days * DAY
    queue = [(p.due, i) for i, p in enumerate(site)]
    heapq.heapify(queue)
    requests = unchanged = 0
    samples: list[float] = []
    weighted: list[float] = []
    total_weight = sum(p.weight for p in site)
    hour = 0
    while hour * HOUR < horizon:
        start = hour * HOUR
        sent = 0
        while queue and sent < budget_per_h and queue[0][0] <= start + HOUR:
            due, i = heapq.heappop(queue)
            page = site[i]
            if abs(due - page.due) > 1e-6:
                continue  # rescheduled since
            t = max(due, start + sent * HOUR / budget_per_h)
            live = page.version(t)
            changed = live != page.stored
            if page.stored >= 0 and not changed:
                unchanged += 1
            after_fetch(page, t, None if page.last_fetch is None else t - page.last_fetch, changed)
            page.stored, page.last_fetch = live, t
            page.due = t + page.interval
            heapq.heappush(queue, (page.due, i))
            requests += 1
            sent += 1
        hour += 1
        now = hour * HOUR
        fresh = [p.stored == p.version(now) for p in site]
        samples.append(sum(fresh) / len(site))
        weighted.append(
            sum(p.weight for p, ok in zip(site, fresh, strict=True) if ok) / total_weight
        )
    return Result(sum(samples) / len(samples), requests, unchanged, sum(weighted) / len(weighted))


def fixed(site: list[Page], days: int, budget: int) -> Result:
    interval = len(site) / budget * HOUR
    for p in site:
        p.interval = interval
    return simulate(site, days=days, budget_per_h=budget, after_fetch=lambda p, t, dt, c: None)


def nutch(site: list[Page], days: int, budget: int) -> Result:
    start = len(site) / budget * HOUR
    for p in site:
        p.interval = start

    def adapt(page: Page, t: float, dt: float | None, changed: bool) -> None:
        if dt is None:
            return
        factor = 0.8 if changed else 1.4
        page.interval = min(max(page.interval * factor, MIN_S), MAX_S)

    return simulate(site, days=days, budget_per_h=budget, after_fetch=adapt)


def collector(site: list[Page], days: int, budget: int, min_gain_s: float = 0.0) -> Result:
    start = len(site) / budget * HOUR
    schedule = RevisitSchedule(
        TTLSettings(
            default_fresh_s=start,
            revisit="adaptive",
            budget_per_hour=budget * 0.98,  # the simulator sends at most the budget: a margin
            min_fresh_s=MIN_S,
            max_fresh_s=MAX_S,
            min_gain_s=min_gain_s,
        ),
        PrioritySettings(
            rules=tuple(
                PriorityRule(prefix=f"https://site.test/w{w}/", weight=w) for w in range(1, 11)
            )
        ),
    )
    for p in site:
        p.interval = start

    def settled(page: Page, t: float, dt: float | None, changed: bool) -> None:
        page.interval, page.history = schedule.settled(
            page.url, page.history, at=t, changed=changed
        )

    result = simulate(site, days=days, budget_per_h=budget, after_fetch=settled)
    assert schedule.budget is not None
    solves, classes = schedule.budget.solves, len(schedule.budget.counts)
    print(f"  (collector: {solves} budget solves, {classes} classes at the end)")
    return result


def requests_for(curve: list[tuple[int, float]], target: float) -> float | None:
    """Requests the fixed TTL needs for ``target`` weighted freshness, read off its curve
    (requests, freshness) by linear interpolation; None above its best point."""
    points = sorted(curve)
    for (r0, f0), (r1, f1) in pairwise(points):
        if f0 <= target <= f1 and f1 > f0:
            return r0 + (target - f0) / (f1 - f0) * (r1 - r0)
    if points and target <= points[0][1]:
        return points[0][0] * target / points[0][1]  # below the curve: as if proportional
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=10_000)
    parser.add_argument("--days", type=int, default=14)
    parser.add_argument("--budget", type=int, default=420, help="requests per hour")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--gains", default="0,28800,43200,64800", help="collector's ttl.min_gain_s values (seconds)"
    )
    args = parser.parse_args()
    runs: list[tuple[str, Callable[[list[Page]], Result]]] = [
        (f"fixed {share:.0%}", partial(_fixed_at, days=args.days, budget=args.budget, share=share))
        for share in FIXED_SHARES
    ]
    runs.append(("nutch", lambda site: nutch(site, args.days, args.budget)))
    for gain in (float(g) for g in args.gains.split(",")):
        label = f"collector {gain / HOUR:g} h" if gain else "collector"
        runs.append(
            (label, partial(collector, days=args.days, budget=args.budget, min_gain_s=gain))
        )
    rows = []
    for name, policy in runs:
        site = make_site(args.pages, args.days, random.Random(args.seed))
        began = time.process_time()
        result = policy(site)
        rows.append((name, result, time.process_time() - began))
    base = rows[0][1]  # fixed at the whole budget
    curve = [(r.requests, r.weighted_freshness) for name, r, _ in rows if name.startswith("fixed")]
    print(f"{args.pages} pages, {args.days} days, budget {args.budget} requests/hour (simulated)")
    print(
        "policy            freshness  weighted  requests  fresh/req x fixed  fixed needs  x fewer"
        "  unchanged fetches (304s)  bytes saved  cpu s"
    )
    for name, r, cpu in rows:
        per = r.per_request(args.pages, args.days) / base.per_request(args.pages, args.days)
        needs = requests_for(curve, r.weighted_freshness)
        needed = f"{needs:11.0f}  {needs / r.requests:7.2f}" if needs else "  (above)        -"
        saved = r.unchanged_fetches * (HEADER_BYTES + BODY_BYTES - NOT_MODIFIED_BYTES)
        share = r.unchanged_fetches / r.requests if r.requests else 0.0
        print(
            f"{name:17} {r.freshness:9.3f} {r.weighted_freshness:9.3f} {r.requests:9d} "
            f"{per:15.2f}  {needed}  {r.unchanged_fetches:8d} ({share:5.1%})"
            f"          {saved / 1e6:7.1f} MB  {cpu:5.1f}"
        )
    print(
        "fixed needs: the requests a fixed TTL needs for the row's weighted freshness (read off"
        " the fixed rows); x fewer: that over the row's requests"
    )


def _fixed_at(site: list[Page], *, days: int, budget: int, share: float) -> Result:
    """The fixed TTL spending ``share`` of the budget (a longer TTL): a point of its curve."""
    return fixed(site, days, max(1, round(budget * share)))


if __name__ == "__main__":
    main()
