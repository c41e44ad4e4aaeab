"""The seeds' scaling rules in the autoscaler's model (collector/fleet/model.py), against a plain
model of the rules: pool size ``max(minSize, ceil(depth x 0.8 / throughput))``, busy held ->
up 20 % rounded up, idle or memory held -> down, each only after its window, never above the
cap, never below ``min_helpers``; and the windows the tracker keeps, in virtual time.

With a helper's start (its creation to its first claim, measured): a step up only when the
backlog outlasts a new helper's start at the rate it drains now, the pool size on the backlog
left when it arrives, and no helper for "nothing claims" while a process is on its way."""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from collector.fleet.model import (
    FleetSettings,
    Held,
    HelperStarts,
    ScalingRules,
    SourceLoad,
    decide,
    plan_actions,
    pool_size,
    step_down,
    step_up,
    want,
)
from collector.fleet.report import MEMORY_LABEL, helpers_memory, memory_share_of
from collector.fleet.schedule import ScheduleSettings
from collector.fleet.tracker import Arrivals, SourceTracker
from collector.frontier.base import Holder, StateCounts

FACTORS = [1.1, 1.2, 1.25, 1.5, 2.0, 3.0]


def _plain_want(load: SourceLoad, fleet: FleetSettings) -> tuple[int, bool]:
    """The rules as written, in exact fractions: (helpers wanted, whether a scale-down)."""
    r = load.rules
    cap, have = max(0, load.max_helpers), load.helpers
    if load.backlog <= 0 or cap == 0:
        return 0, False
    low = min(cap, r.min_helpers)
    factor = Fraction(str(r.scale_factor))
    down = max(0, min(have - 1, math.floor(Fraction(have) / factor)))
    memory_high = load.memory is not None and load.memory > r.memory_high
    if memory_high and have > low and load.memory_high_for_s >= r.memory_held_s:
        return min(cap, max(low, down)), True
    idle = load.busy is not None and load.busy < r.idle_below
    if idle and have > low and load.idle_for_s >= r.idle_held_s:
        return min(cap, max(low, down)), True
    if memory_high or idle:
        return min(cap, max(low, have)), False
    target = max(low, have)
    # a helper asked for now claims start seconds from now: only if work is left by then
    # with the processes on their way claiming too, and long enough to pay for its start
    start, infinite = Fraction(str(load.start_s)), math.isinf(load.wait_s)
    wait = None if infinite else Fraction(str(load.wait_s))
    rate = None  # items/s claimed once the coming processes claim (None: not known)
    if wait is not None and wait > 0:
        rate = Fraction(load.backlog) / wait
        if load.throughput is not None:
            rate += load.coming * Fraction(str(load.throughput))
    work = Fraction(str(fleet.arrival_work))
    arrives_in_time = (
        start <= 0
        or infinite
        or (rate is not None and Fraction(load.backlog) / rate > start * (1 + work))
    )
    if load.throughput and arrives_in_time:
        left = Fraction(load.backlog)  # claimed at that rate until it arrives
        if start > 0 and rate is not None:
            left = left - rate * start
        per_process = Fraction(str(load.throughput)) * Fraction(str(r.size_horizon_s))
        processes = math.ceil(left * Fraction(str(r.depth_share)) / per_process)
        target = max(target, r.min_helpers, processes - 1)
    above = infinite or (
        wait is not None and wait > max(Fraction(str(fleet.wait_high_s)), start) and arrives_in_time
    )
    on_the_way = infinite and load.coming > 0  # it claims before a new one would
    if load.wait_high_for_s >= fleet.wait_held_s and above and not on_the_way:
        target = max(target, have + 1)
    busy = load.busy is not None and load.busy > fleet.busy_high
    if arrives_in_time and busy and have > 0 and load.busy_high_for_s >= r.busy_held_s:
        target = max(target, have + 1, math.ceil(have * factor))
    if arrives_in_time and load.cpu is not None and load.cpu > fleet.cpu_high and have > 0:
        target = max(target, have + 1)
    if load.no_gain_above is not None:  # helpers that brought no gain: no step up past them
        target = min(target, max(have, low, load.no_gain_above))
    return min(cap, target), False


