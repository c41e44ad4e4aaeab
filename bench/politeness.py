"""Politeness: host profiles, each a real local server, fetched side by side.

    .venv/bin/python bench/politeness.py [fast|slow|noise|bucket|pool|outage|mix|all] [--quick]

Each profile is a real aiohttp server in a process of its own (tests/politeness_site.py) on
127.0.0.x, fetched by the real engine (collector.fetch.engine) in three ways, one after the
other in the same run, so the box's load weighs on each: a sweep of fixed windows
(``adaptive: false``), the adaptive defaults, and Scrapy's AutoThrottle (a faithful port of its
delay formula, scrapy 2.19 ``scrapy/extensions/throttle.py`` with its defaults: start delay 5 s,
target concurrency 1, max delay 60 s, per-domain concurrency 8, a +-50 % jitter on the delay;
it drives the same engine, whose retry policy also serves it). Ratios are printed:

* ``fast``: a healthy fast host. adaptive / best fixed pages/s (goal >= 0.9);
* ``slow``: a healthy slow host (100-300 ms a page). adaptive / best fixed (>= 0.9);
* ``noise``: a fast host where 6 % of requests, at random and at any rate, answer 503 or 429
  (a quarter of them with Retry-After: 1). adaptive / best fixed (>= 0.9);
* ``bucket``: a token bucket of 100/s that answers 429 above it, without and with Retry-After.
  pages/s after warm-up (the first third) / the bucket's rate (>= 0.9), and the share of 429s
  after warm-up (<= 2 %);
* ``pool``: 8 workers of 50 ms each (max goodput 160/s, latency floor 50 ms): adaptive pages/s
  / the pool's max (>= 0.8) at a mean latency / its floor (<= 2);
* ``outage``: a host down for 20 s (``--quick``: 5 s) once a quarter of the items are stored:
  the circuit breaker vs none (requests sent while down, dead letters: none for the outage);
* ``mix``: a fast and a slow healthy host and a bucket of 20/s in one batch, with
  ``concurrency`` 96 (room for each host's ceiling of 32) and 32 (the default, shared): each
  healthy host's pages/s in the mix / alone at the same concurrency (>= 0.9). Lent first
  come, first served, 32 shared clients went to the slow host's 200 ms requests and the fast
  host got 0.11x its rate alone; they are lent fewest-held first now (fetch/sharing.py).

The load average is printed: this box is shared, read ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collector.config import AdaptiveSettings, load_source  # noqa: E402
from collector.fetch.adaptive import HostGate, Signal  # noqa: E402
from collector.fetch.engine import FetchEngine  # noqa: E402
from collector.frontier.base import ClaimedItem  # noqa: E402
from collector.policy.retry import RetryBudget, RetrySettings  # noqa: E402
from collector.policy.urls import HostPolicy  # noqa: E402
from collector.run.collection import Collection  # noqa: E402
from tests.helpers import write_source  # noqa: E402
from tests.politeness_site import PolitenessSite, SiteProcess  # noqa: E402


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class _AutoThrottleGate(HostGate):
    """Scrapy's AutoThrottle on the engine's gate: at most ``ceiling`` in flight (Scrapy's
    CONCURRENT_REQUESTS_PER_DOMAIN, 8) and one send per ``delay`` x uniform(0.5, 1.5); each 200
    moves the delay as scrapy/extensions/throttle.py ``_adjust_delay`` does (target = latency /
    1.0; new = max(target, (delay + target) / 2), within [0, 60]); any other answer may only
    raise it, and the engine reports no latency for errors, so it never does (as in Scrapy for
    quick error pages)."""

    def __init__(self, ceiling: int) -> None:
        super().__init__(ceiling, None)
        self.delay = 5.0  # AUTOTHROTTLE_START_DELAY
        self._last = -math.inf
        self._jitter = random.Random(25)

    async def acquire(self) -> bool:
        await super().acquire()
        try:
            while (wait := self._last + self.delay * self._jitter.uniform(0.5, 1.5)) > (
                now := time.monotonic()
            ):
                await asyncio.sleep(wait - now)
        except asyncio.CancelledError:
            self.release()
            raise
        self._last = time.monotonic()
        return False

    def observe(
        self,
        signal: Signal,
        *,
        sent_at: float,
        latency_s: float,
        paced: bool,
        url: str | None = None,
        raw_latency_s: float | None = None,
    ) -> None:
        target = latency_s / 1.0
        new = min(max(0.0, max(target, (self.delay + target) / 2)), 60.0)
        if signal != "ok" and new <= self.delay:
            return
        self.delay = new


class _AutoThrottleEngine(FetchEngine):
    def _new_gate(self) -> HostGate:
        return _AutoThrottleGate(self.per_domain_concurrency)


def _engine(per_domain: int, adaptive: bool, *, concurrency: int = 32) -> FetchEngine:
    return FetchEngine(
        retry=RetrySettings(base_s=0.05, cap_s=0.5, max_attempts=100, max_total_s=3600),
        host_policy=HostPolicy(allow_private_networks=True),
        concurrency=max(concurrency, per_domain),
        per_domain_concurrency=per_domain,
        adaptive=AdaptiveSettings() if adaptive else None,
    )


def _make(mode: str, concurrency: int = 32) -> FetchEngine:
    """``fixed-N``, ``adaptive`` (ceiling 32) or ``autothrottle`` (8 per domain)."""
    if mode == "autothrottle":
        return _AutoThrottleEngine(
            retry=RetrySettings(base_s=0.05, cap_s=0.5, max_attempts=100, max_total_s=3600),
            host_policy=HostPolicy(allow_private_networks=True),
            concurrency=concurrency,
            per_domain_concurrency=8,
        )
    if mode == "adaptive":
        return _engine(32, True, concurrency=concurrency)
    return _engine(int(mode.split("-")[1]), False, concurrency=concurrency)


LIMIT_S = 40.0  # a mode that has not fetched everything by then is halted (AutoThrottle's 5 s
#                 start delay on a slow host: ~5 pages/s); pages/s counts what it fetched


async def _fetch(
    engine: FetchEngine, urls: list[str], batch: int = 500, limit_s: float = LIMIT_S
) -> tuple[float, int, int, dict[str, str]]:
    """Fetch every URL (failed ones again until ok), for at most ``limit_s`` (then the engine
    halts): (seconds, pages fetched, requests, slowed hosts)."""
    budget = RetryBudget(ratio=100.0, min_retries=10_000_000)
    async with engine:
        started = time.monotonic()
        halt = asyncio.get_running_loop().call_later(limit_s, engine.halt)
        todo = [ClaimedItem(u, 0, None, 0.0) for u in urls]
        waiting: list[tuple[float, str]] = []  # (due, url): handed back with a not-before time
        slowed: dict[str, str] = {}
        fetched = 0
        while (todo or waiting) and not engine.halted:
            now = time.time()
            todo += [ClaimedItem(u, 0, None, 0.0) for due, u in waiting if due <= now]
            waiting = [(due, u) for due, u in waiting if due > now]
            if not todo:  # as the frontier does: nothing due, wait for the first that will be
                await asyncio.sleep(min(due for due, _ in waiting) - now)
                continue
            part, todo = todo[:batch], todo[batch:]
            results = await engine.fetch_batch(part, budget=budget)
            fetched += sum(r.status == "ok" for r in results)
            now = time.time()
            for r in results:
                if r.status == "ok":
                    continue
                later = r.decision.delay_s if r.decision and r.decision.action == "later" else 0
                waiting.append((max(now + later, r.not_before), r.url))
            slowed.update(engine.slowed())
        halt.cancel()
        return time.monotonic() - started, fetched, engine.requests_sent, slowed


def _run(mode: str, urls: list[str], batch: int = 500, concurrency: int = 32) -> dict[str, Any]:
    engine = _make(mode, concurrency)
    seconds, fetched, requests, slowed = asyncio.run(_fetch(engine, urls, batch))
    out: dict[str, Any] = {"pages_per_s": round(fetched / seconds, 1), "requests": requests}
    if fetched < len(urls):
        out["halted_after"] = f"{fetched} of {len(urls)} in {seconds:.0f} s"
    if slowed:
        out["slowed"] = slowed
    return out


def _after_warm_up(stats: dict[str, Any]) -> dict[str, float]:
    """Answers after the first third of the run: 200s per second and the share of 429s."""
    log = sorted((at, status) for at, status in stats["log"])
    start, end = log[0][0], log[-1][0]
    warm = start + (end - start) / 3
    later = [status for at, status in log if at >= warm]
    return {
        "ok_per_s": round(later.count(200) / max(end - warm, 1e-9), 1),
        "share_429": round(later.count(429) / max(len(later), 1), 4),
    }


FIXED = ("fixed-8", "fixed-16", "fixed-32")


def _versus_fixed(name: str, pages: int, site_options: dict[str, Any]) -> dict[str, Any]:
    """Profiles (a)-(c): a sweep of fixed windows, adaptive and AutoThrottle on fresh sites."""
    out: dict[str, Any] = {"pages": pages, "load": _load()}
    for mode in (*FIXED, "adaptive", "autothrottle"):
        with SiteProcess(**site_options) as site:
            out[mode] = _run(mode, [site.url(i) for i in range(pages)])
        print(f"{name} {mode}: {out[mode]}", flush=True)
    best = max(out[m]["pages_per_s"] for m in FIXED)
    out["best_fixed"] = best
    for mode in ("adaptive", "autothrottle"):
        out[f"{mode}_x_best_fixed"] = round(out[mode]["pages_per_s"] / best, 3)
    print(f"{name}: adaptive {out['adaptive_x_best_fixed']} x best fixed ({best}/s), "
          f"autothrottle {out['autothrottle_x_best_fixed']} x", flush=True)  # fmt: skip
    return out


def bench_fast(quick: bool) -> dict[str, Any]:
    return _versus_fixed("fast", 4000 if quick else 10000, {})


def bench_slow(quick: bool) -> dict[str, Any]:
    return _versus_fixed("slow", 500 if quick else 1200, {"latency_min": 0.1, "latency_max": 0.3})


def bench_noise(quick: bool) -> dict[str, Any]:
    return _versus_fixed("noise", 2000 if quick else 5000, {"noise": 0.06})


def bench_bucket(quick: bool) -> dict[str, Any]:
    rate, pages = 100.0, 600 if quick else 1500
    out: dict[str, Any] = {"rate": rate, "pages": pages, "load": _load()}
    for label, retry_after in (("no_retry_after", None), ("retry_after_1", 1.0)):
        for mode in ("fixed-16", "adaptive", "autothrottle"):
            site = SiteProcess(bucket=rate, bucket_retry_after=retry_after)
            with site:
                run = _run(mode, [site.url(i) for i in range(pages)], batch=100)
            run.update(_after_warm_up(site.stats()))
            run["ok_x_rate"] = round(run["ok_per_s"] / rate, 3)
            out[f"{label} {mode}"] = run
            print(f"bucket {label} {mode}: {run}", flush=True)
    return out


def bench_pool(quick: bool) -> dict[str, Any]:
    workers, service_s = 8, 0.05
    pages = 800 if quick else 2000
    best = workers / service_s
    out: dict[str, Any] = {"workers": workers, "service_s": service_s, "max_per_s": best}
    out["load"] = _load()
    for mode in ("fixed-4", "fixed-8", "fixed-16", "fixed-32", "adaptive", "autothrottle"):
        site = SiteProcess(workers=workers, service_s=service_s)
        with site:
            run = _run(mode, [site.url(i) for i in range(pages)])
        latencies = site.stats()["latencies"]
        run["x_max_goodput"] = round(run["pages_per_s"] / best, 3)
        run["latency_x_floor"] = round(sum(latencies) / len(latencies) / service_s, 2)
        out[mode] = run
        print(f"pool {mode}: {run}", flush=True)
    return out


def bench_mix(quick: bool) -> dict[str, Any]:
    """Three hosts in one batch; the healthy ones' pages/s with the bad one beside them."""
    pages = 600 if quick else 1500
    kinds = {
        "127.0.0.2": {},  # fast healthy
        "127.0.0.3": {"latency_min": 0.1, "latency_max": 0.3},  # slow healthy
        "127.0.0.4": {"bucket": 20.0},  # rate-limited
    }
    # The fast host gets ten times the pages: at ~3,000 pages/s, 1,500 were half a second, all
    # of it the run's start (every host's first window at once, the bucket's first 429s), and
    # its "rate" was that start's (0.54 x alone with adaptive windows, 0.50 with fixed ones).
    counts = {"127.0.0.2": 10 * pages, "127.0.0.3": pages, "127.0.0.4": pages}
    healthy = ("127.0.0.2", "127.0.0.3")
    out: dict[str, Any] = {"pages_per_host": counts, "load": _load()}

    def rate_of(stats: dict[str, Any]) -> float:
        """200s a second, after the host's first second (its start, as for each arm)."""
        oks: list[float] = sorted(at for at, status in stats["log"] if status == 200)
        oks = [at for at in oks if at >= oks[0] + 1.0]
        return round(len(oks) / max(oks[-1] - oks[0], 1e-9), 1) if len(oks) > 1 else 0.0

    # 96: room for every host's ceiling (what is measured is the hosts' gates); 32: the
    # default `concurrency`, shared by the three hosts (collector.fetch.sharing lends the
    # clients fewest-held first, so the slow host's long requests cannot hold them all).
    # Each with the adaptive defaults and with a fixed window of 32 (`adaptive: false`, no
    # gate at all): a healthy host that loses as much with fixed windows as with adaptive ones
    # loses it to the client's CPU (two cores shared with three site processes), not to a gate.
    for concurrency in (96, 32):
        for mode in ("adaptive", "fixed-32"):
            tag = f"@{concurrency}" if mode == "adaptive" else f"@{concurrency} {mode}"
            _mix_one(out, kinds, healthy, rate_of, counts, mode, concurrency, tag)
        for host in healthy:
            fixed = out[f"ratio {host} @{concurrency} fixed-32"]
            if fixed:
                out[f"adaptive/fixed ratio {host} @{concurrency}"] = round(
                    out[f"ratio {host} @{concurrency}"] / fixed, 3
                )
    print(f"mix: {out}", flush=True)
    return out


