"""The ``fleet`` flow: `collector work` helpers for every deployed source, by priority and load.

One long run (or a deployment on a short interval with ``duration_s`` to match). It finds the
sources deployed by ``collector deploy`` (deployments ``collect/source-<name>`` on the pool),
samples each one's frontier every ``sample_s`` (100 ms: due backlog, claim wait by Little's law,
which helpers hold leases), and every ``decide_every_s`` decides with
:mod:`collector.fleet.model` how many helpers each source gets within ``budget``, then acts:

- **start**: a flow run of the source's own deployment with ``role=work`` (no plan, no source
  lock: it helps drain the shared frontier) and the tag ``collector-helper``, so any worker of
  the pool runs it; it ends by itself ``helper_idle_s`` after its frontier had nothing due;
- **stop** (soft preemption, and a scale-down by the idle or memory rule; a drained source's
  helpers end by themselves): a running helper is set Cancelling, the worker sends it SIGTERM
  and the collect flow's graceful stop returns its items unchanged (no attempt counted).
  Helpers not running yet are not stopped (a worker submitting one could still start it);
  they are stopped once they run.

A helper is a process start, so the fleet measures it (creation to the first sample in which
the helper's run id holds leases; the median of the last few: collector.fleet.model
``HelperStarts``) and asks only for helpers that arrive before their source's work is gone;
a source's processes live but not claiming yet (helpers starting, its own run starting or
planning, read with the helpers each round) are capacity on its way. While its own run is on
its way and nothing of it claims, a source's backlog is what that run is expected to plan
(collector.fleet.forecast, read then and every 5 s), so its helpers start with its run.

Every round that changes a source emits ``collector.fleet.scaled`` on ``collector.source.<name>``
with the figures that caused it, and the table artifact ``collector-fleet`` (source, class,
backlog, wait, helpers, weight) is updated when it changed. Helpers count against the budget
from the moment they are created until they end, stopping ones included, so the budget is
never exceeded.

Interruptions: stopping this flow (Cancel, Ctrl-C, SIGKILL) starts and stops nothing more; the
helpers it started go on and end by themselves when their frontier is drained (helper_idle_s).
A new run finds them by their tag and counts them.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any
from uuid import UUID

import httpx
from prefect import flow, get_run_logger
from prefect.artifacts import acreate_table_artifact
from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.filters import (
    FlowFilter,
    FlowFilterName,
    FlowRunFilter,
    FlowRunFilterDeploymentId,
    FlowRunFilterExpectedStartTime,
    FlowRunFilterState,
    FlowRunFilterStateType,
    FlowRunFilterTags,
    WorkPoolFilter,
    WorkPoolFilterName,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.events import emit_event
from prefect.exceptions import PrefectHTTPStatusError
from prefect.settings import PREFECT_CLIENT_METRICS_ENABLED
from prefect.states import Cancelling
from pydantic import Field

from collector import defaults
from collector.backends import open_frontier
from collector.config import Source
from collector.errors import CollectorError
from collector.fleet.deploy import DEPLOYMENT_PREFIX
from collector.fleet.forecast import expected_due, prior_throughput
from collector.fleet.model import (
    Actions,
    Decision,
    FleetSettings,
    HelperStarts,
    decide,
    plan_actions,
    politeness_cap,
)
from collector.fleet.report import helpers_cpu, helpers_memory
from collector.fleet.table import TablePacer
from collector.fleet.tracker import Arrivals, Reservations, SourceTracker
from collector.frontier.base import Frontier
from collector.ops import metrics
from flows.sources import resolve_source

__all__ = ["HELPER_TAG", "SCALED_EVENT", "fleet"]

HELPER_TAG = "collector-helper"
SCALED_EVENT = "collector.fleet.scaled"
ARTIFACT_KEY = "collector-fleet"
_LIVE = [StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING, StateType.CANCELLING]
_DISCOVER_EVERY_S = 30.0
_FORECAST_EVERY_S = 5.0  # a run on its way: what it is expected to plan, read again this often
# A failed round is skipped, not the end of the fleet: the next one reads the helpers again from
# the API, so a start or stop that half-happened is counted then (the budget stays true).
_TRANSIENT = (PrefectHTTPStatusError, httpx.TransportError, CollectorError)


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:300]


@dataclass
class _Deployed:
    """A source deployed on the pool, with its frontier and running figures."""

    source: Source
    reference: str
    deployment_id: UUID
    frontier: Frontier
    tracker: SourceTracker
    politeness: str
    # (own run id, its expected due, when read): read again every _FORECAST_EVERY_S while it
    # is on its way (another run of the source may be draining the frontier meanwhile)
    forecast: tuple[str, int, float] | None = None


async def _discover(
    client: PrefectClient,
    pool: str,
    settings: FleetSettings,
    known: dict[str, _Deployed],
    logger: Any,
    starts: HelperStarts | None = None,
) -> None:
    """Add the deployed sources not known yet (one that cannot be loaded is said once)."""
    deployments = await client.read_deployments(
        flow_filter=FlowFilter(name=FlowFilterName(any_=["collect"])),
        work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[pool])),
    )
    for deployment in deployments:
        if not deployment.name.startswith(DEPLOYMENT_PREFIX):
            continue
        reference = str((deployment.parameters or {}).get("source", ""))
        name = deployment.name.removeprefix(DEPLOYMENT_PREFIX)
        if name in known:
            continue
        try:
            source = await asyncio.to_thread(resolve_source, reference)
            frontier = await asyncio.to_thread(open_frontier, source)
        except CollectorError as exc:
            logger.warning("fleet: %s (%s) left out: %s", name, reference, exc)
            continue
        limits = source.limits
        cap, why = politeness_cap(
            shared_domain_concurrency=limits.shared_domain_concurrency,
            per_domain_rate=limits.per_domain_rate,
            rate_storage=limits.rate_storage,
        )
        most = source.schedule.max_helpers if cap is None else min(cap, source.schedule.max_helpers)
        known[name] = _Deployed(
            source,
            reference,
            deployment.id,
            frontier,
            SourceTracker(
                name,
                source.priority.run_class,
                max_helpers=most,
                settings=settings,
                rules=source.schedule.scaling,
                starts=starts,
                prior_throughput=prior_throughput(source),
            ),
            why,
        )
        logger.info(
            "fleet: watching %s (%s, at most %d helpers: %s)",
            name,
            source.priority.run_class,
            most,
            why,
        )


async def _runs(
    client: PrefectClient, deployed: dict[str, _Deployed]
) -> tuple[dict[str, list[FlowRun]], dict[str, list[FlowRun]]]:
    """The live runs of each source's deployment: its helpers (created, pending, running,
    stopping: every one, so the budget counts them all) and its own runs (the same states; a
    scheduled one only once due: a schedule's future runs, up to a hundred per deployment, are
    not capacity on the way and must not crowd the helpers out of one read's limit). Two reads
    a decision round."""
    by_id = {d.deployment_id: name for name, d in deployed.items()}
    helpers: dict[str, list[FlowRun]] = {name: [] for name in deployed}
    own: dict[str, list[FlowRun]] = {name: [] for name in deployed}
    if not by_id:
        return helpers, own
    live = FlowRunFilterState(type=FlowRunFilterStateType(any_=_LIVE))
    deployments = FlowRunFilterDeploymentId(any_=list(by_id))
    for run in await client.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            deployment_id=deployments, tags=FlowRunFilterTags(all_=[HELPER_TAG]), state=live
        ),
        limit=200,
    ):
        if run.deployment_id in by_id:
            helpers[by_id[run.deployment_id]].append(run)
    due = FlowRunFilterExpectedStartTime(before_=datetime.now(UTC) + timedelta(seconds=1))
    for run in await client.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            deployment_id=deployments, state=live, expected_start_time=due
        ),
        limit=200,
    ):
        if run.deployment_id in by_id and HELPER_TAG not in (run.tags or []):
            own[by_id[run.deployment_id]].append(run)
    return helpers, own


def _age_s(run: FlowRun) -> float:
    """Seconds since the run was created (or, scheduled for later, since it was due)."""
    at = [t.timestamp() for t in (run.created, run.expected_start_time) if t is not None]
    return time.time() - max(at) if at else 0.0


def _coming(arrivals: Arrivals, helpers: Sequence[FlowRun], own: Sequence[FlowRun]) -> int:
    """A source's processes live but not claiming yet: capacity on its way (stopping helpers
    are not)."""
    processes = [r for r in helpers if r.state_type != StateType.CANCELLING] + list(own)
    return arrivals.coming((str(r.id), _age_s(r)) for r in processes)


async def _forecast(arrivals: Arrivals, d: _Deployed, own: Sequence[FlowRun]) -> int:
    """What the source's own run on its way is expected to plan (0: none on its way, or it
    claims already): read when it is first seen on its way, and again every
    ``_FORECAST_EVERY_S`` while it stays on its way (a run waiting for its source's lock while
    another drains the frontier)."""
    waiting = [r for r in own if r.state_type != StateType.CANCELLING
               and arrivals.coming([(str(r.id), _age_s(r))])]  # fmt: skip
    if not waiting:
        d.forecast = None
        return 0
    run_id = str(min(waiting, key=_age_s).id)  # the newest: the one that will plan
    now = time.monotonic()
    if d.forecast is None or d.forecast[0] != run_id or now - d.forecast[2] >= _FORECAST_EVERY_S:
        due = await asyncio.to_thread(expected_due, d.frontier, d.source, now=time.time())
        d.forecast = (run_id, due, now)
    return d.forecast[1]


async def _sample(
    deployed: dict[str, _Deployed],
    helpers: dict[str, list[FlowRun]],
    arrivals: Arrivals,
    logger: Any,
) -> None:
    now = time.monotonic()
    for name, d in deployed.items():
        counts = await asyncio.to_thread(d.frontier.counts, name)
        holders = await asyncio.to_thread(d.frontier.holders, name)
        running = {str(r.id) for r in helpers.get(name, []) if r.state_type == StateType.RUNNING}
        capped = d.tracker.no_gain
        d.tracker.sample(now, counts, holders, running)  # busy: of the helpers that run
        if d.tracker.no_gain != capped:  # the "no gain" rule judged (or its keep ran out)
            logger.info("fleet: %s: %s", name, d.tracker.no_gain or "no gain forgotten")
        arrived = arrivals.observe(now, holders)
        # did the claim rate rise with them? (the "no gain" rule)
        d.tracker.helpers_arrived(now, len(running), len(arrived))
        for seconds in arrived:  # first claims: helper starts measured
            logger.info(
                "fleet: %s: a helper claimed %.1f s after its creation (expected start now %.1f s)",
                name,
                seconds,
                arrivals.starts.expected_s,
            )


async def _start(
    client: PrefectClient, d: _Deployed, count: int, *, batch_size: int, idle_s: float
) -> list[UUID]:
    started = []
    for _ in range(count):
        run = await client.create_flow_run_from_deployment(
            d.deployment_id,
            parameters={
                "source": d.reference,
                "role": "work",
                "idle_wait_s": idle_s,  # for its first items (a run may still be planning)
                "drain_wait_s": idle_s,  # for retry-later items, then it ends
                "batch_size": batch_size,
            },
            tags=[HELPER_TAG, f"source:{d.source.name}"],
        )
        started.append(run.id)
    return started


async def _stop(client: PrefectClient, runs: Sequence[FlowRun], count: int, why: str) -> list[UUID]:
    """Stop ``count`` running helpers gracefully, the newest first: Cancelling, the worker's
    SIGTERM, the collect flow's stop path. Helpers not running yet are left to start (a run
    cancelled while a worker submits it can still be started by that worker: preempted on a
    later decision instead); stopping ones are not stopped twice."""
    running = sorted(
        (r for r in runs if r.state_type == StateType.RUNNING),
        key=lambda r: r.start_time or r.created or 0,
        reverse=True,
    )
    stopped = []
    for run in running[:count]:
        # not forced: a helper that ended meanwhile stays ended (the server refuses the change)
        await client.set_flow_run_state(run.id, Cancelling(message=f"fleet: {why}"))
        stopped.append(run.id)
    return stopped


def _running_labels(runs: Sequence[FlowRun]) -> list[dict[str, Any]]:
    return [dict(r.labels or {}) for r in runs if r.state_type == StateType.RUNNING]


def _figures(decision: Decision, settings: FleetSettings, used: int) -> dict[str, Any]:
    load = decision.load
    return {
        "source": load.source,
        "class": load.run_class,
        "backlog": load.backlog,
        "claim_wait_s": None if math.isinf(load.wait_s) else round(load.wait_s, 4),
        "wait_high_for_s": round(load.wait_high_for_s, 2),
        "busy": None if load.busy is None else round(load.busy, 3),
        "cpu": None if load.cpu is None else round(load.cpu, 3),
        "memory": None if load.memory is None else round(load.memory, 3),
        "busy_high_for_s": round(load.busy_high_for_s, 2),
        "idle_for_s": round(load.idle_for_s, 2),
        "throughput": None if load.throughput is None else round(load.throughput, 3),
        "helper_start_s": round(load.start_s, 2),
        "coming": load.coming,
        "forecast": load.forecast,
        "no_gain_above": load.no_gain_above,
        "helpers": load.helpers,
        "max_helpers": load.max_helpers,
        "load_factor": round(decision.load_factor, 3),
        "weight": round(decision.weight, 3),
        "want": decision.want,
        "share": decision.share,
        "why": decision.why,
        "budget": settings.budget,
        "budget_used": used,
    }


def _emit(
    decision: Decision, actions: Actions, settings: FleetSettings, used: int, *,
    started: int, stopped: int,
) -> None:  # fmt: skip
    """The event of one source's change (what was done, not only decided)."""
    name = decision.load.source
    if not started and not stopped:
        return
    payload = _figures(decision, settings, used)
    payload.update(started=started, stopped=stopped, preempted_for=actions.preempted.get(name),
                   preempted_why=actions.victim_why.get(name))  # fmt: skip
    emit_event(
        event=SCALED_EVENT,
        resource={
            "prefect.resource.id": f"collector.source.{name}",
            "collector.class": decision.load.run_class,
        },
        payload=payload,
    )