rules_st = st.builds(
    ScalingRules,
    min_helpers=st.integers(0, 5),
    scale_factor=st.sampled_from(FACTORS),
    depth_share=st.sampled_from([0.5, 0.8, 1.0]),
    size_horizon_s=st.sampled_from([10.0, 60.0, 120.0]),
    busy_held_s=st.sampled_from([0.0, 5.0, 30.0]),
    idle_below=st.sampled_from([0.1, 0.3, 0.5]),
    idle_held_s=st.sampled_from([0.0, 30.0, 60.0]),
    memory_high=st.sampled_from([0.8, 0.85, 0.95]),
    memory_held_s=st.sampled_from([0.0, 10.0]),
)
load_st = st.builds(
    SourceLoad,
    source=st.just("s"),
    run_class=st.sampled_from(["critical", "high", "normal", "low"]),
    backlog=st.one_of(st.just(0), st.integers(0, 100_000)),
    wait_s=st.one_of(st.just(math.inf), st.sampled_from([0.0, 0.01, 0.2, 5.0, 9.0, 30.0, 120.0])),
    wait_high_for_s=st.sampled_from([0.0, 0.5, 1.0, 3.0]),
    busy=st.one_of(st.none(), st.sampled_from([0.0, 0.2, 0.5, 0.9, 0.95, 1.0])),
    cpu=st.one_of(st.none(), st.sampled_from([0.1, 0.75, 0.9])),
    helpers=st.integers(0, 40),
    max_helpers=st.integers(0, 40),
    busy_high_for_s=st.sampled_from([0.0, 4.9, 5.0, 31.0]),
    idle_for_s=st.sampled_from([0.0, 29.0, 30.0, 61.0]),
    memory=st.one_of(st.none(), st.sampled_from([0.5, 0.85, 0.9, 0.99])),
    memory_high_for_s=st.sampled_from([0.0, 9.0, 10.0]),
    throughput=st.one_of(st.none(), st.sampled_from([0.5, 2.0, 4.0, 40.0])),
    rules=rules_st,
    start_s=st.sampled_from([0.0, 0.03, 3.6, 9.0, 15.0, 20.0]),
    coming=st.integers(0, 3),
    no_gain_above=st.one_of(st.none(), st.integers(0, 12)),
)


@settings(max_examples=2000, deadline=None)
@given(load=load_st)
def test_want_equals_the_plain_rules_and_keeps_within_min_and_cap(load: SourceLoad) -> None:
    fleet = FleetSettings()
    count, why, down = want(load, fleet)
    assert (count, down) == _plain_want(load, fleet), why
    cap = max(0, load.max_helpers)
    assert 0 <= count <= cap
    if load.backlog > 0:
        assert count >= min(cap, load.rules.min_helpers)  # never below min while items are due
    if count > max(load.helpers, load.rules.min_helpers):  # up past the floor: memory allows
        assert not (load.memory is not None and load.memory > load.rules.memory_high)
        assert not (load.busy is not None and load.busy < load.rules.idle_below)
    if down:
        assert count < load.helpers
    if load.no_gain_above is not None and count > max(load.helpers, load.rules.min_helpers):
        assert count <= load.no_gain_above, why  # no step up past helpers that did not help
    if count > max(load.helpers, min(cap, load.rules.min_helpers)):  # a step up: it arrives in time
        assert load.start_s <= 0 or load.wait_s > load.start_s * (1 + fleet.arrival_work), why
        assert not (math.isinf(load.wait_s) and load.coming > 0 and load.throughput is None
                    and not load.busy and not load.cpu), why  # fmt: skip


def test_no_helper_for_a_source_that_drains_before_a_helper_could_start() -> None:
    """The play at 18:57: 30-item sources, drained by their own run in ~10 s, got helpers on
    a claim wait of 8 s while a helper took 15-20 s to arrive: all of them came too late."""
    fleet = FleetSettings(budget=4)
    small = SourceLoad("crit-a", "critical", backlog=27, wait_s=9.0, wait_high_for_s=3.0,
                       busy=1.0, busy_high_for_s=10.0, cpu=0.9, helpers=0, max_helpers=1,
                       throughput=0.05, start_s=20.0)  # fmt: skip
    count, why, _ = want(small, fleet)
    assert count == 0 and why.startswith("drains in 9.0 s, before a helper's start"), why
    assert decide([small], fleet)[0].share == 0
    quick = SourceLoad("crit-a", "critical", backlog=27, wait_s=9.0, wait_high_for_s=3.0,
                       helpers=0, max_helpers=1, start_s=3.6)  # fmt: skip
    assert want(quick, fleet)[:2] == (1, "claim wait 9.0 s > 3.6 s for 3.0 s")  # starts fast
    instant = SourceLoad("crit-a", "critical", backlog=27, wait_s=9.0, wait_high_for_s=3.0,
                         helpers=0, max_helpers=1)  # fmt: skip
    assert want(instant, fleet)[0] == 1  # start 0: the 50 ms rule as before


