"""A Prefect server's database under concurrent writers: SQLite against Postgres, side by side.

Why the test servers that several processes write to run on Postgres (issue 30): on a loaded
box a SQLite-backed server answered "database is locked". Each database gets the same server
(Prefect's uvicorn app, as its test harness starts it) and the same load: WRITERS threads, each
doing RUNS times what a collect run does to the API (a flow run, Running, task runs, logs, an
artifact, Completed), optionally beside one CPU-bound process per core (``--burn``). Printed per
database: the failed requests (HTTP 5xx, transport errors), how many server log lines say
"database is locked", and the wall time; then the ratio Postgres / SQLite.

    .venv/bin/python -m bench.prefect_database --writers 8 --runs 10 --burn
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from tests.servers import PostgresServer, free_port


def _burn() -> None:
    while True:
        pass


def _server(database: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    import prefect

    port = free_port()
    env = {
        **os.environ,
        "PREFECT_SERVER_DATABASE_CONNECTION_URL": database,
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
        "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
    }
    env.pop("PREFECT_API_URL", None)
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent),
             "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1",
             "--port", str(port), "--log-level", "warning", "--lifespan", "on"],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"the server on {database.split(':')[0]} did not start; see {log}")


def _writer(url: str, flow_id: str, runs: int, failures: list[str]) -> None:
    now = datetime.now(UTC).isoformat()
    with httpx.Client(base_url=url, timeout=120) as client:

        def call(path: str, body: Any) -> Any:
            try:
                response = client.post(path, json=body)
            except httpx.HTTPError as exc:
                failures.append(f"{path}: {type(exc).__name__} {exc}"[:120])
                return None
            if response.status_code >= 500:
                failures.append(f"{path}: HTTP {response.status_code} {response.text[:80]}")
                return None
            return response.json() if response.content else None

        for _ in range(runs):
            run = call("/flow_runs/", {"flow_id": flow_id, "state": {"type": "PENDING"}})
            if run is None:
                continue
            run_id = run["id"]
            call(f"/flow_runs/{run_id}/set_state", {"state": {"type": "RUNNING"}, "force": True})
            for batch in range(3):
                call("/task_runs/", {"flow_run_id": run_id, "task_key": "fetch-batch",
                                     "dynamic_key": str(batch), "name": f"fetch-batch-{batch}",
                                     "state": {"type": "COMPLETED"}})  # fmt: skip
            logs = [{"name": "bench", "level": 20, "message": f"line {i}", "timestamp": now,
                     "flow_run_id": run_id} for i in range(20)]  # fmt: skip
            call("/logs/", logs)
            call("/artifacts/", {"key": f"bench-{uuid.uuid4().hex[:8]}", "type": "markdown",
                                 "data": "# ledger", "flow_run_id": run_id})  # fmt: skip
            call(f"/flow_runs/{run_id}/set_state", {"state": {"type": "COMPLETED"}, "force": True})


def _measure(url: str, writers: int, runs: int) -> tuple[list[str], float]:
    flow_id = httpx.post(f"{url}/flows/", json={"name": "bench"}, timeout=60).json()["id"]
    failures: list[str] = []
    threads = [
        threading.Thread(target=_writer, args=(url, flow_id, runs, failures))
        for _ in range(writers)
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return failures, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--runs", type=int, default=10, help="flow runs per writer")
    parser.add_argument("--burn", action="store_true", help="one CPU-bound process per core")
    args = parser.parse_args()
    burners = []
    if args.burn:
        burners = [multiprocessing.Process(target=_burn, daemon=True)
                   for _ in range(os.cpu_count() or 1)]  # fmt: skip
        for burner in burners:
            burner.start()
    results: dict[str, float] = {}
    try:
        with tempfile.TemporaryDirectory() as folder, PostgresServer() as postgres:
            databases = {
                "sqlite": f"sqlite+aiosqlite:///{Path(folder) / 'prefect.db'}",
                "postgres": postgres.prefect_database(),
            }
            for name, database in databases.items():
                log = Path(folder) / f"{name}.log"
                process, url = _server(database, log)
                try:
                    failures, wall = _measure(url, args.writers, args.runs)
                finally:
                    process.terminate()
                    process.wait(timeout=30)
                text = log.read_text(errors="replace")
                locked = text.count("database is locked")
                if failures:
                    print(text[-1500:])
                results[name] = wall
                print(f"{name:8} {args.writers} writers x {args.runs} runs: "
                      f"{len(failures)} failed requests, {locked} 'database is locked' in the "
                      f"server log, {wall:.1f} s  {sorted(set(failures))[:3]}")  # fmt: skip
    finally:
        for burner in burners:
            burner.kill()
    print(f"wall time postgres / sqlite: {results['postgres'] / results['sqlite']:.2f}")


if __name__ == "__main__":
    main()
