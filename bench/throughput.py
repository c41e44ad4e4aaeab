"""Throughput: `collector run` vs the two raw httpx loops it is judged against, in one run.

    .venv/bin/python bench/throughput.py [--pages 20000] [--batch-size 500] [--repeat 2]
    .venv/bin/python bench/throughput.py --transport httpx    # collector on httpx's own pool
    .venv/bin/python bench/throughput.py --observability [--repeat 2]   # metrics+traces on vs off

Serves PAGES small JSON pages from nginx on loopback, then, per batch size and repeat, measures
side by side (the two raw loops right before the collector run, so all three see the same box):

1. raw httpx on aiohttp's pool (httpx-aiohttp, one client of ``--concurrency`` connections):
   the loop on the very transport collector fetches through by default
   (collector/fetch/transport.py), fetching and json-decoding every page, nothing else;
2. raw httpx on its own pool (``--own-shape`` clients x connections, 16 x 2 by default: the
   fastest shape measured on this box, see docs/architecture.md);
3. `collector run --json` with every policy on: TTL rules, priority rules, leases, retries, a
   rate limit far above the load, the circuit breaker, a 4-expectation Great Expectations suite
   (the demo's), the JSONL sink, in a fresh state folder.

Targets (issues 14 and 40): collector >= 0.8 x loop 1 and >= 1.2 x loop 2. Collector's figure is its
*loop*: pages over the drain (first claim to last settle; ``timings_s.drain`` of the run's
summary), start-up (Prefect, plan, GX import) and wind-down excluded, as the raw loops exclude
their imports. Also printed: pages/s as the run reports itself (from opening the run: plan
included) and over the whole command's wall time.

On a box shared with other jobs pages/s swing with the load (printed before and after each
trio), so each row also gives CPU microseconds per page: the raw loops' process CPU over the
loop, and collector's process CPU over its drain (``timings_s.drain_cpu``: every thread of the
run's process, Prefect's included; the GX worker process is apart, see ``great_expectations``).
CPU per page hardly moves with the load: ``cpu_ratio_*`` (raw CPU / collector CPU) says what
the pages/s ratio would be on an otherwise idle core.

``--observability`` measures what metrics and traces cost instead: per batch size, collector
runs alternate off (nothing configured) and on (``--metrics-port`` scraped every second, and
``OTEL_EXPORTER_OTLP_ENDPOINT`` exporting every span to a local OTLP/HTTP sink), ``--repeat``
pairs, and it prints each pair's on/off ratio of pages/s (target: >= 0.95) and of CPU time per
page (the steadier figure on a busy box).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml
from httpx_aiohttp import AiohttpTransport

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _nginx import StaticSite

from collector.demo.scenario import SUITE  # the demo's 4-expectation suite

ROOT = Path(__file__).resolve().parents[1]


async def raw_httpx(
    urls: list[str], *, clients: int, connections: int, aiohttp_pool: bool = False
) -> tuple[float, float]:
    """(pages/s, CPU us per page) of a plain loop: N small clients, one worker per connection,
    decode JSON."""
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    pool = [
        httpx.AsyncClient(transport=AiohttpTransport(limits=limits))
        if aiohttp_pool
        else httpx.AsyncClient(limits=limits)
        for _ in range(clients)
    ]
    queue: asyncio.Queue[str] = asyncio.Queue()
    for url in urls:
        queue.put_nowait(url)

    async def worker(client: httpx.AsyncClient) -> None:
        while True:
            try:
                url = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            response = await client.get(url)
            response.raise_for_status()
            orjson.loads(response.content)

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker(c) for c in pool for _ in range(connections)))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    await asyncio.gather(*(c.aclose() for c in pool))
    return len(urls) / elapsed, cpu * 1e6 / len(urls)


def collector_run(
    site: StaticSite,
    pages: int,
    batch_size: int,
    concurrency: int,
    transport: str,
    observed: Observability | None = None,
) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="collector-bench-src-"))
    (folder / "suite.json").write_text(json.dumps(SUITE))
    source = {
        "name": "bench-items",
        "seeds": {"template": site.url(0).replace("/0.json", "/{i}.json"), "range": [0, pages]},
        "record": {"key": "id"},
        "ttl": {
            "default_fresh_s": 3600,
            "rules": [{"pattern": r"/items/\d+\.json$", "fresh_s": 1800}],
            "http_timeout_s": 5,
            "request_deadline_s": 10,
            "batch_timeout_s": 120,
            "lease_s": 300,
        },
        "priority": {"weight": 5, "rules": [{"pattern": r"/items/1\d*\.json$", "weight": 8}]},
        "retry": {"max_attempts": 3, "base_s": 0.1, "cap_s": 2},
        "limits": {
            "concurrency": concurrency,
            "per_domain_concurrency": concurrency,
            "per_domain_rate": "100000/second",
            "transport": transport,
        },
        "validation": {"suite": "suite.json"},
        "sink": {"type": "jsonl", "path": "out"},
        "allow_private_networks": True,
    }
    path = folder / "bench.yaml"
    path.write_text(yaml.safe_dump(source))
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "PREFECT_API_URL" and not k.startswith(("OTEL_", "PREFECT_CLIENT_METRICS"))
    }
    env.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")  # a loaded box
    extra: list[str] = []
    if observed is not None:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = observed.otlp_url
        extra = ["--metrics-port", str(observed.metrics_port)]
    started = time.perf_counter()
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with observed.scraping() if observed is not None else _nothing():
        done = subprocess.run(
            [sys.executable, "-m", "flows.cli", "run", str(path), "--json",
             "--batch-size", str(batch_size), *extra],
            capture_output=True, text=True, cwd=ROOT, env=env,
        )  # fmt: skip
    wall = time.perf_counter() - started
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"collector run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    summary: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    summary["wall_pages_per_second"] = round(summary["stored"] / wall, 1)
    summary["wall_seconds"] = round(wall, 2)
    # CPU of the command and the processes it waited for (Prefect server, GX worker): less
    # sensitive than pages/s to other jobs on a shared box
    summary["cpu_ms_per_page"] = round(cpu_s * 1000 / max(summary["stored"], 1), 3)
    return summary


@contextmanager
def _nothing() -> Iterator[None]:
    yield


class Observability:
    """What an observed run talks to: a local OTLP/HTTP sink (accepts and counts POSTs) and a
    scraper of the run's metrics port, once a second, as Prometheus would."""

    def __init__(self) -> None:
        self.posts = 0
        self.scrapes = 0
        bench = self

        class Sink(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                bench.posts += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.otlp_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.metrics_port = sock.getsockname()[1]

    @contextmanager
    def scraping(self) -> Iterator[None]:
        stop = threading.Event()

        def scrape() -> None:
            while not stop.wait(1.0):
                try:
                    url = f"http://127.0.0.1:{self.metrics_port}/metrics"
                    with urllib.request.urlopen(url, timeout=2) as answer:
                        answer.read()
                    self.scrapes += 1
                except OSError:
                    pass  # not serving yet (Prefect starting)

        thread = threading.Thread(target=scrape, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def observability_main(args: argparse.Namespace) -> int:
    """Collector runs alternating off / on, side by side; the on/off ratio per pair."""
    observed = Observability()
    report: dict[str, object] = {"pages": args.pages, "target_ratio_on_to_off": 0.95}
    balanced = True
    with StaticSite(args.pages) as site:
        for size in args.batch_size:
            pairs: list[dict[str, Any]] = []
            for _ in range(args.repeat):
                load = [round(x, 2) for x in os.getloadavg()]
                off = collector_run(site, args.pages, size, args.concurrency, args.transport)
                scrapes, posts = observed.scrapes, observed.posts
                on = collector_run(
                    site, args.pages, size, args.concurrency, args.transport, observed
                )
                balanced = balanced and off["balanced"] and on["balanced"]
                pairs.append({
                    "off_pages_per_second": off["pages_per_second"],
                    "on_pages_per_second": on["pages_per_second"],
                    "ratio_on_to_off": round(on["pages_per_second"] / off["pages_per_second"], 3),
                    "off_cpu_ms_per_page": off["cpu_ms_per_page"],
                    "on_cpu_ms_per_page": on["cpu_ms_per_page"],
                    "cpu_ratio_on_to_off": round(on["cpu_ms_per_page"] / off["cpu_ms_per_page"], 3),
                    "off_wall_seconds": off["wall_seconds"],
                    "on_wall_seconds": on["wall_seconds"],
                    "scrapes_during_on": observed.scrapes - scrapes,
                    "otlp_posts_during_on": observed.posts - posts,
                    "load_average_before": load,
                })  # fmt: skip
            ratios = [pair["ratio_on_to_off"] for pair in pairs]
            cpu = [pair["cpu_ratio_on_to_off"] for pair in pairs]
            report[f"collector_batch_{size}"] = {
                "pairs": pairs,
                "mean_ratio_on_to_off": round(sum(ratios) / len(ratios), 3),
                "mean_cpu_ratio_on_to_off": round(sum(cpu) / len(cpu), 3),
            }
    observed.close()
    print(json.dumps(report, indent=2))
    return 0 if balanced else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=20_000)
    parser.add_argument(
        "--batch-size", type=int, nargs="+", default=[500], help="one collector run each"
    )
    parser.add_argument(
        "--own-shape", default="16x2", help="raw httpx on its own pool: clients x connections"
    )
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--transport",
        choices=["aiohttp", "httpx"],
        default="aiohttp",
        help="the pool collector fetches through (limits.transport); aiohttp is the default",
    )
    parser.add_argument(
        "--observability",
        action="store_true",
        help="measure metrics + traces on vs off (pairs of collector runs) instead",
    )
    parser.add_argument(
        "--repeat", type=int, default=2, help="trios per batch size (--observability: pairs)"
    )
    args = parser.parse_args()
    if args.observability:
        return observability_main(args)

    own_clients, own_connections = (int(n) for n in args.own_shape.split("x"))
    with StaticSite(args.pages) as site:
        urls = [site.url(i) for i in range(args.pages)]
        asyncio.run(raw_httpx(urls[:500], clients=1, connections=32, aiohttp_pool=True))  # warm-up
        rows: list[dict[str, Any]] = []
        for _ in range(args.repeat):
            for size in args.batch_size:
                load_before = [round(x, 2) for x in os.getloadavg()]
                on_aiohttp, on_aiohttp_cpu = asyncio.run(
                    raw_httpx(urls, clients=1, connections=args.concurrency, aiohttp_pool=True)
                )
                own, own_cpu = asyncio.run(
                    raw_httpx(urls, clients=own_clients, connections=own_connections)
                )
                summary = collector_run(site, args.pages, size, args.concurrency, args.transport)
                rows.append(
                    _row(size, on_aiohttp, on_aiohttp_cpu, own, own_cpu, summary, load_before)
                )

    report: dict[str, object] = {
        "pages": args.pages,
        "collector_transport": args.transport,
        "raw_own_pool_shape": f"{args.own_shape} (clients x connections)",
        "targets": {"ratio_to_raw_on_aiohttp": 0.8, "ratio_to_raw_own_pool": 1.2},
        "runs": rows,
    }
    print(json.dumps(report, indent=2))
    for row in rows:  # one line per trio, to paste into docs
        print(
            f"batch {row['batch_size']}, load {row['load_average_1_5_15min']['before']}: "
            f"collector loop {row['collector_loop_pages_per_second']:,.0f} pages/s "
            f"({row['collector_cpu_us_per_page']:.0f} us CPU/page), raw on aiohttp "
            f"{row['raw_httpx_on_aiohttp_pages_per_second']:,.0f} "
            f"({row['raw_httpx_on_aiohttp_cpu_us_per_page']:.0f}), raw own pool "
            f"{row['raw_httpx_own_pool_pages_per_second']:,.0f} "
            f"({row['raw_httpx_own_pool_cpu_us_per_page']:.0f}): "
            f"x{row['ratio_to_raw_on_aiohttp']} / x{row['ratio_to_raw_own_pool']} "
            f"(CPU x{row['cpu_ratio_to_raw_on_aiohttp']} / x{row['cpu_ratio_to_raw_own_pool']})",
            file=sys.stderr,
        )
    return 0 if all(row["balanced"] for row in rows) else 1


