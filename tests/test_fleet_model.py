"""The autoscaler's model (collector/fleet/model.py), in virtual time: the budget is never
exceeded, no source that wants a helper starves, weights and shares are monotone, the greedy
split equals a plain sort of every quotient, and the claim wait follows Little's law."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.fleet.model import (
    CLASS_PRIORITY,
    ClaimWait,
    Decision,
    FleetSettings,
    SourceLoad,
    decide,
    load_factor,
    plan_actions,
    politeness_cap,
    shares,
    weight,
    with_helpers,
)
from collector.fleet.report import CPU_LABEL, CpuMeter, cpu_of, helpers_cpu
from collector.fleet.tracker import Reservations

CLASSES = list(CLASS_PRIORITY)

loads_st = st.lists(
    st.builds(
        SourceLoad,
        source=st.sampled_from([f"s{i}" for i in range(10)]),
        run_class=st.sampled_from(CLASSES),
        backlog=st.one_of(st.just(0), st.integers(0, 1_000_000)),
        wait_s=st.one_of(st.just(math.inf), st.floats(0, 600)),
        wait_high_for_s=st.floats(0, 10),
        busy=st.one_of(st.none(), st.floats(0, 1)),
        cpu=st.one_of(st.none(), st.floats(0, 4)),
        helpers=st.integers(0, 6),
        max_helpers=st.integers(0, 6),
        short_for_s=st.floats(0, 100),
    ),
    max_size=8,
    unique_by=lambda x: x.source,
)


def _reference_shares(
    wants: Mapping[str, int], weights: Mapping[str, float], short: Mapping[str, float],
    fleet: FleetSettings,
) -> dict[str, int]:  # fmt: skip
    """Plainly: one each in the stated order, then every remaining quotient weight / k sorted."""
    given = dict.fromkeys(wants, 0)
    wanting = [n for n, w in wants.items() if w > 0]
    starved = [n for n in wanting if short.get(n, 0.0) >= fleet.starve_after_s]
    order = sorted(starved, key=lambda n: (-short[n], -weights[n], n)) + sorted(
        (n for n in wanting if n not in starved), key=lambda n: (-weights[n], n)
    )
    left = fleet.budget
    for name in order[:left]:
        given[name] = 1
    left -= min(left, len(order))
    quotients = [(weights[n] / (k + 1), -k, n) for n in wanting for k in range(1, wants[n])]
    for _, _, name in sorted(quotients, reverse=True)[:left]:
        given[name] += 1
    return given


@settings(max_examples=300, deadline=None)
@given(
    wants=st.dictionaries(st.sampled_from("abcdefgh"), st.integers(0, 6), max_size=8),
    raw_weights=st.lists(st.floats(1, 20), min_size=8, max_size=8),
    short=st.lists(st.floats(0, 60), min_size=8, max_size=8),
    budget=st.integers(0, 20),
)
def test_shares_equal_a_plain_sort_of_quotients_and_respect_budget_and_wants(
    wants: dict[str, int], raw_weights: list[float], short: list[float], budget: int
) -> None:
    weights = {n: raw_weights[i] for i, n in enumerate(sorted(wants))}
    shorts = {n: short[i] for i, n in enumerate(sorted(wants))}
    fleet = FleetSettings(budget=budget)
    got = shares(wants, weights, shorts, fleet)
    assert got == _reference_shares(wants, weights, shorts, fleet)
    assert sum(got.values()) <= budget
    assert all(got[n] <= wants[n] for n in wants)
    wanting = [n for n in wants if wants[n] > 0]
    if budget >= len(wanting):  # nothing starves: every source that wants one gets one
        assert all(got[n] >= 1 for n in wanting)
    assert sum(got.values()) == min(budget, sum(wants.values()))  # no slot left idle


@settings(max_examples=300, deadline=None)
@given(
    backlog=st.integers(0, 10**7), more=st.integers(0, 10**7),
    wait=st.floats(0, 3600), longer=st.floats(0, 3600),
)  # fmt: skip
def test_load_factor_and_weight_are_monotone(
    backlog: int, more: int, wait: float, longer: float
) -> None:
    fleet = FleetSettings()
    low = load_factor(backlog, wait, fleet)
    high = load_factor(backlog + more, wait + longer, fleet)
    assert 0 <= low <= high <= fleet.load_cap
    assert load_factor(0, wait, fleet) == 0.0  # nothing due: no load
    for lower, upper in zip(CLASSES[1:], CLASSES, strict=False):  # critical > high > ...
        assert weight(lower, low) < weight(upper, low)
    assert weight("normal", low) <= weight("normal", high)


@settings(max_examples=200, deadline=None)
@given(
    wants=st.dictionaries(st.sampled_from("abcdef"), st.integers(1, 5), min_size=2, max_size=6),
    raw=st.lists(st.floats(1, 20), min_size=6, max_size=6),
    boost=st.floats(0, 20),
    budget=st.integers(1, 12),
)
def test_a_heavier_source_never_gets_fewer_helpers(
    wants: dict[str, int], raw: list[float], boost: float, budget: int
) -> None:
    weights = {n: raw[i] for i, n in enumerate(sorted(wants))}
    fleet = FleetSettings(budget=budget)
    name = sorted(wants)[0]
    before = shares(wants, weights, {}, fleet)[name]
    after = shares(wants, {**weights, name: weights[name] + boost}, {}, fleet)[name]
    assert after >= before


@settings(max_examples=150, deadline=None)
@given(loads=loads_st, budget=st.integers(0, 8), rounds=st.integers(1, 30))
def test_in_virtual_time_the_budget_is_never_exceeded(
    loads: list[SourceLoad], budget: int, rounds: int
) -> None:
    """Rounds of decide -> act: starts take effect at once, stops one round later (a stopping
    helper still runs); sources that start above the budget are only ever brought down."""
    fleet = FleetSettings(budget=budget)
    helpers = {x.source: 0 for x in loads}  # the fleet starts empty
    stopping: dict[str, int] = {}
    current = with_helpers(loads, helpers)
    for _ in range(rounds):
        for name, count in stopping.items():
            helpers[name] -= count
        actions = plan_actions(decide(current, fleet), fleet)
        for name, count in actions.start.items():
            helpers[name] += count
        stopping = {n: min(c, helpers[n]) for n, c in actions.stop.items()}
        assert sum(helpers.values()) <= budget
        for x in loads:  # per source: never above its cap by a start
            assert helpers[x.source] <= max(0, x.max_helpers)
        current = with_helpers(current, helpers)


def _plain_starts(
    decisions: list[Decision], budget: int, reserved: Mapping[str, int]
) -> dict[str, int]:
    """Plainly: one free slot at a time, first to the highest class (then weight, name) that
    has a reserved slot left and wants more; its other reserved slots kept free; then to the
    highest class short of its share."""
    free = max(0, budget - sum(d.load.helpers for d in decisions))
    order = sorted(
        decisions, key=lambda d: (-CLASS_PRIORITY[d.load.run_class], -d.weight, d.load.source)
    )
    start: dict[str, int] = {}
    left = dict(reserved)
    for d in order:
        name = d.load.source
        while free and left.get(name, 0) > 0:
            if d.load.helpers + start.get(name, 0) < d.want:
                start[name] = start.get(name, 0) + 1
            left[name] -= 1
            free -= 1
    for d in order:
        name = d.load.source
        while free and d.load.helpers + start.get(name, 0) < d.share:
            start[name] = start.get(name, 0) + 1
            free -= 1
    return start


@settings(max_examples=300, deadline=None)
@given(
    loads=loads_st,
    budget=st.integers(0, 8),
    reserved=st.dictionaries(st.sampled_from([f"s{i}" for i in range(10)]), st.integers(1, 3)),
)
def test_starts_serve_reserved_slots_first_and_equal_a_plain_allocation(
    loads: list[SourceLoad], budget: int, reserved: dict[str, int]
) -> None:
    """Slots preemption freed for a source go to it while it wants them (its share aside);
    the rest by class to the shares; never more than the free budget."""
    fleet = FleetSettings(budget=budget)
    decisions = decide(loads, fleet)
    actions = plan_actions(decisions, fleet, reserved)
    assert actions.start == _plain_starts(decisions, budget, reserved)
    free = max(0, budget - sum(x.helpers for x in loads))
    assert sum(actions.start.values()) <= free
    for d in decisions:  # above its share only by reserved slots, never above its want
        got = actions.start.get(d.load.source, 0)
        if got:
            assert d.load.helpers + got <= max(
                d.share, min(d.want, d.load.helpers + reserved.get(d.load.source, 0))
            )
    assert plan_actions(decisions, fleet, {}) == plan_actions(decisions, fleet)


def test_a_slot_freed_for_a_critical_source_is_not_taken_by_another_meanwhile() -> None:
    """The `open` play of 2026-12-06 08:25: `bulk-low`'s helper was stopped for `urgent`; when
    it ended, `urgent` (asking one more helper at a time) wanted no more than it had for a
    round, so `burst` (short by its share) started into the slot and was stopped for `urgent`
    0.7 s later. Reserved, the slot waits for `urgent`'s next ask."""
    fleet = FleetSettings(budget=4)
    loads = [
        SourceLoad("bulk-low", "low", backlog=400, wait_s=33.0, wait_high_for_s=30.0,
                   helpers=1, max_helpers=4, throughput=4.0, start_s=4.0),
        SourceLoad("burst", "normal", backlog=150, wait_s=37.5, wait_high_for_s=30.0,
                   helpers=1, max_helpers=4, throughput=4.0, start_s=4.0),
        SourceLoad("urgent", "critical", backlog=150, wait_s=19.0, wait_high_for_s=0.0,
                   helpers=1, max_helpers=2, throughput=4.0, start_s=4.0),
    ]  # fmt: skip
    decisions = decide(loads, fleet)
    assert [d.want for d in decisions] == [2, 2, 1]  # `urgent`: its window restarted
    assert plan_actions(decisions, fleet).start == {"burst": 1}  # the slot, unreserved
    assert plan_actions(decisions, fleet, {"urgent": 1}).start == {}  # kept for `urgent`
    asks = [replace(x, wait_high_for_s=8.0) if x.source == "urgent" else x for x in loads]
    assert plan_actions(decide(asks, fleet), fleet, {"urgent": 1}).start == {"urgent": 1}


