"""The deployments the README documents: the on-source-changed YAML is valid Prefect trigger
configuration and, on a real Prefect server, an emitted ``collector.source.changed`` event creates
a run of that deployment for the event's source; the backlog-monitor YAML fits the flow."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
from prefect.events import emit_event
from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger
from pydantic import TypeAdapter

from flows.source_changed import source_changed

README = Path(__file__).resolve().parents[1] / "docs" / "prefect.md"  # where the docs show it


def _documented_deployment() -> dict[str, Any]:
    """The on-source-changed deployment as the README shows it."""
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    [block] = [b for b in blocks if "name: on-source-changed" in b]
    deployments: list[dict[str, Any]] = yaml.safe_load(block)["deployments"]
    [deployment] = deployments
    return deployment


def test_documented_trigger_is_valid_prefect_configuration() -> None:
    deployment = _documented_deployment()
    assert deployment["entrypoint"] == "flows/source_changed.py:source_changed"
    from prefect.events import DeploymentTriggerTypes

    [trigger] = [
        TypeAdapter(DeploymentTriggerTypes).validate_python(t) for t in deployment["triggers"]
    ]
    assert isinstance(trigger, DeploymentEventTrigger)
    assert trigger.expect == {"collector.source.changed"}
    assert trigger.parameters == {"source": "{{ event.payload.source }}"}


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
async def test_event_creates_a_run_of_the_triggered_deployment(tmp_path: Path) -> None:
    from prefect.events import DeploymentTriggerTypes, TriggerTypes

    spec = _documented_deployment()
    triggers: list[DeploymentTriggerTypes | TriggerTypes] = [
        TypeAdapter(DeploymentTriggerTypes).validate_python(t) for t in spec["triggers"]
    ]
    name = f"on-source-changed-{uuid.uuid4().hex[:8]}"
    deployment = await source_changed.ato_deployment(name=name, triggers=triggers)
    deployment_id = await deployment.aapply()  # what apply() dispatches to under a loop

    path = str(tmp_path / f"{name}.yaml")
    # The trigger service learns of a new automation asynchronously: an event that arrives
    # before it has loaded the trigger is not matched. So the event is sent again every 10 s
    # until a run shows up; every run must carry the event's source.
    deadline = time.monotonic() + 120
    runs: list[Any] = []
    async with get_client() as client:
        while not runs and time.monotonic() < deadline:
            emit_event(
                event="collector.source.changed",
                resource={"prefect.resource.id": f"collector.source.{name}"},
                payload={"source": path},
            )
            resend_at = time.monotonic() + 10
            while not runs and time.monotonic() < min(resend_at, deadline):
                await asyncio.sleep(0.5)
                runs = await client.read_flow_runs(
                    deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
                )
    assert runs, "no run of the triggered deployment within 120 s"
    assert {tuple(sorted(run.parameters.items())) for run in runs} == {(("source", path),)}


def test_documented_backlog_monitor_deployment_fits_the_flow() -> None:
    from flows.backlog import backlog_monitor

    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    [block] = [b for b in blocks if "name: backlog-monitor" in b]
    [deployment] = yaml.safe_load(block)["deployments"]
    assert deployment["entrypoint"] == "flows/backlog.py:backlog_monitor"
    # the parameters the schedule passes (the docs' snippet equals deployments/prefect.yaml)
    (schedule,) = deployment["schedules"]
    assert backlog_monitor.validate_parameters(schedule["parameters"]) == {
        "sources": ["/srv/sources/items.yaml"]
    }
    with pytest.raises(Exception, match="sources"):
        backlog_monitor.validate_parameters({"sources": []})
