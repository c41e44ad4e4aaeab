"""``domain:<host>`` slots of a process SIGKILLed while holding them come back, even when the
local Prefect server stopped meanwhile (a reboot mid-run takes both).

The slots are Prefect leases (``flows/_locks.py:domain_slots``, ``max(60, batch_timeout_s)``
long, renewed by the holder); the server's repossessor gives back the slots of a lease left to
expire. With Prefect's default lease storage (memory) a server that stopped forgot the leases
while its database kept their slots counted: held for good, every later batch on the host
waited 600 s and failed. The local server keeps them on disk (``flows/_lease_storage.py``).

A temporary server (``PREFECT__SERVER_EPHEMERAL``, the suite's session API) runs no repossessor:
there, slots of a killed process are never given back (tests/test_locks.py works around it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import write_source
from tests.prefect_db import seed_home

COLLECTOR = [sys.executable, "-m", "flows.cli"]
ROOT = Path(__file__).resolve().parents[1]
LIMIT = "domain:slots.example"

HOLD = """
import asyncio, json, sys, uuid
from collector.config import load_source
from flows._locks import domain_slots

async def hold() -> None:
    source = load_source(sys.argv[1])
    async with domain_slots(source, {"slots.example": 2}, holder=str(uuid.uuid4())) as granted:
        print(json.dumps(granted), flush=True)
        await asyncio.sleep(3600)

asyncio.run(hold())
"""


def test_the_local_server_keeps_leases_on_disk_beside_its_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.settings import PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE, temporary_settings

    from flows import _lease_storage
    from flows.local_server import server_environment, state_folder

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    monkeypatch.delenv(_lease_storage.LEASES_FOLDER_VARIABLE, raising=False)
    # a lease storage the user chose (Redis, for several servers) is theirs
    chosen = "prefect_redis.lease_storage"
    with temporary_settings(updates={PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE: chosen}):
        env = server_environment(4321)
    assert "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE" not in env
    assert _lease_storage.LEASES_FOLDER_VARIABLE not in env

    env = server_environment(4321)
    assert env["PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE"] == "flows._lease_storage"
    folder = Path(env[_lease_storage.LEASES_FOLDER_VARIABLE])
    assert folder.parent == state_folder()  # the install's, beside its database
    assert str(state_folder()) in env["PREFECT_SERVER_DATABASE_CONNECTION_URL"]
    monkeypatch.setenv(_lease_storage.LEASES_FOLDER_VARIABLE, str(folder))
    assert _lease_storage.ConcurrencyLeaseStorage().storage_path == folder


def _collector(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COLLECTOR, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )


def _server_url(env: dict[str, str]) -> str:
    started = _collector(env, "server", "start")
    assert started.returncode == 0, started.stderr
    status = json.loads(_collector(env, "server", "status", "--json").stdout)
    return str(status["local"])


def _active_slots(url: str) -> int:
    with urllib.request.urlopen(f"{url}/v2/concurrency_limits/{LIMIT}", timeout=30) as answer:
        return int(json.loads(answer.read())["active_slots"])


@pytest.mark.slow  # two local servers, and a lease (60 s at least) left to expire
def test_slots_of_a_sigkilled_holder_come_back_after_the_server_restarts(
    tmp_path: Path,
) -> None:
    home = seed_home(tmp_path / "prefect-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.pop("PREFECT_PROFILE", None)
    env |= {
        "PREFECT_HOME": str(home),
        "COLLECTOR_SERVER_IDLE_S": "600",
        # the repossessor looks every 2 s, not 15: the wait is the lease's own
        "PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS": "2",
        "PYTHONPATH": str(ROOT),
    }
    source = write_source(
        tmp_path,
        name="slot-recovery",
        seeds={"urls": ["http://slots.example/a"]},
        ttl={"batch_timeout_s": 30},  # the slots' lease: 60 s, Prefect's least
        limits={"per_domain_concurrency": 2, "shared_domain_concurrency": True},
    )
    try:
        url = _server_url(env)
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(source)],
            cwd=ROOT,
            env={**env, "PREFECT_API_URL": url},
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None
        try:
            granted = holder.stdout.readline()
            assert json.loads(granted) == {"slots.example": 2}, granted
            assert _active_slots(url) == 2
        finally:
            holder.send_signal(signal.SIGKILL)  # no release: its lease stops being renewed
            holder.wait(timeout=30)
            holder.stdout.close()
        # the server goes too (a reboot), before the lease ran out; a new one starts
        stopped = _collector(env, "server", "stop")
        assert stopped.returncode == 0, stopped.stderr
        url = _server_url(env)
        assert _active_slots(url) == 2  # still counted: the new server must give them back
        deadline = time.monotonic() + 300  # the lease's 60 s, then a repossessor pass
        while (held := _active_slots(url)) > 0:
            assert time.monotonic() < deadline, f"{held} slots of a dead holder still held"
            time.sleep(2)
    finally:
        _collector(env, "server", "stop")