def test_reservations_are_kept_until_used_unwanted_or_old() -> None:
    kept = Reservations(keep_s=30.0)
    kept.freed("urgent", 1, now=10.0)
    kept.freed("urgent", 1, now=12.0)
    assert kept.now(13.0, {"urgent": 2}) == {"urgent": 2}
    kept.started("urgent", 1)
    assert kept.now(14.0, {"urgent": 1}) == {"urgent": 1}  # wants no more now: kept
    assert kept.now(15.0, {"urgent": 0}) == {}  # wants none: given up
    kept.freed("urgent", 1, now=20.0)
    assert kept.now(49.0, {"urgent": 1}) == {"urgent": 1}
    assert kept.now(50.0, {"urgent": 1}) == {}  # kept 30 s at most
    kept.freed("urgent", 2, now=60.0)
    kept.started("urgent", 5)
    assert kept.now(61.0, {"urgent": 3}) == {}


def test_nothing_starves_when_the_budget_is_smaller_than_the_demand() -> None:
    """Six sources of one class keep wanting helpers, the budget is 2, helpers never end by
    themselves: those short longest go first, so each gets one within a bounded time."""
    fleet = FleetSettings(budget=2, starve_after_s=3.0, preempt=False)
    names = [f"s{i}" for i in range(6)]
    helpers = dict.fromkeys(names, 0)
    short_since = dict.fromkeys(names, 0.0)
    served_at: dict[str, float] = {}
    for step in range(200):
        now = step * 0.5
        loads = [
            SourceLoad(n, "normal", backlog=5000, wait_s=10.0, wait_high_for_s=5.0,
                       helpers=helpers[n], max_helpers=2,
                       short_for_s=now - short_since[n] if helpers[n] == 0 else 0.0)
            for n in names
        ]  # fmt: skip
        decisions = decide(loads, fleet)
        actions = plan_actions(decisions, fleet)
        for name, count in actions.start.items():
            helpers[name] += count
            served_at.setdefault(name, now)
        # a helper runs 2 s, then its run ends (a graceful end: the source gives its slot back)
        if step % 4 == 3:
            for name in names:
                if helpers[name]:
                    helpers[name] = 0
                    short_since[name] = now
        assert sum(helpers.values()) <= fleet.budget
    assert set(served_at) == set(names), served_at
    assert max(served_at.values()) <= 20.0  # bounded: starve_after_s + a few rounds


