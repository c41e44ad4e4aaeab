"""Fetching ahead vs one batch at a time, side by side in one run (collector.run.drain).

    .venv/bin/python bench/fetch_ahead.py [--repeat 2]

One run loop (``Collection`` + ``drain``, the flow's loop without Prefect, SQLite + JSONL) over
the local fault site, for each shape twice: ``fetch_ahead=1`` (the next batch claimed once the
whole batch is fetched) and ``fetch_ahead=2`` (claimed once every request of the batch has
started). Shapes:

* **fleet**: batch 3 on 2 request slots of one host, every page answered after 0.5 s (the fleet
  bench's shape, docs/fleet.md): a batch of 3 takes two rounds, the second with a slot idle;
  its slots allow 4 items/s;
* **tail**: batch 200 on 8 slots of one host, 5 % of the pages answered after 2 s and the rest
  after 20 ms: a batch's slow pages hold its end while the other slots have nothing to do.

Printed per shape: items/s of each (items stored over the loop's own ``timings_s.drain``, the
mean of ``--repeat`` runs, alternated), the ratio ahead / one at a time, and the load average
(``os.getloadavg``) before and after: the box is shared, read the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collector.config import load_source  # noqa: E402
from collector.demo.site import FaultSite  # noqa: E402
from collector.fetch.engine import FetchResult  # noqa: E402
from collector.frontier import Lease  # noqa: E402
from collector.run.collection import Collection  # noqa: E402
from collector.run.drain import DrainPolicy, drain  # noqa: E402
from tests.helpers import write_source  # noqa: E402


@dataclass(frozen=True)
class Shape:
    name: str
    items: int
    batch: int
    slots: int
    fast_s: float
    slow_s: float
    slow_every: int  # every slow_every-th page is slow (0: none)


SHAPES = (
    Shape("fleet: batch 3, 2 slots, 0.5 s pages", 40, 3, 2, 0.5, 0.5, 0),
    Shape("tail: batch 200, 8 slots, 5 % of pages 2 s", 1000, 200, 8, 0.02, 2.0, 20),
)


def _source(folder: Path, site: FaultSite, shape: Shape) -> Path:
    urls = []
    for i in range(shape.items):
        slow = shape.slow_every and i % shape.slow_every == 7 % shape.slow_every
        urls.append(site.url(f"/items/{i}.json?delay={shape.slow_s if slow else shape.fast_s}"))
    return write_source(
        folder,
        name="ahead",
        seeds={"urls": urls},
        limits={
            "concurrency": shape.slots,
            "per_domain_concurrency": shape.slots,
            "adaptive": {"enabled": False},  # the slots fixed: the comparison is the loop's
        },
        ttl={"http_timeout_s": 5, "request_deadline_s": 5, "batch_timeout_s": 120, "lease_s": 600},
    )


async def _drain(path: Path, shape: Shape, ahead: int) -> float:
    """Items stored per second of the loop's own time."""
    with Collection(load_source(path), run_id=f"bench-{ahead}") as run:
        run.plan()
        async with run.engine() as engine:

            async def fetch(lease: Lease) -> list[FetchResult]:
                return await run.fetch(engine, lease)

            try:
                await drain(run, fetch, DrainPolicy(batch_size=shape.batch, fetch_ahead=ahead))
            finally:
                await run.aclose()
        run.finish()
        summary = run.summary()
    assert summary.balanced and summary.stored == shape.items, summary.problems
    return summary.stored / summary.timings_s["drain"]


def _once(shape: Shape, ahead: int) -> float:
    with tempfile.TemporaryDirectory() as folder, FaultSite() as site:
        return asyncio.run(_drain(_source(Path(folder), site, shape), shape, ahead))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    print(f"load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for shape in SHAPES:
        rates: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(args.repeat):
            for ahead in (1, 2):
                rates[ahead].append(_once(shape, ahead))
        one, two = (sum(rates[a]) / len(rates[a]) for a in (1, 2))
        print(
            f"{shape.name}: one at a time {one:.2f} items/s, ahead {two:.2f} items/s, "
            f"ratio {two / one:.2f}x ({args.repeat} runs each)"
        )
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