def _shuffled(sites: dict[str, SiteProcess], counts: dict[str, int]) -> list[str]:
    """Every host's pages in one batch, in an order fixed by a seed (hosts of several sizes)."""
    urls = [site.url(i) for host, site in sites.items() for i in range(counts[host])]
    random.Random(7).shuffle(urls)
    return urls


def _mix_one(
    out: dict[str, Any],
    kinds: dict[str, dict[str, Any]],
    healthy: tuple[str, ...],
    rate_of: Any,
    counts: dict[str, int],
    mode: str,
    concurrency: int,
    tag: str,
) -> None:
    """One mode at one concurrency: each healthy host alone, the three together, and each
    healthy host beside the rate-limited one only."""
    for host in healthy:
        site = SiteProcess(host, **kinds[host])
        with site:
            urls = [site.url(i) for i in range(counts[host])]
            _run(mode, urls, batch=len(urls), concurrency=concurrency)
        out[f"alone {host} {tag}"] = rate_of(site.stats())
    sites = {host: SiteProcess(host, **options) for host, options in kinds.items()}
    for site in sites.values():
        site.__enter__()
    try:
        urls = _shuffled(sites, counts)
        out[f"mix run {tag}"] = _run(mode, urls, batch=len(urls), concurrency=concurrency)
    finally:
        for site in sites.values():
            site.__exit__()
    for host in healthy:
        mixed = rate_of(sites[host].stats())
        out[f"mixed {host} {tag}"] = mixed
        out[f"ratio {host} {tag}"] = round(mixed / out[f"alone {host} {tag}"], 3)
    # the goal's own question: does the *bad* host slow a healthy one? Each healthy host
    # beside the rate-limited one only (the three-host mix above also shares the client's
    # CPU between two healthy hosts, which no gate can give back)
    bad = "127.0.0.4"
    for host in healthy:
        pair = {h: SiteProcess(h, **kinds[h]) for h in (host, bad)}
        for site in pair.values():
            site.__enter__()
        try:
            urls = _shuffled(pair, counts)
            _run(mode, urls, batch=len(urls), concurrency=concurrency)
        finally:
            for site in pair.values():
                site.__exit__()
        beside = rate_of(pair[host].stats())
        out[f"beside the bad host {host} {tag}"] = beside
        out[f"ratio beside bad {host} {tag}"] = round(beside / out[f"alone {host} {tag}"], 3)


