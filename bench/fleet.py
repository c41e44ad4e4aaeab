"""Fleet: the autoscaler on real processes against a fixed helper count, and preemption.

    .venv/bin/python bench/fleet.py [--budget 4] [--no-model]

Measured, in one run, side by side: the eight sources of issue 26 (tests/fleet_world.py EIGHT,
the same as tests/test_fleet_flow.py: six small sources, a normal burst of 360 items and a low
bulk source of 600, pages answered after 0.5 s by a local site, 2 requests at once per process)
on real parts: one Prefect server (on Postgres), one process worker of a pool of its own,
Redis frontiers, a Postgres sink. All but the critical `urgent` source are requested at once;
`urgent` (40 items) is requested once the budget is full. Three plays, each on a fresh Redis
database and a fresh sink database:

1. autoscaler: the ``fleet`` flow with a budget of ``--budget`` helpers, preemption on;
2. autoscaler without preemption (``preempt=False``);
3. fixed: ``--budget`` helpers started by hand with the runs, half to the burst and half to the
   bulk source (what an operator would do; the small sources need none), no fleet.

It prints the time until every source's records are all in the sink (from the first request),
and for `urgent` the time from its request to its first record and to its last, with ratios.
Every helper is a process start on the worker (5-30 s on a loaded 2-core box): the figures
measure this box as much as the fleet, and the machine load is printed with them.

Then, labelled as such, the MODEL: the same decision functions (collector/fleet/model.py) in
virtual time, with a fixed claim rate per process and start latency (no Prefect, no processes):
what the rules do when the box is not the bottleneck. Not a measurement.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collector.fleet.model import FleetSettings, decide, plan_actions
from collector.fleet.tracker import SourceTracker
from collector.frontier.base import StateCounts

SOURCES = [  # name, class, planned items
    ("crit-a", "critical", 2_000), ("high-a", "high", 6_000), ("high-b", "high", 1_000),
    ("norm-a", "normal", 12_000), ("norm-b", "normal", 3_000), ("low-a", "low", 20_000),
    ("low-b", "low", 8_000), ("low-c", "low", 500),
]  # fmt: skip
STEP_S = 0.1
IDLE_END_S = 5.0


@dataclass
class _Source:
    name: str
    run_class: str
    queued: float
    done: float = 0.0
    helpers: list[float] = field(default_factory=list)  # start times (work from then on)
    stopping: list[float] = field(default_factory=list)  # end times of preempted helpers
    drained_at: float | None = None
    first_helper_at: float | None = None
    arrives_at: float = 0.0


def simulate(
    sources: list[tuple[str, str, int]], *, mode: str, budget: int, rate: float, start_s: float,
    arrive: dict[str, float] | None = None, preempt: bool = True, horizon_s: float = 3600.0,
) -> dict[str, _Source]:  # fmt: skip
    """Run the sources to the end; ``mode`` autoscaler | fixed | none."""
    arrive = arrive or {}
    state = {n: _Source(n, c, float(q), arrives_at=arrive.get(n, 0.0)) for n, c, q in sources}
    fleet = FleetSettings(budget=budget, preempt=preempt)
    trackers = {n: SourceTracker(n, s.run_class, max_helpers=4, settings=fleet)
                for n, s in state.items()}  # fmt: skip
    if mode == "fixed":
        for name, *_ in sorted(sources, key=lambda x: -x[2])[:budget]:
            state[name].helpers.append(start_s)
    now = 0.0
    while now < horizon_s and any(s.drained_at is None for s in state.values()):
        for s in state.values():
            if now < s.arrives_at or s.drained_at is not None:
                continue
            working = 1 + sum(1 for t in s.helpers if t <= now)
            claimed = min(s.queued, working * rate * STEP_S)
            s.queued -= claimed
            s.done += claimed
            if claimed and s.first_helper_at is None and working > 1:
                s.first_helper_at = now
            if s.queued <= 0:
                s.drained_at = now
            s.stopping = [t for t in s.stopping if t > now]
        if mode == "autoscaler":
            for name, s in state.items():
                if now >= s.arrives_at:
                    counts = StateCounts(queued=math.ceil(s.queued), done=int(s.done))
                    trackers[name].sample(now, counts, [], set())
            step = round(now / STEP_S)
            if step % 10 == 0:
                _decide(state, trackers, fleet, now, start_s)
        now += STEP_S
    return state


def _decide(
    state: dict[str, _Source], trackers: dict[str, SourceTracker], fleet: FleetSettings,
    now: float, start_s: float,
) -> None:  # fmt: skip
    for s in state.values():  # helpers end by themselves once drained (after the idle wait)
        if s.drained_at is not None and now - s.drained_at >= IDLE_END_S:
            s.helpers = []
    present = [n for n, s in state.items() if now >= s.arrives_at]
    loads = [trackers[n].load(now, len(state[n].helpers) + len(state[n].stopping))
             for n in present]  # fmt: skip
    decisions = decide(loads, fleet)
    actions = plan_actions(decisions, fleet)
    for d in decisions:
        trackers[d.load.source].decided(now, want=d.want, helpers=d.load.helpers)
    for name, count in actions.stop.items():
        s = state[name]
        for _ in range(min(count, len(s.helpers))):
            s.helpers.pop()
            s.stopping.append(now + 2.0)  # the graceful stop: ~STOP_GRACE_S until its slot frees
    for name, count in actions.start.items():
        state[name].helpers += [now + start_s] * count


def _drain_all(state: dict[str, _Source]) -> float:
    return max(s.drained_at or math.inf for s in state.values())


def model(budget: int, rate: float, start_s: float) -> None:
    """The decision model in virtual time (the old simulation): clearly not a measurement."""
    total = sum(q for *_, q in SOURCES)
    print(f"\nMODEL (virtual time, not measured): 8 sources, {total} items; "
          f"{rate:g} items/s per process, helpers start {start_s:g} s after decisions")  # fmt: skip
    times = {mode: _drain_all(simulate(SOURCES, mode=mode, budget=budget, rate=rate,
                                       start_s=start_s))
             for mode in ("autoscaler", "fixed", "none")}  # fmt: skip
    for mode, seconds in times.items():
        ratio = seconds / times["autoscaler"]
        print(f"   all drained, {mode:10} {seconds:8.1f} s   ratio to autoscaler {ratio:.2f}")
    late = [*SOURCES[1:], ("crit-a", "critical", 2_000)]
    for preempt in (True, False):
        state = simulate(late, mode="autoscaler", arrive={"crit-a": 20.0}, preempt=preempt,
                         budget=budget, rate=rate, start_s=start_s)  # fmt: skip
        crit = state["crit-a"]
        first = "never" if crit.first_helper_at is None else f"{crit.first_helper_at - 20:.1f} s"
        drained = (crit.drained_at or math.inf) - 20.0
        print(f"   critical arriving at 20 s, preemption {'on ' if preempt else 'off'}: first "
              f"helper claims after {first:>7}, drained after {drained:6.1f} s")  # fmt: skip


@dataclass
class Play:
    """One real play's figures (seconds)."""

    label: str
    all_drained_s: float
    late_first_s: float
    late_drained_s: float
    started: int = 0
    preempted: int = 0
    notes: list[str] = field(default_factory=list)


