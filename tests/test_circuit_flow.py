"""The collect flow on a host that is down when the run starts and comes back: the run stores
everything, and the breaker's transitions are Prefect events on ``collector.host.<host>``."""

from __future__ import annotations

import asyncio
import datetime
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter

from flows.collect import collect, listening
from tests.helpers import summary_of, write_source
from tests.politeness_site import PolitenessSite

pytestmark = pytest.mark.usefixtures("prefect_api")

ITEMS = 30


async def _events(run_id: str, expected: set[str]) -> list[Any]:
    """The run's circuit events, once all ``expected`` names are stored (the server persists
    events asynchronously)."""
    since = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
    deadline = time.monotonic() + 60
    async with get_client() as client:
        while True:
            page = await client.read_events(
                EventFilter(
                    event=EventNameFilter(prefix=["collector.circuit."]),
                    occurred=EventOccurredFilter(since=since),
                ),
                limit=50,
            )
            found = [e for e in page.events if e.payload.get("run_id") == run_id]
            if {e.event for e in found} >= expected or time.monotonic() > deadline:
                return found
            await asyncio.sleep(0.5)


async def test_a_host_down_at_start_is_waited_for_and_its_breaker_is_in_the_events(
    tmp_path: Path,
) -> None:
    with PolitenessSite() as site:
        site.go_down()
        path = write_source(
            tmp_path,
            seeds={"template": site.url(0).replace("/0", "/{i}"), "range": [0, ITEMS]},
            limits={
                "concurrency": 4,
                "per_domain_concurrency": 4,
                "circuit": {"failures": 3, "cooldown_s": 0.5, "cooldown_max_s": 1, "probes": 1},
            },
        )
        seen: list[str] = []

        def listener(event: str, data: dict[str, Any]) -> None:
            if event == "circuit":
                seen.append(data["kind"])
                if seen == ["opened"]:  # back 1.5 s after the breaker first opened
                    threading.Timer(1.5, site.come_back).start()

        with listening(listener):
            summary = summary_of(await collect(source=str(path), batch_size=10, drain_wait_s=30))
    assert summary["balanced"], summary["problems"]
    assert summary["stored"] == ITEMS and summary["dead_lettered"] == 0
    assert summary["deferred_by_circuit"] > 0
    assert summary["hosts"]["circuit"]["opened"] >= 1

    events = await _events(
        summary["run_id"], {"collector.circuit.opened", "collector.circuit.closed"}
    )
    names = [e.event for e in sorted(events, key=lambda e: e.occurred)]
    assert names[0] == "collector.circuit.opened" and names[-1] == "collector.circuit.closed"
    assert {e.resource.id for e in events} == {"collector.host.127.0.0.1"}
    assert all(e.payload["source"] == "test-items" for e in events)
