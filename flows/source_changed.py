"""The ``source-changed`` flow: start a collect run when a source really changed.

Run by the ``on-source-changed`` deployment, whose trigger reacts to the event
``collector.source.changed`` (payload ``source``: the source file's path). It fingerprints the
source as loaded (``collector.ops.fingerprint``: formatting, comments, key order and spelled-out
defaults change nothing) and compares with the fingerprint kept in the Prefect Variable
``collector-source-fp-<name>``. Only when they differ does it start one run and store the new
fingerprint, after the run was created: if starting fails, the next event tries again.

The run is of the source's own deployment (``collect/source-<name>``, made by ``collector
deploy``) when it has one: its work queue, its runs, its helpers; a class deployment
(``collect/collect-<class>``) would run the source a second time beside it (and one of the two
would end ``skipped``). Only a source without its own deployment runs on its class's.
"""

from __future__ import annotations

from typing import Annotated, Any

from prefect import flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.deployments import arun_deployment
from prefect.exceptions import ObjectNotFound
from prefect.variables import Variable
from pydantic import Field

from collector.errors import ConfigError
from collector.fleet.deploy import deployment_name
from collector.ops.fingerprint import fingerprint
from flows._variables import variable_name
from flows.sources import resolve_source

__all__ = ["fingerprint_variable", "source_changed"]

COLLECT_DEPLOYMENT = "collect/collect-{priority_class}"


def fingerprint_variable(source: str) -> str:
    """The Prefect Variable holding the fingerprint of the source's last started version."""
    return variable_name("collector-source-fp", source)


async def _own_deployment(source: str) -> str | None:
    """``collect/source-<name>`` when ``collector deploy`` made it, else None."""
    own = f"collect/{deployment_name(source)}"
    async with get_client() as client:
        try:
            await client.read_deployment_by_name(own)
        except ObjectNotFound:
            return None
    return own


@flow(name="source-changed", validate_parameters=True)
async def source_changed(
    source: Annotated[
        str, Field(description="The source that changed: a file path, or block:<name>.")
    ],
    deployment: Annotated[
        str,
        Field(
            description="Collect deployment to run, as flow/deployment; {priority_class} is "
            "replaced by the source's priority class. A source with its own deployment "
            "(collector deploy) runs on that one instead."
        ),
    ] = COLLECT_DEPLOYMENT,
) -> dict[str, Any]:
    """Start one collect run of ``source`` if it changed since the last started version."""
    logger = get_run_logger()
    loaded = resolve_source(source)
    current = fingerprint(loaded)
    name = fingerprint_variable(loaded.name)
    previous = await Variable.aget(name)
    if previous == current:
        logger.info("%s unchanged (%s): no collect run started", loaded.name, current[:19])
        return {"source": loaded.name, "changed": False, "fingerprint": current, "flow_run": None}
    target = await _own_deployment(loaded.name) or deployment.format(
        priority_class=loaded.priority.run_class
    )
    try:
        run = await arun_deployment(target, parameters={"source": source}, timeout=0)
    except ObjectNotFound:
        raise ConfigError(
            f"{source}: deployment {target!r} not found (deploy deployments/prefect.yaml, or "
            "pass `deployment`)"
        ) from None
    await Variable.aset(name, current, overwrite=True)
    logger.info("%s changed: started %s run %s", loaded.name, target, run.id)
    return {
        "source": loaded.name,
        "changed": True,
        "fingerprint": current,
        "deployment": target,
        "flow_run": str(run.id),
    }
