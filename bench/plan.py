"""Planning at scale: a new, an unchanged and a changed seed list, SQLite and Redis, in one run.

    .venv/bin/python bench/plan.py [--n 1000000] [--backends sqlite,redis] [--keep DIR]
                                   [--seeds template|file]

For each backend, a source of N URLs (``seeds.template`` + ``range``, or with ``--seeds file``
a seed file of N lines) is planned several times by
``Collection.plan`` (the code a run uses; no Prefect, nothing fetched), each in a child process
of its own so its peak RSS (``ru_maxrss``) is that plan's alone:

1. ``new``: an empty frontier, every URL offered (URLs/s, target >= 150,000 on SQLite);
2. ``unchanged, all queued``: the same source again, every item still queued, so all are due
   and join the run (an incremental plan costs O(due): here due = N);
3. ``unchanged, all fresh``: every item is then made done and fresh (SQLite: one UPDATE, a
   shortcut, and the kept counts counted again; Redis: claims and acks of 10,000), and the
   source planned again: nothing is due (target <= 2 s);
4. ``changed``: the range grown by 1 % (a file: 1 % more lines appended), a difference plan:
   only the 1 % new offered;
5. ``middle`` (a file only): 100 lines in the middle of the file replaced by other URLs, a
   difference plan: 100 offered, the file read once for URLs still named;
6. ``edited``: ``on_removed`` switched (a full plan: every seed offered again, all known).

Then storage per queued URL: the SQLite file (after a checkpoint) / N (target <= 200 bytes), and
Redis ``used_memory`` growth / N (target <= 230). Peak RSS target: <= 200 MB whatever N. On
Redis, the longest command of each plan (from its slow log): how long a plan held the server.
Redis runs as a throwaway server on a free port (tests/servers.py). The machine is shared:
``uptime`` is printed with the figures; compare only within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGETS = {"rate": 150_000, "unchanged_s": 2.0, "rss_mb": 200, "sqlite_b": 200, "redis_b": 230}


MIDDLE = 100  # lines replaced in the middle of a seed file


def write_source(
    folder: Path,
    n: int,
    frontier: dict[str, Any],
    on_removed: str = "retire",
    *,
    form: str = "template",
    replaced: int = 0,
) -> Path:
    """The bench's source: a template over ``range(n)``, or a seed file of ``n`` lines whose
    ``replaced`` middle lines name other URLs."""
    import yaml

    template = "http://127.0.0.1:9/items/{i}.json"
    seeds: dict[str, Any] = {"template": template, "range": [0, n]}
    if form == "file":
        moved = range(n // 2 - replaced // 2, n // 2 - replaced // 2 + replaced)
        other = template.replace("/items/", "/other/")
        with (folder / "seeds.txt").open("w", encoding="utf-8") as out:
            for start in range(0, n, 100_000):
                lines = range(start, min(n, start + 100_000))
                out.write(
                    "".join((other if i in moved else template).format(i=i) + "\n" for i in lines)
                )
        seeds = {"file": "seeds.txt"}
    source = {
        "name": "plan-bench",
        "seeds": {**seeds, "on_removed": on_removed},
        "record": {"key": "id"},
        "sink": {"type": "jsonl", "path": "out"},
        "state_dir": "state",
        "allow_private_networks": True,
        **frontier,
    }
    path = folder / "source.yaml"
    path.write_text(yaml.safe_dump(source), encoding="utf-8")
    return path


def child(path: str, run_id: str) -> None:
    """One plan, in this (child) process; prints its figures as JSON."""
    from collector.config import load_source
    from collector.run.collection import Collection

    source = load_source(path)
    with Collection(source, run_id=run_id) as run:
        started, cpu = time.perf_counter(), time.process_time()
        ledger = run.plan()
        seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "seconds": seconds,
                "cpu_s": cpu_s,
                "peak_rss_mb": peak_kb / 1024,
                "plan": ledger.plan,
                "discovered": ledger.discovered,
                "unlisted": ledger.unlisted,
            }
        )
    )


def longest_script_ms(client: Any) -> float:
    """The longest command Redis ran since the last call (its slow log, reset here), in ms."""
    entries = client.slowlog_get(1024)
    client.slowlog_reset()
    return max((entry["duration"] / 1000 for entry in entries), default=0.0)


def plan_in_child(path: Path, run_id: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(path), run_id],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if out.returncode != 0:
        raise SystemExit(f"the plan {run_id} failed:\n{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def bench_backend(
    kind: str, n: int, folder: Path, redis_url: str | None, form: str = "template"
) -> dict[str, Any]:
    frontier = {"frontier": {"type": "redis", "url": redis_url}} if kind == "redis" else {}
    client = None
    if kind == "redis":
        import redis

        assert redis_url is not None
        client = redis.Redis.from_url(redis_url)
        client.flushall()
        # every command over 10 ms goes to the slow log: the longest one a plan ran is how long
        # it held Redis (other clients wait that long)
        client.config_set("slowlog-log-slower-than", 10_000)
        client.config_set("slowlog-max-len", 1024)
        client.slowlog_reset()
        base_memory = int(client.info("memory")["used_memory"])
    path = write_source(folder, n, frontier, form=form)
    figures: dict[str, Any] = {"backend": kind, "n": n, "form": form}
    figures["new"] = plan_in_child(path, "bench-new")
    if client is not None:
        figures["new"]["longest_ms"] = longest_script_ms(client)
    assert figures["new"]["discovered"] == n, figures["new"]
    if kind == "sqlite":
        import sqlite3

        db_path = folder / "state" / "frontier.db"
        db = sqlite3.connect(db_path)
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.close()
        figures["bytes_per_url"] = db_path.stat().st_size / n
    else:
        assert client is not None
        used = int(client.info("memory")["used_memory"]) - base_memory
        figures["bytes_per_url"] = used / n
        figures["breakdown"] = redis_breakdown(client, n)
    figures["unchanged"] = plan_in_child(path, "bench-unchanged")
    if client is not None:
        figures["unchanged"]["longest_ms"] = longest_script_ms(client)
    assert figures["unchanged"]["plan"] == "incremental", figures["unchanged"]
    assert figures["unchanged"]["discovered"] == n, figures["unchanged"]
    all_done(kind, folder, redis_url)
    if client is not None:
        longest_script_ms(client)  # the bench's own claims and acks
    figures["fresh"] = plan_in_child(path, "bench-fresh")
    assert figures["fresh"]["plan"] == "incremental", figures["fresh"]
    assert figures["fresh"]["discovered"] == 0, figures["fresh"]
    if kind == "sqlite":
        figures["counts"] = count_both_ways(folder / "state" / "frontier.db")
    grown = n + max(1, n // 100)
    write_source(folder, grown, frontier, form=form)
    figures["changed"] = plan_in_child(path, "bench-changed")
    if client is not None:
        figures["changed"]["longest_ms"] = longest_script_ms(client)
    # a difference plan: the 1 % new offered, the rest fresh (nothing due)
    assert figures["changed"]["plan"] == "difference", figures["changed"]
    assert figures["changed"]["discovered"] == grown - n, figures["changed"]
    if form == "file":
        write_source(folder, grown, frontier, form=form, replaced=MIDDLE)
        figures["middle"] = plan_in_child(path, "bench-middle")
        if client is not None:
            figures["middle"]["longest_ms"] = longest_script_ms(client)
        assert figures["middle"]["plan"] == "difference", figures["middle"]
        # the lines replaced, and the appended ones still queued (due: adopted)
        assert figures["middle"]["discovered"] == MIDDLE + grown - n, figures["middle"]
    write_source(folder, grown, frontier, on_removed="collect", form=form, replaced=MIDDLE)
    figures["edited"] = plan_in_child(path, "bench-edited")
    if client is not None:
        figures["edited"]["longest_ms"] = longest_script_ms(client)
    # an edit other than the range: every seed offered again, all of them known
    assert figures["edited"]["plan"] == "full", figures["edited"]
    assert figures["edited"]["discovered"] == grown, figures["edited"]
    if client is not None:
        client.close()
    return figures


def redis_breakdown(client: Any, n: int, sample: int = 1_000) -> dict[str, float]:
    """Bytes per URL by kind of key (``MEMORY USAGE``; record buckets ``B:r:HHHH`` and expiry
    lists ``B:x:T`` sampled and scaled). Redis counts a zset's dict entries at 24 bytes, which
    jemalloc rounds to 32, and no key's place in the keyspace: the sum is below used_memory."""
    import random

    sizes: dict[str, float] = {}
    groups: dict[str, list[Any]] = {}
    for key in client.scan_iter(count=10_000):
        kind = key.decode().rsplit("}", 1)[-1]
        for many in (":r:", ":x:", ":rc:"):
            if kind.startswith(many):
                kind = many + "*"
        groups.setdefault(kind, []).append(key)
    for kind, keys in groups.items():
        picked = random.sample(keys, min(sample, len(keys)))
        total = sum(client.memory_usage(key, samples=0) or 0 for key in picked)
        sizes[kind] = total * len(keys) / len(picked) / n
    return sizes


