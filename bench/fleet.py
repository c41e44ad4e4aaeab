"""Fleet: the autoscaler on real processes against a fixed helper count, and preemption.

    .venv/bin/python bench/fleet.py [--budget 4] [--no-model]
    .venv/bin/python bench/fleet.py --starts 4 [--query-s 5,1]   # helper starts, stage by stage
    .venv/bin/python bench/fleet.py --rules                      # MODEL: each scaling rule undone

Measured, in one run, side by side: the eight sources of issue 26 (tests/fleet_world.py EIGHT,
the same as tests/test_fleet_flow.py: six small sources, a normal burst of 360 items and a low
bulk source of 600, pages answered after 0.5 s by a local site, 2 requests at once per process)
on real parts: one Prefect server (on Postgres), one process worker of a pool of its own,
Redis frontiers, a Postgres sink. All but the critical `urgent` source are requested at once;
`urgent` (200 items; 40 until 2026-12-05, docs/fleet.md) is requested 10 s after the others in
every play (``--late-at``; until 2026-12-06 once the budget was full, which each play reached at
its own time). Four plays, each on a fresh Redis database and a fresh sink database:

1. autoscaler: the ``fleet`` flow with a budget of ``--budget`` helpers, preemption on;
2. autoscaler without preemption (``preempt=False``);
3. the same with the arrival rule before 2026-12-06 (``arrival_work=0``: a helper whenever
   work is left at its arrival, the processes on their way not counted), the reference of
   ``arrival_work``;
4. fixed: ``--budget`` helpers started by hand with the runs, half to the burst and half to the
   bulk source (what an operator would do; the small sources need none), no fleet.

It prints the time until every source's records are all in the sink (from the first request),
for `urgent` the time from its request to its first record and to its last, with ratios, and
the helpers' start: from each helper's creation (the fleet's decision) to the first moment it
held leases (sampled every half second), median and longest.

``--starts N`` measures only a helper's start, stage by stage (STAGES: created, picked by the
worker, process started, flow running, first claim), N helpers one after another into a source
with a long backlog, once per worker poll interval of ``--query-s``, on one server in one run.
Every helper is a process start on the worker (5-30 s on a loaded 2-core box): the figures
measure this box as much as the fleet, and the machine load is printed with them.

Then, labelled as such, the MODEL: the same decision functions (collector/fleet/model.py) in
virtual time, with a fixed claim rate per process and start latency (no Prefect, no processes):
what the rules do when the box is not the bottleneck. Not a measurement. ``--rules`` (also
printed after the real plays) plays three scenarios (deep sources, a source bound by its host's
rate, helpers that fill the box's memory) with the seeds' scaling rules and with each undone in
turn: drain time, helper-seconds (idle ones apart), starts, stops, peak memory.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _world import real_parts

from collector.fleet.model import FleetSettings, HelperStarts, ScalingRules, decide, plan_actions
from collector.fleet.tracker import SourceTracker
from collector.frontier.base import Holder, StateCounts

SOURCES = [  # name, class, planned items
    ("crit-a", "critical", 2_000), ("high-a", "high", 6_000), ("high-b", "high", 1_000),
    ("norm-a", "normal", 12_000), ("norm-b", "normal", 3_000), ("low-a", "low", 20_000),
    ("low-b", "low", 8_000), ("low-c", "low", 500),
]  # fmt: skip
STEP_S = 0.1
# a forecast's throughput before any is measured: the plays' 2 request slots a process at
# collector.defaults.FLEET_SLOT_RATE_PRIOR (collector.fleet.forecast.prior_throughput)
PRIOR_THROUGHPUT = 2.0
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
    run_at: float = 0.0  # its own run's first claim (a process start after its request)
    started: int = 0  # helpers started, and stopped by a scaling rule or preemption
    stopped: int = 0
    helper_s: float = 0.0  # helper-seconds spent (from each start decision to its end)
    idle_helper_s: float = 0.0  # of which running without work to claim
    peak_memory: float = 0.0  # the box's memory share at its highest (all sources share it)


def simulate(
    sources: list[tuple[str, str, int]], *, mode: str, budget: int, rate: float, start_s: float,
    arrive: dict[str, float] | None = None, preempt: bool = True, horizon_s: float = 3600.0,
    rules: ScalingRules | None = None, max_helpers: int = 4,
    host_cap: dict[str, float] | None = None, memory_per_helper: float = 0.0,
    run_start_s: float = 0.0, caps: dict[str, int] | None = None,
    fixed: dict[str, int] | None = None, fleet_overrides: dict[str, Any] | None = None,
) -> dict[str, _Source]:  # fmt: skip
    """Run the sources to the end; ``mode`` autoscaler | fixed | none. ``host_cap``: items/s a
    source's hosts allow in all (its helpers beyond that idle); ``memory_per_helper``: the
    share of the box's memory each running helper adds to a 0.5 base (reported by all);
    ``caps``: a source's own max_helpers (else ``max_helpers``); ``fixed``: the fixed split's
    helpers per source (else one each to the ``budget`` largest).

    A helper claims ``start_s`` after the decision that created it, a source's own run
    ``run_start_s`` after its request; the fleet measures each helper's start at its first
    claim (the flow's HelperStarts, its prior before any) and counts the helpers and the run
    not claiming yet as capacity on the way, as flows/fleet.py does."""
    arrive = arrive or {}
    host_cap = host_cap or {}
    state = {n: _Source(n, c, float(q), arrives_at=arrive.get(n, 0.0),
                        run_at=arrive.get(n, 0.0) + run_start_s)
             for n, c, q in sources}  # fmt: skip
    fleet = FleetSettings(budget=budget, preempt=preempt, **(fleet_overrides or {}))
    starts = HelperStarts()
    caps = caps or {}
    trackers = {n: SourceTracker(n, s.run_class, max_helpers=caps.get(n, max_helpers),
                                 settings=fleet, rules=rules, starts=starts,
                                 prior_throughput=PRIOR_THROUGHPUT)
                for n, s in state.items()}  # fmt: skip
    memory = 0.5
    if mode == "fixed" and fixed:
        for name, count in fixed.items():
            state[name].helpers += [start_s] * count
    elif mode == "fixed":
        for name, *_ in sorted(sources, key=lambda x: -x[2])[:budget]:
            state[name].helpers.append(start_s)
    now = 0.0
    while now < horizon_s and any(s.drained_at is None for s in state.values()):
        holding: dict[str, int] = {}
        for s in state.values():
            s.helper_s += (len(s.helpers) + len(s.stopping)) * STEP_S
            s.stopping = [t for t in s.stopping if t > now]  # drained or not, a stop ends
            if now < s.arrives_at or s.drained_at is not None:
                continue
            running = sum(1 for t in s.helpers if t <= now)
            if mode == "autoscaler":  # a helper arriving now: its start measured at its claim
                starts_now = sum(1 for t in s.helpers if now - STEP_S < t <= now)
                for _ in range(starts_now if s.queued > 0 else 0):
                    starts.add(start_s)
                if s.queued > 0:  # did the claim rate rise with them? (the "no gain" rule)
                    trackers[s.name].helpers_arrived(now, running, starts_now)
            working = (1 if now >= s.run_at else 0) + running
            can = min(working * rate, host_cap.get(s.name, math.inf)) * STEP_S
            claimed = min(s.queued, can)
            holding[s.name] = min(working, math.ceil(claimed / (rate * STEP_S) - 1e-9))
            s.idle_helper_s += max(0, working - holding[s.name]) * STEP_S if running else 0.0
            s.queued -= claimed
            s.done += claimed
            if claimed and s.first_helper_at is None and running > 0:
                s.first_helper_at = now
            if s.queued <= 0:
                s.drained_at = now
        memory = 0.5 + memory_per_helper * sum(len(s.helpers) for s in state.values())
        for s in state.values():
            s.peak_memory = max(s.peak_memory, memory)
        if mode == "autoscaler":
            for name, s in state.items():
                if now >= s.arrives_at:
                    counts = StateCounts(queued=math.ceil(s.queued), done=int(s.done))
                    ids = [f"h{i}" for i, t in enumerate(s.helpers) if t <= now]
                    own = ["run"] if now >= s.run_at else []
                    holders = [Holder(h, 1, now) for h in [*own, *ids][: holding.get(name, 0)]]
                    trackers[name].sample(now, counts, holders, set(ids))
            step = round(now / STEP_S)
            if step % 10 == 0:
                _decide(state, trackers, fleet, now, start_s,
                        memory if memory_per_helper else None)  # fmt: skip
        now += STEP_S
    return state


def _decide(
    state: dict[str, _Source], trackers: dict[str, SourceTracker], fleet: FleetSettings,
    now: float, start_s: float, memory: float | None = None,
) -> None:  # fmt: skip
    for s in state.values():  # helpers end by themselves once drained (after the idle wait)
        if s.drained_at is not None and now - s.drained_at >= IDLE_END_S:
            s.helpers = []
    present = [n for n, s in state.items() if now >= s.arrives_at]
    loads = [trackers[n].load(now, len(state[n].helpers) + len(state[n].stopping),
                              len(state[n].stopping), memory=memory,
                              coming=_coming(state[n], now),
                              # its run on the way: what it will plan (flows/fleet.py _forecast)
                              forecast=math.ceil(state[n].queued) if now < state[n].run_at else 0)
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
            s.stopped += 1
    for name, count in actions.start.items():
        state[name].helpers += [now + start_s] * count
        state[name].started += count


def _coming(s: _Source, now: float) -> int:
    """Its processes not claiming yet: helpers starting, and its own run before its start."""
    return sum(1 for t in s.helpers if t > now) + (1 if now < s.run_at else 0)


def _drain_all(state: dict[str, _Source]) -> float:
    return max(s.drained_at or math.inf for s in state.values())


def model(budget: int, rate: float, start_s: float) -> None:
    """The decision model in virtual time (the old simulation): clearly not a measurement."""
    total = sum(q for *_, q in SOURCES)
    print(f"\nMODEL (virtual time, not measured): 8 sources, {total} items; "
          f"{rate:g} items/s per process, helpers start {start_s:g} s after decisions, "
          f"each source's own run {start_s:g} s after its request")  # fmt: skip
    times = {mode: _drain_all(simulate(SOURCES, mode=mode, budget=budget, rate=rate,
                                       start_s=start_s, run_start_s=start_s))
             for mode in ("autoscaler", "fixed", "none")}  # fmt: skip
    for mode, seconds in times.items():
        ratio = seconds / times["autoscaler"]
        print(f"   all drained, {mode:10} {seconds:8.1f} s   ratio to autoscaler {ratio:.2f}")
    late = [*SOURCES[1:], ("crit-a", "critical", 2_000)]
    for preempt in (True, False):
        state = simulate(late, mode="autoscaler", arrive={"crit-a": 20.0}, preempt=preempt,
                         budget=budget, rate=rate, start_s=start_s,
                         run_start_s=start_s)  # fmt: skip
        crit = state["crit-a"]
        first = "never" if crit.first_helper_at is None else f"{crit.first_helper_at - 20:.1f} s"
        drained = (crit.drained_at or math.inf) - 20.0
        print(f"   critical arriving at 20 s, preemption {'on ' if preempt else 'off'}: first "
              f"helper claims after {first:>7}, drained after {drained:6.1f} s, all drained "
              f"{_drain_all(state):6.1f} s, {sum(s.stopped for s in state.values())} "
              f"stopped")  # fmt: skip


def _lowest_weight_first(
    decisions: Any, beneficiary: Any, taken: Any = (), starting: Any = None
) -> list[Any]:
    """The victim order before the critical path counted (MODEL only): every lower-class
    source over its share, the lowest weight first."""
    from collector.fleet.model import CLASS_PRIORITY, Victim

    rank = CLASS_PRIORITY[beneficiary.load.run_class]
    found = [d for d in decisions if d.load.source not in taken
             and d.load.helpers - d.load.stopping > d.share
             and CLASS_PRIORITY[d.load.run_class] < rank]  # fmt: skip
    return [Victim(d, False, False, "lowest weight")
            for d in sorted(found, key=lambda d: (d.weight, d.load.source))]  # fmt: skip


def plays_model(budget: int, start_s: float) -> None:
    """The real plays' eight sources in virtual time (not measured): 4 items/s per process
    (2 requests at once, 0.5 s pages), `urgent` arriving at 20 s; both scenarios, the victim
    order before and after the critical path counted, and the fixed split."""
    from collector.fleet import model as fleet_model
    from tests.fleet_world import EIGHT, LATE, OPEN

    print(f"\nMODEL, the plays' eight sources (virtual time, not measured): 4 items/s per "
          f"process, helpers and runs start {start_s:g} s after the decision or request, "
          f"`urgent` arrives at 20 s")  # fmt: skip
    print(
        "   scenario  play                                    all drained   urgent drained  stopped"
    )
    half = {"burst": budget // 2, "bulk-low": budget - budget // 2}
    for scenario, specs in (("capped", EIGHT), ("open", OPEN)):
        sources = [(x.name, x.run_class, x.items) for x in specs]
        caps = {x.name: x.max_helpers for x in specs}
        plays = [("autoscaler, preemption on", "autoscaler", True, None),
                 ("  same, lowest weight first", "autoscaler", True, _lowest_weight_first),
                 ("autoscaler, preemption off", "autoscaler", False, None),
                 ("fixed: half to burst, half to bulk", "fixed", False, None)]  # fmt: skip
        for label, mode, preempt, order in plays:
            kept = fleet_model.victims
            if order is not None:
                fleet_model.victims = order
            try:
                state = simulate(sources, mode=mode, budget=budget, rate=4.0, start_s=start_s,
                                 run_start_s=start_s, arrive={LATE: 20.0}, preempt=preempt,
                                 caps=caps, fixed=half)  # fmt: skip
            finally:
                fleet_model.victims = kept
            late = (state[LATE].drained_at or math.inf) - 20.0
            print(f"   {scenario:8}  {label:38} {_drain_all(state):9.1f} s  {late:12.1f} s"
                  f"  {sum(x.stopped for x in state.values()):7d}")  # fmt: skip


RULE_VARIANTS = [  # what each of the seeds' rules changes: all of them, then each one undone
    ("seeds' rules (all)", ScalingRules()),
    ("no pool size", ScalingRules(size_horizon_s=math.inf)),
    ("+1 steps, not +20 %", ScalingRules(scale_factor=1.000001)),
    ("no pool size, +1 steps", ScalingRules(size_horizon_s=math.inf, scale_factor=1.000001)),
    ("no windows (0 s)", ScalingRules(busy_held_s=0.0, idle_held_s=0.0, memory_held_s=0.0)),
    ("no idle scale-down", ScalingRules(idle_below=0.0)),
    ("no memory rule", ScalingRules(memory_high=1.0)),
    ("no 'no gain' rule", ScalingRules()),  # FleetSettings: never judged (NO_GAIN_OFF)
]
NO_GAIN_OFF = {"gain_window_s": math.inf}  # a trial needs half a window seen before it
RULE_SCENARIOS = [  # name, sources, budget, max_helpers, host caps (items/s), memory per helper
    ("deep: 2 sources, 30,000 items", [("deep-a", "normal", 20_000), ("deep-b", "low", 10_000)],
     16, 12, {}, 0.0),
    ("polite: one host allows 40/s", [("polite", "high", 8_000), ("bulk", "normal", 16_000)],
     6, 6, {"polite": 40.0}, 0.0),
    ("memory: each helper +4 %", [("deep-a", "normal", 20_000), ("deep-b", "low", 10_000)],
     16, 12, {}, 0.04),
]  # fmt: skip


def rules_model(rate: float, start_s: float) -> None:
    """Each of the seeds' rules undone in turn, per scenario, in virtual time (not measured)."""
    print(
        f"\nMODEL, the seeds' scaling rules (virtual time, not measured): {rate:g} items/s "
        f"per process, helpers start {start_s:g} s after decisions; each line undoes one rule"
    )
    for title, sources, budget, most, caps, per_helper in RULE_SCENARIOS:
        print(f"\n   {title} (budget {budget}, max_helpers {most})")
        print(
            "   rules                    all drained  ratio   helper-s  idle helper-s"
            "  started  stopped  peak memory"
        )
        base = None
        for label, rules in RULE_VARIANTS:
            off = NO_GAIN_OFF if label == "no 'no gain' rule" else None
            state = simulate(sources, mode="autoscaler", budget=budget, rate=rate,
                             start_s=start_s, rules=rules, max_helpers=most, host_cap=caps,
                             memory_per_helper=per_helper, horizon_s=7200.0,
                             fleet_overrides=off)  # fmt: skip
            drained = _drain_all(state)
            base = base or drained
            peak = max(s.peak_memory for s in state.values())
            print(f"   {label:24} {drained:9.1f} s  {drained / base:5.2f}"
                  f"   {sum(s.helper_s for s in state.values()):8.0f}"
                  f"   {sum(s.idle_helper_s for s in state.values()):12.0f}"
                  f"   {sum(s.started for s in state.values()):6d}"
                  f"   {sum(s.stopped for s in state.values()):6d}"
                  f"   {f'{peak:.0%}' if per_helper else '-':>10}")  # fmt: skip


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
    first_claim_s: list[float] = field(default_factory=list)  # each helper's, from its creation
    timeline: list[str] = field(default_factory=list)  # where the play's time went (breakdown)

    def start_text(self) -> str:
        """Decision to first claim: median and longest over the helpers that claimed."""
        if not self.first_claim_s:
            return "-"
        return f"{statistics.median(self.first_claim_s):.1f} / {max(self.first_claim_s):.1f} s"


# `urgent` is requested this long after the first request in every play. Until 2026-12-06 it
# was requested once the budget was full, which depends on the play: the fixed split's four
# helpers running (8-21 s in, with eleven processes starting at once), the autoscaler's
# created (8 s in when its first helpers waited for a plan; 2-3 s with the forecast), and
# "all drained", decided by `urgent` in the fixed split, moved with it.
LATE_AT_S = 10.0

SCENARIOS = ("capped", "open")
"""capped: tests/fleet_world.py EIGHT (`burst` and `bulk-low` at most 2 helpers each, what the
fixed split gives them); open: OPEN, the same at the default cap of 4, the fixed split still
half the budget to each."""


def real(budget: int, scenario: str = "capped", late_at_s: float | None = LATE_AT_S) -> list[Play]:
    """The three plays on real processes (see the module's docstring)."""

    from tests.fleet_world import EIGHT, LATE, OPEN, Pool, play, warm_up

    specs = {"capped": EIGHT, "open": OPEN}[scenario]

    plays: list[Play] = []
    with real_parts() as (folder, postgres, redis, site, api):
        pool = Pool(api, Path(folder))
        pool.start()
        try:
            warm_up(pool, Path(folder), site.base_url,
                    redis.url.rsplit("/", 1)[0] + "/15",  # a database of its own
                    postgres.create_database())  # fmt: skip
            half = budget // 2
            old_rule = {"arrival_work": 0.0}  # a helper whenever work is left at its arrival
            setups = [
                ("autoscaler, preemption on", "autoscaler", True, None, None),
                ("autoscaler, preemption off", "autoscaler", False, None, None),
                ("autoscaler off, old arrival", "autoscaler", False, None, old_rule),
                (f"fixed {budget} helpers", "fixed", True,
                 {"burst": half, "bulk-low": budget - half}, None),
            ]  # fmt: skip
            for index, (label, mode, preempt, fixed, params) in enumerate(setups, start=1):
                here = Path(folder) / f"{scenario}-play-{index}"
                here.mkdir()
                sink = postgres.create_database()
                frontier = redis.url.rsplit("/", 1)[0] + f"/{index}"
                print(f"   playing {scenario}: {label} ...", flush=True)
                seen = play(pool, here, site.base_url, frontier, sink, budget=budget,
                            mode=mode, preempt=preempt, fixed=fixed, specs=specs,
                            fleet_params=params, late_at_s=late_at_s)  # fmt: skip
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
                        first_claim_s=sorted(seen.first_claim_s.values()),
                        timeline=breakdown(seen, budget),
                    )
                )  # fmt: skip
        finally:
            pool.stop()
    return plays


