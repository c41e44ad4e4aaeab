"""End to end on a real Prefect server: bootstrap, `prefect deploy --all`, a process worker, and
runs started every way users start them (CLI, REST, Python, events, schedules, the UI).

One server, one worker and one demo site are shared by the whole module (start-up is the
expensive part). Nothing here asserts a duration: tests wait for states with generous timeouts
and assert orders and counts read back from the Prefect API.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prefect.client.schemas.objects import FlowRun

from collector.demo.site import FaultSite
from flows.deploy import portable_warm_command
from flows.warmstart import common, zygote
from tests.servers import PostgresServer, free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PREFECT = str(BIN / "prefect")
START_TIMEOUT_S = 150  # server / worker start-up on a loaded 2-core box
RUN_TIMEOUT_S = 150  # one flow run: worker poll, process start, Prefect import, the run


# --- pieces -------------------------------------------------------------------------------------
class Webhook:
    """A local HTTP endpoint that records the JSON bodies POSTed to it (notifications)."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                try:
                    received.append(json.loads(body or b"{}"))
                except ValueError:
                    received.append({"raw": body.decode(errors="replace")})
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/notify"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class World:
    """The running Prefect server, worker, demo site and helpers to talk to them."""

    folder: Path
    env: dict[str, str]
    api: str
    site: FaultSite
    webhook: Webhook
    http: httpx.Client
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    bootstrap_output: str = ""  # what infra/bootstrap printed when the world was set up

    @property
    def ui(self) -> str:
        return self.api.removesuffix("/api")

    def cli(self, *args: str, check: bool = True, timeout: float = 120) -> str:
        done = subprocess.run(
            args, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"{args} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
            )
        return done.stdout

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """One API call; like Prefect's own client, retry while the server says it is busy."""
        for attempt in range(10):
            response = self.http.request(method, self.api + path, json=body)
            if response.status_code not in (429, 503):
                break
            time.sleep(0.5 * (attempt + 1))
        response.raise_for_status()
        return response.json() if response.content else None

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def deployment(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.get(f"/deployments/name/collect/{name}")
        return result

    def flow_run(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.get(f"/flow_runs/{run_id}")
        return result

    def runs_of(self, deployment_id: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.post(
            "/flow_runs/filter",
            {"flow_runs": {"deployment_id": {"any_": [deployment_id]}}, "limit": 200},
        )
        return result

    def wait_for(self, what: str, check: Callable[[], Any], timeout: float = RUN_TIMEOUT_S) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            for process in self.processes:
                if process.poll() is not None:
                    raise AssertionError(
                        f"{process.args!r} exited {process.returncode}: {self.logs()}"
                    )
            time.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}\n{self.logs()}")

    def wait_final(self, run_id: str) -> dict[str, Any]:
        def final() -> dict[str, Any] | None:
            run = self.flow_run(run_id)
            return (
                run
                if run["state_type"] in {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
                else None
            )

        run: dict[str, Any] = self.wait_for(f"flow run {run_id} to finish", final)
        return run

    def logs(self) -> str:
        tails = []
        for log in sorted(self.folder.glob("*.log")):
            tails.append(f"--- {log.name}\n" + log.read_text(errors="replace")[-3000:])
        return "\n".join(tails)

    def source(self, name: str, *, items: int = 4, delay_s: float = 0.0, missing: int = 0,
               concurrency: int = 2) -> Path:  # fmt: skip
        """A small source over the demo site (its own folder, so runs never share state);
        ``missing`` URLs answer 404 and end as dead letters. Written again with the same name
        and seeds, it is the same source (the same plan), with the limits given."""
        folder = self.folder / "sources" / name
        folder.mkdir(parents=True, exist_ok=True)
        knob = f"?delay={delay_s}" if delay_s else ""
        urls = [f"{self.site.base_url}/items/{i}.json{knob}" for i in range(items)]
        urls += [f"{self.site.base_url}/missing/{i}.json" for i in range(missing)]
        document = {
            "name": name,
            "seeds": {"urls": urls},
            "record": {"key": "id"},
            "sink": {"type": "jsonl", "path": "out"},
            "ttl": {"default_fresh_s": 1, "http_timeout_s": 20, "request_deadline_s": 25},
            "limits": {"concurrency": concurrency, "per_domain_concurrency": concurrency},
            "allow_private_networks": True,
        }
        path = folder / "source.yaml"
        path.write_text(yaml.safe_dump(document), encoding="utf-8")
        return path

    def stored_ids(self, source: Path) -> set[int]:
        ids = set()
        for file in (source.parent / "out").glob("*.jsonl"):
            for line in file.read_text(encoding="utf-8").splitlines():
                ids.add(json.loads(line)["id"])
        return ids


def _start(world: World, name: str, *args: str) -> subprocess.Popen[bytes]:
    # The child writes to its own copy of the file's descriptor: ours is closed at once (left
    # open, each one was a ResourceWarning "unclosed file" when collected).
    with (world.folder / f"{name}.log").open("wb") as log:
        process = subprocess.Popen(
            args, cwd=ROOT, env=world.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    world.processes.append(process)
    return process


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def _server_env(folder: Path, port: int, database: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(folder / "prefect-home"),
        PREFECT_API_URL=f"http://127.0.0.1:{port}/api",
        # Postgres, not SQLite: the server, the worker's runs, the UI and the services write at
        # once, and on a loaded box SQLite answered "database is locked" (issue 30): a deferred
        # transaction that must upgrade to a write fails at once, whatever its busy timeout.
        PREFECT_API_DATABASE_CONNECTION_URL=database,
        PREFECT_UI_ENABLED="true",  # the Chromium test drives it
        PREFECT_SERVER_DATABASE_TIMEOUT="60",
        PREFECT_SERVER_DATABASE_CONNECTION_TIMEOUT="60",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_LOGGING_LEVEL="WARNING",
        PREFECT_SERVER_LOGGING_LEVEL="WARNING",
        PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="1",
        PREFECT_SERVER_SERVICES_SCHEDULER_MIN_RUNS="2",
        PREFECT_SERVER_SERVICES_SCHEDULER_MAX_RUNS="4",
        PREFECT_WORKER_QUERY_SECONDS="1",
        PREFECT_WORKER_PREFETCH_SECONDS="1",
        PREFECT_WORKER_HEARTBEAT_SECONDS="5",
        DO_NOT_TRACK="1",
        GX_ANALYTICS_ENABLED="false",
        PYTHONUNBUFFERED="1",
    )
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
    return env


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, postgres_server: PostgresServer
) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("deploy-e2e")
    port = free_port()
    env = _server_env(folder, port, postgres_server.prefect_database())
    # the worker's zygotes, read by the tests: a short path (a unix socket's is at most 107
    # bytes; under pytest-xdist's tmp_path it was longer, and every run started cold)
    env[common.DIR_VARIABLE] = tempfile.mkdtemp(prefix="cw-", dir="/tmp")
    with FaultSite() as site, httpx.Client(timeout=30) as http:
        webhook = Webhook()
        world = World(folder, env, f"http://127.0.0.1:{port}/api", site, webhook, http)
        try:
            _start(world, "server", PREFECT, "server", "start", "--host", "127.0.0.1",
                   "--port", str(port))  # fmt: skip

            def healthy() -> bool:
                try:
                    return http.get(world.api + "/health", timeout=2).status_code == 200
                except httpx.HTTPError:
                    return False

            world.wait_for("the Prefect server", healthy, timeout=START_TIMEOUT_S)
            world.bootstrap_output = world.cli(
                str(ROOT / "infra" / "bootstrap"), "--notify-url", webhook.url,
                "--pool-limit", "4",
            )  # fmt: skip
            world.cli(PREFECT, "--no-prompt", "deploy", "--prefect-file",
                      str(ROOT / "deployments" / "prefect.yaml"), "--all", timeout=300)  # fmt: skip
            _start(world, "worker", PREFECT, "worker", "start", "--pool", "collector",
                   "--type", "process")  # fmt: skip
            world.wait_for(
                "the worker to poll",
                lambda: any(
                    w["status"] == "ONLINE"
                    for w in world.post("/work_pools/collector/workers/filter", {})
                ),
                timeout=START_TIMEOUT_S,
            )
            yield world
        finally:
            for process in reversed(world.processes):
                _stop(process)
            webhook.close()
            shutil.rmtree(env[common.DIR_VARIABLE], ignore_errors=True)


# --- tests --------------------------------------------------------------------------------------
def test_bootstrap_made_the_pool_and_running_it_again_changes_nothing(world: World) -> None:
    first = world.bootstrap_output
    assert "created  work pool collector" in first
    bootstrap = str(ROOT / "infra" / "bootstrap")
    limited = str(world.source("limited"))
    with_limits = world.cli(bootstrap, "--notify-url", world.webhook.url, "--source", limited)
    assert "created  concurrency limit source:limited = 1" in with_limits
    assert "created  concurrency limit domain:127.0.0.1 = 2" in with_limits
    again = world.cli(bootstrap, "--notify-url", world.webhook.url, "--source", limited)
    lines = [line for line in again.splitlines() if line.strip()]
    assert lines[0].startswith("Prefect API http://"), again  # which server it acted on
    assert {line.split()[0] for line in lines[1:]} == {"ok"}, again
    assert world.get("/v2/concurrency_limits/source:limited")["limit"] == 1
    queues = world.post("/work_pools/collector/queues/filter", {})
    priorities = {q["name"]: q["priority"] for q in queues}
    assert {k: priorities[k] for k in ("critical", "high", "normal", "low")} == {
        "critical": 1, "high": 2, "normal": 3, "low": 4
    }  # fmt: skip
    names = {a["name"] for a in world.post("/automations/filter", {})}
    assert {"collector-backlog-critical", "collector-collect-failed"} <= names
    deployment = world.deployment("collect-normal")
    assert deployment["work_queue_name"] == "normal"
    # no deployment-wide limit: it would cancel one source's run while another's runs (issue 26)
    assert deployment["global_concurrency_limit"] is None


def test_runs_started_by_cli_rest_python_and_event_complete(world: World) -> None:
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    by_rest, by_python, by_event = (
        world.source(name) for name in ("by-rest", "by-python", "by-event")
    )
    by_cli = world.source("by-cli", missing=1)  # its dead letter starts the triage deployment
    # The REST run names a CollectorSource block instead of a path.
    world.cli(str(BIN / "collector"), "blocks", "save", "by-rest", str(by_rest))

    out = world.cli(PREFECT, "deployment", "run", "collect/collect-critical",
                    "--param", f"source={by_cli}")  # fmt: skip
    cli_run = next(line.split()[-1] for line in out.splitlines() if "UUID:" in line)
    assert cli_run, out

    high = world.deployment("collect-high")
    rest_run = world.post(
        f"/deployments/{high['id']}/create_flow_run", {"parameters": {"source": "block:by-rest"}}
    )["id"]

    with temporary_settings(updates={PREFECT_API_URL: world.api}):
        python_run = run_deployment(
            "collect/collect-low", parameters={"source": str(by_python)}, timeout=0
        )
    assert isinstance(python_run, FlowRun)  # run_deployment is sync here (no event loop)
    world.cli(
        PREFECT, "event", "emit", "collector.collect.requested",
        "--resource", json.dumps(
            {"prefect.resource.id": "collector.source.by-event", "collector.class": "normal"}
        ),
        "--payload", json.dumps({"source": str(by_event)}),
    )  # fmt: skip
    normal = world.deployment("collect-normal")
    event_run = world.wait_for(
        "the event-triggered run", lambda: [r["id"] for r in world.runs_of(normal["id"])]
    )[0]

    for run_id in (cli_run, rest_run, str(python_run.id), event_run):
        run = world.wait_final(run_id)
        assert run["state_type"] == "COMPLETED", (run["name"], run["state"], world.logs())
    for source in (by_cli, by_rest, by_python, by_event):
        assert world.stored_ids(source) == {0, 1, 2, 3}, source
    assert world.flow_run(event_run)["parameters"]["source"] == str(by_event)

    # by-cli quarantined one item: its `collector.deadletter.quarantined` event started triage.
    triage = world.get("/deployments/name/triage/triage-on-quarantine")
    triage_run = world.wait_for("the triage run", lambda: world.runs_of(triage["id"]))[0]
    assert triage_run["parameters"]["source"] == str(by_cli.resolve())
    assert world.wait_final(triage_run["id"])["state_type"] == "COMPLETED", world.logs()


def test_prefect_yaml_runs_start_warm_once_a_zygote_serves(world: World) -> None:
    """prefect.yaml's build step (flows.deploy.warm_start_step) gave every deployment the
    deploying interpreter's warm start; the worker's first run of a key starts cold and starts
    the zygote, and a run after it serves is forked from it, and ends exact."""
    low = world.deployment("collect-low")
    command = low["job_variables"]["command"]
    assert command == portable_warm_command(sys.executable), command  # `prefect deploy`'s
    warm = world.env[common.DIR_VARIABLE]
    first, second = (world.source(name) for name in ("warm-first", "warm-second"))
    run = world.post(f"/deployments/{low['id']}/create_flow_run",
                     {"parameters": {"source": str(first)}})["id"]  # fmt: skip
    assert world.wait_final(run)["state_type"] == "COMPLETED", world.logs()
    world.wait_for("a zygote serving", lambda: list(Path(warm).glob("*.sock")))
    run = world.post(f"/deployments/{low['id']}/create_flow_run",
                     {"parameters": {"source": str(second)}})["id"]  # fmt: skip
    assert world.wait_final(run)["state_type"] == "COMPLETED", world.logs()
    assert run in zygote.forked_runs(warm), (run, zygote.forked_runs(warm))
    assert world.stored_ids(first) == world.stored_ids(second) == {0, 1, 2, 3}


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def test_ui_lists_collect_deployments_and_a_custom_run_from_its_form_completes(
    world: World, tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Debian's chromium is missing: `./bootstrap test` installs it"
    source = world.source("by-ui")
    deployment = world.deployment("collect-normal")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),  # a fresh --user-data-dir
            executable_path=CHROMIUM,
            args=CHROMIUM_FLAGS,
            headless=True,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            page = browser.new_page()
            page.set_default_timeout(60_000)
            page.goto(f"{world.ui}/deployments")
            for name in ("collect-critical", "collect-high", "collect-normal", "collect-low"):
                page.get_by_text(name, exact=True).first.wait_for()

            page.goto(f"{world.ui}/deployments/deployment/{deployment['id']}/run")
            page.get_by_text("Parameters", exact=True).wait_for()
            field = page.locator("textarea").first  # the `source` parameter
            field.fill(str(source))
            field.press("Tab")  # leave the field, as a person would, so the form takes the value
            page.get_by_role("button", name="Submit").click()

            def started() -> list[str]:
                return [
                    r["id"]
                    for r in world.runs_of(deployment["id"])
                    if r["parameters"].get("source") == str(source)
                ]

            try:  # the browser stays open until the server has the run
                run_id = world.wait_for("the run started from the UI", started)[0]
            finally:
                page.screenshot(path=str(world.folder / "ui-run.png"))
        finally:
            browser.close()
    run = world.wait_final(run_id)
    assert run["deployment_id"] == deployment["id"]
    assert run["parameters"]["source"] == str(source)
    assert run["state_type"] == "COMPLETED", (run["state"], world.logs())
    assert world.stored_ids(source) == {0, 1, 2, 3}


def _create_run(world: World, deployment: str, source: str) -> str:
    run_id: str = world.post(
        f"/deployments/{world.deployment(deployment)['id']}/create_flow_run",
        {"parameters": {"source": source}},
    )["id"]
    return run_id


def test_critical_run_queued_after_low_runs_starts_first(world: World) -> None:
    bootstrap = str(ROOT / "infra" / "bootstrap")
    assert "updated  work pool collector concurrency 1" in world.cli(
        bootstrap, "--notify-url", world.webhook.url, "--pool-limit", "1"
    )
    lows: list[str] = []
    try:
        blocker = _create_run(world, "collect-normal", str(world.source("blocker", delay_s=3)))
        world.wait_for(
            "the blocking run to start", lambda: world.flow_run(blocker)["state_type"] == "RUNNING"
        )
        lows = [_create_run(world, "collect-low", str(world.source(f"low-{i}"))) for i in range(3)]
        critical = _create_run(world, "collect-critical", str(world.source("critical")))
        assert world.wait_final(critical)["state_type"] == "COMPLETED", world.logs()
        assert world.wait_final(blocker)["state_type"] == "COMPLETED"
        critical_start = world.flow_run(critical)["start_time"]
        for low in lows:  # still waiting, or started only after the critical run
            started = world.flow_run(low)["start_time"]
            assert started is None or started > critical_start, (low, started, critical_start)
    finally:
        for low in lows:
            if world.flow_run(low)["state_type"] == "SCHEDULED":
                world.request("DELETE", f"/flow_runs/{low}")
        world.cli(bootstrap, "--notify-url", world.webhook.url, "--pool-limit", "4")


def test_scheduled_run_outlasting_its_interval_never_overlaps(world: World) -> None:
    """A tick that comes while its source still runs ends at once as skipped (Completed, the
    schedule says on_busy: skip): never two runs of the source at once, none cancelled; and a
    run of another source of the same class, started meanwhile, completes too."""
    high = world.deployment("collect-high")
    slow = world.source("overlap", items=2, delay_s=3)
    neighbour = world.source("neighbour", items=2)
    created = world.post(
        f"/deployments/{high['id']}/schedules",
        [{"schedule": {"interval": 2}, "active": True,
          "parameters": {"source": str(slow), "on_busy": "skip"}}],
    )  # fmt: skip
    other = ""
    try:

        def observe() -> bool:
            nonlocal other
            runs = [r for r in world.runs_of(high["id"]) if r["auto_scheduled"]]
            states = [r["state_type"] for r in runs]
            if states.count("RUNNING") and not other:
                other = _create_run(world, "collect-high", str(neighbour))
            return states.count("COMPLETED") >= 3

        world.wait_for("scheduled runs to complete while one of them holds the source", observe)
    finally:
        for schedule in created:
            world.request("DELETE", f"/deployments/{high['id']}/schedules/{schedule['id']}")
    ticks = [r for r in world.runs_of(high["id"]) if r["auto_scheduled"]]
    assert not [r for r in ticks if r["state_type"] in ("CANCELLED", "FAILED", "CRASHED")]
    assert world.wait_final(other)["state_type"] == "COMPLETED", world.logs()
    assert world.stored_ids(neighbour) == {0, 1}
    assert world.stored_ids(slow) == {0, 1}


def test_automations_pause_low_queue_on_critical_backlog_and_notify_failed_runs(
    world: World,
) -> None:
    failing = _create_run(world, "collect-critical", str(world.folder / "no-such-source.yaml"))

    def low_paused() -> bool:
        queue = world.get("/work_pools/collector/queues/low")
        return bool(queue["is_paused"])

    backlog = {"source": "busy", "depth": 900, "capacity": 1000, "ratio": 0.9, "level": "critical"}
    world.cli(PREFECT, "event", "emit", "collector.backlog.critical",
              "--resource-id", "collector.source.busy",
              "--payload", json.dumps(backlog))  # fmt: skip
    world.wait_for("the low queue to be paused", low_paused)
    world.wait_for(
        "the backlog notification",
        lambda: any("busy" in json.dumps(body) for body in world.webhook.received),
    )
    world.cli(PREFECT, "event", "emit", "collector.backlog.recovered",
              "--resource-id", "collector.source.busy",
              "--payload", json.dumps({**backlog, "depth": 10, "level": "ok"}))  # fmt: skip
    world.wait_for("the low queue to be resumed", lambda: not low_paused())

    assert world.wait_final(failing)["state_type"] == "FAILED"
    name = world.flow_run(failing)["name"]
    world.wait_for(
        "the failed-run notification",
        lambda: any(name in json.dumps(body) for body in world.webhook.received),
    )


def test_cancelling_a_running_collect_run_releases_its_items_and_a_rerun_completes(
    world: World,
) -> None:
    """Cancel from the API (as the UI's Cancel button does) a run the process worker is running:
    it ends Cancelled, nothing stays leased, its summary is published, and a rerun stores every
    record once."""
    from collector.backends import open_frontier
    from collector.config import load_source

    items = 300
    source = world.source("cancelled", items=items, delay_s=0.3)
    run = world.post(
        f"/deployments/{world.deployment('collect-normal')['id']}/create_flow_run",
        {"parameters": {"source": str(source), "batch_size": 10}},
    )["id"]
    world.wait_for("the run to store something", lambda: len(world.stored_ids(source)) >= 8)
    world.post(
        f"/flow_runs/{run}/set_state",
        {"state": {"type": "CANCELLING", "message": "cancelled by the test"}, "force": True},
    )
    final = world.wait_final(run)
    assert final["state_type"] == "CANCELLED", final
    stored_before = world.stored_ids(source)
    assert 0 < len(stored_before) < items, world.logs()

    loaded = load_source(source)
    frontier = open_frontier(loaded)
    try:
        counts = frontier.counts(loaded.name)
        assert counts.leased == 0, counts  # every lease went back (released, not waited out)
        assert frontier.holders(loaded.name) == []
    finally:
        frontier.close()
    artifact = world.post(
        "/artifacts/filter", {"artifacts": {"key": {"any_": ["collector-cancelled-summary"]}}}
    )
    assert artifact and any(
        row["count"] == "ended" and "stopped" in str(row["value"])
        for row in json.loads(artifact[0]["data"])
    ), artifact

    # The rerun fetches what the cancelled run gave back (most of the 300 slow pages): the same
    # source and seeds, 8 requests at a time instead of 2 (~40 s of waiting on the pages, alone
    # on its worker, at 2).
    world.source("cancelled", items=items, delay_s=0.3, concurrency=8)
    rerun = _create_run(world, "collect-normal", str(source))
    assert world.wait_final(rerun)["state_type"] == "COMPLETED", world.logs()
    assert world.stored_ids(source) == set(range(items))