def real(budget: int) -> list[Play]:
    """The three plays on real processes (see the module's docstring)."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_DATABASE_CONNECTION_URL,
        temporary_settings,
    )

    from collector.demo.site import FaultSite
    from tests.fleet_world import LATE, Pool, play
    from tests.servers import PostgresServer, RedisServer, free_port

    plays: list[Play] = []
    with (
        tempfile.TemporaryDirectory() as folder,
        PostgresServer() as postgres,
        RedisServer() as redis,
        FaultSite() as site,
    ):
        with temporary_settings(
            updates={PREFECT_SERVER_DATABASE_CONNECTION_URL: postgres.prefect_database()}
        ):
            server = SubprocessASGIServer(port=free_port())
            server.start(timeout=180)
        try:
            with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
                pool = Pool(server.api_url, Path(folder))
                pool.start()
                try:
                    half = budget // 2
                    setups = [
                        ("autoscaler, preemption on", "autoscaler", True, None),
                        ("autoscaler, preemption off", "autoscaler", False, None),
                        (f"fixed {budget} helpers", "fixed", True,
                         {"burst": half, "bulk-low": budget - half}),
                    ]  # fmt: skip
                    for index, (label, mode, preempt, fixed) in enumerate(setups, start=1):
                        here = Path(folder) / f"play-{index}"
                        here.mkdir()
                        sink = postgres.create_database()
                        frontier = redis.url.rsplit("/", 1)[0] + f"/{index}"
                        print(f"   playing {label} ...", flush=True)
                        seen = play(pool, here, site.base_url, frontier, sink, budget=budget,
                                    mode=mode, preempt=preempt, fixed=fixed)  # fmt: skip
                        late_at = seen.late_at or math.nan
                        plays.append(
                            Play(
                                label,
                                max(seen.drained_at.values(), default=math.nan)
                                if len(seen.drained_at) == 8 else math.nan,
                                seen.first_record_at.get(LATE, math.nan) - late_at,
                                seen.drained_at.get(LATE, math.nan) - late_at,
                                started=len(seen.helpers),
                                preempted=int(seen.tally.get("preempted", 0)),
                                notes=[f"urgent requested at {late_at:.1f} s"],
                            )
                        )  # fmt: skip
                finally:
                    pool.stop()
        finally:
            server.stop()
    return plays


def _load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=int, default=4)
    parser.add_argument("--no-model", action="store_true", help="real plays only")
    parser.add_argument("--rate", type=float, default=40.0, help="MODEL: items/s per process")
    parser.add_argument("--start-s", type=float, default=5.0, help="MODEL: a helper's start")
    args = parser.parse_args()
    print(f"REAL: 8 sources of issue 26 on a process worker, budget {args.budget}; "
          f"{os.cpu_count()} cores; before: {_load()}")  # fmt: skip
    began = time.monotonic()
    plays = real(args.budget)
    print(f"   after {time.monotonic() - began:.0f} s: {_load()}")
    base = plays[0]
    print(
        "\n   play                          all drained  ratio   urgent: 1st record  ratio"
        "   drained  ratio   helpers  preempted"
    )
    for p in plays:
        ratio = p.all_drained_s / base.all_drained_s
        print(f"   {p.label:28} {p.all_drained_s:9.1f} s  {ratio:5.2f}"
              f"   {p.late_first_s:15.1f} s  {p.late_first_s / base.late_first_s:5.2f}"
              f"   {p.late_drained_s:6.1f} s  {p.late_drained_s / base.late_drained_s:5.2f}"
              f"   {p.started:7d}  {p.preempted:9d}   ({'; '.join(p.notes)})")  # fmt: skip
    if not args.no_model:
        model(args.budget, args.rate, args.start_s)


if __name__ == "__main__":
    main()
