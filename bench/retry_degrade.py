"""The 429 degrade (``retry.degrade_share``) against a token-bucket host, side by side with none.

    .venv/bin/python bench/retry_degrade.py [--items 600] [--bucket 100] [--rounds 2]

A real aiohttp host in a process of its own (tests/politeness_site.py) answers 429 above a
token bucket; a whole run (plan, claim, fetch, settle: collector.run.collection) collects every
item, with the adaptive pacing on (the default) and the circuit breaker off, once with no
degrade and once with the seed's 30 %, alternately, ``--rounds`` times. Printed per run: wall
seconds, requests the host saw, its 429 share, items handed back by the degrade, stored and
dead-lettered items (stored must be every item, dead none). The load average is printed: this
box is shared, read ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collector.config import load_source  # noqa: E402
from collector.run.collection import Collection  # noqa: E402
from tests.helpers import write_source  # noqa: E402
from tests.politeness_site import SiteProcess  # noqa: E402


async def _drain(run: Collection, batch: int) -> int:
    """claim -> fetch -> settle until nothing is left; returns the items handed back."""
    handed_back = 0
    async with run.engine() as engine:
        while True:
            lease = await run.claim(batch)
            if not lease.items:
                wait = await run.seconds_until_claimable()
                if wait is None:
                    return handed_back
                await asyncio.sleep(min(max(wait, 0.01), 0.2))
                continue
            results = await run.fetch(engine, lease)
            handed_back += sum(1 for r in results if r.status == "deferred")
            await run.settle(lease, results)


def one_run(items: int, bucket: float, share: float) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp())
    with SiteProcess(bucket=bucket) as site:
        source = load_source(
            write_source(
                folder,
                seeds={"template": site.url(0).replace("/0", "/{i}"), "range": [0, items]},
                limits={"concurrency": 16, "per_domain_concurrency": 16,
                        "circuit": {"enabled": False}},
                retry={"base_s": 0.05, "cap_s": 1, "max_attempts": 100, "budget_min": 100_000,
                       "degrade_share": share, "degrade_hold_s": 1},
            )
        )  # fmt: skip
        began = time.monotonic()
        with Collection(source, run_id=str(uuid.uuid4())) as run:
            run.plan()
            handed_back = asyncio.run(_drain(run, 100))
            run.finish()
        wall = time.monotonic() - began
    log = site.stats()["log"]
    throttled = sum(1 for _, status in log if status == 429)
    return {
        "share": share,
        "wall_s": wall,
        "requests": len(log),
        "429_share": throttled / max(len(log), 1),
        "handed_back": handed_back,
        "stored": run.ledger.stored,
        "dead": run.ledger.dead_lettered,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=600)
    parser.add_argument("--bucket", type=float, default=100.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()[0]:.2f}; {args.items} items, bucket {args.bucket:g}/s")
    print("degrade_share  wall_s  requests  429_share  handed_back  stored  dead")
    rows = []
    for _ in range(args.rounds):
        for share in (1.0, 0.3):
            row = one_run(args.items, args.bucket, share)
            rows.append(row)
            print(
                f"{row['share']:>13.1f}  {row['wall_s']:6.2f}  {row['requests']:8d}  "
                f"{row['429_share']:9.1%}  {row['handed_back']:11d}  {row['stored']:6d}  "
                f"{row['dead']:4d}"
            )
    for key in ("wall_s", "requests"):
        off = [r[key] for r in rows if r["share"] == 1.0]
        on = [r[key] for r in rows if r["share"] == 0.3]
        print(f"{key} 0.3 / off: {sum(on) / sum(off):.2f}")
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
