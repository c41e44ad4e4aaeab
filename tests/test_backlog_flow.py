"""The backlog-monitor flow against a real Prefect API: events on transitions only, read back
from the API's event store, state in a Prefect Variable, and the trend artifact."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from prefect.client.schemas.objects import Artifact
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
from prefect.events.schemas.events import ReceivedEvent
from prefect.variables import Variable

from collector.backends import open_frontier
from collector.config import load_source
from collector.errors import CollectorError
from collector.frontier.base import Offer
from flows.backlog import backlog_monitor, state_variable
from tests.helpers import write_source

pytestmark = pytest.mark.usefixtures("prefect_api")


def _fill(source_path: Path, queued: int, done: int) -> None:
    """Put ``queued`` items in the queue and ``done`` finished ones in the source's frontier."""
    source = load_source(source_path)
    frontier = open_frontier(source)  # the source's own backend: SQLite or Redis
    try:
        now = time.time()
        offers = [Offer(f"http://site.example/{i}", 60.0) for i in range(queued + done)]
        frontier.offer(
            source.name, offers, now=now, queue_ttl_s=3600, rank_for=lambda *_: 0.0, run_id="r"
        )
        if done:
            from collector.frontier.base import Completed

            lease = frontier.claim(source.name, done, now=now, lease_s=60)
            frontier.ack(
                lease,
                [Completed(i.url, now + 3600, now) for i in lease.items],
                now=now,
            )
        counts = frontier.counts(source.name)
        assert (counts.queued, counts.done) == (queued, done)
    finally:
        frontier.close()


def _set_capacity(source_path: Path, capacity: int | None) -> None:
    data = yaml.safe_load(source_path.read_text())
    data["backlog"] = {"capacity": capacity} if capacity else {}
    source_path.write_text(yaml.safe_dump(data))


def _created(artifact: Artifact) -> datetime:
    assert artifact.created is not None  # optional in the model, set on every stored artifact
    return artifact.created


async def _events(resource: str, expected: int) -> list[ReceivedEvent]:
    """The backlog events of ``resource`` once ``expected`` of them are stored (the event
    persister writes in batches, so they appear a little after emission)."""
    deadline = time.monotonic() + 90
    async with get_client() as client:
        while True:
            page = await client.read_events(
                filter=EventFilter(
                    event=EventNameFilter(prefix=["collector.backlog."]),
                    resource=EventResourceFilter(id=[resource]),
                ),
                limit=50,
            )
            if len(page.events) >= expected or time.monotonic() > deadline:
                return sorted(page.events, key=lambda e: e.occurred)
            await asyncio.sleep(0.5)


async def test_events_only_on_transitions_and_trend_artifact(tmp_path: Path) -> None:
    name = f"backlog-{uuid.uuid4().hex[:8]}"
    path = write_source(tmp_path, name=name, seeds={"urls": ["http://site.example/0"]})
    _fill(path, queued=7, done=3)

    levels = []
    for capacity in (10, 10, 8, 9, 100, 100):  # 70 %, 70 %, 87.5 %, 77.8 %, 7 %, 7 %
        _set_capacity(path, capacity)
        [result] = await asyncio.to_thread(backlog_monitor, sources=[str(path)])
        assert (result["depth"], result["capacity"]) == (7, capacity)
        levels.append((result["level"], result["event"]))
    assert levels == [
        ("warning", "collector.backlog.warning"),
        ("warning", None),
        ("critical", "collector.backlog.critical"),
        ("critical", None),  # 77.8 % stays critical until below 70 %
        ("ok", "collector.backlog.recovered"),
        ("ok", None),
    ]

    events = await _events(f"collector.source.{name}", expected=3)
    assert [e.event for e in events] == [
        "collector.backlog.warning",
        "collector.backlog.critical",
        "collector.backlog.recovered",
    ]
    assert events[1].payload == {
        "source": name,
        "depth": 7,
        "capacity": 8,
        "ratio": 0.875,
        "level": "critical",
        "previous_level": "warning",
    }

    state = await Variable.aget(state_variable(name))
    assert isinstance(state, dict)
    assert state["level"] == "ok"
    assert [row[1:] for row in state["samples"]] == [
        [7, 10], [7, 10], [7, 8], [7, 9], [7, 100], [7, 100]
    ]  # fmt: skip

    async with get_client() as client:
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[f"collector-{name}-backlog"])
            )
        )
    latest = max(artifacts, key=_created)
    assert latest.type == "markdown" and isinstance(latest.data, str)
    assert f"# Backlog of `{name}`: ok" in latest.data
    assert "| 7 | 100 | 7.0% |" in latest.data and "| 7 | 8 | 87.5% |" in latest.data


async def test_default_capacity_is_the_whole_source_and_bad_source_fails_after_others(
    tmp_path: Path,
) -> None:
    name = f"backlog-{uuid.uuid4().hex[:8]}"
    good = write_source(tmp_path, name=name, seeds={"urls": ["http://site.example/0"]})
    _fill(good, queued=2, done=8)
    missing = tmp_path / "nope.yaml"
    with pytest.raises(CollectorError, match=r"nope\.yaml: file not found"):
        await asyncio.to_thread(backlog_monitor, sources=[str(missing), str(good)])
    state = await Variable.aget(state_variable(name))  # the good one was still sampled
    assert isinstance(state, dict)
    assert state["level"] == "ok" and [row[1:] for row in state["samples"]] == [[2, 10]]


async def test_redis_frontier_source_is_watched_the_same_way(
    tmp_path: Path, redis_url: str
) -> None:
    name = f"backlog-{uuid.uuid4().hex[:8]}"
    path = write_source(
        tmp_path,
        name=name,
        seeds={"urls": ["http://site.example/0"]},
        frontier={"type": "redis", "url": redis_url},
        backlog={"capacity": 4},
    )
    _fill(path, queued=4, done=1)
    [result] = await asyncio.to_thread(backlog_monitor, sources=[str(path)])
    assert result == {
        "source": name,
        "depth": 4,
        "capacity": 4,
        "ratio": 1.0,
        "level": "critical",
        "event": "collector.backlog.critical",
    }
    [event] = await _events(f"collector.source.{name}", expected=1)
    assert event.event == "collector.backlog.critical" and event.payload["depth"] == 4
