"""A Prefect process work pool of a test's own, with one real worker, and `collector deploy`
run as a user runs it (tests/test_fleet_*.py)."""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
RUN_TIMEOUT_S = 180  # one flow run: worker poll, process start, Prefect import, the run


class Pool:
    """A process work pool of its own on the session's Prefect API, with one worker."""

    def __init__(self, api: str, folder: Path, *, query_s: float = 1.0) -> None:
        self.api = api
        self.query_s = query_s  # the worker's poll interval (PREFECT_WORKER_QUERY_SECONDS)
        self.name = f"fleet-{uuid.uuid4().hex[:8]}"
        self.folder = folder
        self.log = folder / "worker.log"
        self.worker: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import WorkPoolCreate

        async def create() -> None:
            async with get_client() as client:
                await client.create_work_pool(WorkPoolCreate(name=self.name, type="process"))

        asyncio.run(create())
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(
            PREFECT_API_URL=self.api,
            PREFECT_HOME=str(self.folder / "prefect-home"),
            PREFECT_WORKER_QUERY_SECONDS=f"{self.query_s:g}",
            PREFECT_WORKER_PREFETCH_SECONDS="1",
            PREFECT_LOGGING_LEVEL="WARNING",
            COLLECTOR_LOCAL_SERVER="0",
        )
        work_dir = self.folder / "elsewhere"  # the module entrypoint runs from any folder
        work_dir.mkdir()
        with self.log.open("wb") as out:
            self.worker = subprocess.Popen(
                [str(BIN / "prefect"), "worker", "start", "--pool", self.name,
                 "--type", "process", "--limit", "12"],
                cwd=work_dir, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def stop(self) -> None:
        if self.worker is not None and self.worker.poll() is None:
            os.killpg(self.worker.pid, signal.SIGTERM)
            try:
                self.worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.worker.pid, signal.SIGKILL)
                self.worker.wait(timeout=10)

    def wait_for(self, what: str, check: Callable[[], Any], timeout: float = RUN_TIMEOUT_S) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            if self.worker is not None and self.worker.poll() is not None:
                raise AssertionError(f"the worker exited: {self.log.read_text()[-3000:]}")
            time.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}\n{self.log.read_text()[-3000:]}")


@pytest.fixture
def pool(prefect_api: str, tmp_path: Path) -> Iterator[Pool]:
    running = Pool(prefect_api, tmp_path)
    running.start()
    try:
        yield running
    finally:
        running.stop()


