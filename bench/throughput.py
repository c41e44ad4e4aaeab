"""Throughput: the best raw httpx loop vs `collector run` with every policy on, in one run.

    .venv/bin/python bench/throughput.py [--pages 20000] [--batch-size 500] [--transport httpx]
    .venv/bin/python bench/throughput.py --observability [--repeat 2]   # metrics+traces on vs off

Serves PAGES small JSON pages from nginx on loopback, then measures side by side:

1. raw httpx: the fastest plain loop we know on this box on httpx's own connection pool
   (several small AsyncClients, as measured in docs/architecture.md), fetching and
   json-decoding every page, nothing else. This is the figure the target is set against;
2. raw httpx on aiohttp's pool (httpx-aiohttp, one client of 32 connections): the same loop on
   the pool collector fetches through by default (collector/fetch/transport.py), for reference;
3. `collector run --json` on a source with TTL rules, priority rules, leases, retries, a rate
   limit far above the load, a Great Expectations suite, and the JSONL sink, in a fresh state
   folder, against a temporary Prefect server (as a user's first run would);

and prints pages/s for each and the ratios (target: collector >= 0.7 x raw httpx; the ratio to
the raw loop on aiohttp's pool says what the pipeline itself costs). Collector's
figure is pages over the run's own loop time (``pages_per_second``) and, for honesty, over the
whole command's wall time including Prefect start-up and GX import. Each collector run also
reports its Great Expectations cost: GX time per 500-record-ish batch and per record (measured
in the validation worker), and how many GX calls it made for how many batches (waiting batches
are validated together, see collector/settle/validation_worker.py). The load average is printed
before and after each pair: on this shared box, read the ratios, not the absolute figures.
For GX alone, side by side with one GX call per batch, see bench/validation.py.

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
) -> float:
    """Pages/s of a plain loop: N small clients, one worker per connection, decode JSON."""
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

    started = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in pool for _ in range(connections)))
    elapsed = time.perf_counter() - started
    await asyncio.gather(*(c.aclose() for c in pool))
    return len(urls) / elapsed


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
        "--batch-size", type=int, nargs="+", default=[500, 1000], help="one collector run each"
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
    parser.add_argument("--repeat", type=int, default=2, help="--observability: pairs per size")
    args = parser.parse_args()
    if args.observability:
        return observability_main(args)

    with StaticSite(args.pages) as site:
        urls = [site.url(i) for i in range(args.pages)]
        asyncio.run(raw_httpx(urls[:500], clients=16, connections=2))  # warm-up
        shapes = {}
        for clients, connections in ((16, 2), (32, 1), (8, 4), (1, 32)):
            rate = asyncio.run(raw_httpx(urls, clients=clients, connections=connections))
            shapes[f"{clients}x{connections}"] = round(rate, 1)
        best_shape = max(shapes, key=lambda k: shapes[k])
        clients, connections = (int(n) for n in best_shape.split("x"))
        # This box is shared and noisy: each collector run is compared with a raw run of the
        # best shape made right before it, so both see the same machine.
        runs = {}
        for size in args.batch_size:
            load_before = [round(x, 2) for x in os.getloadavg()]
            raw = asyncio.run(raw_httpx(urls, clients=clients, connections=connections))
            raw_aiohttp = asyncio.run(
                raw_httpx(urls, clients=1, connections=args.concurrency, aiohttp_pool=True)
            )
            summary = collector_run(site, args.pages, size, args.concurrency, args.transport)
            summary["load_average"] = {
                "before": load_before,
                "after": [round(x, 2) for x in os.getloadavg()],
            }
            runs[size] = (round(raw, 1), round(raw_aiohttp, 1), summary)

    report: dict[str, object] = {
        "pages": args.pages,
        "raw_httpx_pages_per_second_by_shape": shapes,
        "raw_httpx_best_shape": f"{best_shape} (clients x connections)",
        "collector_transport": args.transport,
        "target_ratio": 0.7,
    }
    for size, (raw, raw_aiohttp, summary) in runs.items():
        report[f"collector_batch_{size}"] = {
            "raw_httpx_just_before": raw,
            "raw_httpx_on_aiohttp_pool_just_before": raw_aiohttp,
            "pages_per_second": summary["pages_per_second"],
            "ratio_to_raw": round(summary["pages_per_second"] / raw, 3),
            "ratio_to_raw_on_aiohttp_pool": round(summary["pages_per_second"] / raw_aiohttp, 3),
            "wall_pages_per_second": summary["wall_pages_per_second"],
            "wall_ratio_to_raw": round(summary["wall_pages_per_second"] / raw, 3),
            "wall_seconds": summary["wall_seconds"],
            "loop_seconds": summary["seconds"],
            "timings_s": summary["timings_s"],
            "great_expectations": summary["validation"],
            "load_average_1_5_15min": summary["load_average"],
            "stored": summary["stored"],
            "balanced": summary["balanced"],
        }
    print(json.dumps(report, indent=2))
    return 0 if all(summary["balanced"] for *_, summary in runs.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
