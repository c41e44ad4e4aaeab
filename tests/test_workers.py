"""Several worker processes on one Redis frontier: nothing lost, nothing held twice.

Each worker is a real ``collector`` subprocess (``run`` plans and drains under the source lock,
``work`` only helps drain) against the session's Prefect server, a throwaway redis-server and a
local HTTP server that logs which worker fetched which item (the ``X-Collector-Worker`` header).
"""

from __future__ import annotations

import json
import os
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