def test_a_critical_source_preempts_the_lowest_weight_lower_class_helper() -> None:
    fleet = FleetSettings(budget=3)
    loads = [
        SourceLoad("low-a", "low", backlog=900, wait_s=1.0, helpers=2, max_helpers=4),
        SourceLoad("low-b", "low", backlog=100_000, wait_s=1.0, helpers=1, max_helpers=4),
        SourceLoad("urgent", "critical", backlog=50, wait_s=math.inf, wait_high_for_s=2.0),
    ]
    decisions = {d.load.source: d for d in decide(loads, fleet)}
    assert decisions["urgent"].share >= 1 and decisions["urgent"].want == 1
    actions = plan_actions(list(decisions.values()), fleet)
    assert actions.start == {}  # the budget is full: nothing starts before a slot is free
    assert actions.stop == {"low-a": 1}  # the lighter of the two low sources
    assert actions.preempted == {"low-a": "urgent"}
    # the next round, once the stopped helper ended, the critical source gets the slot
    after = with_helpers(loads, {"low-a": 1})
    assert plan_actions(decide(after, fleet), fleet).start == {"urgent": 1}


def test_no_preemption_within_a_class_or_when_a_slot_is_free() -> None:
    fleet = FleetSettings(budget=2)
    same = [
        SourceLoad("a", "normal", backlog=10, wait_s=0.01, helpers=2, max_helpers=4),
        SourceLoad("b", "normal", backlog=10**6, wait_s=math.inf, wait_high_for_s=5.0),
    ]
    assert plan_actions(decide(same, fleet), fleet).stop == {}
    roomy = FleetSettings(budget=3)
    actions = plan_actions(decide(same, roomy), roomy)
    assert actions.start == {"b": 1} and actions.stop == {}


