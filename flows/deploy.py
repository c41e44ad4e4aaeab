"""Write each source's own deployment (``collector deploy``), through Prefect's public API.

:func:`collector.fleet.deploy.plan_for` says what a source's deployment is; this writes it with
``RunnerDeployment.from_flow(collect, ...).apply()``: created the first time, updated in place
after (its schedule replaced, its trigger automation re-created, its concurrency limit removed
if an older layout set one). The entrypoint is a module path (``flows.collect.collect``), so any
worker with Collector installed runs it from anywhere: no working directory, no code copy.

A file source is deployed by its absolute path, which must exist on every worker machine; a
``block:<name>`` source travels with the server (docs/fleet.md).

The plan's ``command`` becomes the ``command`` job variable (always written, so deploying again
with ``--cold-start`` takes a warm start off): :func:`warm_command` names the interpreter, the
deploying one's by default, which must exist at that path on every worker machine
(docs/workers.md "Warm starts").

:func:`prefect_yaml_entry` writes the same plan as an entry of deployments/prefect.yaml (what
``collector init`` writes): ``prefect deploy`` of it makes the same deployment, by the same
name, with the same parameters, schedule and trigger, and no concurrency limit.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

from collector import defaults
from collector.errors import ConfigError
from collector.fleet.deploy import DeploymentPlan

__all__ = [
    "WARM_BUILD_STEP",
    "WARM_FROM_BUILD_STEP",
    "Deployed",
    "check_schedule",
    "deploy_plans",
    "portable_warm_command",
    "prefect_yaml_entry",
    "warm_command",
    "warm_start_step",
]

WARM_MODULE = "flows.warmstart"  # the shim (flows/warmstart/shim.py)
# the interpreters a portable warm start tries after the deploying one, on the worker's PATH
WARM_FALLBACKS = ("python3", "python")
# POSIX sh: the first of "$0" (the deploying interpreter) and WARM_FALLBACKS that exists runs
# the shim in this process (`exec`: the worker's child stays the shim, its signals its own)
_PORTABLE_SCRIPT = (
    'for p in "$0" ' + " ".join(WARM_FALLBACKS) + "; do "
    'command -v "$p" >/dev/null 2>&1 && exec "$p" -m ' + WARM_MODULE + ' "$@"; done; '
    'echo "collector: cannot start this flow run warm: neither $0 nor '
    + " nor ".join(WARM_FALLBACKS)
    + " is on this worker (collector deploy --worker-python PATH or --cold-start; prefect.yaml: "
    'its warm_start definition)" >&2; '
    "exit 127"
)


def warm_command(python: str | None = None) -> str:
    """The process worker's command of a warm start: ``<python> -m flows.warmstart``, with
    ``python`` this interpreter unless given (an absolute path: the worker runs the command
    from a temporary folder)."""
    python = python or sys.executable
    if not os.path.isabs(python):
        raise ConfigError(f"--worker-python {python}: give the interpreter's absolute path")
    return shlex.join([python, "-m", WARM_MODULE])


def portable_warm_command(python: str | None = None) -> str:
    """The default warm start: the deploying interpreter where it exists on the worker, else
    the first of ``python3``, ``python`` on the worker's PATH, through ``/bin/sh -c``.

    Why: the deploying interpreter's absolute path often does not exist on the worker (a
    compose or Helm container deployed to from a host's virtual environment), and a command
    naming it would fail every run at once. The image's own Python on its PATH is the one that
    has Collector there (the flow's entrypoint needs it anyway). With none of them it prints one
    line naming what it tried and exits 127 (the run Crashed, the line in the worker's log).
    ``--worker-python PATH`` stays exact: :func:`warm_command`, no fallback.
    """
    python = python or sys.executable
    if not os.path.isabs(python):
        raise ConfigError(f"--worker-python {python}: give the interpreter's absolute path")
    return shlex.join(["/bin/sh", "-c", _PORTABLE_SCRIPT, python])


WARM_BUILD_STEP = {"flows.deploy.warm_start_step": {"id": "warm"}}
"""prefect.yaml's ``build:`` step that names the deploying interpreter (:func:`warm_start_step`)."""
WARM_FROM_BUILD_STEP = "{{ warm.command }}"
"""A deployment's ``command`` job variable taken from :data:`WARM_BUILD_STEP`'s output."""


def warm_start_step(python: str | None = None) -> dict[str, str | None]:
    """A ``prefect deploy`` build step (deployments/prefect.yaml): ``{"command": ...}``, the
    :func:`portable_warm_command` of the interpreter that runs ``prefect deploy``.

    Why a step: a static YAML file cannot name the deploying interpreter, and a bare
    ``python3 -m flows.warmstart`` would run whatever ``python3`` the worker's PATH has, often
    not the one with Collector (a cold start always uses the worker's own). The step runs in
    ``prefect deploy``'s own process, so its interpreter is the one ``collector deploy`` would
    name; the deployments take it as ``{{ warm.command }}`` in their ``job_variables``.

    Those deployments load their flow from the checkout by file (``flows/collect.py``), while a
    warm start forks an interpreter that imported the *installed* Collector. Both are one code
    only when the checkout being deployed is the installed one (``pip install -e .``, what
    ``./bootstrap`` does); otherwise the command is None (the worker's own cold start, the
    checkout's code throughout) and one line says so.
    """
    checkout = Path.cwd().resolve()
    installed = Path(__file__).resolve().parents[1]
    if checkout != installed:
        print(
            f"collector: these deployments' runs will start cold: {checkout} is not the "
            f"Collector this Python imports ({installed}); deploy from that checkout, or "
            "`pip install -e .` this one, to start them warm"
        )
        return {"command": None}
    return {"command": portable_warm_command(python)}


@dataclass(frozen=True)
class Deployed:
    """One deployment written: its id, and whether it existed before."""

    plan: DeploymentPlan
    deployment_id: UUID
    updated: bool


def check_schedule(plan: DeploymentPlan) -> None:
    """Prefect's own check of the cron string, as one line naming the source."""
    if plan.cron is None:
        return
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    try:
        CronSchedule(cron=plan.cron, timezone=plan.timezone)
    except ValidationError as exc:
        reason = exc.errors()[0].get("msg", str(exc))
        raise ConfigError(f"{plan.source}: schedule.cron {plan.cron!r}: {reason}") from None


async def deploy_plans(
    plans: Sequence[DeploymentPlan], *, pool: str = defaults.FLEET_POOL
) -> list[Deployed]:
    """Create or update one deployment per plan on ``pool`` (which must exist)."""
    from prefect.client.orchestration import get_client
    from prefect.deployments.runner import RunnerDeployment
    from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger
    from prefect.exceptions import ObjectNotFound
    from prefect.schedules import Cron, Interval, Schedule
    from prefect.types.entrypoint import EntrypointType

    from flows.collect import collect

    for plan in plans:
        check_schedule(plan)
    async with get_client() as client:
        try:
            await client.read_work_pool(pool)
        except ObjectNotFound:
            raise ConfigError(
                f"work pool {pool!r} does not exist on {client.api_url}: create it with "
                f"infra/bootstrap (or `prefect work-pool create {pool} --type process`)"
            ) from None
        existing: set[str] = set()
        for plan in plans:
            try:
                await client.read_deployment_by_name(f"{collect.name}/{plan.name}")
                existing.add(plan.name)
            except ObjectNotFound:
                pass
    written = []
    for plan in plans:
        schedules: list[Schedule] = []
        busy = {"on_busy": "skip"}
        if plan.cron is not None:
            schedules.append(
                Cron(plan.cron, timezone=plan.timezone, active=plan.active, parameters=busy)
            )
        elif plan.interval_s is not None:
            schedules.append(
                Interval(
                    plan.interval_s, timezone=plan.timezone, active=plan.active, parameters=busy
                )
            )
        deployment = RunnerDeployment.from_flow(
            collect,
            name=plan.name,
            schedules=schedules,
            parameters=dict(plan.parameters),
            triggers=[DeploymentEventTrigger(**plan.trigger)],
            description=plan.description,
            tags=list(plan.tags),
            work_pool_name=pool,
            work_queue_name=plan.work_queue,
            entrypoint_type=EntrypointType.MODULE_PATH,
            concurrency_limit=None,  # never limited by a deployment: the source lock is per source
            # always set: an update replaces the job variables (a cold start takes warm off)
            job_variables={} if plan.command is None else {"command": plan.command},
        )
        deployment_id = await deployment.aapply()
        written.append(Deployed(plan, deployment_id, plan.name in existing))
    return written


def prefect_yaml_entry(plan: DeploymentPlan, *, pool: str = defaults.FLEET_POOL) -> str:
    """The plan as a ``deployments:`` entry of prefect.yaml (``prefect deploy`` makes from it
    what :func:`deploy_plans` makes: only the entrypoint is the file's, as prefect.yaml's are,
    and the start is the plan's: ``collector init`` plans :data:`WARM_FROM_BUILD_STEP`, the
    build step's command, which its file and deployments/prefect.yaml both carry)."""
    import yaml

    busy = {"on_busy": "skip"}
    entry: dict[str, object] = {
        "name": plan.name,
        "description": plan.description,
        "entrypoint": "flows/collect.py:collect",
        "tags": list(plan.tags),
        "parameters": dict(plan.parameters),
        "work_pool": {"name": pool, "work_queue_name": plan.work_queue},
    }
    if plan.command is not None:
        entry["work_pool"] = {"name": pool, "work_queue_name": plan.work_queue,
                              "job_variables": {"command": plan.command}}  # fmt: skip
    if plan.cron is not None:
        when: dict[str, object] = {"cron": plan.cron, "timezone": plan.timezone}
        entry["schedules"] = [{**when, "active": plan.active, "parameters": busy}]
    elif plan.interval_s is not None:
        when = {"interval": plan.interval_s, "timezone": plan.timezone}
        entry["schedules"] = [{**when, "active": plan.active, "parameters": busy}]
    entry["triggers"] = [{"type": "event", **plan.trigger}]

    class Indented(yaml.SafeDumper):  # "  - name:", as deployments/prefect.yaml's entries
        def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
            super().increase_indent(flow, False)

    text: str = yaml.dump({"deployments": [entry]}, Dumper=Indented, sort_keys=False, width=100)
    return text