# --- outage ----------------------------------------------------------------------------------
async def _collect_with_outage(folder: Path, site: PolitenessSite, items: int, down_s: float,
                               circuit: Any) -> dict[str, Any]:  # fmt: skip
    path = write_source(
        folder,
        name=f"outage-{uuid.uuid4().hex[:6]}",
        seeds={"template": site.url(0).replace("/0", "/{i}"), "range": [0, items]},
        limits={"concurrency": 16, "per_domain_concurrency": 16, "circuit": circuit},
        retry={"base_s": 0.5, "cap_s": 5, "max_attempts": 4, "max_inline_delay_s": 2},
        ttl={"http_timeout_s": 2, "request_deadline_s": 3, "batch_timeout_s": 60, "lease_s": 120},
    )
    source = load_source(path)
    marks: dict[str, int] = {}
    with Collection(source, run_id=str(uuid.uuid4())) as run:
        run.plan()
        async with run.engine() as engine:

            async def outage() -> None:
                while site.served() < items // 4:
                    await asyncio.sleep(0.01)
                await asyncio.to_thread(site.go_down)
                marks["down"] = engine.requests_sent
                await asyncio.sleep(down_s)
                marks["up"] = engine.requests_sent
                await asyncio.to_thread(site.come_back)

            watcher = asyncio.create_task(outage())
            started = time.monotonic()
            while True:
                lease = await run.claim(100)
                if not lease.items:
                    wait = await run.seconds_until_claimable()
                    if wait is None and watcher.done():
                        break
                    await asyncio.sleep(min(max(wait or 0.05, 0.02), 0.5))
                    continue
                await run.settle(lease, await run.fetch(engine, lease))
            seconds = time.monotonic() - started
        run.finish()
        ledger = run.ledger
        return {
            "sent_while_down": marks["up"] - marks["down"],
            "requests": engine.requests_sent,
            "stored": ledger.stored,
            "dead_lettered": ledger.dead_lettered,
            "deferred_by_circuit": ledger.deferred_by_circuit,
            "retried": ledger.retried,
            "balanced": ledger.balanced,
            "seconds": round(seconds, 1),
        }


