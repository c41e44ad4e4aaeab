"""The ``dead-run-sweeper`` flow: running collect, work and triage runs whose heartbeat stopped.

Prefect finds a dead flow run through its zombie automation, whose state lives in the messaging
broker (Redis in the scale-out topology) and whose triggers need the services process: after a
Redis restart, or with the services process down, a run whose worker died stays RUNNING, holds
its source lock and its leased items, and its deployment's concurrency slot cancels the next run.

This flow judges from Collector's own heartbeats instead, which live in the Prefect database and
the frontier: the source lock's beat Variable (``flows/_locks.py``) and the frontier's holders
(:mod:`collector.run.heartbeat`), the freshest of the two. A run silent past
``HOLDER_DEAD_AFTER_S`` (or whose process is gone from this machine) is marked Crashed with a
message naming the silence, its leased items go back to the queue and its source lock is freed,
so the next run completes the source exactly. A run with no heartbeat on record yet (starting,
or holding nothing) is left to the zombie automation, which stays as a second line.
Deployed on a short schedule (``deployments/prefect.yaml``: ``dead-run-sweeper``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Annotated, Any

from prefect import flow, get_run_logger
from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.filters import (
    FlowFilter,
    FlowFilterName,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.logging import get_logger
from pydantic import Field

from collector import defaults
from collector.backends import open_frontier
from collector.config import Source
from collector.run.liveness import judge_beat, machine
from flows._dead_runs import crash_message, mark_crashed, revoke_in_frontier
from flows._locks import read_beat, release_dead_holder
from flows.sources import resolve_source

__all__ = ["SWEPT_FLOWS", "Swept", "sweep", "sweep_dead_runs"]

log = get_logger(__name__)

SWEPT_FLOWS = ("collect", "triage")  # `work` runs are collect runs with role=work


@dataclass
class Swept:
    """What one sweep saw and did (the flow's result)."""

    looked_at: int = 0
    crashed: list[str] = field(default_factory=list)
    items_returned: int = 0
    unjudged: list[str] = field(default_factory=list)  # no heartbeat on record

    def as_dict(self) -> dict[str, Any]:
        return {
            "looked_at": self.looked_at,
            "crashed": self.crashed,
            "items_returned": self.items_returned,
            "unjudged": self.unjudged,
        }


async def sweep(
    client: PrefectClient,
    *,
    now: float | None = None,
    dead_after_s: float = defaults.HOLDER_DEAD_AFTER_S,
) -> Swept:
    """Mark every running collect/triage run whose heartbeat stopped Crashed; free its hold."""
    now = time.time() if now is None else now
    runs = await client.read_flow_runs(
        flow_filter=FlowFilter(name=FlowFilterName(any_=list(SWEPT_FLOWS))),
        flow_run_filter=FlowRunFilter(
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING]))
        ),
    )
    swept = Swept(looked_at=len(runs))
    by_source: dict[str, list[FlowRun]] = {}
    for run in runs:
        reference = run.parameters.get("source")
        if isinstance(reference, str):
            by_source.setdefault(reference, []).append(run)
    for reference, source_runs in by_source.items():
        try:
            source = await asyncio.to_thread(resolve_source, reference)
        except Exception as exc:  # a source this worker cannot read: its runs are not judged
            log.warning("source %s not read: %s", reference, exc)
            swept.unjudged += [str(r.id) for r in source_runs]
            continue
        await _sweep_source(client, source, source_runs, now, dead_after_s, swept)
    return swept


async def _sweep_source(
    client: PrefectClient,
    source: Source,
    runs: list[FlowRun],
    now: float,
    dead_after_s: float,
    swept: Swept,
) -> None:
    raw, lock_beat = await read_beat(source)
    frontier_beats = await asyncio.to_thread(_frontier_beats, source)
    for run in runs:
        run_id = str(run.id)
        beats = [b for h, b in frontier_beats if h == run_id]
        why: str | None = None
        if lock_beat is not None and lock_beat.holder == run_id:
            verdict = judge_beat(lock_beat, now=now, here=machine(), dead_after_s=dead_after_s)
            if verdict.dead and "is gone" in verdict.why:
                why = verdict.why
            beats.append(lock_beat.at)
        if not beats:
            swept.unjudged.append(run_id)
            continue
        silent = now - max(beats)
        if why is None and silent <= dead_after_s:
            continue
        why = why or f"its last heartbeat was {silent:.0f}s ago (dead after {dead_after_s:g}s)"
        await mark_crashed(client, run_id, crash_message(why, found_by="the dead-run sweeper"))
        swept.crashed.append(run_id)
        swept.items_returned += await asyncio.to_thread(revoke_in_frontier, source, run_id)
        if lock_beat is not None and lock_beat.holder == run_id:
            await release_dead_holder(client, source, raw)
        log.warning("run %s of %s: %s: marked Crashed", run_id, source.name, why)


def _frontier_beats(source: Source) -> list[tuple[str, float]]:
    """(holder, last beat) of every holder leasing items of the source."""
    with open_frontier(source) as frontier:
        return [
            (h.holder, h.beat_at)
            for h in frontier.holders(source.name)
            if h.holder and h.beat_at is not None
        ]


@flow(name="dead-run-sweeper", log_prints=False, validate_parameters=True, timeout_seconds=120)
async def sweep_dead_runs(
    dead_after_s: Annotated[
        float, Field(gt=0, description="A run silent this long is dead (the holders' bound).")
    ] = defaults.HOLDER_DEAD_AFTER_S,
) -> dict[str, Any]:
    """Mark running collect/triage runs whose heartbeat stopped Crashed; free what they held."""
    async with get_client() as client:
        swept = await sweep(client, dead_after_s=dead_after_s)
    get_run_logger().info(
        "looked at %d running runs: %d crashed, %d items returned to the queue, %d not judged",
        swept.looked_at, len(swept.crashed), swept.items_returned, len(swept.unjudged),
    )  # fmt: skip
    return swept.as_dict()
