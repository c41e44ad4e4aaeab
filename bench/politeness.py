"""Politeness: the circuit breaker and the adaptive window, side by side with their absence.

    .venv/bin/python bench/politeness.py [outage|pool|ratelimit|nginx|all] [--quick]

* ``outage``: a host goes down for 20 s (``--quick``: 5 s) once a quarter of the items are
  stored, then comes back. One run with the breaker, one with ``circuit: false``; for each:
  requests sent while it was down, items stored, dead-lettered, deferred by the breaker, and
  whether the ledger balances (the collect loop on a Collection, as the flow runs it);
* ``pool``: a host with a fixed pool of K workers (each request takes S seconds; more than K
  in flight only queue). Sweeps fixed ``per_domain_concurrency`` 1..32 and runs adaptive;
  prints pages/s of each and adaptive / best fixed (target >= 0.9) and the windows it settled on;
* ``ratelimit``: a host that answers 429 above R requests a second without saying so: share
  of 429s after warm-up (the first third), adaptive (target < 2 %) vs fixed;
* ``nginx``: a fast healthy host (bench/throughput.py's nginx): pages/s adaptive vs fixed 32,
  alternated over several rounds (target: adaptive >= 0.95 x fixed).

The test hosts run in their own process (tests/politeness_site.py), so the client's figures are
not shared with the server's GIL. The load average is printed: this box is shared, read ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collector.config import AdaptiveSettings, load_source  # noqa: E402
from collector.fetch.engine import FetchEngine  # noqa: E402
from collector.frontier.base import ClaimedItem  # noqa: E402
from collector.policy.retry import RetryBudget, RetrySettings  # noqa: E402
from collector.policy.urls import HostPolicy  # noqa: E402
from collector.run.collection import Collection  # noqa: E402
from tests.helpers import write_source  # noqa: E402
from tests.politeness_site import PolitenessSite  # noqa: E402
from tests.servers import free_port  # noqa: E402


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class _SiteProcess:
    """tests/politeness_site.py in a process of its own."""

    def __init__(self, **options: Any) -> None:
        self.port = free_port()
        self.args = [f"--{k.replace('_', '-')}={v}" for k, v in options.items() if v is not None]
        self._process: subprocess.Popen[bytes] | None = None

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.port}/item/{i}"

    def __enter__(self) -> _SiteProcess:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.politeness_site", str(self.port), *self.args], cwd=ROOT
        )
        import socket

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("politeness site did not start")

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)


def _engine(per_domain: int, adaptive: bool, *, concurrency: int = 32) -> FetchEngine:
    return FetchEngine(
        retry=RetrySettings(base_s=0.05, cap_s=0.5, max_attempts=100, max_total_s=3600),
        host_policy=HostPolicy(allow_private_networks=True),
        concurrency=max(concurrency, per_domain),
        per_domain_concurrency=per_domain,
        adaptive=AdaptiveSettings() if adaptive else None,
    )


async def _fetch(
    engine: FetchEngine, urls: list[str], batch: int = 500
) -> tuple[float, int, list[int]]:
    """Fetch every URL (failed ones again until ok): (seconds, requests, window per batch)."""
    budget = RetryBudget(ratio=100.0, min_retries=10_000_000)
    windows: list[int] = []
    async with engine:
        started = time.monotonic()
        todo = [ClaimedItem(u, 0, None, 0.0) for u in urls]
        while todo:
            part, todo = todo[:batch], todo[batch:]
            results = await engine.fetch_batch(part, budget=budget)
            todo += [ClaimedItem(r.url, 0, None, 0.0) for r in results if r.status != "ok"]
            windows += list(engine.windows().values())
        return time.monotonic() - started, engine.requests_sent, windows


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
                lease = run.claim(100)
                if not lease.items:
                    wait = run.seconds_until_claimable()
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


# --- pool ------------------------------------------------------------------------------------
def bench_pool(quick: bool) -> dict[str, Any]:
    workers, service_s = 8, 0.05
    pages = 1200 if quick else 3000
    out: dict[str, Any] = {"workers": workers, "service_s": service_s, "pages": pages}
    out["load_before"] = _load()
    fixed: dict[int, float] = {}
    with _SiteProcess(workers=workers, service_s=service_s) as site:
        urls = [site.url(i) for i in range(pages)]
        for per_domain in (1, 2, 4, 8, 16, 32):
            seconds, _, _ = asyncio.run(_fetch(_engine(per_domain, False), urls))
            fixed[per_domain] = round(pages / seconds, 1)
            print(f"pool fixed {per_domain:>2}: {fixed[per_domain]} pages/s", flush=True)
        seconds, _, windows = asyncio.run(_fetch(_engine(32, True), urls))
    adaptive = round(pages / seconds, 1)
    best = max(fixed.values())
    out.update(
        fixed=fixed,
        adaptive=adaptive,
        ratio_to_best_fixed=round(adaptive / best, 3),
        windows=windows,
        load_after=_load(),
    )
    print(f"pool adaptive: {adaptive} pages/s, {out['ratio_to_best_fixed']} x best fixed "
          f"({best}); windows per batch {windows}", flush=True)  # fmt: skip
    return out


# --- ratelimit -------------------------------------------------------------------------------
def bench_ratelimit(quick: bool) -> dict[str, Any]:
    rate = 100
    pages = 1000 if quick else 3000
    out: dict[str, Any] = {"rate": rate, "pages": pages, "load": _load()}
    for label, adaptive in (("adaptive", True), ("fixed", False)):
        with PolitenessSite(rate=rate) as site:
            seconds, requests, _ = asyncio.run(
                _fetch(_engine(16, adaptive), [site.url(i) for i in range(pages)], batch=100)
            )
            log = sorted(site.log)
        start, end = log[0][0], log[-1][0]
        later = [status for at, status in log if at > start + (end - start) / 3]
        out[label] = {
            "requests": requests,
            "share_429_after_warm_up": round(later.count(429) / max(len(later), 1), 4),
            "share_429_all": round(sum(s == 429 for _, s in log) / len(log), 4),
            "pages_per_s": round(pages / seconds, 1),
        }
        print(f"ratelimit {label}: {out[label]}", flush=True)
    return out


# --- nginx -----------------------------------------------------------------------------------
def bench_nginx(quick: bool) -> dict[str, Any]:
    from bench._nginx import StaticSite

    pages, rounds = (5000, 3) if quick else (20000, 4)
    figures: dict[str, list[float]] = {"fixed": [], "adaptive": []}
    out: dict[str, Any] = {"pages": pages, "load_before": _load()}
    with StaticSite(pages) as site:
        urls = [site.url(i) for i in range(pages)]
        asyncio.run(_fetch(_engine(32, False), urls[:1000]))  # warm up nginx and the OS
        for _ in range(rounds):
            for label in ("fixed", "adaptive"):
                seconds, _, _ = asyncio.run(_fetch(_engine(32, label == "adaptive"), urls))
                figures[label].append(round(pages / seconds, 1))
                print(f"nginx {label}: {figures[label][-1]} pages/s", flush=True)
    best = {label: max(values) for label, values in figures.items()}
    median = {label: sorted(v)[len(v) // 2] for label, v in figures.items()}
    out.update(
        figures=figures,
        ratio_best=round(best["adaptive"] / best["fixed"], 3),
        ratio_median=round(median["adaptive"] / median["fixed"], 3),
        load_after=_load(),
    )
    print(f"nginx adaptive / fixed: best {out['ratio_best']}, median {out['ratio_median']}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "which", nargs="?", default="all", choices=["outage", "pool", "ratelimit", "nginx", "all"]
    )
    parser.add_argument("--quick", action="store_true", help="shorter runs (5 s outage)")
    args = parser.parse_args()
    benches = {
        "outage": bench_outage,
        "pool": bench_pool,
        "ratelimit": bench_ratelimit,
        "nginx": bench_nginx,
    }
    chosen = benches if args.which == "all" else {args.which: benches[args.which]}
    report = {name: bench(args.quick) for name, bench in chosen.items()}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
