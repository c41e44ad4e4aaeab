"""The source-changed flow against a real Prefect API, with a real collect deployment: a real
change starts exactly one collect run; reformatting, comments, key order or a spelled-out
default start none."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
from prefect.client.schemas.objects import FlowRun
from prefect.variables import Variable

from collector.config import SourceError, load_source
from collector.errors import ConfigError
from collector.ops.fingerprint import fingerprint, fingerprinted
from flows.collect import collect
from flows.source_changed import fingerprint_variable, source_changed
from tests.helpers import write_source

pytestmark = pytest.mark.usefixtures("prefect_api")


def test_fingerprint_ignores_form_and_sees_content(tmp_path: Path) -> None:
    path = write_source(tmp_path, seeds={"file": "urls.txt"}, priority={"class": "high"})
    (tmp_path / "urls.txt").write_text("http://site.example/1\n")
    before = fingerprint(load_source(path))

    data = yaml.safe_load(path.read_text())
    reordered = {key: data[key] for key in reversed(list(data))}
    reordered["retry"]["profile"] = "exponential"  # the default, now spelled out
    path.write_text("# a comment\n" + yaml.safe_dump(reordered, indent=4, sort_keys=False))
    assert fingerprint(load_source(path)) == before

    (tmp_path / "urls.txt").write_text("http://site.example/1\nhttp://site.example/2\n")
    assert fingerprint(load_source(path)) != before  # the seed file is part of the source


def test_only_what_the_file_says_is_fingerprinted(tmp_path: Path) -> None:
    """A setting the file leaves at its default is not hashed: a release that adds settings
    (retry profiles, scaling rules) or changes a default does not make every source look
    changed, which would start a run of each once it is installed."""
    path = write_source(tmp_path, seeds={"urls": ["http://site.example/1"]})
    said = yaml.safe_load(path.read_text())
    hashed = fingerprinted(load_source(path))["source"]
    assert isinstance(hashed, dict)
    assert set(hashed) <= set(said), sorted(set(hashed) - set(said))
    assert hashed["seeds"] == said["seeds"] and hashed["name"] == said["name"]


def _source(folder: Path, name: str, weight: int) -> Path:
    return write_source(
        folder,
        name=name,
        seeds={"urls": ["http://site.example/1"]},
        priority={"class": "low", "weight": weight},
    )


async def _runs_of(deployment_id: uuid.UUID) -> list[FlowRun]:
    async with get_client() as client:
        return await client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
        )


async def test_changed_source_starts_one_collect_run_unchanged_none(tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:8]
    deployment_name = f"collect-low-{suffix}"
    deployment = await collect.ato_deployment(name=deployment_name)
    deployment_id = await deployment.aapply()  # what apply() dispatches to under a loop
    target = f"collect/{deployment_name}"
    template = target.replace("collect-low", "collect-{priority_class}")
    name = f"changed-{suffix}"
    path = _source(tmp_path, name, weight=5)

    first = await source_changed(source=str(path), deployment=template)
    assert first["changed"] is True and first["deployment"] == target
    [run] = await _runs_of(deployment_id)
    assert str(run.id) == first["flow_run"]
    assert run.parameters == {"source": str(path)}
    assert run.state is not None and run.state.is_scheduled()
    assert await Variable.aget(fingerprint_variable(name)) == first["fingerprint"]

    # Same source, new form: comments, another indentation, another key order -> nothing.
    data = yaml.safe_load(path.read_text())
    path.write_text("# touched\n" + yaml.safe_dump(dict(sorted(data.items())), indent=4))
    again = await source_changed(source=str(path), deployment=template)
    assert again == {**again, "changed": False, "flow_run": None}
    assert len(await _runs_of(deployment_id)) == 1

    # A real change -> exactly one more run.
    path = _source(tmp_path, name, weight=9)
    changed = await source_changed(source=str(path), deployment=template)
    assert changed["changed"] is True and changed["fingerprint"] != first["fingerprint"]
    runs = await _runs_of(deployment_id)
    assert len(runs) == 2 and changed["flow_run"] in {str(r.id) for r in runs}


async def test_missing_collect_deployment_fails_and_keeps_the_old_fingerprint(
    tmp_path: Path,
) -> None:
    name = f"nodeploy-{uuid.uuid4().hex[:8]}"
    path = _source(tmp_path, name, weight=5)
    with pytest.raises(ConfigError, match=r"deployment 'collect/no-such-deployment' not found"):
        await source_changed(source=str(path), deployment="collect/no-such-deployment")
    # Nothing was started, so nothing is remembered: the next event tries again.
    assert await Variable.aget(fingerprint_variable(name)) is None


async def test_invalid_source_fails_with_the_problem_and_starts_nothing(tmp_path: Path) -> None:
    path = _source(tmp_path, f"bad-{uuid.uuid4().hex[:8]}", weight=5)
    path.write_text(path.read_text().replace("weight: 5", "weight: 50"))
    with pytest.raises(SourceError, match=r"source\.yaml: priority\.weight: .*less than or equal"):
        await source_changed(source=str(path), deployment="collect/no-such-deployment")


async def test_a_source_with_its_own_deployment_runs_there_not_on_its_class(
    tmp_path: Path,
) -> None:
    """`collector deploy` gave the source ``collect/source-<name>``: a change starts its run
    there, and none of the class deployment (which would run the source a second time)."""
    suffix = uuid.uuid4().hex[:8]
    name = f"owned-{suffix}"
    path = _source(tmp_path, name, weight=5)
    klass = await collect.ato_deployment(name=f"collect-low-{suffix}")
    class_id = await klass.aapply()
    own = await collect.ato_deployment(
        name=f"source-{name}", parameters={"source": str(path), "role": "run"}
    )
    own_id = await own.aapply()

    started = await source_changed(source=str(path), deployment=f"collect/collect-low-{suffix}")
    assert started["changed"] is True and started["deployment"] == f"collect/source-{name}"
    [run] = await _runs_of(own_id)
    assert str(run.id) == started["flow_run"]
    assert await _runs_of(class_id) == []