def test_a_helper_must_work_a_start_after_it_arrives_with_those_coming_counted() -> None:
    """The `open` play of 2026-12-06: `burst` helpers decided at 45 s arrived at 55 s, when
    its other helpers (on their way at the decision) had drained it. 100 due at 4/s (a 25 s
    wait), one process claims 4/s, a start takes 10 s: alone the source lasts 25 s, more than
    the start and a start's work after it (20 s); with one process on its way it lasts 12.5 s."""
    fleet = FleetSettings(budget=4)
    alone = SourceLoad("burst", "normal", backlog=100, wait_s=25.0, wait_high_for_s=3.0,
                       helpers=1, max_helpers=4, throughput=4.0, start_s=10.0)  # fmt: skip
    assert want(alone, fleet)[0] == 2
    coming = replace(alone, coming=1)
    count, why, _ = want(coming, fleet)
    assert count == 1 and why.startswith("drains in 12.5 s, before a helper's start (10.0 s)")
    short = replace(alone, wait_s=18.0)  # lasts 18 s: work is left at arrival, too little
    assert want(short, fleet)[0] == 1
    assert want(short, FleetSettings(budget=4, arrival_work=0.0))[0] == 2  # the old rule


def test_nothing_claims_asks_for_none_while_a_process_is_on_its_way() -> None:
    fleet = FleetSettings(budget=4)
    waiting = SourceLoad("urgent", "critical", backlog=200, wait_s=math.inf, wait_high_for_s=9.0,
                         helpers=0, max_helpers=2, start_s=20.0, coming=1)  # fmt: skip
    count, why, _ = want(waiting, fleet)
    assert count == 0 and why == "nothing claims yet: 1 process(es) on the way", why
    alone = SourceLoad("urgent", "critical", backlog=200, wait_s=math.inf, wait_high_for_s=9.0,
                       helpers=0, max_helpers=2, start_s=20.0)  # fmt: skip
    assert want(alone, fleet)[0] == 1  # nothing coming: one, as before


def test_a_critical_source_whose_backlog_outlasts_a_start_still_preempts() -> None:
    """The budget full with low and normal helpers; the critical source's own run claims 4/s
    of 200 due (a 50 s wait) and a helper takes 20 s: it asks, and a helper is stopped: the
    normal one, whose source still drains (33 s without it) before the low one (40 s), which
    decides "all drained" and keeps its helpers (tests/test_fleet_victims.py)."""
    fleet = FleetSettings(budget=4)
    loads = [
        SourceLoad("bulk-low", "low", backlog=500, wait_s=40.0, wait_high_for_s=30.0,
                   helpers=2, max_helpers=2, throughput=4.0, start_s=20.0),
        SourceLoad("burst", "normal", backlog=200, wait_s=20.0, wait_high_for_s=30.0,
                   helpers=2, max_helpers=2, throughput=4.0, start_s=20.0),
        SourceLoad("urgent", "critical", backlog=200, wait_s=50.0, wait_high_for_s=1.0,
                   helpers=0, max_helpers=2, throughput=4.0, start_s=20.0),
    ]  # fmt: skip
    decisions = {d.load.source: d for d in decide(loads, fleet)}
    assert decisions["urgent"].want == 1 and decisions["urgent"].share >= 1
    assert plan_actions(list(decisions.values()), fleet).preempted == {"burst": "urgent"}
    late = [*loads[:2], SourceLoad("urgent", "critical", backlog=60, wait_s=15.0,
                                   wait_high_for_s=1.0, helpers=0, max_helpers=2,
                                   throughput=4.0, start_s=20.0)]  # fmt: skip
    assert plan_actions(decide(late, fleet), fleet).preempted == {}  # drains before: none


