"""`collector deploy`: one deployment per source, and sources that never cancel each other.

Fast: the ``schedule:`` section's checks and the plan of a source's deployment. Slow: a real
Prefect API (``prefect_api``), a real process worker of a pool, sources deployed by the command
and all requested at once (by ``run_deployment`` and by event): none is cancelled, every one
completes with each record once; one source requested twice at once runs once and skips once.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from collector.config import SourceError, load_source, parse_source
from collector.demo.site import FaultSite
from collector.fleet.deploy import deployment_name, plan_for
from tests.fleet_world import RUN_TIMEOUT_S, Pool, deploy, ended, final
from tests.fleet_world import pool as pool  # the fixture
from tests.servers import numbered_pages

# how long the twice-requested source's pages wait for the other run to end (a loaded box took
# minutes to start a flow run's process)
GATE_BOUND_S = 2 * RUN_TIMEOUT_S


def _document(name: str, base_url: str, *, items: int = 4, delay_s: float = 0.0,
              **extra: Any) -> dict[str, Any]:  # fmt: skip
    knob = f"?delay={delay_s}" if delay_s else ""
    return {
        "name": name,
        "seeds": {"urls": [f"{base_url}/items/{i}.json{knob}" for i in range(items)]},
        "record": {"key": "id"},
        "sink": {"type": "jsonl", "path": "out"},
        "ttl": {"default_fresh_s": 1, "http_timeout_s": 20, "request_deadline_s": 25},
        "limits": {"concurrency": 2, "per_domain_concurrency": 2},
        "allow_private_networks": True,
        **extra,
    }


def _write(folder: Path, document: dict[str, Any]) -> Path:
    path = folder / f"{document['name']}.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path


# --- fast: the schedule section and the plan ----------------------------------------------------
def test_a_source_without_schedule_is_planned_on_request_only(tmp_path: Path) -> None:
    source = load_source(_write(tmp_path, _document("plain", "http://127.0.0.1:1")))
    plan = plan_for(source, "/srv/plain.yaml")
    assert plan.name == deployment_name("plain") == "source-plain"
    assert plan.work_queue == "normal"
    assert not plan.scheduled and plan.schedule_text() == "on request only"
    assert plan.parameters == {"source": "/srv/plain.yaml", "batch_size": 200}
    assert plan.trigger["match"] == {"prefect.resource.id": "collector.source.plain"}
    assert plan.trigger["expect"] == ["collector.collect.requested"]
    assert plan.trigger["parameters"]["on_busy"] == "skip"  # an event never stacks on a run
    assert "class:normal" in plan.tags and "source:plain" in plan.tags


def test_schedule_and_class_come_from_the_source(tmp_path: Path) -> None:
    document = _document(
        "urgent", "http://127.0.0.1:1",
        priority={"class": "critical"},
        schedule={"cron": "*/15 * * * *", "timezone": "Europe/Paris", "active": False},
    )  # fmt: skip
    plan = plan_for(load_source(_write(tmp_path, document)), "block:urgent")
    assert (plan.work_queue, plan.cron, plan.timezone, plan.active) == (
        "critical", "*/15 * * * *", "Europe/Paris", False
    )  # fmt: skip
    assert plan.schedule_text() == "cron '*/15 * * * *' (Europe/Paris), inactive"


@pytest.mark.parametrize(
    ("schedule", "problem"),
    [
        ({"cron": "*/15 * *"}, "schedule.cron: cron '*/15 * *' is not five fields"),
        ({"cron": "0 * * * *", "interval_s": 60}, "give cron or interval_s, not both"),
        ({"interval_s": 0}, "schedule.interval_s: Input should be greater than 0"),
        ({"timezone": "Mars/Olympus"}, "timezone 'Mars/Olympus' is not an IANA name"),
        ({"every": 5}, "schedule.every"),
    ],
)
def test_a_bad_schedule_is_one_line_naming_the_key(schedule: dict[str, Any], problem: str) -> None:
    document = _document("bad", "http://127.0.0.1:1", schedule=schedule)
    with pytest.raises(SourceError) as caught:
        parse_source(document, label="bad.yaml", base_dir=Path("."))
    assert len(caught.value.problems) == 1, caught.value.problems
    assert caught.value.problems[0].startswith("bad.yaml: "), caught.value.problems
    assert problem in caught.value.problems[0]


def test_the_workers_pick_a_helper_within_a_second() -> None:
    """A helper's start waits for one worker poll (docs/fleet.md, measured: 0.65-5.1 s at a
    5 s poll, 0.3-1.0 s at 1 s); every way of starting workers polls every second at most."""
    from tests.fleet_world import ROOT

    settings = dict(
        line.split("=", 1)
        for line in (ROOT / "infra" / "prefect-worker.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    values = yaml.safe_load((ROOT / "infra" / "helm" / "prefect-worker-values.yaml").read_text())
    assert float(settings["PREFECT_WORKER_QUERY_SECONDS"]) <= 1.0, settings
    assert float(values["worker"]["config"]["queryInterval"]) <= 1.0, values["worker"]["config"]


# --- slow: a real API, a real process worker ----------------------------------------------------
def _stored(path: Path) -> list[int]:
    ids = []
    for file in (path.parent / "out").glob("*.jsonl"):
        ids += [json.loads(line)["id"] for line in file.read_text().splitlines()]
    return sorted(ids)


@pytest.mark.slow
def test_sources_of_one_class_requested_at_once_all_complete(pool: Pool, tmp_path: Path) -> None:
    from prefect.deployments import run_deployment
    from prefect.events import emit_event

    with FaultSite() as site:
        paths = []
        for i, run_class in enumerate(["normal", "normal", "normal", "critical"]):
            folder = tmp_path / f"s{i}"
            folder.mkdir()
            document = _document(f"fleet-s{i}", site.base_url, delay_s=1.0,
                                 priority={"class": run_class})  # fmt: skip
            paths.append(_write(folder, document))
        # the folder form: every source file in it
        listing = tmp_path / "listing"
        listing.mkdir()
        for path in paths[2:]:
            (listing / path.name).symlink_to(path)
        written = deploy(str(paths[0]), str(paths[1]), "--dir", str(listing), "--pool", pool.name)
        assert [w["deployment"] for w in written] == [
            f"collect/source-fleet-s{i}" for i in range(4)
        ]
        assert {w["queue"] for w in written} == {"normal", "critical"}
        assert not any(w["updated"] for w in written)
        assert all(w["updated"] for w in deploy(*map(str, paths), "--pool", pool.name))

        runs: list[Any] = [
            run_deployment(f"collect/source-fleet-s{i}", timeout=0)  # all at once
            for i in range(3)
        ]
        emit_event(  # the fourth by its event (no collector.class label: its own deployment)
            event="collector.collect.requested",
            resource={"prefect.resource.id": "collector.source.fleet-s3"},
            payload={"why": "test"},
        )

        def fourth() -> Any:
            from prefect.client.orchestration import get_client
            from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

            async def read() -> Any:
                async with get_client() as client:
                    return await client.read_flow_runs(
                        deployment_filter=DeploymentFilter(
                            name=DeploymentFilterName(any_=["source-fleet-s3"])
                        )
                    )

            return asyncio.run(read())

        runs.append(pool.wait_for("the event-triggered run", fourth)[0])
        finals = [pool.wait_for(f"{r.name} to end", ended(r)) for r in runs]
    states = [(run.name, run.state.type.value, run.state.message) for run in finals]
    assert all(state == "COMPLETED" for _, state, _ in states), states
    for path in paths:
        assert _stored(path) == [0, 1, 2, 3], path
    assert finals[3].parameters["on_busy"] == "skip"  # an event's run never stacks


@pytest.mark.slow
def test_one_source_requested_twice_at_once_runs_once_and_skips_once(
    pool: Pool, tmp_path: Path
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    # "At once" means the second run asks for the lock while the first holds it. Any fixed page
    # delay is outlasted by process starts on a loaded box (seen: the second run started after
    # the first had finished, and both collected), so the pages wait at a gate until one of the
    # two runs has ended: the lock holder is held for as long as it takes the other to start.
    gate = threading.Event()

    def page(n: int) -> tuple[int, bytes]:
        gate.wait(GATE_BOUND_S)
        return 200, json.dumps({"id": n}).encode()

    with numbered_pages(page) as base_url:
        document = _document("fleet-twice", base_url,
                             schedule={"interval_s": 3600, "active": False})  # fmt: skip
        document["seeds"] = {"urls": [f"{base_url}/{i}.json" for i in range(4)]}
        held = GATE_BOUND_S + 30  # a held page answers well within its deadlines
        document["ttl"] = {
            "default_fresh_s": 1,
            "http_timeout_s": held,
            "request_deadline_s": held,
            "batch_timeout_s": held + 30,
            "lease_s": held + 90,
        }
        path = _write(tmp_path, document)
        deploy(str(path), "--pool", pool.name)

        async def read() -> Any:
            async with get_client() as client:
                return await client.read_deployment_by_name("collect/source-fleet-twice")

        deployment = asyncio.run(read())
        assert deployment.global_concurrency_limit is None  # no deployment-wide limit
        (schedule,) = deployment.schedules
        assert schedule.schedule.interval.total_seconds() == 3600 and not schedule.active
        assert schedule.parameters == {"on_busy": "skip"}
        assert deployment.entrypoint == "flows.collect.collect"
        twice: list[Any] = [
            run_deployment("collect/source-fleet-twice", parameters={"on_busy": "skip"}, timeout=0)
            for _ in range(2)
        ]
        try:
            first = pool.wait_for(
                "one of the two to end while the pages are held",
                lambda: next(filter(None, (final(r.id) for r in twice)), None),
                timeout=GATE_BOUND_S,
            )
        finally:
            gate.set()
        finals = [pool.wait_for("both to end", ended(r)) for r in twice]
    assert [run.state.type.value for run in finals] == ["COMPLETED", "COMPLETED"], [
        (run.state.type.value, run.state.message) for run in finals
    ]
    said = {run.id: "skipped: another run" in asyncio.run(_logs(run)) for run in finals}
    assert said[first.id], "the run that ended first, pages still held, did not skip"
    assert sorted(said.values()) == [False, True]  # one collected; the other skipped and ended
    assert _stored(path) == [0, 1, 2, 3]


async def _logs(run: Any) -> str:
    """The run's log lines as the UI shows them (results are not persisted: logs say it)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    async with get_client() as client:
        for _ in range(60):  # logs are shipped in the background: wait for the run's last
            logs = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
            text = "\n".join(log.message for log in logs)
            if "Finished in state" in text:
                return text
            await asyncio.sleep(0.5)
    return text
