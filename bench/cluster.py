"""What one URL and one batch cost the shared parts of the scale-out topology (docs/scaling.md).

    .venv/bin/python bench/cluster.py [--pages 20000] [--batch-size 500] [--dir DIR]

Runs one `collector run` (Redis frontier, Postgres sink, the demo's GX suite, every policy on)
over PAGES small JSON pages from nginx on loopback (bench/_nginx.py), against a local cluster
(`infra/local-cluster`: Postgres, Redis, two API replicas behind nginx, services). With
``--dir`` it uses a cluster already up there; without, it starts one with no workers (so the
only API traffic is the run's own) and stops it afterwards. Around the run it reads:

- Redis: ``INFO commandstats`` (commands by name), ``INFO stats`` (bytes in and out),
  ``used_memory`` (the frontier's records stay: done items with their state);
- Postgres (the sink's database): ``pg_stat_database`` transactions and rows written, and the
  WAL bytes written (``pg_current_wal_lsn``);
- the Prefect API: nginx's access log of the cluster (every request, by path);
- CPU: the run's own (user + sys of it and its children, e.g. the GX worker), and each
  cluster process's (``/proc/<pid>/stat``) over the run;

and prints per URL, per record and per batch figures as JSON.
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
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import redis
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _nginx import StaticSite  # noqa: E402

from collector.demo.scenario import SUITE  # noqa: E402

CLUSTER = str(ROOT / "infra" / "local-cluster")
TICKS = os.sysconf("SC_CLK_TCK")
IDLE_S = 30.0


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / TICKS


def _read_env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def _snapshot(state: dict[str, Any], env: dict[str, str], access_log: Path) -> dict[str, Any]:
    client = redis.Redis.from_url(env["COLLECTOR_REDIS_URL"])
    commands = {
        name.removeprefix("cmdstat_"): int(stats["calls"])
        for name, stats in client.info("commandstats").items()
    }
    info = client.info()
    client.close()
    with psycopg.connect(env["COLLECTOR_POSTGRES_DSN"]) as conn:
        row = conn.execute(
            "SELECT xact_commit, tup_inserted, tup_updated, tup_deleted, "
            "pg_current_wal_lsn() - '0/0'::pg_lsn FROM pg_stat_database "
            "WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    cpu = {name: _cpu_s(int(spec["pid"])) for name, spec in state["components"].items()}
    prefect_dsn = state["postgres_admin_dsn"].rsplit("/", 1)[0] + "/prefect"
    with psycopg.connect(prefect_dsn) as conn:
        counts = conn.execute(
            "SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM task_run)"
        ).fetchone()
    assert counts is not None
    return {
        "prefect_events": int(counts[0]),
        "prefect_task_runs": int(counts[1]),
        "redis_commands": commands,
        "redis_net_bytes": int(info["total_net_input_bytes"]) + int(info["total_net_output_bytes"]),
        "redis_used_memory": int(info["used_memory"]),
        "pg": [int(x) for x in row],
        "api_lines": access_log.read_text().splitlines() if access_log.exists() else [],
        "cpu": cpu,
    }


def _source(folder: Path, template: str, pages: int, dsn: str) -> Path:
    (folder / "suite.json").write_text(json.dumps(SUITE))
    source = {
        "name": f"bench-cluster-{int(time.time())}",
        "seeds": {"template": template, "range": [0, pages]},
        "record": {"key": "id"},
        "ttl": {"http_timeout_s": 5, "request_deadline_s": 10, "batch_timeout_s": 120,
                "lease_s": 300},
        "retry": {"max_attempts": 3, "base_s": 0.1, "cap_s": 2},
        "limits": {"concurrency": 32, "per_domain_concurrency": 32,
                   "per_domain_rate": "100000/second"},
        "validation": {"suite": "suite.json"},
        "sink": {"type": "postgres", "dsn": dsn, "table": "bench_records"},
        "frontier": {"type": "redis", "url": "${env:COLLECTOR_REDIS_URL}"},
        "deadletters": {"type": "redis", "url": "${env:COLLECTOR_REDIS_URL}"},
        "allow_private_networks": True,
    }  # fmt: skip
    path = folder / "source.yaml"
    path.write_text(yaml.safe_dump(source))
    return path


def measure(folder: Path, pages: int, batch: int) -> dict[str, Any]:
    state = json.loads((folder / "state.json").read_text())
    env = {**os.environ, **_read_env(folder / "cluster.env"), "PYTHONPATH": str(ROOT)}
    env["PREFECT_HOME"] = str(folder / "prefect-home")
    access_log = folder / "logs" / "nginx-access.log"
    work = Path(tempfile.mkdtemp(prefix="collector-bench-cluster-"))
    with StaticSite(pages) as site:
        template = site.url(0).replace("/0.json", "/{i}.json")
        path = _source(work, template, pages, env["COLLECTOR_POSTGRES_DSN"])
        idle_start = {n: _cpu_s(int(c["pid"])) for n, c in state["components"].items()}
        time.sleep(IDLE_S)  # what the cluster's processes burn with nothing to do
        idle = {
            n: round((_cpu_s(int(c["pid"])) - idle_start[n]) / IDLE_S, 3)
            for n, c in state["components"].items()
        }
        before = _snapshot(state, env, access_log)
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "flows.cli", "run", str(path), "--json",
             "--batch-size", str(batch)],
            cwd=ROOT, env=env, capture_output=True, text=True,
        )  # fmt: skip
        wall = time.perf_counter() - started
        after_usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        time.sleep(1)  # nginx writes its log line after the response
        after = _snapshot(state, env, access_log)
    if done.returncode != 0:
        raise SystemExit(f"collector run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    stored = summary["stored"]
    batches = -(-summary["discovered"] // batch)
    run_cpu = (after_usage.ru_utime - usage.ru_utime) + (after_usage.ru_stime - usage.ru_stime)
    commands = Counter(after["redis_commands"]) - Counter(before["redis_commands"])
    commands.pop("info", None)
    pg = [b - a for a, b in zip(before["pg"], after["pg"], strict=True)]
    api = after["api_lines"][len(before["api_lines"]) :]
    paths = Counter(
        " ".join(line.split()[1:3]) for line in api if len(line.split()) > 3
    )  # "METHOD /api/..." (ids left in: grouped below by the first two path parts)
    grouped: Counter[str] = Counter()
    for key, n in paths.items():
        method, uri = key.split(" ", 1)
        parts = [p for p in uri.split("/") if p][:2]
        grouped[f"{method} /{'/'.join(parts)}"] += n
    cluster_cpu = {
        name: round(after["cpu"][name] - before["cpu"].get(name, 0.0), 2) for name in after["cpu"]
    }
    return {
        "pages": pages,
        "batch_size": batch,
        "batches": batches,
        "stored": stored,
        "balanced": summary["balanced"],
        "pages_per_second_loop": round(stored / summary["seconds"], 1),
        "pages_per_second_wall": round(stored / wall, 1),
        "run_cpu_seconds": round(run_cpu, 2),
        "pages_per_cpu_second": round(stored / run_cpu, 1),
        "redis_commands_per_url": round(sum(commands.values()) / stored, 2),
        "redis_commands_top": dict(commands.most_common(8)),
        "redis_net_bytes_per_url": round(
            (after["redis_net_bytes"] - before["redis_net_bytes"]) / stored, 1
        ),
        "redis_memory_bytes_per_url": round(
            (after["redis_used_memory"] - before["redis_used_memory"]) / stored, 1
        ),
        "pg_transactions_per_batch": round(pg[0] / batches, 2),
        "pg_rows_written_per_record": round((pg[1] + pg[2] + pg[3]) / stored, 3),
        "pg_wal_bytes_per_record": round(pg[4] / stored, 1),
        "api_requests": len(api),
        "api_requests_per_batch": round(len(api) / batches, 2),
        "api_requests_by_path": dict(grouped.most_common(12)),
        "wall_seconds": round(wall, 1),
        "cluster_cpu_seconds": cluster_cpu,
        "cluster_idle_cpu_per_second": idle,
        "cluster_cpu_ms_per_page_above_idle": {
            name: round(1000 * (cpu - idle[name] * wall) / stored, 3)
            for name, cpu in cluster_cpu.items()
        },
        "prefect_events_per_batch": round(
            (after["prefect_events"] - before["prefect_events"]) / batches, 2
        ),
        "prefect_task_runs_per_batch": round(
            (after["prefect_task_runs"] - before["prefect_task_runs"]) / batches, 2
        ),
        "load_average": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=20_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--dir", default=None, help="a local cluster already up (else: start)")
    args = parser.parse_args()
    if args.dir:
        print(json.dumps(measure(Path(args.dir), args.pages, args.batch_size), indent=2))
        return
    folder = Path(tempfile.mkdtemp(prefix="collector-bench-cluster-"))
    subprocess.run([CLUSTER, "up", "--dir", str(folder), "--workers", "0"], check=True)
    try:
        print(json.dumps(measure(folder, args.pages, args.batch_size), indent=2))
    finally:
        subprocess.run([CLUSTER, "down", "--dir", str(folder)], check=False)


if __name__ == "__main__":
    main()