# --- where a play's time goes ---


@dataclass
class Span:
    """One flow run of a play (own run or helper), seconds from the play's start (nan: not
    seen): created, picked by the worker (Pending), Running, first and last sample holding
    leases (every half second), ended."""

    source: str
    kind: str  # run | helper
    state: str
    at: dict[str, float]


SPAN_STAGES = ("created", "picked", "running", "first claim", "last claim", "ended")


def spans(seen: Any) -> list[Span]:
    """Every run of a play with its stages (its states read from the API)."""
    import asyncio

    from prefect.client.orchestration import get_client

    runs = [*((r, "run") for r in seen.runs.values()), *((h, "helper") for h in seen.helpers)]

    async def states() -> list[Any]:
        async with get_client() as client:
            return [await client.read_flow_run_states(r.id) for r, _ in runs]

    found = []
    for (run, kind), history in zip(runs, asyncio.run(states()), strict=True):
        at: dict[str, float] = {"created": run.created.timestamp() - seen.t0_wall}
        for state in history:
            name = {"PENDING": "picked", "RUNNING": "running"}.get(state.type.value)
            if name and name not in at:
                at[name] = state.timestamp.timestamp() - seen.t0_wall
        if run.end_time is not None:
            at["ended"] = run.end_time.timestamp() - seen.t0_wall
        held = seen.held.get(str(run.id))
        if held:
            at["first claim"], at["last claim"] = held
        source = seen.source_of(run) if kind == "helper" else run.name.split("-")[0]
        if kind == "run":
            source = next((n for n, r in seen.runs.items() if r.id == run.id), source)
        found.append(Span(source, kind, run.state.name, at))
    return sorted(found, key=lambda x: x.at["created"])