def test_the_pool_size_counts_the_backlog_left_when_a_helper_arrives() -> None:
    fleet = FleetSettings(budget=8)
    rules = ScalingRules()  # 0.8 of the depth over 60 s of one process's 4/s = 240 items
    deep = SourceLoad("p", "low", backlog=600, wait_s=150.0, helpers=0, max_helpers=4,
                      throughput=4.0, start_s=0.0)  # fmt: skip
    assert want(deep, fleet)[0] == 1  # ceil(480 / 240) = 2 processes
    later = SourceLoad("p", "low", backlog=600, wait_s=150.0, helpers=0, max_helpers=4,
                       throughput=4.0, start_s=75.0)  # fmt: skip
    count, why, _ = want(later, fleet)  # 300 left at arrival: ceil(240 / 240) = 1: the run
    assert count == 0 and pool_size(300, 4.0, rules) == 0, why


def test_a_helpers_start_is_measured_from_its_creation_to_its_first_claim() -> None:
    starts = HelperStarts(prior_s=15.0, keep=3)
    assert starts.expected_s == 15.0 and starts.measured == 0  # the prior before any
    arrivals = Arrivals(starts, coming_for=3.0)
    arrivals.created("h1", 10.0)
    arrivals.created("h2", 11.0)
    assert arrivals.coming([("h1", 1.0), ("h2", 0.0), ("run", 2.0)]) == 3
    assert arrivals.observe(12.0, [Holder("run", 3, 12.0), Holder("h1", 0, None)]) == []
    assert arrivals.coming([("h1", 2.0), ("h2", 1.0), ("run", 2.0)]) == 2  # the run arrived
    assert arrivals.observe(30.0, [Holder("h1", 2, 30.0)]) == [20.0]
    assert arrivals.observe(31.0, [Holder("h1", 2, 31.0)]) == []  # once
    assert starts.expected_s == 20.0
    assert arrivals.observe(40.0, [Holder("h2", 1, 40.0)]) == [29.0]
    assert starts.expected_s == 24.5  # the median of 20 and 29
    for seconds in (4.0, 5.0, 6.0):
        starts.add(seconds)
    assert starts.expected_s == 5.0 and starts.measured == 5  # the last three
    arrivals.keep(["h9"])
    assert not arrivals.arrived("h1")
    assert arrivals.coming([("h9", 14.0), ("h8", 16.0)]) == 1  # 3 x 5 s: h8 not counted on


def test_a_first_batch_after_nothing_claimed_is_not_a_long_wait() -> None:
    """A run arrives after 10 s of nothing claiming and drains 30 items at 3/s: over the old
    window its first claims look like a 20 s wait; counted from its first claim, 10 s and
    falling, not held above a 15 s start."""
    fleet = FleetSettings()
    tracker = SourceTracker("s", "critical", max_helpers=1, settings=fleet,
                            starts=HelperStarts(prior_s=15.0))  # fmt: skip
    queued, claimed, highest = 30, 0, 0.0
    for step in range(200):
        now = step * 0.1
        if now >= 10.0 and step % 3 == 0 and queued:  # 3 items/s from 10 s on (one a 1/3 s)
            queued, claimed = queued - 1, claimed + 1
        tracker.sample(now, StateCounts(queued=queued, leased=0, done=claimed), [], set())
        load = tracker.load(now, 0, coming=0 if claimed else 1)  # the run is on its way
        highest = max(highest, load.wait_high_for_s if load.wait_s < math.inf else 0.0)
        assert want(load, fleet)[0] == 0, (now, load)
    assert highest == 0.0 and queued == 0


@settings(max_examples=500, deadline=None)
@given(have=st.integers(0, 10_000), factor=st.sampled_from(FACTORS))
def test_a_step_is_twenty_percent_rounded_up_and_at_least_one(have: int, factor: float) -> None:
    exact = Fraction(str(factor))
    assert step_up(have, factor) == max(have + 1, math.ceil(have * exact))
    assert step_down(have, factor) == max(0, min(have - 1, math.floor(have / exact)))
    assert step_up(have, factor) > have and (have == 0 or step_down(have, factor) < have)


