"""The real parts the fleet benches play on (bench/fleet.py, bench/warm_start.py): a folder,
Postgres, Redis, the demo's fault site, and a Prefect server on that Postgres whose API is
this context's (``PREFECT_API_URL``), all stopped at the end."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def real_parts() -> Iterator[tuple[str, Any, Any, Any, str]]:
    """``with real_parts() as (folder, postgres, redis, site, api):`` (``api``: the server's
    API URL, already set for this context)."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_DATABASE_CONNECTION_URL,
        temporary_settings,
    )

    from collector.demo.site import FaultSite
    from tests.servers import PostgresServer, RedisServer, free_port

    with (
        tempfile.TemporaryDirectory() as folder,
        PostgresServer() as postgres,
        RedisServer() as redis,
        FaultSite() as site,
    ):
        with temporary_settings(
            updates={PREFECT_SERVER_DATABASE_CONNECTION_URL: postgres.prefect_database()}
        ):
            server = SubprocessASGIServer(port=free_port())
            server.start(timeout=180)
        try:
            with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
                yield folder, postgres, redis, site, server.api_url
        finally:
            _drain_prefect_workers()
            server.stop()


def _drain_prefect_workers() -> None:
    """Send Prefect's queued events and logs while the server still answers: drained only at
    exit, after ``server.stop()``, they are retried against a closed port for minutes."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    EventsWorker.drain_all(timeout=30)
    APILogWorker.drain_all(timeout=30)
