"""Several worker processes on one Redis frontier and one Postgres sink: nothing lost, nothing
stored twice, nothing held by two workers.

Each worker is a real ``collector`` subprocess (``run`` plans and drains under the source lock,
``work`` only helps drain) against the session's Prefect server, a throwaway redis-server, a
throwaway Postgres and a local HTTP server that logs which worker fetched which item (the
``X-Collector-Worker`` header). A trigger on the records table logs every content write, so
"stored exactly once" is read from the database, not from the workers' own counts.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
import yaml

from collector.run.stop import EXIT_LOST_FOOTING
from collector.sinks.postgres import PostgresSink
from tests.helpers import write_source
from tests.servers import free_port
from tests.worker_site import WORKER_HEADER, WorkerSite

COLLECTOR = [sys.executable, "-m", "flows.cli"]
ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


class Worker:
    """One ``collector run|work`` subprocess (its own folder; its worker id in a header)."""

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
        idle_wait_s: float = 120,
    ) -> None:
        self.name = name
        self.folder = folder / name
        self.folder.mkdir(parents=True)
        path = write_source(self.folder, **source)
        text = yaml.safe_load(path.read_text(encoding="utf-8"))
        text["sink"] = source["sink"]  # replace the default JSONL sink, not merge into it
        path.write_text(yaml.safe_dump(text, sort_keys=False), encoding="utf-8")
        options = ["--json", "--batch-size", str(batch), *args]
        if role == "work":  # a helper started before the run planned waits for the plan
            options += ["--idle-wait", f"{idle_wait_s:g}"]
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

    def finish(self, timeout: float = 600) -> tuple[int, dict[str, Any] | None, str]:
        """The worker's exit code, summary and stderr; ``timeout`` only guards against a hang
        (at load 20, three workers on 20,000 URLs took longer than 240 s)."""
        out, err = self.process.communicate(timeout=timeout)
        lines = out.strip().splitlines()
        summary = json.loads(lines[-1]) if lines else None
        return self.process.returncode, summary, err

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def _source(
    name: str, site: WorkerSite, redis_url: str, dsn: str, total: int, **extra: Any
) -> dict[str, Any]:
    source: dict[str, Any] = {
        "name": name,
        "seeds": {"template": site.url("/items/{i}.json"), "range": [0, total]},
        "frontier": {"type": "redis", "url": redis_url},
        "deadletters": {"type": "redis", "url": redis_url},
        "sink": {"type": "postgres", "dsn": dsn, "table": "records"},
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


_AUDIT = """
CREATE TABLE content_writes (key text, token bigint, batch_id text);
CREATE FUNCTION log_content_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR OLD.digest IS DISTINCT FROM NEW.digest THEN
        INSERT INTO content_writes VALUES (NEW.key, NEW.token, NEW.batch_id);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER log_content_write BEFORE INSERT OR UPDATE ON records
    FOR EACH ROW EXECUTE FUNCTION log_content_write();
"""


def _audited_sink(dsn: str, source: str) -> None:
    """Create the records table (as the sink does) and log every content write to it."""
    PostgresSink(dsn, source=source, table="records").close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(_AUDIT)


def _stored(dsn: str) -> tuple[Counter[int], Counter[int], dict[int, str]]:
    """(rows per key, content writes per key, batch id of each stored row)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT key, batch_id FROM records").fetchall()
        writes = conn.execute("SELECT key FROM content_writes").fetchall()
    return (
        Counter(int(key) for key, _ in rows),
        Counter(int(key) for (key,) in writes),
        {int(key): batch for key, batch in rows},
    )


def _assert_stored_exactly_once(dsn: str, total: int) -> dict[int, str]:
    rows, writes, batches = _stored(dsn)
    assert set(rows) == set(range(total)) and max(rows.values()) == 1
    assert set(writes) == set(range(total))
    assert [key for key, n in writes.items() if n > 1] == []  # one content write per key
    return batches


