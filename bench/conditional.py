"""What a conditional refetch saves: the same pages fetched again whole (200) and answered 304,
through a whole Collection run (no Prefect) against nginx on loopback (its own ETag and
Last-Modified), with the demo's 4-expectation GX suite.

Three runs over PAGES unchanged pages: the first stores them; the second, with the pages stale,
refetches with ``politeness.conditional: false`` (200s, parsed, validated, found unchanged);
the third with conditional requests on (304s: nothing parsed, validated or written). Reported:
the run loop's pages/s and process CPU per page, and bytes on the wire per response (nginx's
access log: ``$bytes_sent``).

    .venv/bin/python bench/conditional.py [--pages 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _nginx import StaticSite

from collector.config import load_source
from collector.demo.scenario import SUITE
from collector.fetch.engine import FetchResult
from collector.frontier import Lease
from collector.run.collection import Collection
from collector.run.drain import DrainPolicy, drain


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def one_run(
    path: Path, run_id: str, offset_s: float
) -> tuple[dict[str, int], float, float, float]:
    """(counts, loop seconds, loop CPU of this process, CPU of the GX worker child)."""
    children = _children_cpu()
    with Collection(load_source(path), run_id=run_id, clock=lambda: time.time() + offset_s) as run:
        run.plan()
        async with run.engine() as engine:

            async def fetch(lease: Lease) -> list[FetchResult]:
                return await run.fetch(engine, lease)

            began, cpu = time.monotonic(), time.process_time()
            try:
                await drain(run, fetch, DrainPolicy(batch_size=500))
            finally:
                await run.aclose()
            wall, cpu = time.monotonic() - began, time.process_time() - cpu
        run.finish()
        s = run.summary()
    counts = {"stored": s.stored, "not_modified": s.not_modified, "requests": s.requests}
    assert s.balanced, s.problems
    return counts, wall, cpu, _children_cpu() - children  # the worker has exited by now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=5_000)
    args = parser.parse_args()
    with StaticSite(pages=args.pages) as site, tempfile.TemporaryDirectory() as folder:
        suite = Path(folder) / "suite.json"
        suite.write_text(json.dumps(SUITE))
        source = {
            "name": "conditional-bench",
            "seeds": {"template": site.url(0).replace("/0.json", "/{i}.json"),
                      "range": [0, args.pages]},
            "record": {"key": "id"},
            "sink": {"type": "jsonl", "path": "out"},
            "allow_private_networks": True,
            "ttl": {"default_fresh_s": 3600},
            "validation": {"suite": str(suite)},
            "limits": {"concurrency": 32, "per_domain_concurrency": 32, "adaptive": False},
        }  # fmt: skip
        path = Path(folder) / "source.yaml"
        path.write_text(yaml.safe_dump(source))
        rows = []
        rows.append(("first fetch (200)", *asyncio.run(one_run(path, "r1", 0))))
        source["politeness"] = {"conditional": False}
        path.write_text(yaml.safe_dump(source))
        rows.append(("refetch, plain (200)", *asyncio.run(one_run(path, "r2", 7_200))))
        source["politeness"] = {"conditional": True}
        path.write_text(yaml.safe_dump(source))
        rows.append(("refetch, conditional (304)", *asyncio.run(one_run(path, "r3", 14_400))))
    print(f"{args.pages} unchanged pages from nginx, demo GX suite, batch 500")
    print(
        "run                          stored  not_modified  pages/s  CPU us/page  GX worker us/page"
    )
    for name, counts, wall, cpu, worker in rows:
        pages = counts["stored"] + counts["not_modified"]
        print(
            f"{name:28} {counts['stored']:6d} {counts['not_modified']:13d} "
            f"{pages / wall:8.0f} {cpu / pages * 1e6:12.0f} {worker / pages * 1e6:18.0f}"
        )


if __name__ == "__main__":
    main()