def all_done(kind: str, folder: Path, redis_url: str | None) -> None:
    """Make every item done and fresh for a day."""
    now = time.time()
    if kind == "sqlite":
        import sqlite3

        from collector.frontier.sqlite import D, SqliteFrontier

        db = sqlite3.connect(folder / "state" / "frontier.db")
        db.execute(
            f"UPDATE items SET state = {D}, fresh_until = ?, last_fetched_at = ?",
            (now + 86_400, now),
        )
        db.commit()
        db.close()
        with SqliteFrontier(folder / "state" / "frontier.db") as rows_moved:
            rows_moved.recount()  # the rows moved behind the frontier's back
        return
    from collector.frontier.base import Completed
    from collector.frontier.redis import RedisFrontier

    assert redis_url is not None
    frontier = RedisFrontier(redis_url)
    try:
        while (lease := frontier.claim("plan-bench", 10_000, now=now, lease_s=600)).items:
            done = [Completed(i.url, now + 86_400, now) for i in lease.items]
            frontier.ack(lease, done, now=now)
    finally:
        frontier.close()


def count_both_ways(path: Path) -> dict[str, float]:
    """The kept counts (what a plan reads) and the plain count of the rows, side by side: the
    seconds of each, best of three, and that they agree."""
    from collector.frontier.sqlite import SqliteFrontier

    with SqliteFrontier(path) as frontier:
        seconds = {}
        for name, count in (("kept", frontier.counts), ("scan", frontier.scan_counts)):
            times = []
            for _ in range(3):
                started = time.perf_counter()
                count("plan-bench")
                times.append(time.perf_counter() - started)
            seconds[name] = min(times)
        assert frontier.counts("plan-bench") == frontier.scan_counts("plan-bench")
    return seconds