def test_three_workers_store_20000_urls_exactly_once_and_never_hold_one_twice(
    tmp_path: Path, prefect_api: str, redis_url: str, postgres_dsn: str
) -> None:
    total = 20_000
    _audited_sink(postgres_dsn, "workers-three")
    with WorkerSite() as site:
        source = _source(
            "workers-three", site, redis_url, postgres_dsn, total,
            limits={"concurrency": 32, "per_domain_concurrency": 32},
        )  # fmt: skip
        workers = [Worker(tmp_path, "run", "w0", prefect_api, source, batch=500)]
        workers += [
            Worker(tmp_path, "work", f"w{i}", prefect_api, source, batch=500) for i in (1, 2)
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

    # The sink: every key written exactly once, by the worker the server saw fetching it.
    batches = _assert_stored_exactly_once(postgres_dsn, total)
    run_of = {s["run_id"]: w.name for w, (_, s, _) in zip(workers, results, strict=True) if s}
    fetched_by = dict(fetches)
    assert all(run_of[batch.split(":")[0]] == fetched_by[key] for key, batch in batches.items())

    # The ledgers: each worker's stored = what it fetched; the run counts the helpers' share.
    for w, (_, summary, _) in zip(workers, results, strict=True):
        assert summary is not None and summary["stored"] == by_worker.get(w.name, 0)
    helped = sum(h["stored"] for h in helpers if h)
    assert planner["stored"] + helped == total
    # The run waited for the live helpers: its books describe the finished source, and what it
    # says the others stored is what the helpers' own ledgers say they stored.
    assert planner["queued"] == 0 and planner["held_by_others"] == 0, planner
    assert planner["stored_by_others"] == helped


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
    tmp_path: Path, prefect_api: str, redis_url: str, postgres_dsn: str
) -> None:
    total = 1500
    _audited_sink(postgres_dsn, "workers-sigkill")
    with WorkerSite() as site:
        site.set_delay(0.02)
        source = _source("workers-sigkill", site, redis_url, postgres_dsn, total, ttl=FAST_TTL)
        # the run plans everything and takes one batch; then the victim drains alone until killed
        plan = Worker(
            tmp_path, "run", "p", prefect_api, source, batch=20, args=("--max-items", "20")
        )
        planned = plan.finish()
        victim = Worker(tmp_path, "work", "w1", prefect_api, source, batch=20)
        try:
            _wait_until(lambda: len(_fetched_by(site.fetches(), "w1")) >= 100, "w1 to fetch")
        finally:
            victim.kill()
        code, summary, err = Worker(tmp_path, "work", "w2", prefect_api, source, batch=20).finish()
        fetches = site.fetches()

    assert planned[0] == 0 and planned[1] is not None and planned[1]["balanced"], planned
    assert code == 0, err[-2000:]
    assert summary is not None and summary["balanced"], summary
    assert summary["leases_reclaimed"] > 0  # the victim's leased items came back after expiry
    # Fetched by the victim, then by w2 once its lease expired, never the other way round (a
    # request that timed out is asked again by the same worker: at load 20 a 1 s deadline
    # does, and that retry is not a second holder).
    refetched = {item: [w for i, w in enumerate(who) if i == 0 or who[i - 1] != w]
                 for item, who in _refetched(fetches).items()}  # fmt: skip
    wrong = {item: who for item, who in refetched.items() if who not in (["w1", "w2"], ["w2"])}
    assert not wrong, wrong
    assert set(dict(fetches)) == set(range(total))
    # Stored once: items the victim wrote but never acked were fetched again after its lease
    # expired, and the refetch found the same content (no second content write).
    _assert_stored_exactly_once(postgres_dsn, total)


def _keys_in_sink(dsn: str) -> set[int]:
    with psycopg.connect(dsn) as conn:
        return {int(key) for (key,) in conn.execute("SELECT key FROM records").fetchall()}


