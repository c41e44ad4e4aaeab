"""Create what Collector's deployments need on a Prefect server, idempotently.

``infra/bootstrap [--notify-url URL] [--pool-limit N] [--source FILE ...]`` acts on the Prefect
server ``collector`` uses (``PREFECT_API_URL``, else the local background server) and makes sure
that:

- the process work pool ``collector`` exists, with the queues ``critical`` / ``high`` /
  ``normal`` / ``low`` at priorities 1..4 (a worker always takes the most urgent class first);
- the global concurrency limits ``source:<name>`` (1: one run of a source at a time) and
  ``domain:<host>`` (the source's ``limits.per_domain_concurrency``) exist for each ``--source``;
- Collector's block types are registered, and, with ``--notify-url`` (or
  ``$COLLECTOR_NOTIFY_URL``), a webhook notification block ``collector-notify`` points to it;
- the automations exist: ``collector-backlog-critical`` (a ``collector.backlog.critical`` event
  pauses the ``low`` queue, and notifies when there is a URL), ``collector-backlog-recovered``
  (resumes it), ``collector-zombie-runs`` (a flow run without a heartbeat for 90 s is marked
  Crashed), and, only with a notify URL, ``collector-collect-failed`` (a ``collect`` flow run
  entering Failed or Crashed notifies).

Running it again changes nothing that is already as described: it reads first, and creates or
updates only what differs (a queue that an automation paused stays paused). Each line printed
says what it found: ``created``, ``updated`` or ``ok``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

POOL = "collector"
QUEUES = {"critical": 1, "high": 2, "normal": 3, "low": 4}
NOTIFY_BLOCK = "collector-notify"
FLOW_NAME = "collect"
ZOMBIE_AFTER_S = 90  # 3 missed heartbeats of PREFECT_FLOWS_HEARTBEAT_FREQUENCY (30 s)


def _say(what: str, state: str) -> None:
    print(f"{state:8} {what}")


async def ensure_pool(client: Any, pool_limit: int | None) -> None:
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    try:
        pool = await client.read_work_pool(POOL)
    except ObjectNotFound:
        await client.create_work_pool(
            WorkPoolCreate(
                name=POOL,
                type="process",
                description="Collector runs; queues by class, most urgent first.",
                base_job_template=ProcessWorker.get_default_base_job_template(),
                concurrency_limit=pool_limit,
            )
        )
        _say(f"work pool {POOL} (process, concurrency {pool_limit})", "created")
    else:
        if pool_limit is not None and pool.concurrency_limit != pool_limit:
            await client.update_work_pool(POOL, WorkPoolUpdate(concurrency_limit=pool_limit))
            _say(f"work pool {POOL} concurrency {pool_limit}", "updated")
        else:
            _say(f"work pool {POOL}", "ok")
    for name, priority in QUEUES.items():
        try:
            queue = await client.read_work_queue_by_name(name, work_pool_name=POOL)
        except ObjectNotFound:
            await client.create_work_queue(name=name, priority=priority, work_pool_name=POOL)
            _say(f"work queue {POOL}/{name} priority {priority}", "created")
            continue
        if queue.priority != priority:
            # A priority can already be taken by another queue (e.g. the pool's `default`
            # queue holds 1): Prefect shifts the others down, so setting ours in order works.
            await client.update_work_queue(queue.id, priority=priority)
            _say(f"work queue {POOL}/{name} priority {priority}", "updated")
        else:
            _say(f"work queue {POOL}/{name} priority {priority}", "ok")


def limits_for_source(path: str) -> dict[str, int]:
    """``source:<name>`` and ``domain:<host>`` limits for one source file."""
    from collector.config import load_source

    source = load_source(path)
    wanted = {f"source:{source.name}": 1}
    samples = list(source.seeds.urls)
    if source.seeds.template is not None:
        start = source.seeds.range[0] if source.seeds.range else 0
        samples.append(source.seeds.template.format(i=start))
    for url in samples:
        host = urlsplit(url).hostname
        if host:
            wanted[f"domain:{host}"] = source.limits.per_domain_concurrency
    return wanted


async def ensure_limits(client: Any, wanted: dict[str, int]) -> None:
    from prefect.client.schemas.actions import (
        GlobalConcurrencyLimitCreate,
        GlobalConcurrencyLimitUpdate,
    )
    from prefect.exceptions import ObjectNotFound

    for name, limit in sorted(wanted.items()):
        try:
            current = await client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            await client.create_global_concurrency_limit(
                GlobalConcurrencyLimitCreate(name=name, limit=limit, active=True)
            )
            _say(f"concurrency limit {name} = {limit}", "created")
            continue
        if current.limit != limit:
            await client.update_global_concurrency_limit(
                name, GlobalConcurrencyLimitUpdate(limit=limit)
            )
            _say(f"concurrency limit {name} = {limit}", "updated")
        else:
            _say(f"concurrency limit {name} = {limit}", "ok")


async def ensure_notify_block(url: str) -> UUID:
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    wanted = {
        "name": "collector",
        "url": url,
        "method": "POST",
        "json_data": {"subject": "{{subject}}", "body": "{{body}}", "name": "{{name}}"},
    }
    try:
        block = await CustomWebhookNotificationBlock.aload(NOTIFY_BLOCK)
    except ValueError:
        block = None
    if block is not None and all(getattr(block, k) == v for k, v in wanted.items()):
        _say(f"notification block {NOTIFY_BLOCK} -> {url}", "ok")
    else:
        state = "created" if block is None else "updated"
        block = CustomWebhookNotificationBlock(**wanted)
        await block.asave(NOTIFY_BLOCK, overwrite=True)
        _say(f"notification block {NOTIFY_BLOCK} -> {url}", state)
    assert block._block_document_id is not None
    return block._block_document_id


def automations(low_queue: UUID, notify: UUID | None) -> list[Any]:
    """The automations Collector relies on (their names are what makes bootstrap idempotent)."""
    from prefect.automations import AutomationCore
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import (
        ChangeFlowRunState,
        PauseWorkQueue,
        ResumeWorkQueue,
        SendNotification,
    )
    from prefect.events.schemas.automations import EventTrigger, Posture

    def notify_with(subject: str, body: str) -> list[Any]:
        if notify is None:
            return []
        return [SendNotification(block_document_id=notify, subject=subject, body=body)]

    def on(events: set[str], **match: Any) -> EventTrigger:
        return EventTrigger(
            expect=events, posture=Posture.Reactive, threshold=1, within=timedelta(0), **match
        )

    sources = {"prefect.resource.id": "collector.source.*"}
    result = [
        AutomationCore(
            name="collector-backlog-critical",
            description="A source's backlog is critical: pause the low queue, notify.",
            trigger=on({"collector.backlog.critical"}, match=sources),
            actions=[
                PauseWorkQueue(source="selected", work_queue_id=low_queue),
                *notify_with(
                    "Collector backlog critical: {{ event.payload.source }}",
                    "Backlog of {{ event.payload.source }} is {{ event.payload.depth }} "
                    "({{ event.payload.ratio }} of capacity); the low queue is paused.",
                ),
            ],
        ),
        AutomationCore(
            name="collector-backlog-recovered",
            description="A source's backlog recovered: resume the low queue.",
            trigger=on({"collector.backlog.recovered"}, match=sources),
            actions=[ResumeWorkQueue(source="selected", work_queue_id=low_queue)],
        ),
    ]
    # Prefect's zombie-run recipe: a flow run whose heartbeats (PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
    # infra/prefect-worker.env) stop for 90 s without a final state is marked Crashed, so a run
    # whose worker or machine died stops looking Running and the Failed/Crashed notice fires.
    result.append(
        AutomationCore(
            name="collector-zombie-runs",
            description="A flow run stopped sending heartbeats (process gone): mark it Crashed.",
            trigger=EventTrigger(
                after={"prefect.flow-run.heartbeat"},
                expect={
                    "prefect.flow-run.heartbeat",
                    "prefect.flow-run.Completed",
                    "prefect.flow-run.Failed",
                    "prefect.flow-run.Cancelled",
                    "prefect.flow-run.Crashed",
                },
                match={"prefect.resource.id": "prefect.flow-run.*"},
                for_each={"prefect.resource.id"},
                posture=Posture.Proactive,
                threshold=1,
                within=timedelta(seconds=ZOMBIE_AFTER_S),
            ),
            actions=[
                ChangeFlowRunState(
                    state=StateType.CRASHED,
                    message="No heartbeat for 90 s: the flow run's process is gone.",
                )
            ],
        )
    )
    if notify is not None:
        result.append(
            AutomationCore(
                name="collector-collect-failed",
                description="A collect flow run failed or crashed: notify.",
                trigger=on(
                    {"prefect.flow-run.Failed", "prefect.flow-run.Crashed"},
                    match={"prefect.resource.id": "prefect.flow-run.*"},
                    match_related={
                        "prefect.resource.role": "flow",
                        "prefect.resource.name": FLOW_NAME,
                    },
                ),
                actions=notify_with(
                    "Collector run {{ flow_run.name }} {{ flow_run.state.name }}",
                    "Flow run {{ flow_run.name }} of {{ flow.name }} ended "
                    "{{ flow_run.state.name }}: {{ flow_run.state.message }}",
                ),
            )
        )
    return result


def _comparable(automation: Any) -> dict[str, Any]:
    fields = {"name", "description", "enabled", "trigger", "actions"}
    data: dict[str, Any] = automation.model_dump(mode="json", include=fields)
    data["trigger"].pop("id", None)
    for key in ("expect", "after", "for_each"):  # sets: their JSON order is arbitrary
        if isinstance(data["trigger"].get(key), list):
            data["trigger"][key] = sorted(data["trigger"][key])
    return data


async def ensure_automations(client: Any, wanted: list[Any]) -> None:
    for automation in wanted:
        existing = await client.read_automations_by_name(automation.name)
        if not existing:
            await client.create_automation(automation)
            _say(f"automation {automation.name}", "created")
        elif _comparable(existing[0]) != _comparable(automation):
            await client.update_automation(existing[0].id, automation)
            _say(f"automation {automation.name}", "updated")
        else:
            _say(f"automation {automation.name}", "ok")


async def bootstrap(
    *, notify_url: str | None, pool_limit: int | None, sources: Sequence[str]
) -> None:
    from prefect.client.orchestration import get_client

    from blocks import register_block_types

    wanted_limits: dict[str, int] = {}
    for path in sources:
        wanted_limits.update(limits_for_source(path))
    await asyncio.to_thread(register_block_types)
    _say("block types collector-source, collector-backends", "ok")
    async with get_client() as client:
        await ensure_pool(client, pool_limit)
        await ensure_limits(client, wanted_limits)
        notify = await ensure_notify_block(notify_url) if notify_url else None
        if notify is None:
            _say("notifications: no --notify-url / $COLLECTOR_NOTIFY_URL, none sent", "skipped")
        low = await client.read_work_queue_by_name("low", work_pool_name=POOL)
        await ensure_automations(client, automations(low.id, notify))


def target_api() -> str | None:
    """The server bootstrap acts on: the one ``collector`` uses. The user's ``PREFECT_API_URL``
    (or profile), else the local background server (started if needed; what ``collector run``
    and ``collector deploy`` use, and the UI shows). None when the local server is turned off:
    Prefect would then start a temporary server whose database is thrown away at exit."""
    from flows.local_server import configured_api_url, use_local_server

    configured = configured_api_url()
    if configured:
        return configured
    return use_local_server(say=lambda line: print(f"infra/bootstrap: {line}", file=sys.stderr))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="infra/bootstrap", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument(
        "--notify-url",
        default=os.environ.get("COLLECTOR_NOTIFY_URL"),
        help="webhook that receives notifications (default $COLLECTOR_NOTIFY_URL)",
    )
    parser.add_argument(
        "--pool-limit", type=int, default=None, metavar="N",
        help="concurrent runs in the whole pool (default: leave as is; new pools unlimited)",
    )  # fmt: skip
    parser.add_argument(
        "--source", action="append", default=[], metavar="FILE",
        help="create the source:<name> and domain:<host> limits for this source (repeatable)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.pool_limit is not None and args.pool_limit < 0:
        parser.error("--pool-limit must be 0 or more")
    from collector.config import SourceError

    api = target_api()
    if api is None:
        print(
            "infra/bootstrap: no Prefect API to act on: set PREFECT_API_URL to the server your "
            "workers use (COLLECTOR_LOCAL_SERVER=0 turns off the local one)",
            file=sys.stderr,
        )
        return 2
    print(f"Prefect API {api}")
    try:
        asyncio.run(
            bootstrap(notify_url=args.notify_url, pool_limit=args.pool_limit, sources=args.source)
        )
    except SourceError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    raise SystemExit(main())
