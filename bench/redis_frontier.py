"""Frontier throughput: RedisFrontier vs SqliteFrontier side by side, in one run.

    .venv/bin/python bench/redis_frontier.py [--n 100000] [--batch 500] [--million]

Starts its own redis-server on a free port (tests/servers.py), then for each backend: offers N
new URLs (one ``offer`` call, chunked inside), and claims + acks (``Completed``) them in batches
until the queue is empty. Prints microseconds per item, amortised, for offer and for claim+ack
(target for Redis: claim+ack < 50 us/item), and the Redis/SQLite ratios.

The Redis frontier runs as it is and, side by side on the same server (another prefix), with
its scripts as they were before replays (collector._redis: no request id, no reply record;
``without_replay``): their offers alternate a slice at a time and their claims and acks a batch
at a time, so a busy moment of the (shared) box weighs on both alike, and the cost of making
the state-changing scripts replayable is the ratio of the two. The reply records the drain left
(kept ``REPLAY_S``) are reported in bytes per claimed item.

``--million`` also offers 1,000,000 URLs to an empty Redis and reports ``used_memory``
(target <= 250 MB).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
import zlib
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collector._redis import REPLAY_S, Scripts, script_text  # noqa: E402
from collector.frontier import redis as frontier_redis  # noqa: E402
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


_HEAD = re.compile(r"^local again = replayed\(\).*\nif again ~= nil then return again end\n", re.M)
_TAIL = re.compile(r"return remember\((.*)\)$", re.M)


def without_replay(frontier: RedisFrontier) -> RedisFrontier:
    """``frontier`` with its scripts as before replays: sent once, no request id, no record."""
    client = frontier._client
    scripts = Scripts(client, "collector.frontier", (), prelude="prelude")
    for name in frontier_redis._SCRIPTS:
        text = script_text("collector.frontier", "prelude", name)
        text, heads = _HEAD.subn("", text)
        text = _TAIL.sub(r"return \1", text)
        assert heads == (name in frontier_redis._REPLAYED), name
        script = client.register_script(text)
        script.sha = client.script_load(text)
        scripts._scripts[name] = script
    frontier._scripts = scripts
    return frontier


def side_by_side(ours: Frontier, before: Frontier, n: int, batch: int) -> list[dict[str, float]]:
    """:func:`measure` of both, interleaved: offers a slice of 5,000 URLs each in turn, claims
    and acks a batch each in turn (who goes first alternates)."""
    pair = (ours, before)
    spent = [dict.fromkeys(("offer", "claim", "ack"), 0.0) for _ in pair]
    for turn, start in enumerate(range(0, n, 5_000)):
        for k in (0, 1) if turn % 2 == 0 else (1, 0):
            offers = [Offer(url(i), 3_600.0) for i in range(start, min(start + 5_000, n))]
            t = time.perf_counter()
            pair[k].offer(SOURCE, offers, now=T0, queue_ttl_s=86_400.0, rank_for=rank_for,
                          run_id="bench")  # fmt: skip
            spent[k]["offer"] += time.perf_counter() - t
    now, turn, left = T0 + 1, 0, [True, True]
    while any(left):
        for k in (0, 1) if turn % 2 == 0 else (1, 0):
            if not left[k]:
                continue
            t = time.perf_counter()
            lease = pair[k].claim(SOURCE, batch, now=now, lease_s=600.0)
            spent[k]["claim"] += time.perf_counter() - t
            if not lease.items:
                left[k] = False
                continue
            outcomes = [Completed(i.url, fresh_until=now + 3_600.0, fetched_at=now)
                        for i in lease.items]  # fmt: skip
            t = time.perf_counter()
            assert pair[k].ack(lease, outcomes, now=now).accepted == len(outcomes)
            spent[k]["ack"] += time.perf_counter() - t
        turn += 1
    us = 1e6 / n
    for frontier in pair:
        counts = frontier.counts(SOURCE)
        assert counts.done == n and counts.total == n, counts
    return [
        {**{k: v * us for k, v in got.items()}, "claim+ack": (got["claim"] + got["ack"]) * us}
        for got in spent
    ]


def records(server: RedisServer) -> tuple[int, int]:
    """(reply records, their bytes) in the server now."""
    client = redis.Redis.from_url(server.url)
    try:
        keys = list(client.scan_iter(match="*:req:*", count=1000))
        return len(keys), sum(int(client.memory_usage(k) or 0) for k in keys)
    finally:
        client.close()


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
        old = without_replay(RedisFrontier(server.url, prefix="before"))
        try:
            found = side_by_side(ours, old, args.n, args.batch)
            got = dict(zip(("redis", "before"), found, strict=True))
        finally:
            ours.close()
            old.close()
        kept = records(server)
        ref = SqliteFrontier(Path(folder) / "frontier.db")
        try:
            got["sqlite"] = measure("sqlite", ref, args.n, args.batch)
        finally:
            ref.close()

        print("\n(redis: the frontier as it is; before: its scripts without replay records, "
              "interleaved with it)")  # fmt: skip
        print(f"\n{'us per item':<14}{'redis':>10}{'before':>10}{'sqlite':>10}"
              f"{'redis/before':>14}{'redis/sqlite':>14}")  # fmt: skip
        for key in ("offer", "claim", "ack", "claim+ack"):
            r, b, s = got["redis"][key], got["before"][key], got["sqlite"][key]
            print(f"{key:<14}{r:>10.1f}{b:>10.1f}{s:>10.1f}{r / b:>14.2f}{r / s:>14.2f}")
        count, size = kept
        print(
            f"\nreply records left by one drain: {count:,} ({size / 1e6:.2f} MB, "
            f"{size / args.n:.0f} bytes per item claimed), each kept {REPLAY_S} s"
        )
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
