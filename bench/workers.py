"""Workers: throughput of 2 worker processes vs 1, and a worker's RSS while draining 1M URLs.

    .venv/bin/python bench/workers.py [--pages 20000] [--batch-size 500]
    .venv/bin/python bench/workers.py --rss [--queued 1000000] [--drain 150000]

Default mode: PAGES small JSON pages from nginx on loopback (bench/_nginx.py, as in
bench/throughput.py), one Redis frontier, one Prefect server (a subprocess, as the test harness
starts), every policy on with the demo's GX suite, and measured in one run, side by side:

1. one worker: `collector run` alone;
2. two workers: `collector run` and `collector work` started together on the same box;

each on its own source name (a fresh frontier), and prints pages/s (all pages over the longest
worker's loop time, and over the whole wall time including Prefect start-up) and the ratio.

``--rss``: offers ``--queued`` URLs to a Redis frontier from this process, then runs one
`collector work --max-items DRAIN` and samples its resident memory (VmRSS) every second while it
drains; prints the samples by items drained and the growth from the first tenth to the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _nginx import StaticSite  # noqa: E402

from collector.demo.scenario import SUITE  # noqa: E402
from collector.frontier.base import Offer  # noqa: E402
from collector.frontier.redis import RedisFrontier  # noqa: E402
from tests.servers import RedisServer  # noqa: E402


def _source(folder: Path, name: str, template: str, pages: int, redis_url: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "suite.json").write_text(json.dumps(SUITE))
    source = {
        "name": name,
        "seeds": {"template": template, "range": [0, pages]},
        "record": {"key": "id"},
        "ttl": {"http_timeout_s": 5, "request_deadline_s": 10, "batch_timeout_s": 120,
                "lease_s": 300},
        "retry": {"max_attempts": 3, "base_s": 0.1, "cap_s": 2},
        "limits": {"concurrency": 32, "per_domain_concurrency": 32,
                   "per_domain_rate": "100000/second"},
        "validation": {"suite": "suite.json"},
        "sink": {"type": "jsonl", "path": "out"},
        "frontier": {"type": "redis", "url": redis_url},
        "deadletters": {"type": "redis", "url": redis_url},
        "allow_private_networks": True,
    }  # fmt: skip
    path = folder / "source.yaml"
    path.write_text(yaml.safe_dump(source))
    return path


def _start(role: str, path: Path, api_url: str, *options: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PREFECT_API_URL": api_url, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", role, str(path), "--json", *options],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
    )  # fmt: skip


def _finish(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"worker failed ({process.returncode}):\n{err[-3000:]}")
    return dict(json.loads(out.strip().splitlines()[-1]))


def _workers(
    count: int, site: StaticSite, pages: int, batch: int, redis_url: str, api_url: str
) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="collector-bench-workers-"))
    template = site.url(0).replace("/0.json", "/{i}.json")
    name = f"bench-workers-{count}"
    paths = [_source(folder / f"w{i}", name, template, pages, redis_url) for i in range(count)]
    started = time.perf_counter()
    processes = [_start("run", paths[0], api_url, "--batch-size", str(batch))]
    processes += [
        _start("work", p, api_url, "--batch-size", str(batch), "--idle-wait", "120")
        for p in paths[1:]
    ]
    summaries = [_finish(p) for p in processes]
    wall = time.perf_counter() - started
    stored = sum(s["stored"] for s in summaries)
    loop = max(s["seconds"] for s in summaries)
    return {
        "workers": count,
        "stored": stored,
        "stored_by_worker": [s["stored"] for s in summaries],
        "balanced": all(s["balanced"] for s in summaries),
        "pages_per_second": round(stored / loop, 1),
        "wall_pages_per_second": round(stored / wall, 1),
        "loop_seconds": round(loop, 2),
        "wall_seconds": round(wall, 2),
    }


def throughput(args: argparse.Namespace, redis_url: str, api_url: str) -> dict[str, Any]:
    with StaticSite(args.pages) as site:
        one = _workers(1, site, args.pages, args.batch_size, redis_url, api_url)
        two = _workers(2, site, args.pages, args.batch_size, redis_url, api_url)
    return {
        "pages": args.pages,
        "batch_size": args.batch_size,
        "one_worker": one,
        "two_workers": two,
        "ratio_two_to_one": round(two["pages_per_second"] / one["pages_per_second"], 3),
        "wall_ratio_two_to_one": round(
            two["wall_pages_per_second"] / one["wall_pages_per_second"], 3
        ),
        "cores": os.cpu_count(),
    }


def _rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def rss(args: argparse.Namespace, redis_url: str, api_url: str) -> dict[str, Any]:
    pages = 10_000  # nginx serves these; URL i asks page i % pages, so every URL is distinct
    with StaticSite(pages) as site:
        template = site.url(0).replace("/0.json", "/{i}.json")
        folder = Path(tempfile.mkdtemp(prefix="collector-bench-rss-"))
        path = _source(folder, "bench-rss", template, 0, redis_url)
        frontier = RedisFrontier(redis_url)
        began = time.perf_counter()
        try:
            offers = (
                Offer(template.format(i=i % pages) + f"?n={i}", 3600.0) for i in range(args.queued)
            )
            frontier.offer(
                "bench-rss", offers, now=time.time(), queue_ttl_s=86400.0,
                rank_for=lambda url, age, fresh: 0.0, run_id="bench-rss-plan",
            )  # fmt: skip
            queued = frontier.counts("bench-rss").queued
        finally:
            frontier.close()
        offered_s = time.perf_counter() - began
        client = redis.Redis.from_url(redis_url)
        worker = _start(
            "work", path, api_url, "--batch-size", str(args.batch_size),
            "--max-items", str(args.drain),
        )  # fmt: skip
        samples: list[tuple[float, int, int]] = []  # (seconds, queued left, RSS KiB)
        started = time.perf_counter()
        while worker.poll() is None:
            kib = _rss_kib(worker.pid)
            left = RedisFrontier(redis_url)
            try:
                remaining = left.counts("bench-rss").queued
            finally:
                left.close()
            if kib is not None:
                samples.append((round(time.perf_counter() - started, 1), remaining, kib))
            time.sleep(1.0)
        summary = _finish(worker)
        client.close()
    drained = [(t, queued - q, kib) for t, q, kib in samples if queued - q > 0]
    tenth = next((kib for _, d, kib in drained if d >= args.drain / 10), None)
    last = drained[-1][2] if drained else None
    return {
        "queued": queued,
        "offer_seconds": round(offered_s, 1),
        "drained": summary["stored"] + summary["dead_lettered"] + summary["returned"],
        "balanced": summary["balanced"],
        "pages_per_second": summary["pages_per_second"],
        "rss_mib_by_items_drained": [
            (d, round(kib / 1024, 1)) for _, d, kib in drained[:: max(1, len(drained) // 12)]
        ],
        "rss_mib_at_first_tenth": None if tenth is None else round(tenth / 1024, 1),
        "rss_mib_at_end": None if last is None else round(last / 1024, 1),
        "rss_growth_first_tenth_to_end_mib": (
            None if tenth is None or last is None else round((last - tenth) / 1024, 1)
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=20_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--rss", action="store_true", help="the 1M-queued RSS measurement")
    parser.add_argument("--queued", type=int, default=1_000_000)
    parser.add_argument("--drain", type=int, default=150_000, help="items the worker drains")
    args = parser.parse_args()

    os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="collector-bench-prefect-"))
    for name, value in (
        ("PREFECT_SERVER_ANALYTICS_ENABLED", "false"), ("DO_NOT_TRACK", "1"),
        ("PREFECT_LOGGING_LEVEL", "WARNING"), ("PREFECT_SERVER_LOGGING_LEVEL", "ERROR"),
        ("PREFECT_UI_ENABLED", "false"), ("GX_ANALYTICS_ENABLED", "false"),
    ):  # fmt: skip
        os.environ.setdefault(name, value)
    from prefect.server.api.server import SubprocessASGIServer

    api = SubprocessASGIServer()
    api.start(timeout=120)
    try:
        with RedisServer() as server:
            report = (rss if args.rss else throughput)(args, server.url, api.api_url)
    finally:
        api.stop()
    report["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report, indent=2))
    return 0 if report.get("balanced", True) else 1


if __name__ == "__main__":
    raise SystemExit(main())