def test_a_drained_source_wants_none_and_its_helpers_end_by_themselves() -> None:
    fleet = FleetSettings(budget=4)
    loads = [
        SourceLoad("done", "high", backlog=0, wait_s=0.0, helpers=3),
        SourceLoad("calm", "high", backlog=10, wait_s=0.01, helpers=0),
    ]
    decisions = decide(loads, fleet)
    assert [(d.want, d.why) for d in decisions] == [(0, "drained"), (0, "steady")]
    assert plan_actions(decisions, fleet).stop == {}  # no request in flight is cut


def test_busy_helpers_ask_for_one_more_and_politeness_can_forbid_any() -> None:
    fleet = FleetSettings(budget=4)
    busy = SourceLoad("b", "normal", backlog=100, wait_s=0.0, busy=0.95, helpers=1)
    assert decide([busy], fleet)[0].want == 1  # not held for its window yet
    busy = SourceLoad("b", "normal", backlog=100, wait_s=0.0, busy=0.95, helpers=1,
                      busy_high_for_s=5.0)  # fmt: skip
    (decision,) = decide([busy], fleet)
    assert (decision.want, decision.why) == (2, "helpers busy 95% for 5 s")
    cap, why = politeness_cap(
        shared_domain_concurrency=False, per_domain_rate=None, rate_storage="memory://"
    )
    assert cap == 0 and "shared_domain_concurrency" in why
    cap, why = politeness_cap(
        shared_domain_concurrency=True, per_domain_rate="5/second", rate_storage="memory://"
    )
    assert cap == 0 and "redis" in why
    assert (
        politeness_cap(
            shared_domain_concurrency=True, per_domain_rate="5/second", rate_storage="redis://x"
        )[0]
        is None
    )
    fenced = SourceLoad("f", "critical", backlog=10**6, wait_s=math.inf, wait_high_for_s=9,
                        max_helpers=0)  # fmt: skip
    assert decide([fenced], fleet)[0].want == 0