def test_the_seeds_figures() -> None:
    assert [step_up(n, 1.2) for n in (0, 1, 2, 5, 10, 100)] == [1, 2, 3, 6, 12, 120]
    assert [step_down(n, 1.2) for n in (0, 1, 2, 10, 12)] == [0, 0, 1, 8, 10]
    rules = ScalingRules()  # 0.8 of the depth, 60 s of one process's throughput
    assert pool_size(3_000, 10.0, rules) == 3  # ceil(2400 / 600) = 4 processes: the run + 3
    assert pool_size(10, 10.0, rules) == 0  # one process does it: no helper
    assert pool_size(10, 10.0, ScalingRules(min_helpers=2)) == 2
    assert pool_size(3_000, None, rules) is None  # nothing measured yet: the rule waits


def test_busy_scales_up_twenty_percent_only_once_its_window_held() -> None:
    fleet = FleetSettings(budget=40)
    busy = SourceLoad("b", "normal", backlog=10**6, wait_s=0.0, busy=0.95, helpers=10,
                      max_helpers=20, busy_high_for_s=4.9)  # fmt: skip
    assert want(busy, fleet)[:2] == (10, "steady")
    held = SourceLoad("b", "normal", backlog=10**6, wait_s=0.0, busy=0.95, helpers=10,
                      max_helpers=20, busy_high_for_s=5.0)  # fmt: skip
    assert want(held, fleet) == (12, "helpers busy 95% for 5 s", False)
    (decision,) = decide([held], fleet)
    assert plan_actions([decision], fleet).start == {"b": 2}


def test_idle_and_memory_scale_down_after_their_windows_and_stop_the_surplus() -> None:
    fleet = FleetSettings(budget=20)
    idle = SourceLoad("i", "normal", backlog=500, wait_s=0.0, busy=0.1, helpers=10,
                      max_helpers=20, idle_for_s=29.0)  # fmt: skip
    assert want(idle, fleet)[0] == 10  # not yet: the window is 30 s
    idle = SourceLoad("i", "normal", backlog=500, wait_s=0.0, busy=0.1, helpers=10,
                      max_helpers=20, idle_for_s=30.0, stopping=1)  # fmt: skip
    (decision,) = decide([idle], fleet)
    assert (decision.want, decision.scale_down) == (8, True)
    assert plan_actions([decision], fleet).stop == {"i": 1}  # 10 - 1 stopping - 8
    hot = SourceLoad("m", "normal", backlog=500, wait_s=10.0, wait_high_for_s=9.0, busy=1.0,
                     busy_high_for_s=60.0, helpers=3, max_helpers=10, memory=0.9)  # fmt: skip
    assert want(hot, fleet)[:2] == (3, "helpers' memory 90%: no step up")
    held = SourceLoad("m", "normal", backlog=500, wait_s=10.0, busy=1.0, helpers=3,
                      max_helpers=10, memory=0.9, memory_high_for_s=10.0)  # fmt: skip
    (decision,) = decide([held], fleet)
    assert decision.want == 2 and "memory 90% > 85% for 10 s" in decision.why
    assert plan_actions([decision], fleet).stop == {"m": 1}
    floor = ScalingRules(min_helpers=3)
    kept = SourceLoad("f", "normal", backlog=500, wait_s=0.0, busy=0.0, helpers=3,
                      idle_for_s=100.0, rules=floor)  # fmt: skip
    assert want(kept, fleet)[0] == 3  # never below min_helpers while items are due
    drained = SourceLoad("d", "normal", backlog=0, wait_s=0.0, busy=0.0, helpers=3,
                         idle_for_s=100.0, rules=floor)  # fmt: skip
    (decision,) = decide([drained], fleet)
    assert decision.want == 0 and plan_actions([decision], fleet).stop == {}  # they end alone


