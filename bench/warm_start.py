"""Warm starts against cold ones: a helper's decision to its first claim, on one worker.

    .venv/bin/python bench/warm_start.py [--helpers 6] [--hogs 0] [--query-s 1]

Measured in one run, on one Prefect server (on Postgres), one process worker of a pool of its
own (tests/fleet_world.py ``Pool``), a Redis frontier, a Postgres sink and a local site: one
source with a long backlog (2,000 items, pages answered after 0.5 s), deployed by
``collector deploy --cold-start``; then ``--helpers`` helpers started cold and as many warm,
alternating (cold, warm, cold, ...), one after another as the fleet starts them
(flows/fleet.py ``_start``), each stopped (Cancelling) once it claimed. A warm helper is the
same flow run with the job variable ``command`` set to ``<python> -m flows.warmstart`` (what
``collector deploy`` writes by default); a cold one has none (Prefect's own
``python -m prefect.engine``, as before). One warm helper first, not measured: it finds no
zygote, starts one and runs cold.

Each helper's stages are seconds from the decision (the flow run created): picked (its Pending
state), running (its Running state), first claim (the first frontier sample, every 50 ms, in
which its run id holds leases). CPU is the helper's own process's user+system seconds up to
its first claim (warm: the fork's, plus the shim's), read from /proc. Prints the medians of
each set, the ratio warm / cold, the zygote's memory, and ``uptime`` before and after.

``--hogs N`` runs N ``yes > /dev/null`` for the whole measurement (stopped after): a box whose
cores are busy. ``--burst K`` then starts K helpers at once, cold, then K warm (the fleet plays
start 8-11 processes at once on two cores: where a start's CPU is what a helper waits for).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _world import real_parts  # noqa: E402  (bench/, beside this file)

from flows.warmstart.zygote import forked_runs  # noqa: E402  (standard library only)

STAGES = ("picked", "running", "first claim")


@dataclass
class Start:
    mode: str  # cold | warm
    at: dict[str, float] = field(default_factory=dict)
    cpu_s: float = math.nan
    forked: bool = False


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (nan once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


def _zygote(folder: str) -> int | None:
    for path in Path(folder).glob("*.pid"):
        try:
            pid = int(path.read_text())
            os.kill(pid, 0)
            return pid
        except (OSError, ValueError):
            continue
    return None


def _load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def measure(helpers: int, query_s: float, burst: int) -> tuple[list[Start], float]:

    from flows.warmstart import common
    from tests.fleet_world import Pool

    warm_dir = tempfile.mkdtemp(prefix="cw-", dir="/tmp")
    os.environ[common.DIR_VARIABLE] = warm_dir  # the worker's, so its shims'
    with real_parts() as (folder, postgres, redis, site, api):
        pool = Pool(api, Path(folder), query_s=query_s)
        pool.start()
        try:
            starts = _starts(pool, Path(folder), helpers, site.base_url, redis.url,
                             postgres.create_database(), warm_dir, burst)  # fmt: skip
            zygote = _zygote(warm_dir)
            rss = _rss_mb(zygote) if zygote else math.nan
        finally:
            pool.stop()
    pid = _zygote(warm_dir)
    if pid is not None:
        os.kill(pid, 15)
    return starts, rss


def _starts(pool: Any, folder: Path, count: int, site: str, redis: str, dsn: str,
            warm_dir: str, burst: int) -> list[Start]:  # fmt: skip
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelling

    from collector.backends import open_frontier
    from collector.config import load_source
    from collector.fleet.deploy import deployment_name
    from collector.run.collection import Collection
    from flows.deploy import warm_command
    from flows.fleet import HELPER_TAG
    from tests.fleet_world import Spec, deploy, write_source

    spec = Spec("warm-bench", "normal", 2000, 0.5, 4)
    path = write_source(folder, spec, site, redis, dsn)
    deploy(str(path), "--pool", pool.name, "--batch-size", "3", "--cold-start")
    source = load_source(path)
    with Collection(source, run_id="bench-plan") as run:
        run.plan()
    frontier = open_frontier(source)
    warm = {"command": warm_command()}

    async def together(mode: str, size: int) -> list[Start]:
        return list(await asyncio.gather(*(one(mode) for _ in range(size))))

    async def one(mode: str) -> Start:
        async with get_client() as client:
            deployment = await client.read_deployment_by_name(
                f"collect/{deployment_name(spec.name)}"
            )
            start = Start(mode.split()[0])
            decided = time.time()
            flow_run = await client.create_flow_run_from_deployment(
                deployment.id,
                parameters={"source": str(path), "role": "work", "idle_wait_s": 3.0,
                            "drain_wait_s": 3.0, "batch_size": 3},
                tags=[HELPER_TAG, f"source:{spec.name}"],
                job_variables=warm if mode.startswith("warm") else None,
            )  # fmt: skip
            run_id = flow_run.id
            deadline = time.monotonic() + 300
            while "first claim" not in start.at and time.monotonic() < deadline:
                holders = await asyncio.to_thread(frontier.holders, spec.name)
                if any(h.holder == str(run_id) and h.leased for h in holders):
                    start.at["first claim"] = time.time() - decided
                await asyncio.sleep(0.05)
            read = await client.read_flow_run(run_id)
            shim = (read.infrastructure_pid or "").rsplit(":", 1)[-1]
            fork = forked_runs(warm_dir).get(str(run_id))
            start.forked = fork is not None
            pids = [int(shim)] if shim.isdigit() else []
            pids += [fork] if fork else []
            start.cpu_s = sum(_cpu_s(p) for p in pids) if pids else math.nan
            for state in await client.read_flow_run_states(run_id):
                name = {"PENDING": "picked", "RUNNING": "running"}.get(state.type.value)
                if name and name not in start.at:
                    start.at[name] = state.timestamp.timestamp() - decided
            await client.set_flow_run_state(run_id, Cancelling(message="bench"))
            while not (await client.read_flow_run(run_id)).state.is_final():  # type: ignore[union-attr]
                await asyncio.sleep(0.2)
            return start

    try:
        first = asyncio.run(one("warm"))  # finds no zygote: cold, and starts one
        print(f"   warm-up (cold, starts the zygote): first claim "
              f"{first.at.get('first claim', math.nan):.2f} s", flush=True)  # fmt: skip
        deadline = time.monotonic() + 120
        while _zygote(warm_dir) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        starts = []
        for index in range(2 * count):
            mode = ("cold", "warm")[index % 2]
            starts.append(asyncio.run(one(mode)))
            s = starts[-1]
            stages = "  ".join(f"{n} {s.at.get(n, math.nan):6.2f}" for n in STAGES)
            forked = "  (forked)" if s.forked else ""
            print(f"   {mode}: {stages}  cpu {s.cpu_s:5.2f} s{forked}", flush=True)
        for mode in ("cold", "warm") if burst else ():
            group = asyncio.run(together(mode, burst))
            for s in group:
                s.mode = f"{mode} x{burst}"
            claims = " ".join(f"{s.at.get('first claim', math.nan):.1f}" for s in group)
            cpu = _median([s.cpu_s for s in group])
            print(f"   {burst} {mode} at once: first claims {claims}  cpu {cpu:.2f} s each",
                  flush=True)  # fmt: skip
            starts += group
        return starts
    finally:
        frontier.close()


def _median(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--helpers", type=int, default=6, help="helpers of each kind")
    parser.add_argument("--hogs", type=int, default=0, help="`yes > /dev/null` for the run")
    parser.add_argument("--query-s", type=float, default=1.0, help="the worker's poll interval")
    parser.add_argument("--burst", type=int, default=0,
                        help="then this many started at once, cold, then warm")  # fmt: skip
    args = parser.parse_args()
    hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(args.hogs)]
    try:
        print(f"warm vs cold helper starts on a process worker, {os.cpu_count()} cores, "
              f"{args.hogs} hogs; before: {_load()}", flush=True)  # fmt: skip
        began = time.monotonic()
        starts, rss = measure(args.helpers, args.query_s, args.burst)
        print(f"   after {time.monotonic() - began:.0f} s: {_load()}")
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    modes = ["cold", "warm"] + (
        [f"cold x{args.burst}", f"warm x{args.burst}"] if args.burst else []
    )
    by = {m: [s for s in starts if s.mode == m] for m in modes}
    print("\n   medians, seconds from the decision"
          "      picked  running  first claim   CPU to first claim   forked")  # fmt: skip
    medians = {}
    for mode, group in by.items():
        row = [_median([s.at.get(n, math.nan) for s in group]) for n in STAGES]
        cpu = _median([s.cpu_s for s in group])
        medians[mode] = (row[-1], cpu)
        forked = sum(s.forked for s in group)
        label = f"{mode} ({len(group)} helpers)"
        print(f"   {label:37}" + "".join(f"{v:8.2f} " for v in row)
              + f"{cpu:14.2f} s   {forked}/{len(group)}")  # fmt: skip
    for cold, warm in zip(modes[0::2], modes[1::2], strict=True):
        (cold_claim, cold_cpu), (warm_claim, warm_cpu) = medians[cold], medians[warm]
        ratio, cpu_ratio = warm_claim / cold_claim, warm_cpu / cold_cpu
        print(f"\n   first claim, {warm} / {cold}: {ratio:.2f} "
              f"({warm_claim:.2f} s vs {cold_claim:.2f} s); CPU: {cpu_ratio:.2f}")  # fmt: skip
    print(f"   the zygote's memory (RSS, shared copy-on-write with its forks): {rss:.0f} MB")


if __name__ == "__main__":
    main()