def _table(decisions: Sequence[Decision]) -> list[dict[str, Any]]:
    return [
        {
            "source": d.load.source,
            "class": d.load.run_class,
            "backlog": d.load.backlog,
            # the backlog is a forecast: what the source's run on its way is expected to plan
            "forecast": "yes" if d.load.forecast else "-",
            "wait": "-"
            if d.load.backlog == 0
            else ("no claims" if math.isinf(d.load.wait_s) else f"{d.load.wait_s:.3f} s"),
            "helpers": d.load.helpers,
            "coming": d.load.coming,
            "helper start": f"{d.load.start_s:.1f} s",
            "cpu": "-" if d.load.cpu is None else f"{d.load.cpu:.0%}",
            "share": d.share,
            "weight": round(d.weight, 2),
            "why": d.why,
        }
        for d in sorted(decisions, key=lambda d: (-d.weight, d.load.source))
    ]


@flow(name="fleet", validate_parameters=True, log_prints=False)
async def fleet(
    budget: Annotated[
        int, Field(ge=0, le=1000, description="Helpers running at once across all sources.")
    ] = defaults.FLEET_BUDGET,
    duration_s: Annotated[
        float, Field(gt=0, description="How long this run keeps scaling (seconds).")
    ] = 3600.0,
    pool: Annotated[str, Field(description="The work pool of the deployed sources.")] = (
        defaults.FLEET_POOL
    ),
    sample_s: Annotated[
        float, Field(gt=0, description="Each frontier is sampled this often (seconds).")
    ] = defaults.FLEET_SAMPLE_S,
    decide_every_s: Annotated[
        float, Field(gt=0, description="Helpers are started/stopped at most this often.")
    ] = 1.0,
    wait_high_s: Annotated[
        float, Field(gt=0, description="A claim wait above this asks for a helper (seconds).")
    ] = defaults.FLEET_WAIT_HIGH_S,
    wait_held_s: Annotated[
        float, Field(ge=0, description="...when it stayed above it this long (seconds).")
    ] = defaults.FLEET_WAIT_HELD_S,
    preempt: Annotated[
        bool, Field(description="Stop a lower class's helper when a higher class waits.")
    ] = True,
    arrival_work: Annotated[
        float,
        Field(
            ge=0,
            description="Start a helper only when its source would still have work for this "
            "many of its starts after it arrives (0: any work left at its arrival).",
        ),
    ] = defaults.FLEET_ARRIVAL_WORK,
    helper_idle_s: Annotated[
        float, Field(ge=0, description="A helper ends after nothing was due this long.")
    ] = defaults.FLEET_HELPER_IDLE_S,
    batch_size: Annotated[int, Field(ge=1, le=10_000, description="Helpers' batch size.")] = (
        defaults.BATCH_SIZE
    ),
    stop_when_idle_s: Annotated[
        float | None,
        Field(
            ge=0,
            description="End early once every source had nothing due, no helper and no "
            "live run of its own this long (None: run for duration_s).",
        ),
    ] = None,
) -> dict[str, Any]:
    """Keep each deployed source's helpers at its share of the budget; returns the tallies."""
    logger = get_run_logger()
    metrics.enable(metrics.enabled() or bool(PREFECT_CLIENT_METRICS_ENABLED.value()))
    settings = FleetSettings(
        budget=budget,
        wait_high_s=wait_high_s,
        wait_held_s=wait_held_s,
        preempt=preempt,
        arrival_work=arrival_work,
    )
    deployed: dict[str, _Deployed] = {}
    tally: dict[str, Any] = {"rounds": 0, "started": 0, "stopped": 0, "preempted": 0,
                             "most_helpers": 0, "cpu_reports": 0, "api_errors": 0}  # fmt: skip
    starts = HelperStarts()  # a helper's start, measured by this run (the prior before any)
    arrivals = Arrivals(starts)
    reservations = Reservations()  # slots preemption freed for a source, kept for it
    pacer = TablePacer()  # a new version of the table when worth one (collector.fleet.table)
    last_table: list[dict[str, Any]] | None = None  # the one computed last
    deadline = time.monotonic() + duration_s
    next_decision = next_discovery = time.monotonic()
    helpers: dict[str, list[FlowRun]] = {}
    own: dict[str, list[FlowRun]] = {}
    idle_since: float | None = None
    seen_work = False  # stop_when_idle_s counts only after some work was seen
    try:
        async with get_client() as client:
            while time.monotonic() < deadline:
                now = time.monotonic()
                try:
                    if now >= next_discovery:
                        await _discover(client, pool, settings, deployed, logger, starts)
                        next_discovery = now + _DISCOVER_EVERY_S
                    if now >= next_decision:
                        helpers, own = await _runs(client, deployed)
                        arrivals.keep({str(r.id) for runs in (*helpers.values(), *own.values())
                                       for r in runs})  # fmt: skip
                    await _sample(deployed, helpers, arrivals, logger)
                    if now >= next_decision:
                        next_decision = now + decide_every_s
                        last_table = await _round(
                            client,
                            deployed,
                            helpers,
                            own,
                            arrivals,
                            reservations,
                            settings,
                            tally,
                            pacer,
                            batch_size,
                            helper_idle_s,
                            logger,
                        )
                except _TRANSIENT as exc:  # the API or a store away for a moment: next round
                    next_decision = max(next_decision, now + decide_every_s)
                    tally["api_errors"] += 1
                    logger.warning("fleet: round skipped, will retry: %s", _first_line(exc))
                # a source's own run still starting or planning is work on its way: its backlog
                # shows only once it planned (a play's big runs, late on a loaded worker)
                busy = (
                    any(d.tracker.backlog for d in deployed.values())
                    or any(helpers.values())
                    or any(own.values())
                )
                seen_work = seen_work or busy
                idle_since = None if busy else (now if idle_since is None else idle_since)
                idle_for = 0.0 if idle_since is None or not seen_work else now - idle_since
                if stop_when_idle_s is not None and idle_for >= stop_when_idle_s > 0:
                    break
                await asyncio.sleep(max(0.0, sample_s - (time.monotonic() - now)))
            if last_table is not None and pacer.held_back(last_table):  # the last word shown
                try:
                    await _show(last_table, pacer, time.monotonic(), settings.budget)
                except _TRANSIENT as exc:  # the API away at the end: the table stays a round old
                    logger.warning("fleet: last table not shown: %s", _first_line(exc))
    finally:  # closed off the loop (a Redis or SQLite close may wait)
        await asyncio.gather(*(asyncio.to_thread(d.frontier.close) for d in deployed.values()))
    tally["tables_shown"] = pacer.versions
    tally["table_figure_versions"] = pacer.figure_versions
    tally["helper_start_s"] = round(starts.expected_s, 2)  # the last estimate
    tally["starts_measured"] = starts.measured
    logger.info("fleet: %s", tally)
    return tally


