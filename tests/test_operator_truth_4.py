"""The operator is told the truth, round 4: each test runs the real command as a subprocess (or
the real Prefect run) and reads what a user reads: bootstrap's server, the deployment init
writes, every run named by its source, and the words of a few lines."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

from collector.demo.site import FaultSite
from flows.deploy import portable_warm_command
from tests.fleet_world import BIN, Pool, ended, pool  # noqa: F401  (the pool fixture)
from tests.helpers import write_source
from tests.prefect_db import seed_home
from tests.test_cli_terminal import ROOT, collector, env, put_letters
from tests.test_operator_truth import _dead_port


# --- item 1: bootstrap acts on the server collector uses -----------------------------------------
def _own_home(tmp_path: Path) -> dict[str, str | None]:
    """No API configured, and a PREFECT_HOME of the test's own: its own background server (on
    a migrated database, tests/prefect_db.py)."""
    home = seed_home(tmp_path / "prefect-home")
    return {"PREFECT_API_URL": None, "PREFECT_PROFILE": None, "COLLECTOR_LOCAL_SERVER": None,
            "PREFECT_HOME": str(home)}  # fmt: skip


def _run(*command: str, **changes: str | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(command), capture_output=True, text=True, cwd=ROOT, stdin=subprocess.DEVNULL,
        env=env(None, **changes), timeout=300,
    )  # fmt: skip


@pytest.mark.slow
def test_bootstrap_acts_on_the_background_server_that_deploy_then_uses(
    tmp_path: Path, site: FaultSite
) -> None:
    home = _own_home(tmp_path)
    path = write_source(tmp_path, seeds={"urls": [site.url("/items/1.json")]})
    try:
        booted = _run(str(ROOT / "infra" / "bootstrap"), **home)
        assert booted.returncode == 0, booted.stdout + booted.stderr
        said = booted.stdout + booted.stderr
        assert "temporary server" not in said and "telemetry" not in said, said
        assert "starting a local Prefect server in the background" in booted.stderr, said
        assert "created  work pool collector" in booted.stdout, said
        deployed = collector("deploy", str(path), "--json", **home)  # the pool is there
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        assert json.loads(deployed.stdout.splitlines()[-1])["deployment"].startswith("collect/")
    finally:
        stopped = collector("server", "stop", **home)
    assert stopped.returncode == 0, stopped.stderr
    lines = stopped.stdout.splitlines()
    assert "waiting for it to end its requests in flight and its services" in lines[0], lines
    assert lines[-1].startswith("stopped the local Prefect server at "), lines


def test_bootstrap_without_any_server_to_act_on_refuses_in_one_line(tmp_path: Path) -> None:
    home = {**_own_home(tmp_path), "COLLECTOR_LOCAL_SERVER": "0"}
    done = _run(str(ROOT / "infra" / "bootstrap"), **home)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
    assert "set PREFECT_API_URL" in done.stderr, done.stderr


# --- item 2: init's entry is collector deploy's deployment; never a cancelled request -----------
def _read_deployment(name: str) -> Any:
    async def read() -> Any:
        async with get_client() as client:
            return await client.read_deployment_by_name(name)

    return asyncio.run(read())


@pytest.mark.slow
def test_inits_entry_deployed_by_prefect_and_requested_twice_never_cancels(
    pool: Pool,  # noqa: F811
    tmp_path: Path,
    site: FaultSite,
) -> None:
    from prefect.deployments import run_deployment

    name = f"init-{uuid.uuid4().hex[:6]}"
    made = collector("init", name, "--from-url", site.url("/items/1.json"), "--dir",
                     str(tmp_path), "--contact", "ops@example.org")  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    entry = tmp_path / f"{name}.deployment.yaml"
    done = subprocess.run(
        [str(BIN / "prefect"), "--no-prompt", "deploy", "--prefect-file", str(entry),
         "--name", f"source-{name}", "--pool", pool.name],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PREFECT_API_URL": pool.api},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    deployment = _read_deployment(f"collect/source-{name}")
    assert deployment.global_concurrency_limit is None  # no limit that cancels a request
    # its build step gave it `prefect deploy`'s interpreter's warm start (flows/deploy.py)
    assert deployment.job_variables == {"command": portable_warm_command(sys.executable)}
    assert deployment.parameters == {"source": str(tmp_path / f"{name}.yaml"), "batch_size": 200}
    (trigger,) = yaml.safe_load(entry.read_text())["deployments"][0]["triggers"]
    assert trigger["parameters"]["on_busy"] == "skip"
    twice = [run_deployment(f"collect/source-{name}", timeout=0) for _ in range(2)]
    finals = [pool.wait_for("both requests to end", ended(run)) for run in twice]
    assert [run.state.type.value for run in finals] == ["COMPLETED", "COMPLETED"], [
        (run.state.type.value, run.state.message) for run in finals
    ]
    # `collector deploy` of the same source writes the same deployment: updated, not another
    redeployed = collector("deploy", str(tmp_path / f"{name}.yaml"), "--pool", pool.name,
                           "--json", api=pool.api)  # fmt: skip
    assert redeployed.returncode == 0, redeployed.stdout + redeployed.stderr
    written = json.loads(redeployed.stdout.splitlines()[-1])
    assert (written["deployment"], written["updated"]) == (f"collect/source-{name}", True)
    assert written["parameters"] == deployment.parameters


# --- item 8: every run is named and tagged by its source and role -------------------------------
def _runs_tagged(tag: str) -> list[Any]:
    async def read() -> list[Any]:
        async with get_client() as client:
            return await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[tag]))
            )

    return asyncio.run(read())


def test_local_runs_are_named_and_tagged_by_source_and_role(
    tmp_path: Path, site: FaultSite, prefect_api: str
) -> None:
    name = f"named-{uuid.uuid4().hex[:6]}"
    seeds = {"urls": [site.url("/items/1.json"), site.url("/missing/1007.json")]}
    path = write_source(tmp_path, name=name, seeds=seeds)
    relative = os.path.relpath(path, ROOT)  # typed relative to where the command runs
    ran = collector("run", relative, "--json", api=prefect_api)
    assert ran.returncode == 0, ran.stderr[-1500:]
    triaged = collector("triage", relative, api=prefect_api)
    assert triaged.returncode == 0, triaged.stderr[-1500:]
    runs = {run.name: run for run in _runs_tagged(f"source:{name}")}
    assert sorted(runs) == [f"run-{name}", f"triage-{name}"], sorted(runs)
    for role in ("run", "triage"):
        run = runs[f"{role}-{name}"]
        assert {"collector", role, f"source:{name}", "class:normal"} <= set(run.tags), run.tags
        assert run.parameters["source"] == str(path.resolve())  # not the relative path typed


# --- item 9: the words -------------------------------------------------------------------------
def test_a_refused_connection_is_said_so_and_what_is_left_comes_first(
    tmp_path: Path, prefect_api: str
) -> None:
    port = _dead_port()
    path = write_source(
        tmp_path,
        seeds={"template": f"http://127.0.0.1:{port}/items/{{i}}.json", "range": [0, 10]},
        limits={"circuit": {"failures": 3, "cooldown_s": 120}},
        retry={"base_s": 0.05, "cap_s": 0.1, "max_attempts": 50},
    )
    done = collector("run", str(path), "--drain-wait", "1", api=prefect_api)
    assert done.returncode == 75, (done.returncode, done.stderr[-2000:])
    host = [line for line in done.stderr.splitlines() if line.startswith("collector:   127.")]
    assert len(host) == 1 and "127.0.0.1: connection refused x" in host[0], done.stderr
    assert "connect_error" not in done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("not done:") and "left queued" in lines[0], lines[:3]
    conservation = next(line for line in lines if line.startswith("conservation:"))
    assert "balanced, but not done" in conservation, conservation


def test_the_demo_says_rejected_records_beside_its_dead_letters(prefect_api: str) -> None:
    done = collector("demo", api=prefect_api)
    assert done.returncode == 0, done.stderr[-2000:]
    conservation = next(line for line in done.stdout.splitlines() if "conservation:" in line)
    assert "quarantined" not in conservation, conservation
    assert "rejected 1 (failed record.key or the suite: dead letters)" in conservation


def test_triage_points_to_review_which_names_the_os_user_without_user(
    tmp_path: Path, prefect_api: str
) -> None:
    path = write_source(tmp_path, seeds={"urls": ["http://127.0.0.1:9/x"]})
    (entry_id,) = put_letters(path, [("http://h/gone", "fetch", "http_404")])
    triaged = collector("triage", str(path), api=prefect_api)
    assert triaged.returncode == 0, triaged.stderr[-1500:]
    hint = [line for line in triaged.stdout.splitlines() if line.startswith("next:")]
    assert hint == [f"next: the escalated entries wait for a person: collector review {path}"]
    nobody = {"USER": None, "LOGNAME": None, "LNAME": None, "USERNAME": None}
    reviewed = collector("review", str(path), "--id", entry_id, "--discard", "gone", "--json",
                         **nobody)  # fmt: skip
    assert reviewed.returncode == 0, reviewed.stderr[-1500:]
    account = pwd.getpwuid(os.getuid()).pw_name
    decided = json.loads(reviewed.stdout.splitlines()[-1])  # after the entry it shows
    assert decided["detail"] == f"gone ({account})", reviewed.stdout