def _leased_items(redis_url: str, source: str) -> set[int]:
    """The items leased now (the frontier's lease index, ``{collector:<source>}:l``): with one
    worker running, the ones it holds. A page fetched and not stored is not always held: a
    timed-out fetch was acked "retry later" and is queued again."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        urls: list[str] = client.zrange("{collector:" + source + "}:l", 0, -1)  # type: ignore[assignment]
    finally:
        client.close()
    return {int(url.rsplit("/", 1)[1].split(".")[0]) for url in urls}


def test_sigstop_a_worker_past_its_lease_its_late_writes_are_refused_and_counted(
    tmp_path: Path, prefect_api: str, redis_url: str, postgres_dsn: str
) -> None:
    total = 1500
    _audited_sink(postgres_dsn, "workers-sigstop")
    with WorkerSite() as site:
        site.set_delay(0.02)
        source = _source("workers-sigstop", site, redis_url, postgres_dsn, total, ttl=FAST_TTL)
        # the run plans everything and takes one batch; then w1 drains alone until stopped
        plan = Worker(
            tmp_path, "run", "p", prefect_api, source, batch=20, args=("--max-items", "20")
        )
        planned = plan.finish()
        paused = Worker(tmp_path, "work", "w1", prefect_api, source, batch=20)
        try:
            _wait_until(lambda: len(_fetched_by(site.fetches(), "w1")) >= 60, "w1 to fetch")
            for _ in range(10):  # stop it while it holds fetched items it has not stored yet
                paused.process.send_signal(signal.SIGSTOP)
                fetched = _fetched_by(site.fetches(), "w1")
                held = (fetched & _leased_items(redis_url, "workers-sigstop")) - _keys_in_sink(
                    postgres_dsn
                )
                if held:
                    break
                paused.process.send_signal(signal.SIGCONT)
                time.sleep(0.2)
            assert held, "could not catch w1 holding unstored items"
            # its lease expires; w2 takes those items and stores them under newer tokens
            taker = Worker(tmp_path, "work", "w2", prefect_api, source, batch=20)
            _wait_until(lambda: held & _keys_in_sink(postgres_dsn), "w2 to store w1's items")
            overtaken = held & _keys_in_sink(postgres_dsn)  # stored by w2 before w1 wakes
        finally:
            paused.process.send_signal(signal.SIGCONT)
        results = [planned, taker.finish()]
        late_code, late, late_err = paused.finish()
        # what the late worker gave back when it stopped is collected by a rerun. The source is
        # planned long before: no idle wait for a plan (with 120 s, a rerun that found nothing
        # given back waited out all 120 s before it ended drained).
        rerun = Worker(tmp_path, "work", "w3", prefect_api, source, batch=20, idle_wait_s=0)
        results.append(rerun.finish())
        fetches = site.fetches()

    for code, summary, err in results:
        assert code == 0, err[-2000:]
        assert summary is not None and summary["balanced"], summary
    second = results[1][1]
    assert second is not None
    if late_code == EXIT_LOST_FOOTING:
        # it woke to find its lease taken: it stopped at once, saying so in one line
        assert "lost the lease of batch" in late_err, late_err[-2000:]
    else:
        # it woke and tried to settle first: the fences (the frontier's for acks, the sink's
        # for record writes) refused what it no longer held, and its summary counts them
        assert late_code == 0 and late is not None, late_err[-2000:]
        assert late["stale_acks"] > 0, late
        assert late["fence_refused"] == late["stale_writes"] + late["stale_acks"]
    assert set(dict(fetches)) == set(range(total))
    batches = _assert_stored_exactly_once(postgres_dsn, total)
    # what w2 had stored of w1's items before w1 woke stays w2's: w1's late writes were refused
    assert overtaken
    assert {key for key in overtaken if batches[key].split(":")[0] != second["run_id"]} == set()


def test_the_run_waits_for_slower_helpers_and_ends_when_the_source_is_done(
    tmp_path: Path, prefect_api: str, redis_url: str, postgres_dsn: str
) -> None:
    """Helpers with batches ten times the run's, default lease (600 s): the run does not quit
    while live helpers hold items; its counts match the helpers' own summaries."""
    total = 2000
    _audited_sink(postgres_dsn, "workers-slow-helpers")
    with WorkerSite() as site:
        site.set_delay(0.01)
        source = _source("workers-slow-helpers", site, redis_url, postgres_dsn, total)
        run = Worker(tmp_path, "run", "w0", prefect_api, source, batch=50)
        helpers = [
            Worker(tmp_path, "work", f"w{i}", prefect_api, source, batch=500) for i in (1, 2)
        ]
        results = [w.finish() for w in [run, *helpers]]

    for code, summary, err in results:
        assert code == 0, err[-2000:]
        assert summary is not None and summary["balanced"], summary
    planner = results[0][1]
    assert planner is not None
    helped = [r[1]["stored"] for r in results[1:] if r[1]]
    assert planner["queued"] == 0 and planner["held_by_others"] == 0, planner
    assert planner["stored_by_others"] == sum(helped), (planner, helped)
    assert planner["stored"] + planner["stored_by_others"] == total
    _assert_stored_exactly_once(postgres_dsn, total)


