"""The ``fleet`` flow on real parts (issue 26): a Prefect API, a process worker of the pool,
Redis frontiers and dead letters, a Postgres sink, a local site. Eight sources of four classes
are deployed by `collector deploy` and requested at once; with a budget of 4 helpers:

- none is cancelled (each source's run is its own deployment's, Completed, with its ledger);
- the burst source's helpers go up to its cap and back to none once it drained, while the bulk
  source still has helpers;
- the critical source, requested once the budget is full with a backlog that outlasts a
  helper's start, preempts a lower class's helper, saying what the stop costs the fleet's end
  (which one: tests/test_fleet_victims.py);
- the fleet measured helper starts (creation to first claim) and shows them in its events;
- the burst and the bulk source got their first helpers with their runs, on the forecast of
  what each run would plan (collector/fleet/forecast.py);
- every source ends exact: each record once, every ledger balanced, and per source the run's
  and its helpers' stored items add up to the seeds (each item stored by exactly one of them).

One play of the scenario (tests/fleet_world.py, shared with bench/fleet.py) checks all of it:
each play costs minutes of process starts on a loaded box."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from collector.demo.site import FaultSite
from tests.fleet_world import EIGHT, LATE, Outcome, Pool, ledgers, play, warm_up
from tests.fleet_world import pool as pool  # the fixture

pytestmark = pytest.mark.slow

BUDGET = 4
# the six small sources drain in their own run: no helpers for them here (bench/fleet.py lets
# them have one), so the budget goes to the burst and the bulk source with fewer process starts
SPECS = tuple(replace(s, max_helpers=0) if s.items <= 30 else s for s in EIGHT)
ITEMS = {s.name: s.items for s in SPECS}


def _rows(dsn: str) -> Counter[tuple[str, int]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT source, key FROM records").fetchall()
    return Counter((source, int(key)) for source, key in rows)


async def _events(name: str, sources: list[str]) -> list[Any]:
    """The events ``name`` about each source (the API returns at most 50 per call)."""
    from prefect.client.orchestration import get_client

    found: list[Any] = []
    async with get_client() as client:
        for source in sources:
            query = {"event": {"name": [name]},
                     "resource": {"id": [f"collector.source.{source}"]}}  # fmt: skip
            response = await client._client.post(
                "/events/filter", json={"filter": query, "limit": 50}
            )
            response.raise_for_status()
            found += response.json()["events"]
    return found


async def _messages(run_ids: list[Any]) -> dict[Any, list[str]]:
    """Every state message of each run (a preempted helper was set Cancelling by the fleet)."""
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        return {i: [s.message or "" for s in await client.read_flow_run_states(i)] for i in run_ids}


def _timeline(outcome: Outcome) -> list[Any]:
    return [
        (outcome.source_of(r), r.state.type.value, r.state.message, r.start_time, r.end_time)
        for r in outcome.helpers
    ]


def test_eight_sources_share_a_budget_of_four_by_priority_and_load(
    pool: Pool, tmp_path: Path, redis_url: str, postgres_dsn: str, postgres_server: Any
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with FaultSite() as site:
        # the worker's zygote first, as bench/fleet.py plays (one run, stores of its own)
        apart = postgres_server.create_schema("collector_tests")
        try:
            warm_up(pool, tmp_path, site.base_url, redis_url.rsplit("/", 1)[0] + "/15", apart)
        finally:
            postgres_server.drop_schema(apart)
        outcome = play(
            pool, tmp_path, site.base_url, redis_url, postgres_dsn, budget=BUDGET, specs=SPECS
        )
    result, helpers, timeline = outcome.tally, outcome.helpers, _timeline(outcome)

    # requested at once, none cancelled: every source's own run Completed
    assert outcome.late_at is not None, "the fleet never filled its budget"
    assert sorted(outcome.runs) == sorted(ITEMS), outcome.runs
    states = {n: (r.state.type.value, r.state.message) for n, r in outcome.runs.items()}
    assert {s for s, _ in states.values()} == {"COMPLETED"}, states

    # the budget held (helpers count from creation until they ended, stopping ones included)
    assert outcome.most_live <= BUDGET, (outcome.most_live_seen, result)
    assert result["most_helpers"] <= BUDGET, result
    assert result["started"] == len(helpers), (result, timeline)
    assert {r.state.type.value for r in helpers} <= {"COMPLETED", "CANCELLED"}, timeline
    assert result["cpu_reports"] > 0, result  # the helpers reported their CPU share
    assert result["starts_measured"] >= 1, result  # creation to first claim, by the fleet

    # the burst: up to its cap, then none once it drained while the bulk source still had some
    assert outcome.peak("burst") == 2, (outcome.live, timeline)
    top = next(t for t, live in outcome.live if live["burst"] == 2)
    after = [(t, live) for t, live in outcome.live if t > top]
    assert any(live["burst"] == 0 and live["bulk-low"] > 0 for _, live in after), (
        "the burst's helpers did not end while the bulk source was still helped",
        outcome.live,
    )

    # the critical source preempted a lower class's helper, saying what the stop costs
    assert result["preempted"] >= 1, (result, timeline)
    cancelled = [r for r in helpers if r.state.type.value == "CANCELLED"]
    victims = {outcome.source_of(r) for r in cancelled}
    assert victims and victims <= {"burst", "bulk-low"}, timeline
    said = asyncio.run(_messages([r.id for r in cancelled]))
    # every stop a preemption for a higher class, with what it costs the fleet's end (a
    # `bulk-low` one may go to `burst` while `burst` drains last: the end moves no later)
    higher = {"burst": ("bulk-low",), LATE: ("burst", "bulk-low")}
    unsaid = {(outcome.source_of(r), *said[r.id]) for r in cancelled
              if not any(f"preempted for {b}; " in m and "critical path" in m
                         and outcome.source_of(r) in higher[b]
                         for b in higher for m in said[r.id])}  # fmt: skip
    assert not unsaid, unsaid
    assert any(f"preempted for {LATE}; " in m for r in cancelled for m in said[r.id]), said
    events = asyncio.run(_events("collector.fleet.scaled", list(ITEMS)))
    payloads = [e["payload"] for e in sorted(events, key=lambda e: e["occurred"])]
    preempting = [p for p in payloads if p.get("preempted_for")]
    assert any(p["preempted_for"] == LATE for p in preempting), payloads
    assert all("critical path: drains in" in p["preempted_why"] for p in preempting), payloads
    assert all({"backlog", "claim_wait_s", "weight", "share", "budget_used", "cpu",
                "helper_start_s", "coming", "forecast"} <= p.keys() for p in payloads)  # fmt: skip
    # the two long sources got their first helpers with their runs, on the forecast of what
    # each run would plan (all their seeds: a fresh frontier), not after a plan and a claim
    first = {n: next(p for p in payloads if p["source"] == n and p["started"])
             for n in ("burst", "bulk-low")}  # fmt: skip
    assert {n: p["forecast"] for n, p in first.items()} == {"burst": 360, "bulk-low": 600}, first

    # every source exact: each record once, every ledger balanced, helpers' terms counted
    rows = _rows(postgres_dsn)
    assert set(rows) == {(n, i) for n, count in ITEMS.items() for i in range(count)}
    assert set(rows.values()) == {1}
    runs = list(outcome.runs.values())
    tables = ledgers([r.id for r in runs + helpers])
    # A run that reached Running publishes its ledger, a preempted helper too (it stops
    # gracefully). A helper stopped before it ever ran (preempted while its process was still
    # starting: 20-60 s on a box half as fast, where a CI run saw one) ran no flow: nothing
    # claimed, nothing to account, and Cancelled is its only possible end.
    ran = [r for r in runs + helpers if r.start_time is not None]
    never = [r for r in helpers if r.start_time is None]
    missing = [(r.name, r.state.type.value, r.start_time) for r in ran if r.id not in tables]
    assert not missing, f"runs without a ledger artifact: {missing}"
    assert {r.state.type.value for r in never} <= {"CANCELLED"}, _timeline(outcome)
    assert all(t["balanced"] is True for t in tables.values()), tables
    for name, run in outcome.runs.items():
        own = tables[run.id]
        assert own["discovered"] == ITEMS[name], (name, own)
        theirs = [tables[h.id] for h in helpers if outcome.source_of(h) == name and h.id in tables]
        stored = own["stored"] + sum(t["stored"] for t in theirs)
        assert stored == ITEMS[name], (name, own, theirs)  # each item by exactly one holder
        assert own["stored"] + own["stored_by_others"] <= ITEMS[name], (name, own)
        if theirs and name in ("burst", "bulk-low"):
            assert own["stored_by_others"] > 0, (name, own)  # the run counted its helpers'

    async def artifact() -> Any:
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["collector-fleet"]))
            )

    versions = asyncio.run(artifact())
    assert versions and all(v.type == "table" for v in versions), versions
    # a version when the fleet did something, figures alone at most every 15 s (a version per
    # decision was one a second: collector.fleet.table); every version written is kept
    assert len(versions) == result["tables_shown"], (len(versions), result)
    # versions for figures alone: one per 15 s at most, and the last word at the end (the
    # fleet ran no longer than the play; a version per decision would be one per round)
    played_s = time.monotonic() - outcome.t0
    assert result["table_figure_versions"] <= played_s / 15 + 2, (played_s, result)


def test_the_fleet_reads_every_helper_and_only_the_due_own_runs(prefect_api: str) -> None:
    """The budget counts every live helper (one scheduled later included); capacity on the
    way counts the source's own runs only once due (a schedule's future runs are not coming)
    and not the helpers being stopped."""
    from datetime import UTC, datetime, timedelta
    from typing import cast

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelling, Running, Scheduled

    from collector.fleet.model import HelperStarts
    from collector.fleet.tracker import Arrivals
    from flows.fleet import HELPER_TAG, _coming, _Deployed, _runs

    later: Any = Scheduled(scheduled_time=datetime.now(UTC) + timedelta(hours=1))

    async def play() -> tuple[dict[str, list[Any]], dict[str, list[Any]], set[Any]]:
        async with get_client() as client:
            flow_id = await client.create_flow_from_name("collect")
            deployment_id = await client.create_deployment(flow_id, "source-readme")
            made = set()
            for tags, state in (([HELPER_TAG], None), ([HELPER_TAG], later), ([], None),
                                ([], later), ([HELPER_TAG], None)):  # fmt: skip
                run = await client.create_flow_run_from_deployment(
                    deployment_id, tags=tags, state=state
                )
                made.add((tuple(tags), state is later, run.id))
            stopping = max(r for t, lat, r in made if t and not lat)
            await client.set_flow_run_state(stopping, Running(), force=True)
            await client.set_flow_run_state(stopping, Cancelling(), force=True)
            target = _Deployed(cast(Any, None), "", deployment_id, cast(Any, None),
                               cast(Any, None), "")  # fmt: skip
            helpers, own = await _runs(client, {"readme": target})
            assert (await client.read_flow_run(stopping)).state_type == StateType.CANCELLING
            return helpers, own, {r for t, lat, r in made if not t and not lat}

    helpers, own, due_own = asyncio.run(play())
    assert len(helpers["readme"]) == 3  # the due one, the later one, the stopping one
    assert {r.id for r in own["readme"]} == due_own  # not the one scheduled an hour later
    arrivals = Arrivals(HelperStarts(prior_s=15.0))
    assert _coming(arrivals, helpers["readme"], own["readme"]) == 3  # 2 helpers + the run