def report(figures: dict[str, Any]) -> None:
    n, kind = figures["n"], figures["backend"]
    new, same, changed = figures["new"], figures["unchanged"], figures["changed"]
    fresh = figures["fresh"]
    rate = n / new["seconds"]
    storage_target = TARGETS["sqlite_b" if kind == "sqlite" else "redis_b"]
    runs = (new, same, fresh, changed, figures["edited"], figures.get("middle", new))
    peak = max(run["peak_rss_mb"] for run in runs)
    listed = "template + range" if figures["form"] == "template" else "a seed file"
    print(f"\n{kind}, {n:,} URLs ({listed}):")
    cpu_rate = n / max(new["cpu_s"], 1e-9)
    print(
        f"  new list        {new['seconds']:8.2f} s wall {new['cpu_s']:7.2f} s CPU"
        f"  {rate:9,.0f} URLs/s wall, {cpu_rate:9,.0f} per CPU second"
        f"  (target {TARGETS['rate']:,}; ratio {rate / TARGETS['rate']:.2f} wall,"
        f" {cpu_rate / TARGETS['rate']:.2f} CPU)  peak RSS {new['peak_rss_mb']:.0f} MB"
    )
    print(
        f"  unchanged, all queued (due) {same['seconds']:8.2f} s wall {same['cpu_s']:7.2f} s CPU"
        f"  {new['seconds'] / max(same['seconds'], 1e-9):,.1f} x less than the new plan"
        f"  peak RSS {same['peak_rss_mb']:.0f} MB"
    )
    print(
        f"  unchanged, all fresh  {fresh['seconds']:8.3f} s wall {fresh['cpu_s']:7.3f} s CPU"
        f"  (target <= {TARGETS['unchanged_s']} s)"
        f"  {new['seconds'] / max(fresh['seconds'], 1e-9):,.0f} x less than the new plan"
        f"  peak RSS {fresh['peak_rss_mb']:.0f} MB"
    )
    if "counts" in figures:
        kept, scan = figures["counts"]["kept"], figures["counts"]["scan"]
        print(
            f"  counts          kept {kept * 1000:8.3f} ms, rows counted {scan * 1000:8.1f} ms"
            f"  (ratio {scan / max(kept, 1e-9):,.0f}; equal)"
        )
    edited = figures["edited"]
    grew = "range +1 %" if figures["form"] == "template" else "file +1 % lines"
    print(
        f"  {grew} (difference plan) {changed['seconds']:8.2f} s wall"
        f" {changed['cpu_s']:7.2f} s CPU  {new['cpu_s'] / max(changed['cpu_s'], 1e-9):,.0f} x"
        f" less CPU than the new plan  peak RSS {changed['peak_rss_mb']:.0f} MB"
    )
    if "middle" in figures:
        middle = figures["middle"]
        print(
            f"  {MIDDLE} lines replaced mid-file (difference plan) {middle['seconds']:8.2f} s wall"
            f" {middle['cpu_s']:7.2f} s CPU  {new['cpu_s'] / max(middle['cpu_s'], 1e-9):,.0f} x"
            f" less CPU than the new plan  peak RSS {middle['peak_rss_mb']:.0f} MB"
        )
    print(
        f"  edited, all known (full plan) {edited['seconds']:8.2f} s wall"
        f" {edited['cpu_s']:7.2f} s CPU  {edited['discovered'] / edited['cpu_s']:9,.0f} URLs"
        f" per CPU second  peak RSS {edited['peak_rss_mb']:.0f} MB"
    )
    print(
        f"  storage         {figures['bytes_per_url']:8.1f} bytes per queued URL"
        f"  (target <= {storage_target}; ratio {figures['bytes_per_url'] / storage_target:.2f})"
    )
    if "breakdown" in figures:
        parts = sorted(figures["breakdown"].items(), key=lambda kv: -kv[1])
        kinds = ", ".join(f"{kind} {size:.1f}" for kind, size in parts if size >= 0.05)
        print(f"  by key kind     {kinds} (bytes per URL, MEMORY USAGE)")
    print(f"  peak RSS        {peak:8.0f} MB (target <= {TARGETS['rss_mb']})")
    if "longest_ms" in new:
        held = ", ".join(
            f"{name} {run.get('longest_ms', 0.0):,.0f} ms"
            for name, run in (
                ("new", new),
                ("unchanged", same),
                ("changed", changed),
                ("edited", edited),
            )
        )
        print(f"  longest script  {held} (Redis held that long; 0: none over 10 ms)")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--backends", default="sqlite,redis")
    parser.add_argument("--keep", type=Path, default=None, help="folder to keep the state in")
    parser.add_argument("--seeds", choices=("template", "file"), default="template")
    args = parser.parse_args()
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"{stamp}; uptime: {os.popen('uptime').read().strip()}")
    folder_ctx = tempfile.TemporaryDirectory() if args.keep is None else None
    base = Path(folder_ctx.name) if folder_ctx else args.keep
    try:
        for kind in args.backends.split(","):
            folder = base / kind
            folder.mkdir(parents=True, exist_ok=True)
            if kind == "redis":
                from tests.servers import RedisServer

                with RedisServer() as server:
                    report(bench_backend(kind, args.n, folder, server.url, args.seeds))
            else:
                report(bench_backend(kind, args.n, folder, None, args.seeds))
    finally:
        if folder_ctx is not None:
            folder_ctx.cleanup()
    print(f"\nuptime after: {os.popen('uptime').read().strip()}")


if __name__ == "__main__":
    main()
