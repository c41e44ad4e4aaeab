"""Shared fixtures: a real Prefect API (the Prefect test harness), the local fault site, and
throwaway Redis and Postgres servers."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest

from collector.demo.site import FaultSite
from tests.servers import PostgresServer, RedisServer

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
if _WORKER or "PREFECT_HOME" not in os.environ:
    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix=f"collector-tests-prefect-{_WORKER or ''}")
os.environ.setdefault("COLLECTOR_SERVER_IDLE_S", "60")


@pytest.fixture(scope="session", autouse=True)
def _stop_the_local_server_at_the_end() -> Iterator[None]:
    yield
    from flows.local_server import stop_local_server

    stop_local_server()


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[str]:
    """A real Prefect server (SQLite, subprocess) for the whole session; yields its API URL."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield str(PREFECT_API_URL.value())


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