def bench_outage(quick: bool) -> dict[str, Any]:
    items, down_s = (1000, 5.0) if quick else (4000, 20.0)
    out: dict[str, Any] = {"items": items, "down_s": down_s, "load": _load()}
    for label, circuit in (("breaker", {"cooldown_s": 2, "cooldown_max_s": 8}), ("none", False)):
        with tempfile.TemporaryDirectory() as folder, PolitenessSite() as site:
            out[label] = asyncio.run(
                _collect_with_outage(Path(folder), site, items, down_s, circuit)
            )
        print(f"outage {label}: {out[label]}", flush=True)
    return out


BENCHES = {
    "fast": bench_fast,
    "slow": bench_slow,
    "noise": bench_noise,
    "bucket": bench_bucket,
    "pool": bench_pool,
    "outage": bench_outage,
    "mix": bench_mix,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # checked below, not with ``choices``: Python 3.11's argparse refuses an empty "*" list then
    parser.add_argument("which", nargs="*", help=f"any of {', '.join([*BENCHES, 'all'])}")
    parser.add_argument("--quick", action="store_true", help="shorter runs (5 s outage)")
    args = parser.parse_args()
    which = args.which or ["all"]
    if unknown := sorted(set(which) - {*BENCHES, "all"}):
        parser.error(f"unknown profile(s) {', '.join(unknown)}; choose from {', '.join(BENCHES)}")
    chosen = BENCHES if "all" in which else {k: BENCHES[k] for k in which}
    report = {name: bench(args.quick) for name, bench in chosen.items()}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
