"""The scale-out topology, started: `infra/local-cluster up` (Postgres, Redis, migration, two API
replicas behind nginx, one services process, two process workers), then `infra/bootstrap`,
`prefect deploy --all` and runs started through the REST API, on Redis frontiers and Postgres
sinks.

Default (slow, part of the suite): three sources started at once on three priority queues end
exact, and with the pool limited to one run the critical one starts first, then normal, then
low; every server process runs with exactly the settings of infra/prefect-server.env.

Faults (opt-in, ``COLLECTOR_CLUSTER_FAULTS=1``: each waits out real timeouts of Prefect's or
Collector's): SIGKILL an API replica mid-run, SIGKILL the services process, restart Redis,
SIGKILL a worker mid-run. Each checks that nothing is lost or stored twice and prints what the
fault cost (``FAULT <name>: ...`` lines; run with ``-s`` to see them).

``COLLECTOR_TEST_CLUSTER_DIR=DIR`` uses a cluster already up in DIR (left running) instead of
starting one: for working on these tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from collector.demo.site import FaultSite
from tests.test_deploy_e2e import PREFECT, ROOT, Webhook, World
from tests.test_workers import _audited_sink
from tests.worker_site import WORKER_HEADER, WorkerSite

pytestmark = pytest.mark.slow

CLUSTER = str(ROOT / "infra" / "local-cluster")
FAULTS = pytest.mark.skipif(
    os.environ.get("COLLECTOR_CLUSTER_FAULTS") != "1",
    reason="fault injection takes minutes: set COLLECTOR_CLUSTER_FAULTS=1",
)
# Caller-side tuning the cluster passes through (none of it is in the shared env files): a
# scheduler that looks every 2 s instead of every 60 s, so a schedule's ticks come quickly.
TUNING = {"PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2"}


@dataclass
class Cluster:
    """A running local cluster and how to reach it."""

    folder: Path
    world: World
    client_env: dict[str, str]
    sources: Path

    def ctl(self, *args: str, timeout: float = 400) -> str:
        done = subprocess.run(
            [CLUSTER, *args, "--dir", str(self.folder)],
            env=self.world.env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        assert done.returncode == 0, f"local-cluster {args}: {done.stdout}\n{done.stderr}"
        return done.stdout

    def state(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads((self.folder / "state.json").read_text())
        return result

    def pid(self, name: str) -> int:
        return int(self.state()["components"][name]["pid"])

    @property
    def redis_url(self) -> str:
        return self.client_env["COLLECTOR_REDIS_URL"]

    @property
    def collector_dsn(self) -> str:
        return self.client_env["COLLECTOR_POSTGRES_DSN"]

    def schema_dsn(self) -> str:
        """A fresh schema in the collector database (one sink table and audit per source)."""
        name = f"s_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.collector_dsn, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
        return f"{self.collector_dsn}?options=-csearch_path%3D{name}"


def _read_env(path: Path) -> dict[str, str]:
    lines = path.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("local-cluster")
    given = os.environ.get("COLLECTOR_TEST_CLUSTER_DIR")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(TUNING, PYTHONUNBUFFERED="1", PREFECT_LOGGING_LEVEL="WARNING")
    cluster_dir = Path(given) if given else folder / "cluster"
    with FaultSite() as site, httpx.Client(timeout=30) as http:
        webhook = Webhook()
        world = World(cluster_dir / "logs", env, "", site, webhook, http)  # logs(): the cluster's
        started = False
        try:
            if not given:
                done = subprocess.run(
                    [CLUSTER, "up", "--dir", str(cluster_dir), "--workers", "2"],
                    env=env, capture_output=True, text=True, timeout=600,
                )  # fmt: skip
                started = True
                assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
            client_env = _read_env(cluster_dir / "cluster.env")
            env.update(client_env, PREFECT_HOME=str(cluster_dir / "prefect-home"))
            world.api = client_env["PREFECT_API_URL"]
            running = Cluster(cluster_dir, world, client_env, folder / "sources")
            world.bootstrap_output = world.cli(  # type: ignore[attr-defined]
                str(ROOT / "infra" / "bootstrap"), "--notify-url", webhook.url
            )
            world.cli(PREFECT, "--no-prompt", "deploy", "--prefect-file",
                      str(ROOT / "deployments" / "prefect.yaml"), "--all", timeout=300)  # fmt: skip
            yield running
        finally:
            if started:
                subprocess.run([CLUSTER, "down", "--dir", str(cluster_dir)], env=env, timeout=300)
            webhook.close()


# --- helpers ------------------------------------------------------------------------------------
def _source_file(
    cluster: Cluster, name: str, site: WorkerSite, first: int, total: int, **extra: Any
) -> tuple[Path, str]:
    """A source over ``site`` items ``first..first+total``: the cluster's Redis frontier (through
    ``${env:COLLECTOR_REDIS_URL}``, as the workers are given it) and a Postgres sink in a schema
    of its own with the content-write audit of tests/test_workers.py. Returns (path, sink DSN)."""
    dsn = cluster.schema_dsn()
    _audited_sink(dsn, name)
    folder = cluster.sources / name
    folder.mkdir(parents=True)
    document: dict[str, Any] = {
        "name": name,
        "seeds": {"template": site.url("/items/{i}.json"), "range": [first, first + total]},
        "record": {"key": "id"},
        "frontier": {"type": "redis", "url": "${env:COLLECTOR_REDIS_URL}"},
        "deadletters": {"type": "redis", "url": "${env:COLLECTOR_REDIS_URL}"},
        "sink": {"type": "postgres", "dsn": dsn, "table": "records"},
        "limits": {"concurrency": 8, "per_domain_concurrency": 8,
                   "headers": {WORKER_HEADER: name}},
        "ttl": {"http_timeout_s": 10, "request_deadline_s": 15, "batch_timeout_s": 30,
                "lease_s": 60},
        "allow_private_networks": True,
        **extra,
    }  # fmt: skip
    path = folder / "source.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path, dsn


def _create_run(world: World, deployment: str, source: Path, **parameters: Any) -> str:
    run_id: str = world.post(
        f"/deployments/{world.deployment(deployment)['id']}/create_flow_run",
        {"parameters": {"source": str(source), "batch_size": 25, **parameters}},
    )["id"]
    return run_id


def _summary(world: World, source: str) -> dict[str, Any]:
    """The ledger table artifact the run published (latest of ``collector-<source>-summary``)."""
    artifacts = world.post(
        "/artifacts/latest/filter",
        {"artifacts": {"key": {"any_": [f"collector-{source}-summary"]}}},
    )
    assert artifacts, f"no summary artifact for {source}"
    data = artifacts[0]["data"]
    rows = json.loads(data) if isinstance(data, str) else data
    return {row["count"]: row["value"] for row in rows}


def _assert_exact(world: World, name: str, dsn: str, first: int, total: int, site: WorkerSite):  # type: ignore[no-untyped-def]
    """Every item stored once (one content write per key) and the run's ledger balanced."""
    summary = _summary(world, name)
    assert summary["balanced"] is True, summary
    assert summary["discovered"] == total and summary["queued"] == 0, summary
    rows, writes = _counts(dsn)
    expected = set(range(first, first + total))
    assert set(rows) == expected and max(rows.values()) == 1, name
    assert set(writes) == expected and max(writes.values()) == 1, name
    return summary