def test_claim_wait_follows_littles_law_in_virtual_time() -> None:
    wait = ClaimWait(window_s=2.0, threshold_s=0.05)
    claimed = 0
    for step in range(40):  # 100 items/s claimed, 500 queued: a 5 s wait
        now = step * 0.1
        claimed += 10
        estimate = wait.observe(now, queued=500, claimed_total=claimed)
    assert math.isclose(estimate, 5.0, rel_tol=0.01)
    assert math.isclose(wait.high_for(3.9), 3.8, abs_tol=0.01)
    for step in range(40, 70):  # nobody claims any more: infinite after the window
        estimate = wait.observe(step * 0.1, queued=500, claimed_total=claimed)
    assert math.isinf(estimate)
    assert wait.observe(7.1, queued=0, claimed_total=claimed) == 0.0  # drained
    assert wait.high_for(7.1) == 0.0
    fast = ClaimWait(window_s=2.0, threshold_s=0.05)
    for step in range(30):  # 10,000/s claimed, 100 queued: 10 ms, under the threshold
        fast.observe(step * 0.1, queued=100, claimed_total=step * 1000)
    assert fast.estimate < 0.05 and fast.high_for(2.9) == 0.0


def test_the_tracker_turns_frontier_samples_into_a_load() -> None:
    """Helpers report through the frontier: a helper holding leases is busy in that sample."""
    from collector.fleet.tracker import SourceTracker
    from collector.frontier.base import Holder, StateCounts

    fleet = FleetSettings(wait_high_s=0.05, wait_held_s=1.0)
    tracker = SourceTracker("s", "high", max_helpers=3, settings=fleet, window_s=2.0)
    helpers = {"h1", "h2"}
    for step in range(30):  # 3 s: 20 claims/s, 400 queued -> 20 s wait; h1 busy, h2 idle
        now = step * 0.1
        counts = StateCounts(queued=400, leased=10, done=2 * step)
        holders = [Holder("run", 5, now), Holder("h1", 5, now), Holder("h2", 0, now)]
        tracker.sample(now, counts, holders, helpers)
    load = tracker.load(2.9, helpers=2)
    assert load.backlog == 400 and math.isclose(load.wait_s, 20.0, rel_tol=0.01)
    assert math.isclose(load.wait_high_for_s, 2.8, abs_tol=0.01)  # high from the 2nd sample
    assert load.busy == 0.5  # one of two helpers held leases in every sample
    (decision,) = decide([load], fleet)
    assert decision.want == 3 and "claim wait 20.0 s" in decision.why
    tracker.decided(3.0, want=3, helpers=2)
    assert tracker.load(5.0, helpers=2).short_for_s == 2.0  # short since 3.0
    tracker.decided(6.0, want=2, helpers=2)
    assert tracker.load(7.0, helpers=2).short_for_s == 0.0
    no_helpers = SourceTracker("t", "low", max_helpers=1, settings=fleet)
    no_helpers.sample(0.0, StateCounts(queued=0), [], set())
    assert no_helpers.busy_share() is None and no_helpers.load(0.0, 0).wait_s == 0.0


def test_the_fleet_series_are_recorded_in_the_exposition() -> None:
    from prometheus_client import REGISTRY, generate_latest

    from collector.ops import metrics

    was = metrics.enabled()
    metrics.enable()
    try:
        metrics.fleet_sampled("fleet-metrics", 0.02, 3)
        metrics.fleet_sampled("fleet-metrics", math.inf, 3, 0.8)
        metrics.fleet_sampled("fleet-metrics", 0.01, 3, None)  # no report: the last one stays
        metrics.fleet_budget(4, 3)
        metrics.fleet_preempted("fleet-metrics", 2)
    finally:
        metrics.enable(was)
    value = REGISTRY.get_sample_value
    labels = {"source": "fleet-metrics"}
    assert value("collector_fleet_claim_wait_seconds_count", labels) == 3
    assert value("collector_fleet_helper_cpu_ratio", labels) == 0.8
    assert value("collector_fleet_claim_wait_seconds_bucket", {**labels, "le": "0.025"}) == 2
    assert value("collector_fleet_helpers", labels) == 3
    assert value("collector_fleet_budget_helpers", {"kind": "used"}) == 3
    assert value("collector_fleet_preemptions_total", labels) == 2
    assert b"collector_fleet_budget_helpers" in generate_latest(REGISTRY)