def _row(
    size: int,
    on_aiohttp: float,
    on_aiohttp_cpu: float,
    own: float,
    own_cpu: float,
    summary: dict[str, Any],
    load_before: list[float],
) -> dict[str, Any]:
    """One trio: the two raw loops and the collector run made right after them."""
    timings = summary["timings_s"]
    loop = summary["stored"] / timings["drain"]
    cpu = timings["drain_cpu"] * 1e6 / max(summary["stored"], 1)
    return {
        "batch_size": size,
        "raw_httpx_on_aiohttp_pages_per_second": round(on_aiohttp, 1),
        "raw_httpx_own_pool_pages_per_second": round(own, 1),
        "collector_loop_pages_per_second": round(loop, 1),
        "ratio_to_raw_on_aiohttp": round(loop / on_aiohttp, 3),
        "ratio_to_raw_own_pool": round(loop / own, 3),
        "raw_httpx_on_aiohttp_cpu_us_per_page": round(on_aiohttp_cpu, 1),
        "raw_httpx_own_pool_cpu_us_per_page": round(own_cpu, 1),
        "collector_cpu_us_per_page": round(cpu, 1),
        "cpu_ratio_to_raw_on_aiohttp": round(on_aiohttp_cpu / cpu, 3),
        "cpu_ratio_to_raw_own_pool": round(own_cpu / cpu, 3),
        "collector_reported_pages_per_second": summary["pages_per_second"],
        "collector_wall_pages_per_second": summary["wall_pages_per_second"],
        "collector_seconds": {
            "wall": summary["wall_seconds"],
            "run": summary["seconds"],
            **timings,
        },
        "great_expectations": summary["validation"],
        "load_average_1_5_15min": {
            "before": load_before,
            "after": [round(x, 2) for x in os.getloadavg()],
        },
        "stored": summary["stored"],
        "balanced": summary["balanced"],
    }


if __name__ == "__main__":
    raise SystemExit(main())
