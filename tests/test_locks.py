"""Cross-worker locks on a real Prefect server: the source lock and shared per-domain slots."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from collector.config import load_source
from collector.fetch.engine import FetchEngine
from collector.frontier import ClaimedItem
from collector.policy.retry import RetryBudget, RetrySettings
from collector.policy.urls import HostPolicy
from collector.run.locks import domain_lock_name, host_slots, source_lock_name
from collector.sinks.jsonl import JsonlSink
from flows._locks import ensure_limit
from flows.collect import collect
from tests.helpers import hold_source_lock, sink_lines, summary_of, write_source
from tests.worker_site import WorkerSite

COLLECTOR = [sys.executable, "-m", "flows.cli"]
ROOT = Path(__file__).resolve().parents[1]


def _env(api_url: str) -> dict[str, str]:
    return {**os.environ, "PREFECT_API_URL": api_url, "PYTHONPATH": str(ROOT)}


async def _active_slots(name: str) -> int:
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        return (await client.read_global_concurrency_limit_by_name(name)).active_slots


def test_host_slots_count_the_batch_items_per_host_capped() -> None:
    hosts = ["a.example"] * 5 + ["b.example"] * 2
    assert host_slots(hosts, per_domain_concurrency=3) == {"a.example": 3, "b.example": 2}
    assert domain_lock_name("a.example") == "domain:a.example"
    assert source_lock_name("shop") == "source:shop"


async def test_the_engine_uses_at_most_the_granted_slots_of_a_host() -> None:
    with WorkerSite() as site:
        site.set_delay(0.05)
        items = [ClaimedItem(site.url(f"/items/{i}.json"), 0, None, 0.0) for i in range(24)]
        engine = FetchEngine(
            retry=RetrySettings(),
            host_policy=HostPolicy(allow_private_networks=True),
            concurrency=16,
            per_domain_concurrency=16,
        )
        async with engine:
            results = await engine.fetch_batch(
                items, budget=RetryBudget(ratio=0.2, min_retries=20), host_slots={"127.0.0.1": 2}
            )
        assert [r.status for r in results] == ["ok"] * 24
        assert site.max_in_flight == 2


async def test_a_run_holds_the_source_lock_and_a_second_one_waits_skips_or_exits_3(
    tmp_path: Path, prefect_api: str
) -> None:
    from prefect.concurrency.asyncio import concurrency

    name = "locks-busy"
    with WorkerSite() as site:
        source = write_source(
            tmp_path,
            name=name,
            seeds={"template": site.url("/items/{i}.json"), "range": [0, 20]},
            locks={"wait_s": 1},
        )
        await ensure_limit(source_lock_name(name), 1)
        async with concurrency(source_lock_name(name), occupy=1, strict=True, lease_duration=60):
            # we hold what a run holds: the lock, and the JSONL sink's one-writer lock (the
            # others must wait for or skip the source lock, not be refused by the sink)
            writer = JsonlSink(load_source(source).sink_path, source=name)
            runs = {
                option: subprocess.Popen(
                    [*COLLECTOR, "run", str(source), "--json", *option.split()],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=_env(prefect_api),
                )
                for option in ("--lock-wait 1", "--on-busy skip", "--lock-wait 240")
            }
            busy = runs["--lock-wait 1"].communicate(timeout=300)
            skipped = runs["--on-busy skip"].communicate(timeout=300)
            waiting = runs["--lock-wait 240"]
            # the patient one says it waits once it finds the lock taken (read while we hold
            # it, however long its start-up takes on a loaded box); it goes on when we let go
            assert waiting.stderr is not None
            said = ""
            while "held by another run" not in said and (line := waiting.stderr.readline()):
                said += line
            if waiting.poll() is not None:
                rest = waiting.communicate(timeout=60)[1]
                said += rest
                pytest.fail(f"the waiting run ended while the lock was held:\n{said[-4000:]}")
            assert site.fetches() == [] and sink_lines(tmp_path / "out") == []
            writer.close()
        out, err = waiting.communicate(timeout=300)
        err = said + err
        assert runs["--lock-wait 1"].returncode == 3, busy[1][-2000:]
        assert "source:locks-busy" in busy[1] and "busy" in busy[1]
        assert "Traceback" not in busy[1], busy[1][-2000:]  # one line, not Prefect's traceback
        assert runs["--on-busy skip"].returncode == 0, skipped[1][-2000:]
        assert json.loads(skipped[0].strip().splitlines()[-1])["skipped"] == "busy"
        assert waiting.returncode == 0, err[-2000:]
        # said when the wait began (a 1 s wait may give up on its first try on a loaded box,
        # before there is any waiting to say, so the patient run is the one checked)
        assert "source:locks-busy is held by another run: waiting up to 240s" in said, err
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary["balanced"] and summary["stored"] == 20
        assert len(site.fetches()) == 20
    assert await _active_slots(source_lock_name(name)) == 0  # released at the end


async def test_a_dead_holders_slot_is_taken_back_after_its_heartbeat_goes_stale(
    tmp_path: Path, prefect_api: str
) -> None:
    """A run killed with SIGKILL keeps its slot (no repossessor on local servers); its heartbeat
    Variable stops. A waiter frees the slot once the heartbeat is HOLDER_DEAD_AFTER_S old (well
    before the lock's 60 s lease), and never while it is fresh."""
    import asyncio
    import contextlib
    import time

    from prefect.variables import Variable

    from collector.defaults import HOLDER_DEAD_AFTER_S
    from collector.run.locks import SourceBusy

    name = "locks-dead-holder"
    with WorkerSite() as site:
        source = write_source(
            tmp_path,
            name=name,
            seeds={"template": site.url("/items/{i}.json"), "range": [0, 5]},
            locks={"wait_s": 2, "lease_s": 60},
        )
        held = await hold_source_lock(name)  # the dead run's slot, as SIGKILL leaves it
        lock, heartbeat = held.name, held.beat

        async def beating() -> None:  # a live holder beats on, however slow the box
            while True:
                beat = {"holder": "alive", "at": time.time()}
                await Variable.aset(heartbeat, beat, overwrite=True)
                await asyncio.sleep(1)

        beats = asyncio.create_task(beating())
        try:
            with pytest.raises(SourceBusy):
                await collect(source=str(source))
        finally:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats
        assert site.fetches() == [] and await _active_slots(lock) == 1

        dead = time.time() - HOLDER_DEAD_AFTER_S - 1  # silent, though its lease (60 s) runs on
        await Variable.aset(heartbeat, {"holder": "dead", "at": dead}, overwrite=True)
        summary = summary_of(await collect(source=str(source)))
        assert summary["balanced"] and summary["stored"] == 5
    assert await _active_slots(lock) == 0
    assert await Variable.aget(heartbeat) is None  # ended cleanly: no heartbeat


async def test_shared_domain_slots_cap_every_batch_at_the_limits_size(
    tmp_path: Path, prefect_api: str
) -> None:
    """A ``domain:<host>`` limit of 3 caps every batch at 3 requests in flight on the host.

    The host is this test's own (``localhost``, the site's 127.0.0.1 by another name, so a
    ``domain:`` limit of its own) and its limit is made anew: an earlier test on this worker's
    session API (the fleet's) runs on 127.0.0.1 and SIGKILLs helpers that may hold its slots,
    and this API (a temporary server, without Prefect's repossessor) never frees those. Once,
    sharing 127.0.0.1, this test waited its 600 s for them in a full run."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectNotFound

    with WorkerSite() as site:
        site.set_delay(0.05)
        template = site.url("/items/{i}.json").replace("//127.0.0.1:", "//localhost:")
        source = write_source(
            tmp_path,
            name="locks-domain",
            seeds={"template": template, "range": [0, 60]},
            limits={"concurrency": 16, "per_domain_concurrency": 16,
                    "shared_domain_concurrency": True},
        )  # fmt: skip
        name = domain_lock_name("localhost")
        # a limit smaller than the per-worker cap, with no slot held: made anew, whatever an
        # earlier run on this host left on it
        async with get_client() as client:
            with contextlib.suppress(ObjectNotFound):
                await client.delete_global_concurrency_limit_by_name(name)
            await client.create_global_concurrency_limit(
                GlobalConcurrencyLimitCreate(name=name, limit=3)
            )
        try:
            summary = summary_of(await collect(source=str(source), batch_size=30))
            assert summary["balanced"] and summary["stored"] == 60
            assert {item for item, _ in site.fetches()} == set(range(60))
            assert site.max_in_flight == 3
            assert await _active_slots(name) == 0
        finally:  # a later test's runs on localhost are not to be held to 3
            async with get_client() as client:
                await client.delete_global_concurrency_limit_by_name(name)


@pytest.fixture(autouse=True)
def _forget_limit_sizes() -> None:
    from flows import _locks

    _locks._limits_seen.clear()


async def test_helpers_creating_one_limit_at_once_all_get_it(prefect_api: str) -> None:
    """Helpers start together and each makes sure the source's limit exists: the losers of
    the create race get Prefect's 409 (its unique name, on Postgres) and must still find the
    limit, not fail their run."""
    import asyncio
    import uuid

    from flows import _locks

    for _ in range(5):  # a race: several rounds make losing it all but certain
        name = f"race-{uuid.uuid4().hex[:8]}"
        sizes = await asyncio.gather(*(_locks.ensure_limit(name, 1) for _ in range(8)))
        assert sizes == [1] * 8
        _locks._limits_seen.pop(name, None)


async def test_the_holders_beat_goes_to_the_api_the_run_chose_by_context(
    tmp_path: Path, prefect_api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The beat thread sees the Prefect API its creator chose by context (as here: the session's
    API is a context setting, not in the environment, as ``prefect_test_harness`` does it). A
    bare thread saw no API, and Prefect started an ephemeral server of its own to beat on: the
    real server's beat stood still and its lease went unrenewed."""
    import asyncio
    import time

    from collector import defaults
    from flows._locks import read_beat, source_lock

    assert "PREFECT_API_URL" not in os.environ  # the API is chosen by context only
    monkeypatch.setattr(defaults, "HEARTBEAT_S", 0.2)
    source = load_source(
        write_source(tmp_path, name="locks-beat-context", seeds={"urls": ["http://h.example/0"]})
    )
    async with source_lock(source, holder="beat-context", on_busy="wait", wait_s=0) as held:
        assert held
        _, first = await read_beat(source)
        assert first is not None and first.holder == "beat-context"
        latest = first
        deadline = time.monotonic() + 60  # a loaded box: beats every 0.2 s, seen within a minute
        while latest.at <= first.at and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            _, beat = await read_beat(source)
            assert beat is not None
            latest = beat
    assert latest.at > first.at, "no beat after the first reached the run's Prefect API"
