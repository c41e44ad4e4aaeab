"""Several worker processes on one Redis frontier: nothing lost, nothing held twice.

Each worker is a real ``collector`` subprocess (``run`` plans and drains under the source lock,
``work`` only helps drain) against the session's Prefect server, a throwaway redis-server and a
local HTTP server that logs which worker fetched which item (the ``X-Collector-Worker`` header).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import sink_lines, write_source
from tests.worker_site import WORKER_HEADER, WorkerSite

COLLECTOR = [sys.executable, "-m", "flows.cli"]
ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


class Worker:
    """One ``collector run|work`` subprocess with its own source copy (its own JSONL sink)."""

    def __init__(
        self,
        folder: Path,
        role: str,
        name: str,
        api_url: str,
        source: dict[str, Any],
        *,
        batch: int = 100,
        args: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.folder = folder / name
        self.folder.mkdir(parents=True)
        path = write_source(self.folder, **source)
        options = ["--json", "--batch-size", str(batch), *args]
        if role == "work":
            options += ["--idle-wait", "120"]
        env = {
            **os.environ,
            "PREFECT_API_URL": api_url,
            "PYTHONPATH": str(ROOT),
            "COLLECTOR_WORKER": name,
        }
        self.process = subprocess.Popen(
            [*COLLECTOR, role, str(path), *options],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def finish(self, timeout: float = 240) -> tuple[int, dict[str, Any] | None, str]:
        out, err = self.process.communicate(timeout=timeout)
        lines = out.strip().splitlines()
        summary = json.loads(lines[-1]) if lines else None
        return self.process.returncode, summary, err

    def rows(self) -> list[dict[str, Any]]:
        return sink_lines(self.folder / "out")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def _source(name: str, site: WorkerSite, redis_url: str, total: int, **extra: Any) -> dict:
    source: dict[str, Any] = {
        "name": name,
        "seeds": {"template": site.url("/items/{i}.json"), "range": [0, total]},
        "frontier": {"type": "redis", "url": redis_url},
        "deadletters": {"type": "redis", "url": redis_url},
        "limits": {
            "concurrency": 16,
            "per_domain_concurrency": 16,
            "headers": {WORKER_HEADER: "${env:COLLECTOR_WORKER}"},
        },
        "locks": {"wait_s": 5},
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(source.get(key), dict):
            source[key] = {**source[key], **value}
        else:
            source[key] = value
    return source


def _wait_until(condition: Any, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _stored_keys(workers: list[Worker]) -> Counter[int]:
    return Counter(int(row["_collector"]["key"]) for w in workers for row in w.rows())


def test_three_workers_store_20000_urls_exactly_once_and_never_hold_one_twice(
    tmp_path: Path, prefect_api: str, redis_url: str
) -> None:
    total = 20_000
    with WorkerSite() as site:
        source = _source("workers-three", site, redis_url, total)
        workers = [Worker(tmp_path, "run", "w0", prefect_api, source, batch=250)]
        workers += [
            Worker(tmp_path, "work", f"w{i}", prefect_api, source, batch=250) for i in (1, 2)
        ]
        results = [w.finish() for w in workers]
        fetches = site.fetches()

    for code, summary, err in results:
        assert code == 0, err[-2000:]
        assert summary is not None and summary["balanced"], summary
    planner = results[0][1]
    helpers = [r[1] for r in results[1:]]
    assert planner is not None and planner["discovered"] == total

    # The server's log: every item fetched exactly once, each by one worker.
    per_item = Counter(item for item, _ in fetches)
    assert set(per_item) == set(range(total))
    assert [item for item, n in per_item.items() if n > 1] == []
    by_worker = Counter(worker for _, worker in fetches)
    print(f"fetches by worker: {dict(by_worker)}; run: {planner['seconds']}s")
    assert set(by_worker) <= {"w0", "w1", "w2"}
    assert sum(1 for n in by_worker.values() if n) >= 2, by_worker  # the helpers did help

    # The sinks: every key stored exactly once, by the worker the server saw fetching it.
    stored = _stored_keys(workers)
    assert set(stored) == set(range(total)) and max(stored.values()) == 1
    fetched_by = dict(fetches)
    for w in workers:
        assert all(fetched_by[int(row["_collector"]["key"])] == w.name for row in w.rows())

    # The ledgers: each worker's stored = what it fetched; the run counts the helpers' share.
    for w, (_, summary, _) in zip(workers, results, strict=True):
        assert summary is not None and summary["stored"] == by_worker.get(w.name, 0)
    helped = sum(h["stored"] for h in helpers if h)
    assert planner["stored"] + helped == total
    # what the helpers stored before the run closed its books, and what they still held then
    assert planner["stored_by_others"] + planner["queued"] == helped


FAST_TTL = {"http_timeout_s": 1, "request_deadline_s": 1, "batch_timeout_s": 2, "lease_s": 3}


def _fetched_by(fetches: list[tuple[int, str]], worker: str) -> set[int]:
    return {item for item, who in fetches if who == worker}


def _refetched(fetches: list[tuple[int, str]]) -> dict[int, list[str]]:
    """Items fetched more than once, with who fetched them, in order."""
    order: dict[int, list[str]] = {}
    for item, who in fetches:
        order.setdefault(item, []).append(who)
    return {item: who for item, who in order.items() if len(who) > 1}


def test_sigkill_a_worker_mid_batch_its_items_come_back_after_the_lease_once(
    tmp_path: Path, prefect_api: str, redis_url: str
) -> None:
    total = 1500
    with WorkerSite() as site:
        site.set_delay(0.02)
        source = _source("workers-sigkill", site, redis_url, total, ttl=FAST_TTL)
        run = Worker(tmp_path, "run", "w0", prefect_api, source, batch=20)
        victim = Worker(tmp_path, "work", "w1", prefect_api, source, batch=20)
        try:
            _wait_until(lambda: len(_fetched_by(site.fetches(), "w1")) >= 100, "w1 to fetch")
        finally:
            victim.kill()
        code, summary, err = run.finish()
        fetches = site.fetches()

    assert code == 0, err[-2000:]
    assert summary is not None and summary["balanced"], summary
    assert summary["discovered"] == total and summary["queued"] == 0
    assert summary["leases_reclaimed"] > 0  # the victim's leased items came back after expiry
    refetched = _refetched(fetches)
    assert all(who == ["w1", "w0"] for who in refetched.values()), refetched
    assert set(dict(fetches)) == set(range(total))
    # Stored once: the run's sink has no duplicates; together with what the victim stored
    # before it died, every item; an item in both is one the victim wrote but never acked,
    # which the run fetched again after the victim's lease expired.
    mine = Counter(int(row["_collector"]["key"]) for row in run.rows())
    theirs = {int(row["_collector"]["key"]) for row in victim.rows()}
    assert max(mine.values()) == 1
    assert set(mine) | theirs == set(range(total))
    assert set(mine) & theirs <= set(refetched)


def test_sigstop_a_worker_past_its_lease_its_late_acks_are_refused_and_counted(
    tmp_path: Path, prefect_api: str, redis_url: str
) -> None:
    total = 1500
    with WorkerSite() as site:
        site.set_delay(0.02)
        source = _source("workers-sigstop", site, redis_url, total, ttl=FAST_TTL)
        run = Worker(tmp_path, "run", "w0", prefect_api, source, batch=20)
        paused = Worker(tmp_path, "work", "w1", prefect_api, source, batch=20)
        try:
            _wait_until(lambda: len(_fetched_by(site.fetches(), "w1")) >= 60, "w1 to fetch")
            paused.process.send_signal(signal.SIGSTOP)
            stopped_with = _fetched_by(site.fetches(), "w1")
            # its lease expires; the run takes its items and fetches them again
            _wait_until(
                lambda: stopped_with & _fetched_by(site.fetches(), "w0"), "w0 to take w1's items"
            )
        finally:
            paused.process.send_signal(signal.SIGCONT)
        results = [run.finish(), paused.finish()]
        fetches = site.fetches()

    for code, summary, err in results:
        assert code == 0, err[-2000:]
        assert summary is not None and summary["balanced"], summary
    late = results[1][1]
    assert late is not None and late["stale_acks"] > 0, late  # refused by the frontier's fence
    assert set(dict(fetches)) == set(range(total))
    mine = Counter(int(row["_collector"]["key"]) for row in run.rows())
    assert max(mine.values()) == 1