def test_pool_size_asks_for_the_helpers_the_depth_needs_at_once() -> None:
    fleet = FleetSettings(budget=8)
    deep = SourceLoad("p", "normal", backlog=12_000, wait_s=0.01, helpers=0, max_helpers=8,
                      throughput=40.0)  # fmt: skip
    count, why, _ = want(deep, fleet)
    assert count == 3 and why.startswith("pool size")  # ceil(9600 / 2400) = 4 processes
    assert plan_actions(decide([deep], fleet), fleet).start == {"p": 3}


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from([0.0, 0.1, 0.95, 1.0]), st.integers(1, 3),
                  st.sampled_from([None, 0.5, 0.9])),
        min_size=1, max_size=80,
    )
)  # fmt: skip
def test_the_tracker_windows_hold_only_over_unbroken_samples_of_one_helper_count(
    steps: list[tuple[float, int, float | None]],
) -> None:
    """Every helper holds leases (busy 1.0) or none (0.0) in a sample: with a 0.1 s window the
    busy share is that sample's; each window is the run of samples, with the same helper
    count, that kept its condition, back to the first of them."""
    fleet = FleetSettings()
    tracker = SourceTracker("s", "normal", max_helpers=5, settings=fleet, window_s=0.05)
    busy_run = idle_run = memory_run = 0.0
    since_busy = since_idle = since_memory = None
    last_count = None
    for i, (share, count, memory) in enumerate(steps):
        now = i * 0.1
        ids = [f"h{k}" for k in range(count)]
        held = [Holder(h, 1 if share >= 0.5 else 0, now) for h in ids]
        tracker.sample(now, StateCounts(queued=100, leased=count), held, set(ids))
        load = tracker.load(now, count, memory=memory)
        busy = 1.0 if share >= 0.5 else 0.0
        if count != last_count:
            since_busy = since_idle = since_memory = None
            last_count = count
        since_busy = (since_busy if since_busy is not None else now) if busy > 0.9 else None
        since_idle = (since_idle if since_idle is not None else now) if busy < 0.3 else None
        high = memory is not None and memory > 0.85
        since_memory = (since_memory if since_memory is not None else now) if high else None
        busy_run = 0.0 if since_busy is None else now - since_busy
        idle_run = 0.0 if since_idle is None else now - since_idle
        memory_run = 0.0 if since_memory is None else now - since_memory
        assert load.busy == busy
        assert math.isclose(load.busy_high_for_s, busy_run, abs_tol=1e-9)
        assert math.isclose(load.idle_for_s, idle_run, abs_tol=1e-9)
        assert math.isclose(load.memory_high_for_s, memory_run, abs_tol=1e-9)


def test_held_restarts_on_a_break_and_on_reset() -> None:
    held = Held()
    held.observe(1.0, True)
    held.observe(3.0, True)
    assert held.held_for(4.0) == 3.0
    held.observe(5.0, False)
    assert held.held_for(6.0) == 0.0
    held.observe(7.0, True)
    held.reset()
    assert held.held_for(9.0) == 0.0


def test_the_tracker_measures_one_processs_throughput() -> None:
    tracker = SourceTracker("s", "normal", max_helpers=4, settings=FleetSettings())
    claimed = 0
    for step in range(30):  # two processes claim 40 items/s between them
        claimed += 4
        holders = [Holder("run", 2, None), Holder("h1", 2, None)]
        tracker.sample(step * 0.1, StateCounts(queued=5000, done=claimed), holders, {"h1"})
    load = tracker.load(2.9, 1)
    assert load.throughput is not None and math.isclose(load.throughput, 20.0, rel_tol=0.01)


def test_memory_is_the_cgroups_share_else_the_machines() -> None:
    meminfo = "MemTotal:       8000000 kB\nMemFree:  100 kB\nMemAvailable:   2000000 kB\n"
    assert memory_share_of("900", "1000", meminfo) == 0.9  # a container's limit
    assert memory_share_of("900", "max\n", meminfo) == 0.75  # no limit: the machine's
    huge = str(2**63 - 4096)  # cgroup v1 without a limit
    assert memory_share_of("900", huge, meminfo) == 0.75
    assert memory_share_of(None, None, "garbage") is None
    assert helpers_memory([{MEMORY_LABEL: 0.5}, {MEMORY_LABEL: "0.92"}, {}, None]) == 0.92
    assert helpers_memory([{MEMORY_LABEL: "x"}]) is None


def test_the_schedule_section_carries_the_rules_and_refuses_min_above_max() -> None:
    section = ScheduleSettings(min_helpers=1, max_helpers=6, scale_factor=1.5, idle_held_s=60)
    assert section.scaling == ScalingRules(min_helpers=1, scale_factor=1.5, idle_held_s=60.0)
    assert ScheduleSettings().scaling == ScalingRules()
    with pytest.raises(ValidationError, match="min_helpers 5 is above max_helpers 4"):
        ScheduleSettings(min_helpers=5)
    with pytest.raises(ValidationError, match="scale_factor"):
        ScheduleSettings(scale_factor=1.0)