def _counts(dsn: str) -> tuple[Counter[int], Counter[int]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT key FROM records").fetchall()
        writes = conn.execute("SELECT key FROM content_writes").fetchall()
    return Counter(int(k) for (k,) in rows), Counter(int(k) for (k,) in writes)


def _wait_final(world: World, run_id: str, timeout: float = 400) -> dict[str, Any]:
    final = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
    run: dict[str, Any] = world.wait_for(
        f"flow run {run_id} to finish",
        lambda: (r := world.flow_run(run_id))["state_type"] in final and r,
        timeout=timeout,
    )
    return run


def _pool_limit(world: World, limit: int) -> None:
    world.request("PATCH", "/work_pools/collector", {"concurrency_limit": limit})


# --- the topology works -------------------------------------------------------------------------
def test_every_server_process_runs_with_the_shared_settings(cluster: Cluster) -> None:
    """/proc/<pid>/environ of each replica and the services process holds every line of
    infra/prefect-server.env, each worker every line of infra/prefect-worker.env."""
    server = _read_env(ROOT / "infra" / "prefect-server.env")
    worker = _read_env(ROOT / "infra" / "prefect-worker.env")
    for name, spec in cluster.state()["components"].items():
        wanted = {"api": server, "services": server, "worker": worker}.get(spec["kind"])
        if wanted is None:
            continue
        raw = Path(f"/proc/{spec['pid']}/environ").read_bytes().split(b"\0")
        env = dict(item.decode().split("=", 1) for item in raw if b"=" in item)
        assert {k: env.get(k) for k in wanted} == wanted, name


def test_three_sources_at_once_end_exact_and_critical_starts_before_low(
    cluster: Cluster,
) -> None:
    world = cluster.world
    total = 150
    with WorkerSite() as site:
        sources = {
            queue: _source_file(cluster, f"prio-{queue}", site, i * 1000, total)
            for i, queue in enumerate(("low", "normal", "critical"))
        }
        _pool_limit(world, 0)  # nothing starts while the three are queued
        try:
            runs = {  # created low first: creation order alone would favour low
                queue: _create_run(world, f"collect-{queue}", path)
                for queue, (path, _) in sources.items()
            }
            time.sleep(2)  # the workers poll and find no free slot
            assert {world.flow_run(r)["state_type"] for r in runs.values()} == {"SCHEDULED"}
            _pool_limit(world, 1)
            final = {queue: _wait_final(world, run) for queue, run in runs.items()}
        finally:
            _pool_limit(world, 4)
        for queue, run in final.items():
            assert run["state_type"] == "COMPLETED", (queue, run["state"], world.logs())
        for i, (queue, (_, dsn)) in enumerate(sources.items()):
            _assert_exact(world, f"prio-{queue}", dsn, i * 1000, total, site)
    starts = {queue: final[queue]["start_time"] for queue in final}
    ends = {queue: final[queue]["end_time"] for queue in final}
    assert starts["critical"] < starts["normal"] < starts["low"], starts
    assert ends["critical"] <= starts["normal"] and ends["normal"] <= starts["low"], (starts, ends)
    # nginx spread the API calls (and the event websockets) over both replicas
    access = (cluster.folder / "logs" / "nginx-access.log").read_text().splitlines()
    upstreams = Counter(line.split()[4] for line in access if len(line.split()) > 4)
    ports = {f"127.0.0.1:{cluster.state()['ports'][n]}" for n in ("api-1", "api-2")}
    assert ports <= set(upstreams), upstreams
    assert any(" /api/events/in 101 " in line for line in access)
