"""Frontier throughput: RedisFrontier vs SqliteFrontier side by side, in one run.

    .venv/bin/python bench/redis_frontier.py [--n 100000] [--batch 500] [--million]

Starts its own redis-server on a free port (tests/servers.py), then for each backend: offers N
new URLs (one ``offer`` call, chunked inside), and claims + acks (``Completed``) them in batches
until the queue is empty. Prints microseconds per item, amortised, for offer and for claim+ack
(target for Redis: claim+ack < 50 us/item), and the Redis/SQLite ratios.

``--million`` also offers 1,000,000 URLs to an empty Redis and reports ``used_memory``
(target <= 250 MB).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import zlib
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collector.frontier.base import Completed, Frontier, Offer  # noqa: E402
from collector.frontier.redis import RedisFrontier  # noqa: E402
from collector.frontier.sqlite import SqliteFrontier  # noqa: E402
from tests.servers import RedisServer  # noqa: E402

SOURCE = "bench"
T0 = 1_700_000_000.0


def url(i: int) -> str:
    return f"https://example.test/item/{i}"


def rank_for(u: str, age_s: float | None, fresh_s: float) -> float:
    """Cheap and spread out (few ties), like a planner's ranks."""
    return (zlib.crc32(u.encode()) % 10_000) / 1_000.0 - T0 / 60.0


def offer_all(frontier: Frontier, n: int, *, now: float) -> float:
    started = time.perf_counter()
    result = frontier.offer(
        SOURCE,
        (Offer(url(i), 3_600.0) for i in range(n)),
        now=now,
        queue_ttl_s=86_400.0,
        rank_for=rank_for,
        run_id="bench",
    )
    elapsed = time.perf_counter() - started
    assert result.enqueued == n, result
    return elapsed


def drain(frontier: Frontier, batch: int, *, now: float) -> tuple[int, float, float]:
    """Claim and ack until empty; returns (items, seconds in claim, seconds in ack)."""
    items, in_claim, in_ack = 0, 0.0, 0.0
    while True:
        t = time.perf_counter()
        lease = frontier.claim(SOURCE, batch, now=now, lease_s=600.0)
        in_claim += time.perf_counter() - t
        if not lease.items:
            return items, in_claim, in_ack
        outcomes = [
            Completed(i.url, fresh_until=now + 3_600.0, fetched_at=now) for i in lease.items
        ]
        t = time.perf_counter()
        result = frontier.ack(lease, outcomes, now=now)
        in_ack += time.perf_counter() - t
        assert result.accepted == len(outcomes), result
        items += len(outcomes)


def measure(name: str, frontier: Frontier, n: int, batch: int) -> dict[str, float]:
    offer_s = offer_all(frontier, n, now=T0)
    items, claim_s, ack_s = drain(frontier, batch, now=T0 + 1)
    assert items == n, (name, items)
    counts = frontier.counts(SOURCE)
    assert counts.done == n and counts.total == n, counts
    us = 1e6 / n
    return {
        "offer": offer_s * us,
        "claim": claim_s * us,
        "ack": ack_s * us,
        "claim+ack": (claim_s + ack_s) * us,
    }


def million(server: RedisServer) -> tuple[int, int]:
    client = redis.Redis.from_url(server.url)
    client.flushdb()
    before = int(client.info("memory")["used_memory"])
    frontier = RedisFrontier(server.url)
    try:
        offer_all(frontier, 1_000_000, now=time.time())
        after = int(client.info("memory")["used_memory"])
    finally:
        frontier.close()
        client.close()
    return before, after


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="URLs to offer and drain")
    parser.add_argument("--batch", type=int, default=500, help="items per claim")
    parser.add_argument("--million", action="store_true", help="also measure 1M URLs' memory")
    args = parser.parse_args()

    with RedisServer() as server, tempfile.TemporaryDirectory() as folder:
        version = redis.Redis.from_url(server.url).info("server")["redis_version"]
        print(f"N={args.n:,} URLs, batch {args.batch}, redis-server {version} on {server.url}")
        ours = RedisFrontier(server.url)
        try:
            got = {"redis": measure("redis", ours, args.n, args.batch)}
        finally:
            ours.close()
        ref = SqliteFrontier(Path(folder) / "frontier.db")
        try:
            got["sqlite"] = measure("sqlite", ref, args.n, args.batch)
        finally:
            ref.close()

        print(f"\n{'us per item':<14}{'redis':>10}{'sqlite':>10}{'redis/sqlite':>14}")
        for key in ("offer", "claim", "ack", "claim+ack"):
            r, s = got["redis"][key], got["sqlite"][key]
            print(f"{key:<14}{r:>10.1f}{s:>10.1f}{r / s:>14.2f}")
        target = got["redis"]["claim+ack"]
        print(f"\nredis claim+ack {target:.1f} us/item (target < 50): "
              f"{'ok' if target < 50 else 'MISSED'}")  # fmt: skip

        if args.million:
            before, after = million(server)
            used = after - before
            print(
                f"\n1,000,000 URLs offered: used_memory {after / 2**20:.1f} MiB "
                f"({after / 1e6:.1f} MB; {used / 1e6:.0f} bytes per URL above the empty "
                f"server's {before / 2**20:.1f} MiB) (target <= 250 MB): "
                f"{'ok' if after <= 250e6 else 'MISSED'}"
            )


if __name__ == "__main__":
    main()
