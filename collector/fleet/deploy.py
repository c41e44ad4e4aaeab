"""A source's own Prefect deployment, planned from the source alone (no Prefect here).

One deployment per source, ``collect/source-<name>``, so nothing limits one source's runs by
another's: it has no deployment concurrency limit. Two runs of one source still never overlap
(the ``source:<name>`` lock every ``run`` holds); a scheduled or event-triggered run that finds
the lock taken ends at once as ``skipped`` (``on_busy: skip``: the run holding it is doing the
work), never Cancelled and never stacked behind it. Runs started by hand keep the source's own
``locks.on_busy``.

Its work queue is the source's class (critical..low: the pool's queue priorities 1..4), its
schedule the source's ``schedule:`` section, its event trigger the event
``collector.collect.requested`` on the resource ``collector.source.<name>``. Send it without a
``collector.class`` label: with one, the class deployments of deployments/prefect.yaml (which
take any source by parameter) fire too, and one of the two runs ends ``skipped`` (both carry
``on_busy: skip``). The plan is data: flows/deploy.py writes it with Prefect's
``RunnerDeployment``.

Its ``command`` is the process worker's ``command`` job variable: how each flow run's process
starts. ``collector deploy`` sets the warm start (``<python> -m flows.warmstart``: the run is
forked from a pre-started interpreter, docs/workers.md "Warm starts") unless ``--cold-start``;
None leaves Prefect's own ``python -m prefect.engine``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from collector import defaults
from collector.config import Source
from collector.fleet.schedule import ScheduleSettings

__all__ = [
    "DEPLOYMENT_PREFIX",
    "REQUESTED_EVENT",
    "DeploymentPlan",
    "deployment_name",
    "plan_for",
    "plan_named",
]

DEPLOYMENT_PREFIX = "source-"
REQUESTED_EVENT = "collector.collect.requested"
SKIP_WHEN_BUSY = {"on_busy": "skip"}  # a tick or event that finds its source running ends at once


def deployment_name(source: str) -> str:
    """The deployment of ``source`` (under the ``collect`` flow): ``source-<name>``."""
    return f"{DEPLOYMENT_PREFIX}{source}"


@dataclass(frozen=True)
class DeploymentPlan:
    """What ``collector deploy`` writes for one source."""

    source: str  # the source's name
    reference: str  # what the flow is given: an absolute file path, or block:<name>
    name: str  # deployment name (flow ``collect``)
    work_queue: str  # the source's class
    tags: tuple[str, ...]
    parameters: dict[str, Any]
    description: str
    cron: str | None = None
    interval_s: float | None = None
    timezone: str = "UTC"
    active: bool = True
    trigger: dict[str, Any] = field(default_factory=dict)  # Prefect DeploymentEventTrigger kwargs
    command: str | None = None  # the process worker's `command` (None: Prefect's cold start)

    @property
    def start_text(self) -> str:
        """How its runs' processes start, in a few words (what the command prints)."""
        return "cold start" if self.command is None else f"warm start ({self.command})"

    @property
    def scheduled(self) -> bool:
        return self.cron is not None or self.interval_s is not None

    def schedule_text(self) -> str:
        """The schedule in a few words (what the command prints)."""
        if self.cron is not None:
            when = f"cron '{self.cron}' ({self.timezone})"
        elif self.interval_s is not None:
            when = f"every {self.interval_s:g} s"
        else:
            return "on request only"
        return when + ("" if self.active else ", inactive")


def plan_for(
    source: Source,
    reference: str,
    *,
    batch_size: int = defaults.BATCH_SIZE,
    command: str | None = None,
) -> DeploymentPlan:
    """The deployment of ``source``; ``reference`` is what workers load it by (a path that
    exists on every worker machine, or ``block:<name>``); ``command`` the worker's command for
    its runs (None: Prefect's default)."""
    return plan_named(
        source.name,
        reference,
        run_class=source.priority.run_class,
        schedule=source.schedule,
        description=source.description,
        batch_size=batch_size,
        command=command,
    )


def plan_named(
    name: str,
    reference: str,
    *,
    run_class: str = "normal",
    schedule: ScheduleSettings | None = None,
    description: str = "",
    batch_size: int = defaults.BATCH_SIZE,
    command: str | None = None,
) -> DeploymentPlan:
    """The same plan from the source's parts: what ``collector init`` writes as a
    ``prefect.yaml`` entry before the source can be loaded (its seeds may be a placeholder)."""
    schedule = schedule or ScheduleSettings()
    return DeploymentPlan(
        source=name,
        reference=reference,
        name=deployment_name(name),
        work_queue=run_class,
        tags=("collector", f"class:{run_class}", f"source:{name}"),
        parameters={"source": reference, "batch_size": batch_size},
        description=f"Collect source {name} ({run_class}) from {reference}."
        + (f" {description}" if description else ""),
        cron=schedule.cron,
        interval_s=schedule.interval_s,
        timezone=schedule.timezone,
        active=schedule.active,
        trigger={
            "name": f"collect {name} on request",
            "enabled": True,
            "match": {"prefect.resource.id": f"collector.source.{name}"},
            "expect": [REQUESTED_EVENT],
            "parameters": {"source": reference, **SKIP_WHEN_BUSY},
        },
        command=command,
    )