async def _round(
    client: PrefectClient,
    deployed: dict[str, _Deployed],
    helpers: dict[str, list[FlowRun]],
    own: dict[str, list[FlowRun]],
    arrivals: Arrivals,
    reservations: Reservations,
    settings: FleetSettings,
    tally: dict[str, Any],
    pacer: TablePacer,
    batch_size: int,
    idle_s: float,
    logger: Any,
) -> list[dict[str, Any]]:
    """One decision: loads -> decisions -> actions, carried out, said and shown."""
    forecasts = {name: await _forecast(arrivals, d, own.get(name, []))
                 for name, d in deployed.items()}  # fmt: skip
    now = time.monotonic()
    loads = [
        d.tracker.load(
            now,
            len(helpers.get(name, [])),
            sum(1 for r in helpers.get(name, []) if r.state_type == StateType.CANCELLING),
            # their own reports: the labels each running helper keeps on its flow run
            helpers_cpu(_running_labels(helpers.get(name, []))),
            helpers_memory(_running_labels(helpers.get(name, []))),
            _coming(arrivals, helpers.get(name, []), own.get(name, [])),
            forecasts[name],
        )
        for name, d in deployed.items()
    ]
    decisions = decide(loads, settings)
    wants = {d.load.source: d.want for d in decisions}
    actions = plan_actions(decisions, settings, reservations.now(now, wants))
    used = sum(x.helpers for x in loads)
    tally["rounds"] += 1
    tally["most_helpers"] = max(tally["most_helpers"], used)
    tally["cpu_reports"] += sum(1 for x in loads if x.cpu is not None)
    for decision in decisions:
        name = decision.load.source
        d = deployed[name]
        d.tracker.decided(now, want=decision.want, helpers=decision.load.helpers)
        stopped: list[UUID] = []
        started: list[UUID] = []
        metrics.fleet_sampled(name, decision.load.wait_s, decision.load.helpers, decision.load.cpu)
        if actions.stop.get(name):
            victim_for = actions.preempted.get(name)
            why = decision.why
            if victim_for:  # and what the stop costs the fleet's end (model.victims)
                why = f"preempted for {victim_for}; {actions.victim_why.get(name, '')}"
            stopped = await _stop(client, helpers.get(name, []), actions.stop[name], why)
            tally["stopped"] += len(stopped)
            if victim_for and stopped:
                tally["preempted"] += len(stopped)
                reservations.freed(victim_for, len(stopped), now)  # its slot, once it ends
                metrics.fleet_preempted(name, len(stopped))
            if stopped:  # none running yet: preempted at a later decision, once one runs
                logger.info("fleet: %s: stopped %d helper(s) (%s)", name, len(stopped), why)
        if actions.start.get(name):
            started = await _start(
                client, d, actions.start[name], batch_size=batch_size, idle_s=idle_s
            )
            for run_id in started:  # its start: from this decision to its first claim
                arrivals.created(str(run_id), now)
            reservations.started(name, len(started))
            tally["started"] += len(started)
            logger.info(
                "fleet: %s: started %d helper(s) (%s; weight %.2f, share %d)",
                name,
                len(started),
                decision.why,
                decision.weight,
                decision.share,
            )
        _emit(decision, actions, settings, used, started=len(started), stopped=len(stopped))
    metrics.fleet_budget(settings.budget, used)
    table = _table(decisions)
    if pacer.due(table, now):
        await _show(table, pacer, now, settings.budget)
    return table


async def _show(table: list[dict[str, Any]], pacer: TablePacer, now: float, budget: int) -> None:
    used = sum(int(row["helpers"]) for row in table)
    await acreate_table_artifact(
        table, key=ARTIFACT_KEY, description=f"Fleet: {used} of {budget} helpers"
    )
    pacer.written(table, now)
