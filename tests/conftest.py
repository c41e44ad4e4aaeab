"""Shared fixtures: a real Prefect API (the Prefect test harness), the local fault site, and
throwaway Redis and Postgres servers."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from collector.demo.site import FaultSite
from tests import lanes
from tests.servers import PostgresServer, RedisServer, free_port

# Quiet and offline, for this process and every subprocess a test starts.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("PREFECT_UI_ENABLED", "false")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
# A `collector` subprocess without PREFECT_API_URL starts the local background server
# (flows/local_server.py): keep it in a throwaway home, short-lived, and stopped at the end.
# Each pytest-xdist worker gets a home of its own (workers inherit the controller's environment,
# and one worker stopping a shared server at its end would cut off the others' runs).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
_OWN_HOME: str | None = None  # the throwaway home made here (never a user's own)
if _WORKER or "PREFECT_HOME" not in os.environ:
    _OWN_HOME = tempfile.mkdtemp(prefix=f"collector-tests-prefect-{_WORKER or ''}")
    os.environ["PREFECT_HOME"] = _OWN_HOME
os.environ.setdefault("COLLECTOR_SERVER_IDLE_S", "60")
# The GX kwargs verdicts `collector validate` keeps (collector/settle/gx_check_cache.py): in a
# throwaway folder shared by the session's workers, never the user's own cache. Removed at the
# session's end by the process that made it (pytest-xdist's controller: the workers inherit
# its environment).
_OWN_CACHE: str | None = None
if "COLLECTOR_CACHE_DIR" not in os.environ:
    _OWN_CACHE = tempfile.mkdtemp(prefix="collector-tests-cache-")
    os.environ["COLLECTOR_CACHE_DIR"] = _OWN_CACHE

# Hypothesis properties are about results, never speed: no per-example deadline (200 ms by
# default, which a loaded CI box overran) and no "generation too slow" health check. A test's own
# @settings inherits these unless it names them (a suppress_health_check list replaces this one).
settings.register_profile("collector", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("collector")


# --- the fast lane (`./bootstrap test --fast`, `pytest -m "not slow"`): see tests/lanes.py ------
@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    lanes.mark_and_order(items)


# The worker's PREFECT_HOME gets migrated Prefect databases (tests/prefect_db.py) before its
# first slow test: the local background server a `collector` command starts there, and an
# ephemeral server, then skip Prefect's migrations (about 4 s of CPU each). Not for the fast
# lane, which starts no server: the first session on a box makes the migrated database (7 s).
_home_seeded = False


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    global _home_seeded
    if not _home_seeded and _OWN_HOME and item.get_closest_marker("slow") is not None:
        _home_seeded = True
        from tests.prefect_db import seed_home

        seed_home(Path(_OWN_HOME))


# --- where a worker's time goes: COLLECTOR_TEST_TIMELINE=DIR writes one line per test per worker
# (start, end, CPU seconds, API server CPU seconds, test id) to DIR/<worker>.tsv;
# tools/worker_timeline.py draws each worker's busy spans and idle tail from them and sums the CPU
# per file (issue 30: the loaded suite is CPU-bound, so CPU is what a faster CI has to cut).
# CPU is that of this process and of every process it started (the servers and workers a test
# started and stopped); the session's Prefect server is read from /proc apart, as it serves
# every test. Where the box lets this process make a cgroup of its own (cgroup v1's cpuacct),
# that is its CPU: every process a test started counts, detached ones too (a `collector`
# command's local background server, its GX validation worker: 85 s for test_local_server.py
# where reaped children said 36 s, 2026-12-06). Elsewhere, this process's and its reaped
# children's, which misses those.
_TIMELINE = os.environ.get("COLLECTOR_TEST_TIMELINE")
if _TIMELINE:
    os.makedirs(_TIMELINE, exist_ok=True)  # a new path works: CI scripts point it at a fresh dir
_API_PID: int | None = None  # the session's Prefect server process, once started
_CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def _cpuacct_now() -> Path:
    """This process's cpuacct cgroup (a new one is made inside it: its parents still count)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "cpuacct" in controllers.split(","):
                return _CPUACCT / path.lstrip("/")
    return _CPUACCT


_PARENT_CGROUP = _cpuacct_now()


def _own_cgroup() -> Path | None:
    """A cpuacct cgroup holding this process (and so whatever it starts), or None."""
    if not (_PARENT_CGROUP / "cpuacct.usage").exists():
        return None
    group = _PARENT_CGROUP / f"collector-tests-{_WORKER or 'main'}-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        (group / "cgroup.procs").write_text(str(os.getpid()))
        int((group / "cpuacct.usage").read_text())
    except (OSError, ValueError):
        with contextlib.suppress(OSError):
            group.rmdir()
        return None
    return group


_CGROUP = _own_cgroup() if _TIMELINE else None


