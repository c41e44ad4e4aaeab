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
from tests.prefect_db import seed_home
from tests.worker_site import WorkerSite

COLLECTOR = [sys.executable, "-m", "flows.cli"]
ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _env(home: Path, *, fresh: bool = False, **extra: str) -> dict[str, str]:
    """The environment of a user with ``home``: no API URL, so a local server is started.

    Its idle exit is 10 min, not the suite's 60 s: a loaded box took over a minute to start
    another install's server, and the first one, unused meanwhile, stopped itself (the idle
    test sets its own 2 s). Every test here stops its servers at its end. The home's Prefect
    databases are already migrated (tests/prefect_db.py: half a start's CPU), unless ``fresh``:
    the first test starts on nothing, as a user's first command does."""
    if not fresh:
        seed_home(home)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.pop("PREFECT_PROFILE", None)
    return {**env, "PREFECT_HOME": str(home), "COLLECTOR_SERVER_IDLE_S": "600", **extra}


def _collector(env: dict[str, str], *args: str, timeout: float = 240) -> Any:
    return subprocess.run(
        [*COLLECTOR, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def _healthy(url: str, timeout: float = 30) -> bool:  # patient: a loaded box answers slowly
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as response:
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
    env = _env(home, fresh=True)  # a first start on nothing: Prefect migrates its database
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
    assert not list(home.glob("**/server.json"))


def test_the_server_stops_by_itself_when_idle(tmp_path: Path) -> None:
    home = tmp_path / "prefect-home"
    env = _env(home, COLLECTOR_SERVER_IDLE_S="2")
    started = _collector(env, "server", "start")
    assert started.returncode == 0, started.stderr
    (state,) = home.glob("collector-servers/*/server.json")
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


def _other_install(folder: Path) -> Path:
    """Another venv (another ``sys.prefix``) over this one's packages: its python, as a second
    clone's venv would be (a .pth file instead of installing everything again)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    import sysconfig

    (site,) = folder.glob("lib/python*/site-packages")
    (site / "this-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return folder / "bin" / "python"


def test_each_install_has_its_own_server_and_stops_only_its_own(tmp_path: Path) -> None:
    """Two venvs under one PREFECT_HOME: the second never attaches to the first's server (nor
    stops it); a server whose Prefect version is not this install's is replaced."""
    home = tmp_path / "prefect-home"
    # the first server waits idle while the other install starts and stops its own: minutes on
    # a loaded box, past the tests' idle stop (60 s), which would end it and look like the stop
    env = _env(home, COLLECTOR_SERVER_IDLE_S="3600")
    other_python = str(_other_install(tmp_path / "other-venv"))
    seed_home(home, python=other_python)  # its database migrated too (tests/prefect_db.py)
    other = [other_python, "-m", "flows.cli"]

    def other_collector(*args: str) -> Any:
        return subprocess.run([*other, *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=240)  # fmt: skip

    first_url = second_url = ""
    try:
        assert _collector(env, "server", "start").returncode == 0
        first_url = json.loads(_collector(env, "server", "status", "--json").stdout)["local"]
        assert first_url and _healthy(first_url)

        status = other_collector("server", "status")
        assert "no local Prefect server is running" in status.stdout, status.stdout
        assert f"another install's server at {first_url.removesuffix('/api')}" in status.stdout
        started = other_collector("server", "start")
        assert started.returncode == 0, started.stderr
        second_url = json.loads(other_collector("server", "status", "--json").stdout)["local"]
        assert second_url and second_url != first_url and _healthy(second_url)
        stopped = other_collector("server", "stop")
        assert f"stopped the local Prefect server at {second_url.removesuffix('/api')}" in (
            stopped.stdout
        )
        assert not _healthy(second_url)
        assert _healthy(first_url), "the other install's `server stop` stopped it"

        # A server left from another Prefect version (an upgrade in place) is not used: the
        # next command stops it and starts its own.
        (state,) = [
            path for path in home.glob("collector-servers/*/server.json")
            if json.loads(path.read_text())["url"] == first_url
        ]  # fmt: skip
        data = json.loads(state.read_text())
        state.write_text(json.dumps({**data, "prefect_version": "0.0.1"}))
        assert _collector(env, "server", "start").returncode == 0
        replaced = json.loads(_collector(env, "server", "status", "--json").stdout)["local"]
        assert replaced != first_url and _healthy(replaced)
        assert not _healthy(first_url), "the server of the other Prefect version still runs"
    finally:
        _collector(env, "server", "stop")
        other_collector("server", "stop")


def _wait_healthy(port: int, within_s: float = 120) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if _healthy(f"http://127.0.0.1:{port}/api", timeout=5):
            return True
        time.sleep(0.5)
    return False


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_supervisor_killed_outright_takes_its_server_with_it(tmp_path: Path) -> None:
    """SIGKILL cannot be caught: the supervisor cannot stop its uvicorn child then, and CI runs
    left such servers serving on, idle, for good. The child is told the kernel's way."""
    from tests.servers import free_port

    port = free_port()
    database = f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}"
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "flows.local_server", "--port", str(port), "--idle-exit", "600"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=_env(tmp_path, PREFECT_SERVER_DATABASE_CONNECTION_URL=database),
    )  # fmt: skip
    children: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not (children := _children(supervisor.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert children, "the supervisor started no server"
        assert _wait_healthy(port), "the server never answered"
        supervisor.kill()
        supervisor.wait(timeout=10)
        deadline = time.monotonic() + 30
        while any(_alive(child) for child in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(child) for child in children), children
    finally:
        supervisor.kill()
        for child in children:  # whatever the outcome, no server left behind
            if _alive(child):
                os.kill(child, signal.SIGKILL)