def deploy(*args: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [str(BIN / "collector"), "deploy", *args, "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PREFECT_API_URL": api_url()},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def api_url() -> str:
    from prefect.settings import PREFECT_API_URL

    return str(PREFECT_API_URL.value())


_POLLING: dict[str, Any] = {}  # API URL -> the sync client its polls share


def _client() -> Any:
    """The sync client of the API in use, one per API for the whole process: the plays poll
    every half second, and a new client costs an SSL context (~30 ms of CPU each time, 6 s of
    a play's 70 s of test-process CPU)."""
    import atexit

    from prefect.client.orchestration import get_client

    url = api_url()
    client = _POLLING.get(url)
    if client is None:
        client = _POLLING[url] = get_client(sync_client=True).__enter__()
        atexit.register(client.__exit__, None, None, None)
    return client


def final(run_id: Any) -> Any:
    run = _client().read_flow_run(run_id)
    return run if run.state is not None and run.state.is_final() else None


def ended(run: Any) -> Callable[[], Any]:
    return lambda: final(run.id)


# --- the eight sources of issue 26, run as a team runs them (tests/test_fleet_flow.py and
# bench/fleet.py share this) ---


@dataclass(frozen=True)
class Spec:
    """One source of the scenario: its class, how many items, each page's delay, its cap."""

    name: str
    run_class: str
    items: int
    delay_s: float
    max_helpers: int


# four classes, two sources each: six small ones that drain in their own run, a burst (normal)
# and a bulk (low) source that hold the budget, and a critical source that arrives when the
# budget is full. The large ones outlast a process start (5-30 s on a loaded box): `urgent`
# too (200 items, ~50 s for its own run alone; it was 40, ~10 s, which drained before any
# helper could arrive, so a fleet that asks only for helpers that arrive in time rightly gave
# it none: preemption is for a critical backlog that outlasts a helper's start).
EIGHT = (
    Spec("crit-a", "critical", 30, 0.0, 1),
    Spec("high-a", "high", 30, 0.0, 1),
    Spec("high-b", "high", 30, 0.0, 1),
    Spec("norm-b", "normal", 30, 0.0, 1),
    Spec("low-b", "low", 30, 0.0, 1),
    Spec("burst", "normal", 360, 0.5, 2),
    Spec("bulk-low", "low", 600, 0.5, 2),
    Spec("urgent", "critical", 200, 0.5, 2),
)
LATE = "urgent"  # requested once the budget is full
# the same with `burst` and `bulk-low` at the default cap (max_helpers 4): with both capped at
# 2, what the fixed split gives them, the autoscaler cannot move a drained source's helpers to
# the one still busy, and "all drained" is level by construction (docs/fleet.md)
OPEN = tuple(replace(s, max_helpers=4) if s.name in ("burst", "bulk-low") else s for s in EIGHT)


def write_source(folder: Path, spec: Spec, site_url: str, redis: str, dsn: str) -> Path:
    delay = f"?delay={spec.delay_s:g}" if spec.delay_s else ""
    document = {
        "name": spec.name,
        "seeds": {"urls": [f"{site_url}/items/{i}.json{delay}" for i in range(spec.items)]},
        "record": {"key": "id"},
        "priority": {"class": spec.run_class},
        "frontier": {"type": "redis", "url": redis},
        "deadletters": {"type": "redis", "url": redis},
        "sink": {"type": "postgres", "dsn": dsn, "table": "records"},
        "ttl": {"http_timeout_s": 20, "request_deadline_s": 25},
        # shared per-host slots: helpers may join (politeness), 2 requests per process
        "limits": {"concurrency": 2, "per_domain_concurrency": 64,
                   "shared_domain_concurrency": True},
        "locks": {"wait_s": 5},
        "allow_private_networks": True,
        "schedule": {"max_helpers": spec.max_helpers},
    }  # fmt: skip
    path = folder / f"{spec.name}.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path


def record_counts(dsn: str) -> dict[str, int]:
    """Records per source in the sink (no table yet: none)."""
    with psycopg.connect(dsn) as conn:
        try:
            rows = conn.execute("SELECT source, count(*) FROM records GROUP BY source").fetchall()
        except psycopg.errors.UndefinedTable:
            return {}
    return {source: int(count) for source, count in rows}


@dataclass
class Outcome:
    """What one play of the scenario showed."""

    t0: float
    runs: dict[str, Any]  # source -> its own run (final)
    helpers: list[Any]  # every helper run (final)
    tally: dict[str, Any]  # the fleet flow's (empty when fixed)
    late_at: float | None  # when the late source was requested
    first_record_at: dict[str, float] = field(default_factory=dict)
    drained_at: dict[str, float] = field(default_factory=dict)
    live: list[tuple[float, dict[str, int]]] = field(default_factory=list)  # live helpers
    most_live: int = 0
    most_live_seen: list[Any] = field(default_factory=list)
    # each helper's start: seconds from its creation (the fleet's decision) to the first
    # sample in which it held leases (sampled every half second; none: it never claimed)
    first_claim_s: dict[str, float] = field(default_factory=dict)
    # the play's timeline (seconds from t0, sampled every half second): each holder's (a
    # flow run id: own runs and helpers) first and last sample holding leases, and the
    # box's CPU use (share of all cores busy, from /proc/stat) between samples
    held: dict[str, list[float]] = field(default_factory=dict)
    cpu: list[tuple[float, float]] = field(default_factory=list)
    t0_wall: float = 0.0

    def source_of(self, run: Any) -> str:
        tags: list[str] = run.tags
        return next(t.removeprefix("source:") for t in tags if t.startswith("source:"))

    def peak(self, source: str) -> int:
        return max((counts.get(source, 0) for _, counts in self.live), default=0)


def _flow_runs(deployment_ids: dict[Any, str]) -> list[Any]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterDeploymentId

    return _client().read_flow_runs(  # type: ignore[no-any-return]
        flow_run_filter=FlowRunFilter(
            deployment_id=FlowRunFilterDeploymentId(any_=list(deployment_ids))
        ),
        limit=200,
    )


def _deployment_ids(names: list[str]) -> dict[Any, str]:
    from prefect.client.orchestration import get_client

    from collector.fleet.deploy import deployment_name

    async def read() -> dict[Any, str]:
        async with get_client() as client:
            found = {}
            for name in names:
                d = await client.read_deployment_by_name(f"collect/{deployment_name(name)}")
                found[d.id] = name
            return found

    return asyncio.run(read())


def _start_helpers(deployment_id: Any, source: str, reference: str, count: int) -> None:
    """What an operator does without the fleet: ``count`` helpers of one source, by hand."""
    from prefect.client.orchestration import get_client

    from flows.fleet import HELPER_TAG

    async def start() -> None:
        async with get_client() as client:
            for _ in range(count):
                await client.create_flow_run_from_deployment(
                    deployment_id,
                    parameters={"source": reference, "role": "work",
                                "idle_wait_s": FIXED_PLAN_WAIT_S,
                                "drain_wait_s": HELPER_IDLE_S, "batch_size": BATCH},
                    tags=[HELPER_TAG, f"source:{source}"],
                )  # fmt: skip

    asyncio.run(start())


def _first_claims(outcome: Outcome, frontier: Any, live: list[Any]) -> None:
    """Note the helpers seen holding leases for the first time (their start: from creation)."""
    waiting = [h for h in live if str(h.id) not in outcome.first_claim_s]
    if not waiting:
        return
    at = time.time()
    sources = {outcome.source_of(h) for h in waiting}
    holding = {held.holder for s in sources for held in frontier.holders(s) if held.leased}
    for h in waiting:
        if str(h.id) in holding:
            outcome.first_claim_s[str(h.id)] = at - h.created.timestamp()


def _holding(outcome: Outcome, frontier: Any, names: list[str], at: float) -> None:
    """Note when each holder (own run or helper) held leases, first and last."""
    for name in names:
        for held in frontier.holders(name):
            if held.leased:
                seen = outcome.held.setdefault(held.holder, [at, at])
                seen[1] = at


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all cores since boot (/proc/stat's first line)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


HELPER_IDLE_S = 3.0
# a helper started by hand with the runs waits this long for its run's plan: the runs took
# 6-40 s from the request to their plan in the plays of 2026-12-06 (load 1-11), and with the
# 3 s of the fleet's helpers (started after the plan) three of the fixed split's four ended
# before it at 100 % CPU, a fixed split weakened by the bench, not by its rule
FIXED_PLAN_WAIT_S = 60.0
# the fleet ends this long after every source drained and its helpers ended (nothing more can
# happen then: a helper ends HELPER_IDLE_S after its frontier had nothing due); it was 20 s
IDLE_END_S = 6.0
BATCH = 3
SCENARIO_TIMEOUT_S = 900  # a play took 390 s at load 26 on 2 cores


def warm_up(pool: Pool, folder: Path, site: str, redis: str, dsn: str) -> None:
    """One tiny run on the worker before a play: its first run makes the warm-start zygote
    (docs/workers.md "Warm starts") that every later run of the worker forks from, as a worker
    that has been running for a while has one. Without it a play's own runs, requested at once,
    all start cold (the shims racing to start the zygote run cold meanwhile): 7 cold starts of
    ~3.4 s of CPU each on a 2-core box, and own runs 25 s from created to running in the first
    play of 2026-12-06 01:57 against 3-9 s in the next ones. ``redis`` and ``dsn``: stores of
    the warm-up's own, so a play's frontier and sink hold its sources alone."""
    from prefect.deployments import run_deployment

    from collector.fleet.deploy import deployment_name

    here = folder / "warm-up"
    here.mkdir()
    path = write_source(here, Spec("warm-up", "normal", 3, 0.0, 0), site, redis, dsn)
    deploy(str(path), "--pool", pool.name)
    run = run_deployment(f"collect/{deployment_name('warm-up')}", timeout=0)
    pool.wait_for("the warm-up run", ended(run))


def play(
    pool: Pool,
    folder: Path,
    site_url: str,
    redis: str,
    dsn: str,
    *,
    budget: int = 4,
    mode: str = "autoscaler",
    preempt: bool = True,
    specs: tuple[Spec, ...] = EIGHT,
    fixed: dict[str, int] | None = None,
    fleet_params: dict[str, Any] | None = None,
    late_at_s: float | None = None,
) -> Outcome:
    """Deploy ``specs`` with `collector deploy`, request all but LATE at once, and LATE once
    ``budget`` helpers are live (``late_at_s``: that many seconds after the first request
    instead, in every play alike: when the budget fills depends on the play); ``mode``
    autoscaler (the fleet flow, in a thread) or fixed (``fixed`` helpers per source started by
    hand with the runs); ``fleet_params``: more of the fleet flow's parameters. Waits until
    every run and helper ended; returns what was seen."""
    from prefect.deployments import run_deployment

    from collector.backends import open_frontier
    from collector.config import load_source
    from collector.fleet.deploy import deployment_name
    from flows.fleet import HELPER_TAG, fleet

    names = [s.name for s in specs]
    items = {s.name: s.items for s in specs}
    paths = {s.name: write_source(folder, s, site_url, redis, dsn) for s in specs}
    deploy(*(str(p) for p in paths.values()), "--pool", pool.name, "--batch-size", str(BATCH))
    ids = _deployment_ids(names)
    by_name = {name: i for i, name in ids.items()}
    frontier = open_frontier(load_source(paths[names[0]]))  # one Redis: every source's holders
    before = {r.id for r in _flow_runs(ids)}  # an earlier play's runs of the same sources
    t0 = time.monotonic()
    own = {n: run_deployment(f"collect/{deployment_name(n)}", timeout=0)
           for n in names if n != LATE}  # fmt: skip  # all at once
    tally: dict[str, Any] = {}
    scaler: threading.Thread | None = None
    if mode == "autoscaler":

        def scale() -> None:
            tally.update(
                asyncio.run(
                    fleet(
                        budget=budget, duration_s=SCENARIO_TIMEOUT_S, pool=pool.name,
                        decide_every_s=0.5, batch_size=BATCH, helper_idle_s=HELPER_IDLE_S,
                        preempt=preempt, stop_when_idle_s=IDLE_END_S,
                        **(fleet_params or {}),
                    )
                )
            )  # fmt: skip

        # the thread runs in a copy of this context: Prefect's settings (the API) with it
        scaler = threading.Thread(target=contextvars.copy_context().run, args=(scale,), daemon=True)
        scaler.start()
    else:
        for name, count in (fixed or {}).items():
            _start_helpers(by_name[name], name, str(paths[name]), count)
    outcome = Outcome(t0=t0, runs={}, helpers=[], tally=tally, late_at=None,
                      t0_wall=time.time() - (time.monotonic() - t0))  # fmt: skip
    deadline = t0 + SCENARIO_TIMEOUT_S
    ticks = _cpu_ticks()
    while time.monotonic() < deadline:
        now = time.monotonic()
        busy, total = _cpu_ticks()
        if total > ticks[1]:
            outcome.cpu.append((now - t0, (busy - ticks[0]) / (total - ticks[1])))
        ticks = (busy, total)
        _holding(outcome, frontier, names, now - t0)
        found = [r for r in _flow_runs(ids) if r.id not in before]
        helpers = [r for r in found if HELPER_TAG in r.tags]
        live_runs = [h for h in helpers if not h.state.is_final()]
        live = {n: 0 for n in names}
        for h in live_runs:
            live[outcome.source_of(h)] += 1
        outcome.live.append((now - t0, live))
        _first_claims(outcome, frontier, live_runs)
        if len(live_runs) > outcome.most_live:
            outcome.most_live = len(live_runs)
            outcome.most_live_seen = [(h.name, h.state.name) for h in live_runs]
        running = sum(1 for h in live_runs if h.state.is_running())
        full = len(live_runs) >= budget and (mode == "autoscaler" or running >= budget)
        # fixed helpers that ended before all ran at once: the budget is as full as it gets
        full = full or (mode != "autoscaler" and len(live_runs) < len(helpers))
        if late_at_s is not None:
            full = now - t0 >= late_at_s
        if LATE not in own and full:
            own[LATE] = run_deployment(f"collect/{deployment_name(LATE)}", timeout=0)
            outcome.late_at = now - t0
        for name, count in record_counts(dsn).items():
            if count and name not in outcome.first_record_at:
                outcome.first_record_at[name] = now - t0
            if count >= items.get(name, 1 << 60) and name not in outcome.drained_at:
                outcome.drained_at[name] = now - t0
        ours = [r for r in found if HELPER_TAG not in r.tags]
        done = (
            LATE in own
            and len(ours) == len(names)
            and all(r.state.is_final() for r in found)
            and (scaler is None or not scaler.is_alive())
        )
        if done:
            outcome.runs = {ids[r.deployment_id]: r for r in ours}
            outcome.helpers = helpers
            frontier.close()
            return outcome
        if pool.worker is not None and pool.worker.poll() is not None:
            raise AssertionError(f"the worker exited: {pool.log.read_text()[-3000:]}")
        time.sleep(0.5)
    frontier.close()
    states = [(r.name, r.tags, r.state.name, r.state.message) for r in _flow_runs(ids)]
    raise AssertionError(
        f"the scenario did not end in {SCENARIO_TIMEOUT_S} s: late source requested at "
        f"{outcome.late_at}, fleet {tally}, runs {states}\n{pool.log.read_text()[-3000:]}"
    )


def ledgers(run_ids: list[Any]) -> dict[Any, dict[str, Any]]:
    """Each run's ledger artifact (flows/collect.py ``_publish``) as {count: value}."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterType,
        FlowRunFilter,
        FlowRunFilterId,
    )

    async def read() -> dict[Any, dict[str, Any]]:
        async with get_client() as client:
            found = await client.read_artifacts(
                artifact_filter=ArtifactFilter(type=ArtifactFilterType(any_=["table"])),
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=run_ids)),
                limit=200,
            )
        tables: dict[Any, dict[str, Any]] = {}
        for artifact in found:
            if not (artifact.key or "").endswith("-summary"):
                continue
            data: Any = artifact.data
            rows = json.loads(data) if isinstance(data, str) else data
            tables[artifact.flow_run_id] = {row["count"]: row["value"] for row in rows}
        return tables

    return asyncio.run(read())