def test_a_helper_already_stopping_is_waited_for_not_preempted_again() -> None:
    """While the preempted helper ends (seconds: its fetched batches settle), the next decisions
    stop no second helper for the same need."""
    fleet = FleetSettings(budget=4)
    loads = [
        SourceLoad("low-a", "low", backlog=900, wait_s=1.0, helpers=3, stopping=1, max_helpers=4),
        SourceLoad(
            "low-b",
            "low",
            backlog=100_000,
            wait_s=1.0,
            wait_high_for_s=5.0,
            helpers=1,
            max_helpers=4,
        ),
        SourceLoad("urgent", "critical", backlog=50, wait_s=math.inf, wait_high_for_s=2.0),
    ]
    decisions = decide(loads, fleet)
    assert {d.load.source: d.share for d in decisions}["low-a"] == 1  # 3 - 1 stopping > 1
    actions = plan_actions(decisions, fleet)
    assert actions.stop == {} and actions.start == {}
    none_stopping = with_helpers(loads, {})  # the same without the stopping one: preempt
    none_stopping[0] = SourceLoad("low-a", "low", backlog=900, wait_s=1.0, helpers=3)
    assert plan_actions(decide(none_stopping, fleet), fleet).stop == {"low-a": 1}


def test_helpers_whose_cpu_is_high_ask_for_one_more_below_the_cap() -> None:
    fleet = FleetSettings(budget=4)
    hot = SourceLoad("h", "normal", backlog=100, wait_s=0.0, busy=0.5, cpu=0.9, helpers=1)
    (decision,) = decide([hot], fleet)
    assert (decision.want, decision.why) == (2, "helpers' CPU 90% > 75% of a core")
    cool = SourceLoad("c", "normal", backlog=100, wait_s=0.0, busy=0.5, cpu=0.75, helpers=1)
    assert decide([cool], fleet)[0].want == 1  # at the threshold: steady
    capped = SourceLoad("x", "normal", backlog=100, wait_s=0.0, cpu=2.0, helpers=2, max_helpers=2)
    assert decide([capped], fleet)[0].want == 2
    unhelped = SourceLoad("u", "normal", backlog=100, wait_s=0.0, cpu=2.0, helpers=0)
    assert decide([unhelped], fleet)[0].want == 0  # a CPU share is the helpers' own
    drained = SourceLoad("d", "normal", backlog=0, wait_s=0.0, cpu=2.0, helpers=2)
    assert decide([drained], fleet)[0].want == 0


def test_the_cpu_meter_is_cpu_time_over_wall_time_since_the_last_reading() -> None:
    clock = {"cpu": 10.0, "wall": 100.0}
    meter = CpuMeter(cpu=lambda: clock["cpu"], wall=lambda: clock["wall"])
    clock.update(cpu=10.5, wall=102.0)
    assert meter.read() == 0.25
    clock.update(cpu=12.5, wall=103.0)  # two threads on two cores: above one core
    assert meter.read() == 2.0
    assert meter.read() is None  # no wall time passed: nothing to say
    clock.update(wall=104.0)
    assert meter.read() == 0.0


def test_the_cpu_meter_sees_this_process_burn_and_rest() -> None:
    """On the real clocks: a stretch of pure computation uses CPU time, a sleep none (shares,
    not timings: only that the first is above the second)."""
    import time

    meter = CpuMeter()
    end = time.process_time() + 0.2
    while time.process_time() < end:  # 0.2 s of this process's CPU, however long it takes
        pass
    burnt = meter.read()
    time.sleep(0.2)
    rested = meter.read()
    assert burnt is not None and rested is not None and burnt > rested, (burnt, rested)


def test_helpers_cpu_is_the_mean_of_the_helpers_that_reported() -> None:
    assert helpers_cpu([{CPU_LABEL: 0.5}, {CPU_LABEL: "1.5"}, {}, None]) == 1.0
    assert helpers_cpu([{}, {"other": 1}]) is None
    for bad in (True, "warm", float("nan"), float("inf"), -1, [1]):
        assert cpu_of({CPU_LABEL: bad}) is None, bad