def test_a_helper_killed_while_the_run_waits_for_it_is_taken_back_without_the_lease(
    tmp_path: Path, prefect_api: str, redis_url: str, postgres_dsn: str
) -> None:
    """Default lease (600 s): the run notices the helper's heartbeat stop, revokes its leases
    and finishes its items itself; nothing is left queued for a later run."""
    total = 1500
    _audited_sink(postgres_dsn, "workers-helper-dies")
    with WorkerSite() as site:
        site.set_delay(0.05)
        source = _source("workers-helper-dies", site, redis_url, postgres_dsn, total)
        helper = Worker(tmp_path, "work", "w1", prefect_api, source, batch=500)
        run = Worker(tmp_path, "run", "w0", prefect_api, source, batch=50)
        try:
            _wait_until(lambda: len(_fetched_by(site.fetches(), "w1")) >= 50, "w1 to fetch")
        finally:
            helper.kill()
        code, summary, err = run.finish(timeout=600)
        fetches = site.fetches()

    assert code == 0, err[-2000:]
    assert summary is not None and summary["balanced"], summary
    assert summary["queued"] == 0 and summary["held_by_others"] == 0, summary
    assert summary["leases_reclaimed"] > 0  # the dead helper's leases, revoked
    assert set(dict(fetches)) == set(range(total))
    _assert_stored_exactly_once(postgres_dsn, total)


class _PersistentRedis:
    """A redis-server that keeps its data across a restart (append-only file, fsync always)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                shutil.which("redis-server") or "/usr/bin/redis-server",
                "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder),
                "--appendonly", "yes", "--appendfsync", "always", "--save", "",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        client = redis.Redis.from_url(self.url)
        _wait_until(lambda: _pings(client), "redis-server to start", timeout=30)
        client.close()

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=30)
            self.process = None


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def test_redis_restart_mid_run_workers_fail_clearly_or_recover_and_a_rerun_balances(
    tmp_path: Path, prefect_api: str, postgres_dsn: str
) -> None:
    total = 1500
    _audited_sink(postgres_dsn, "workers-restart")
    server = _PersistentRedis(tmp_path)
    server.start()
    try:
        with WorkerSite() as site:
            site.set_delay(0.02)
            source = _source("workers-restart", site, server.url, postgres_dsn, total, ttl=FAST_TTL)
            workers = [
                Worker(tmp_path, "run", "w0", prefect_api, source, batch=20),
                Worker(tmp_path, "work", "w1", prefect_api, source, batch=20),
            ]
            _wait_until(lambda: len(site.fetches()) >= 200, "the workers to get going")
            server.stop()
            time.sleep(1.0)
            server.start()
            for worker in workers:
                code, summary, err = worker.finish()
                lines = err.strip().splitlines()
                print(f"{worker.name} after the restart: exit {code}: {lines[-1:] or ''}")
                if code == EXIT_LOST_FOOTING:  # its leases (3 s) ran out during the outage
                    # and the other worker took the items back: it stops, says so, loses nothing
                    assert lines and lines[-1].startswith("collector: stopped: lost the lease"), (
                        err[-2000:]
                    )
                    assert "run again to continue" in lines[-1]
                elif code != 0:  # failed: one clear line naming the backend, nothing lost
                    assert code == 1 and lines, err[-2000:]
                    assert lines[-1].startswith("collector: ") and "redis" in lines[-1].lower()
                else:  # or it recovered and balanced
                    assert summary is not None and summary["balanced"], summary
            rerun = Worker(tmp_path / "rerun", "run", "w0", prefect_api, source, batch=20)
            code, summary, err = rerun.finish()
    finally:
        server.stop()

    assert code == 0, err[-2000:]
    assert summary is not None and summary["balanced"], summary
    # an unchanged source is planned incrementally: the rerun takes on what was still due
    assert summary["queued"] == 0 and summary["held_by_others"] == 0, summary
    _assert_stored_exactly_once(postgres_dsn, total)
