"""The local Prefect server `collector` starts once in the background and reuses (no
PREFECT_API_URL): started on first use, reused, untouched by the terminal's Ctrl-C, visible in
`collector server status`, stopped by `collector server stop` or when idle."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import write_source
from tests.worker_site import WorkerSite

COLLECTOR = [sys.executable, "-m", "flows.cli"]
ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.pop("PREFECT_PROFILE", None)
    return {**env, "PREFECT_HOME": str(home), **extra}


def _collector(env: dict[str, str], *args: str, timeout: float = 240) -> Any:
    return subprocess.run(
        [*COLLECTOR, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _runs_on(url: str) -> int:
    request = urllib.request.Request(
        f"{url}/flow_runs/count", data=b"{}", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(json.loads(response.read()))


def test_started_once_reused_survives_ctrl_c_and_stops_on_request(tmp_path: Path) -> None:
    home = tmp_path / "prefect-home"
    env = _env(home)
    with WorkerSite() as site:
        source = write_source(
            tmp_path, name="local-server", seeds={"template": site.url("/items/{i}.json"),
                                                  "range": [0, 10]},
        )  # fmt: skip
        try:
            first = _collector(env, "run", str(source), "--json")
            assert first.returncode == 0, first.stderr
            assert "starting a local Prefect server" in first.stderr
            status = json.loads(_collector(env, "server", "status", "--json").stdout)
            url = status["local"]
            assert url and _healthy(url)

            second = _collector(env, "run", str(source), "--json")
            assert second.returncode == 0, second.stderr
            assert "starting a local Prefect server" not in second.stderr  # reused
            again = json.loads(second.stdout.splitlines()[-1])
            assert again["plan"] == "incremental" and again["discovered"] == 0  # all fresh
            assert _runs_on(url) >= 2  # both runs are on the server (and in its UI)

            # Ctrl-C to the foreground job: the run stops, the server does not.
            site.set_delay(0.5)
            proc = subprocess.Popen(
                [*COLLECTOR, "run", str(source), "--json"],
                cwd=ROOT, env={**env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, start_new_session=True,
            )  # fmt: skip
            time.sleep(3)
            os.killpg(proc.pid, signal.SIGINT)
            proc.communicate(timeout=60)
            assert _healthy(url), "the terminal's Ctrl-C reached the background server"
        finally:
            stopped = _collector(env, "server", "stop")
    assert "stopped the local Prefect server" in stopped.stdout
    assert not _healthy(url)
    assert "no local Prefect server" in _collector(env, "server", "status").stdout


def test_a_user_api_url_wins_and_nothing_is_started(tmp_path: Path, prefect_api: str) -> None:
    home = tmp_path / "prefect-home"
    env = _env(home, PREFECT_API_URL=prefect_api)
    with WorkerSite() as site:
        source = write_source(
            tmp_path, name="local-server-own-api",
            seeds={"template": site.url("/items/{i}.json"), "range": [0, 3]},
        )  # fmt: skip
        done = _collector(env, "run", str(source))
    assert done.returncode == 0, done.stderr
    assert "starting a local Prefect server" not in done.stderr
    assert not (home / "collector-server.json").exists()


def test_the_server_stops_by_itself_when_idle(tmp_path: Path) -> None:
    home = tmp_path / "prefect-home"
    env = _env(home, COLLECTOR_SERVER_IDLE_S="2")
    started = _collector(env, "server", "start")
    assert started.returncode == 0, started.stderr
    state = home / "collector-server.json"
    url = json.loads(state.read_text())["url"]
    deadline = time.monotonic() + 90
    while state.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not state.exists(), "the idle server did not stop"
    assert not _healthy(url)


def test_a_server_that_cannot_start_is_one_line_and_exit_1(tmp_path: Path) -> None:
    """A database Prefect cannot reach: the server exits, and `server start` says where its
    log is in one line (no traceback)."""
    bad_database = "postgresql+asyncpg://nobody@127.0.0.1:1/none"
    env = _env(tmp_path / "home", PREFECT_API_DATABASE_CONNECTION_URL=bad_database)
    started = _collector(env, "server", "start")
    assert started.returncode == 1, started.stderr
    assert "Traceback" not in started.stderr, started.stderr
    line = started.stderr.strip().splitlines()[-1]
    assert line.startswith("collector: the local Prefect server exited") and "see " in line