def pytest_unconfigure() -> None:
    """Remove the session's cache folder if this process made it; leave the timeline's cgroup
    and remove it (it stays while a process of the run still lives)."""
    if _OWN_CACHE is not None:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)
    if _CGROUP is not None:
        with contextlib.suppress(OSError):
            (_PARENT_CGROUP / "cgroup.procs").write_text(str(os.getpid()))
            _CGROUP.rmdir()


def _cpu_s() -> float:
    if _CGROUP is not None:
        with contextlib.suppress(OSError, ValueError):
            return int((_CGROUP / "cpuacct.usage").read_text()) / 1e9
    own, reaped = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


def _api_cpu_s() -> tuple[int | None, float]:
    """The session Prefect server's pid and CPU seconds (None once it is gone or not started)."""
    pid = _API_PID
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None, 0.0
    return pid, sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    if not _TIMELINE:
        yield
        return
    started, cpu, (api_pid, api_cpu) = time.time(), _cpu_s(), _api_cpu_s()
    yield
    used = _cpu_s() - cpu
    pid_after, api_cpu_after = _api_cpu_s()
    if pid_after is None:  # none yet, or stopped at the session's end: nothing to count
        api_used = 0.0
    elif pid_after == api_pid:
        api_used = api_cpu_after - api_cpu
    else:  # the test's set-up started it: its start-up is the test's
        api_used = api_cpu_after
    if _CGROUP is not None:  # the session's server is in the cgroup too: counted apart
        used = max(0.0, used - api_used)
    line = f"{started:.3f}\t{time.time():.3f}\t{used:.2f}\t{api_used:.2f}\t{item.nodeid}\n"
    with open(os.path.join(_TIMELINE, f"{_WORKER or 'main'}.tsv"), "a") as out:
        out.write(line)


@pytest.fixture(scope="session", autouse=True)
def _stop_the_local_server_at_the_end() -> Iterator[None]:
    yield
    from flows.local_server import stop_local_server

    stop_local_server()
    # An ephemeral Prefect server this process started (a flow or client called with no API):
    # Prefect stops it at exit, but a pytest-xdist worker may leave without running exit
    # handlers, and CI found one such server per worker still serving, idle, after the run.
    if "prefect.server.api.server" in sys.modules:
        from prefect.server.api.server import SubprocessASGIServer

        for server in list(SubprocessASGIServer._instances.values()):
            server.stop()


@pytest.fixture(scope="session")
def prefect_api(postgres_server: PostgresServer) -> Iterator[str]:
    """A real Prefect server (subprocess) for the whole session; yields its API URL.

    Prefect's test harness, but on a database of the session's Postgres instead of SQLite:
    several `collector` processes and the flows of this one write to it at once, and on a
    loaded box SQLite answered "database is locked" (issue 30; a deferred transaction that must
    upgrade to a write fails at once, whatever the busy timeout)."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_DATABASE_CONNECTION_TIMEOUT,
        PREFECT_SERVER_DATABASE_CONNECTION_URL,
        PREFECT_SERVER_DATABASE_TIMEOUT,
        temporary_settings,
    )

    database = postgres_server.prefect_database()
    # Prefect's 5 s to connect to its database and 10 s per statement: at load 15-17 a
    # connection took longer, and the server answered 500 to a helper's flow run (a fleet
    # test, CI at 30 min). A loaded box is slow, not broken: wait a minute.
    with temporary_settings(
        updates={
            PREFECT_SERVER_DATABASE_CONNECTION_URL: database,
            PREFECT_SERVER_DATABASE_CONNECTION_TIMEOUT: 60.0,
            PREFECT_SERVER_DATABASE_TIMEOUT: 60.0,
        }
    ):
        server = SubprocessASGIServer(port=free_port())
        server.start(timeout=120)
    global _API_PID
    _API_PID = server.server_process.pid if server.server_process else None
    try:
        with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
            yield server.api_url
            _drain_prefect_workers()
    finally:
        server.stop()


def _drain_prefect_workers() -> None:
    """Send the logs and events still buffered before the server stops (as the harness does)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    with contextlib.suppress(RuntimeError):  # never started
        APILogWorker.drain_all()
    EventsWorker.drain_all()


@pytest.fixture
def site() -> Iterator[FaultSite]:
    with FaultSite() as running:
        yield running


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server of our own on a free port, for the whole session."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """A clean Redis database for one test."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    client.close()
    yield redis_server.url


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A real Postgres cluster of our own (initdb in a temp dir, free port), for the session."""
    with PostgresServer() as server:
        server.create_database("collector_tests")
        yield server


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> Iterator[str]:
    """A DSN onto a new empty schema (search_path) of the test database; dropped afterwards."""
    dsn = postgres_server.create_schema("collector_tests")
    yield dsn
    postgres_server.drop_schema(dsn)
