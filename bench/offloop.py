"""Store calls off the loop vs on it, with the stores near and far.

    .venv/bin/python bench/offloop.py [--pages 600] [--delays 0,0.05,0.2] [--suite]

One run loop (``Collection`` + ``drain``, the flow's loop without Prefect) over a local fault
site whose pages answer in 50 ms (5 % not found, 5 % malformed), a 0.5 s request deadline,
the frontier and dead letters on a real redis-server and the sink on a real Postgres, both
behind a relay that adds ``delay`` seconds to every round trip (tests/redis_proxy.py
``SlowRelay``; 0 = no relay). For each delay, two runs side by side: the stores on their lanes
(collector.offloop, as shipped) and every store call made on the loop (``Lane.run`` calling
inline: main's code before the lanes). Printed per run: the loop's pages/s (its own
``timings_s.drain``), the pages asked again (a request whose deadline ran out is retried), and
the ratio lanes / on the loop. ``--suite`` adds the demo GX suite (its worker's answers make
settles run beside fetches, as in a real run; +~7 s of GX import per run).

The box is shared: read the ratios, and the load average printed with them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import ParamSpec, TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from collector.config import load_source  # noqa: E402
from collector.demo.scenario import SUITE  # noqa: E402
from collector.demo.site import FaultSite  # noqa: E402
from collector.offloop import Lane  # noqa: E402
from collector.run.collection import Collection  # noqa: E402
from collector.run.drain import DrainPolicy, drain  # noqa: E402
from tests.helpers import write_source  # noqa: E402
from tests.redis_proxy import SlowRelay  # noqa: E402
from tests.servers import PostgresServer, RedisServer  # noqa: E402

_P = ParamSpec("_P")
_T = TypeVar("_T")
DEADLINE_S = 0.5
BATCH = 50


async def _inline(self: Lane, call: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """``Lane.run`` as main had it: the store called on the loop."""
    return call(*args, **kwargs)


@contextmanager
def _on_the_loop(on: bool) -> Iterator[None]:
    shipped = Lane.run
    if on:
        Lane.run = _inline  # type: ignore[method-assign]
    try:
        yield
    finally:
        Lane.run = shipped  # type: ignore[method-assign]


def _source(
    folder: Path, site: FaultSite, redis_url: str, dsn: str, pages: int, suite: bool
) -> Path:
    urls = []
    for i in range(pages):
        shape = {7: "status=404&times=-1&", 13: "malformed=1&"}.get(i % 20, "")
        urls.append(site.url(f"/items/{i}.json?{shape}delay=0.05"))
    path = write_source(
        folder,
        seeds={"urls": urls},
        frontier={"type": "redis", "url": redis_url},
        deadletters={"type": "redis", "url": redis_url},
        limits={"concurrency": 16, "per_domain_concurrency": 16, "circuit": False},
        ttl={"http_timeout_s": DEADLINE_S, "request_deadline_s": DEADLINE_S,
             "batch_timeout_s": 30, "lease_s": 60},
        **({"validation": {"suite": SUITE}} if suite else {}),
    )  # fmt: skip
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    document["sink"] = {"type": "postgres", "dsn": dsn}
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


async def _loop(source_path: Path) -> tuple[float, int]:
    """(pages/s of the run loop, items stored)."""
    with Collection(load_source(source_path), run_id=str(uuid.uuid4())) as run:
        await run.stores.frontier.lane.run(run.plan)
        async with run.engine() as engine:
            await drain(run, lambda lease: run.fetch(engine, lease), DrainPolicy(batch_size=BATCH))
            await run.aclose()
        ledger = run.finish()
        assert ledger.balanced, ledger.problems
        return run.pages_ok / max(run.drain_seconds, 1e-9), ledger.stored


def _one(
    redis: RedisServer, pg: PostgresServer, delay: float, on_loop: bool, pages: int, suite: bool
) -> tuple[float, int, int]:
    """(pages/s, stored, pages asked again) of one run on fresh stores."""
    import redis as redis_py

    client = redis_py.Redis.from_url(redis.url)
    client.flushdb()
    client.close()
    dsn = pg.create_schema("offloop_bench")
    with ExitStack() as stack, FaultSite() as site, tempfile.TemporaryDirectory() as folder:
        redis_port, dsn_there = redis.port, dsn
        if delay:
            redis_relay = stack.enter_context(SlowRelay(redis.port, delay_s=delay))
            pg_relay = stack.enter_context(SlowRelay(pg.port, delay_s=delay))
            redis_port = redis_relay.port
            dsn_there = dsn.replace(f":{pg.port}/", f":{pg_relay.port}/")
        path = _source(
            Path(folder), site, f"redis://127.0.0.1:{redis_port}/0", dsn_there, pages, suite
        )
        with _on_the_loop(on_loop):
            rate, stored = asyncio.run(_loop(path))
        asked = Counter(r.path for r in site.requests if r.path.startswith("/items/"))
    pg.drop_schema(dsn)
    return rate, stored, sum(1 for n in asked.values() if n > 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/offloop.py", description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=600)
    parser.add_argument("--delays", default="0,0.05,0.2", help="seconds per round trip")
    parser.add_argument("--suite", action="store_true", help="validate with the demo GX suite")
    args = parser.parse_args(argv)
    delays = [float(d) for d in args.delays.split(",")]
    with RedisServer() as redis, PostgresServer() as pg:
        pg.create_database("offloop_bench")
        print(f"{args.pages} pages of 50 ms, deadline {DEADLINE_S} s, batch {BATCH}, "
              f"suite {'on' if args.suite else 'off'}")  # fmt: skip
        print("| store round trip +s | load | lanes pages/s (again) | on the loop pages/s "
              "(again) | lanes / on the loop |")  # fmt: skip
        print("|---|---|---|---|---|")
        for delay in delays:
            lanes = _one(redis, pg, delay, False, args.pages, args.suite)
            loop = _one(redis, pg, delay, True, args.pages, args.suite)
            cells = (
                f"{delay:g}", f"{os.getloadavg()[0]:.1f}", f"{lanes[0]:.0f} ({lanes[2]})",
                f"{loop[0]:.0f} ({loop[2]})", f"{lanes[0] / loop[0]:.2f}",
            )  # fmt: skip
            print("| " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