def _gap(a: Span, start: str, end: str) -> float:
    return a.at.get(end, math.nan) - a.at.get(start, math.nan)


def _mm(values: list[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} / {max(values):.1f}"


def _stage(found: list[Span], start: str, end: str) -> str:
    return _mm([_gap(x, start, end) for x in found])


def breakdown(seen: Any, budget: int) -> list[str]:
    """Lines: every run's stages, then the budget's slot-seconds and the box's CPU."""
    found = spans(seen)
    end = max(seen.drained_at.values(), default=math.nan)
    lines = ["      source     kind    " + "".join(f"{n:>12}" for n in SPAN_STAGES) + "  state"]
    for x in found:
        lines.append(f"      {x.source:10} {x.kind:6}  "
                     + "".join(f"{x.at.get(n, math.nan):12.1f}" for n in SPAN_STAGES)
                     + f"  {x.state}")  # fmt: skip
    runs = [x for x in found if x.kind == "run"]
    helpers = [x for x in found if x.kind == "helper"]
    lines.append(
        f"      own runs (median / longest): created->running {_stage(runs, 'created', 'running')}"
        f" s, running->first claim {_stage(runs, 'running', 'first claim')} s"
    )
    for name in ("burst", "bulk-low", "urgent"):
        for x in runs:
            if x.source == name:
                lines.append(f"      {name}: created {x.at['created']:.1f}, first claim "
                             f"{x.at.get('first claim', math.nan):.1f}, drained "
                             f"{seen.drained_at.get(name, math.nan):.1f}")  # fmt: skip
    if helpers:
        lines.append(
            f"      helpers (median / longest): created->running "
            f"{_stage(helpers, 'created', 'running')} s, running->first claim "
            f"{_stage(helpers, 'running', 'first claim')} s, last claim->ended "
            f"{_stage(helpers, 'last claim', 'ended')} s"
        )
        # the budget's slot-seconds from the play's start to all drained: what filled them
        starting = working = tail = 0.0
        for x in helpers:
            made = min(x.at["created"], end)
            first = min(x.at.get("first claim", x.at.get("ended", end)), end)
            last = min(x.at.get("last claim", first), end)
            gone = min(x.at.get("ended", end), end)
            starting += max(0.0, first - made)
            working += max(0.0, last - first)
            tail += max(0.0, gone - last)
        slots = budget * end
        empty = slots - starting - working - tail
        lines.append(
            f"      slot-seconds to all drained ({slots:.0f}): starting {starting:.0f} "
            f"({starting / slots:.0%}), claiming {working:.0f} ({working / slots:.0%}), "
            f"after the last claim {tail:.0f} ({tail / slots:.0%}), empty {empty:.0f} "
            f"({empty / slots:.0%})"
        )
    during = [c for t, c in seen.cpu if t <= end]
    if during:
        lines.append(
            f"      box CPU to all drained: mean {statistics.mean(during):.0%} of 2 cores, "
            f"{sum(1 for c in during if c >= 0.95) / len(during):.0%} of samples >= 95 %"
        )
    return lines


# --- decision to first claim, stage by stage ---

STAGES = ("created", "picked", "process", "running", "first claim")
"""A helper's start, each stage from the fleet's decision (wall seconds): the flow run created
(the API call returned), picked by the worker (its Pending state), its process started (the
kernel's start time of the flow run's process), the engine running the flow (Running state:
interpreter, imports, flow loaded), its first claim (its run id holds leases in the frontier:
stores opened, GX checks built)."""


@dataclass
class Start:
    """One helper's start: seconds from the decision to each stage (nan: not seen)."""

    at: dict[str, float]

    def stage(self, name: str) -> float:
        """The stage's own share: from the stage before it to this one."""
        index = STAGES.index(name)
        before = 0.0 if index == 0 else self.at.get(STAGES[index - 1], math.nan)
        return self.at.get(name, math.nan) - before


def _process_started(pid: int) -> float:
    """When process ``pid`` started (wall seconds; the kernel's clock ticks since boot)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    boot = next(
        float(line.split()[1])
        for line in Path("/proc/stat").read_text().splitlines()
        if line.startswith("btime")
    )
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def measure_starts(count: int, intervals: list[float]) -> dict[float, list[Start]]:
    """For each worker poll interval in ``intervals`` (one worker each, in turn, on one
    server): ``count`` helpers started one after another, as the fleet starts them, into a
    source with a long backlog; each is stopped (Cancelling) once it claimed, before the next."""

    from tests.fleet_world import Pool

    starts: dict[float, list[Start]] = {}
    with real_parts() as (folder, postgres, redis, site, api):
        for query_s in intervals:
            here = Path(folder) / f"poll-{query_s:g}"
            here.mkdir()
            pool = Pool(api, here, query_s=query_s)
            pool.start()
            try:
                starts[query_s] = _starts_on(
                    pool, here, count, site.base_url, redis.url,
                    postgres.create_database(),
                )  # fmt: skip
            finally:
                pool.stop()
    return starts


def _starts_on(pool: Any, folder: Path, count: int, site: str, redis: str, dsn: str) -> list[Start]:
    """``count`` helper starts on ``pool``'s worker, one after another (see measure_starts)."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.states import Cancelling

    from collector.backends import open_frontier
    from collector.config import load_source
    from collector.fleet.deploy import deployment_name
    from collector.run.collection import Collection
    from flows.fleet import _Deployed, _start
    from tests.fleet_world import Spec, deploy, write_source

    spec = Spec(f"slow-{pool.query_s:g}".replace(".", "-"), "normal", 2000, 0.5, 4)
    path = write_source(folder, spec, site, redis, dsn)
    deploy(str(path), "--pool", pool.name, "--batch-size", "3")
    source = load_source(path)
    with Collection(source, run_id="bench-plan") as run:
        run.plan()
    frontier = open_frontier(source)

    async def one() -> Start:
        async with get_client() as client:
            deployment = await client.read_deployment_by_name(
                f"collect/{deployment_name(spec.name)}"
            )
            target = _Deployed(source, str(path), deployment.id, frontier, None, "")  # type: ignore[arg-type]
            decided = time.time()
            (run_id,) = await _start(client, target, 1, batch_size=3, idle_s=3.0)
            at = {"created": time.time() - decided}
            deadline = time.monotonic() + 300
            while "first claim" not in at and time.monotonic() < deadline:
                holders = await asyncio.to_thread(frontier.holders, spec.name)
                if any(h.holder == str(run_id) and h.leased for h in holders):
                    at["first claim"] = time.time() - decided
                await asyncio.sleep(0.05)
            flow_run = await client.read_flow_run(run_id)
            for state in await client.read_flow_run_states(run_id):
                name = {"PENDING": "picked", "RUNNING": "running"}.get(state.type.value)
                if name and name not in at:
                    at[name] = state.timestamp.timestamp() - decided
            pid = (flow_run.infrastructure_pid or "").rsplit(":", 1)[-1]
            if pid.isdigit() and Path(f"/proc/{pid}").exists():
                at["process"] = _process_started(int(pid)) - decided
            await client.set_flow_run_state(run_id, Cancelling(message="bench"))
            while not (await client.read_flow_run(run_id)).state.is_final():  # type: ignore[union-attr]
                await asyncio.sleep(0.2)
            return Start(at)

    try:
        return [asyncio.run(one()) for _ in range(count)]
    finally:
        frontier.close()


def print_starts(starts: list[Start], label: str) -> None:
    print(f"\n   helper starts ({label}): seconds from the decision")
    print("   " + "".join(f"{name:>13}" for name in STAGES) + "   (each stage's own share)")
    for s in starts:
        print("   " + "".join(f"{s.at.get(n, math.nan):13.2f}" for n in STAGES)
              + "   " + " ".join(f"{s.stage(n):.2f}" for n in STAGES))  # fmt: skip


def _load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _print_plays(plays: list[Play]) -> None:
    base = plays[0]
    print(
        "   play                          all drained  ratio   urgent: 1st record  ratio"
        "   drained  ratio   helpers  preempted   helper start (median / longest)"
    )
    for p in plays:
        ratio = p.all_drained_s / base.all_drained_s
        print(f"   {p.label:28} {p.all_drained_s:9.1f} s  {ratio:5.2f}"
              f"   {p.late_first_s:15.1f} s  {p.late_first_s / base.late_first_s:5.2f}"
              f"   {p.late_drained_s:6.1f} s  {p.late_drained_s / base.late_drained_s:5.2f}"
              f"   {p.started:7d}  {p.preempted:9d}   {p.start_text():>15}"
              f"   ({'; '.join(p.notes)})")  # fmt: skip
    for p in plays:
        if p.timeline:
            print(f"\n   {p.label}: where the time went (seconds from the first request)")
            print("\n".join(p.timeline))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=int, default=4)
    parser.add_argument("--no-model", action="store_true", help="real plays only")
    parser.add_argument(
        "--scenario",
        default=",".join(SCENARIOS),
        help="capped (burst and bulk-low at most 2 helpers), open (at most 4), or both",
    )
    parser.add_argument(
        "--late-at",
        type=float,
        default=LATE_AT_S,
        help="request `urgent` this many seconds after the first request (-1: once the "
        "budget is full, as the test does)",
    )
    parser.add_argument("--rate", type=float, default=40.0, help="MODEL: items/s per process")
    parser.add_argument("--start-s", type=float, default=5.0, help="MODEL: a helper's start")
    parser.add_argument(
        "--rules", action="store_true", help="only the MODEL of the seeds' scaling rules"
    )
    parser.add_argument(
        "--starts", type=int, default=0, help="only measure this many helper starts, stage by stage"
    )
    parser.add_argument(
        "--query-s",
        default="5,1",
        help="the worker's poll intervals to compare (seconds, comma-separated)",
    )
    args = parser.parse_args()
    if args.rules:
        rules_model(args.rate, args.start_s)
        return
    if args.starts:
        print(f"helper starts on a process worker; before: {_load()}")
        intervals = [float(x) for x in args.query_s.split(",")]
        for query_s, starts in measure_starts(args.starts, intervals).items():
            print_starts(starts, f"worker polls every {query_s:g} s")
        print(f"   after: {_load()}")
        return
    print(f"REAL: 8 sources of issue 26 on a process worker, budget {args.budget}; "
          f"{os.cpu_count()} cores; before: {_load()}")  # fmt: skip
    tables = []
    for scenario in args.scenario.split(","):
        began = time.monotonic()
        plays = real(args.budget, scenario, args.late_at if args.late_at >= 0 else None)
        tables.append((scenario, plays, f"after {time.monotonic() - began:.0f} s: {_load()}"))
        print(f"   {scenario}: {tables[-1][2]}", flush=True)
    for scenario, plays, after in tables:
        caps = "2 and 2" if scenario == "capped" else "4 and 4"
        print(f"\n   {scenario}: `burst` and `bulk-low` at most {caps} helpers ({after})")
        _print_plays(plays)
    if not args.no_model:
        for start_s in (args.start_s, 20.0):
            plays_model(args.budget, start_s)
        model(args.budget, args.rate, args.start_s)
        rules_model(args.rate, args.start_s)


if __name__ == "__main__":
    main()
