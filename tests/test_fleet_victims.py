"""Which helper preemption stops (collector/fleet/model.py ``victims``): the one whose stop does
not delay "all drained" first, never the source that decides it while another may go, the
lowest weight among equals, and a critical source still gets its helpers. Against a plain
model of the rule in exact fractions, and in the play's situation (`urgent` arriving while
`burst` and `bulk-low` hold the budget)."""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.fleet.model import (
    CLASS_PRIORITY,
    Decision,
    FleetSettings,
    SourceLoad,
    decide,
    helper_gain_s,
    plan_actions,
    victims,
    with_helpers,
)


def _exact(x: float) -> Fraction:
    return Fraction(str(x))


def _rate(load: SourceLoad, starting: int) -> Fraction | None:
    """Claimed a second once the processes on the way arrive (None: nothing claims)."""
    if math.isinf(load.wait_s) or load.wait_s <= 0:
        return None
    rate = Fraction(load.backlog) / _exact(load.wait_s)
    if load.throughput is not None:
        rate += (load.coming + starting) * _exact(load.throughput)
    return rate


def _plain_victims(
    decisions: list[Decision], beneficiary: Decision, taken: set[str], starting: dict[str, int]
) -> list[str]:
    """The rule as written, plainly: who may be stopped for ``beneficiary``, preferred first."""
    mine = beneficiary.load
    inf = Fraction(10**30)  # "not known" stands above every drain here

    def drain(x: SourceLoad, less: int = 0) -> Fraction:
        if x.backlog <= 0:
            return Fraction(0)
        rate = _rate(x, starting.get(x.source, 0))
        if rate is None or (less and x.throughput is None):
            return inf
        rate -= less * _exact(x.throughput or 0)
        return Fraction(x.backlog) / rate if rate > 0 else inf

    growing = {  # a higher class below its cap: it will preempt, its drain now says nothing
        d.load.source
        for d in decisions
        if CLASS_PRIORITY[d.load.run_class] > CLASS_PRIORITY[mine.run_class]
        and d.load.backlog > 0
        and d.load.helpers < d.load.max_helpers
    }

    def longest(*leave_out: str) -> Fraction:
        known = [
            drain(d.load)
            for d in decisions
            if d.load.source not in leave_out and d.load.source not in growing
        ]
        return max([x for x in known if x != inf] + [Fraction(0)])

    def with_one_more(x: SourceLoad) -> Fraction:
        rate = _rate(x, starting.get(x.source, 0))
        if rate is None or x.throughput is None:
            return drain(x)
        start = _exact(x.start_s)
        left = x.backlog - rate * start  # claimed at the rate now until the helper arrives
        return drain(x) if left <= 0 else start + left / (rate + _exact(x.throughput))

    end_now = longest(mine.source)
    own = with_one_more(mine)  # its drain once the helper it is given has arrived
    own = own if own != inf else Fraction(0)  # not known: no delay allowed
    ceiling = max(end_now, own)
    if mine.run_class == "critical":  # it may move the end later by what the helper saves it
        if drain(mine) != inf:
            ceiling = max(ceiling, end_now + max(Fraction(0), drain(mine) - with_one_more(mine)))
        elif mine.coming + starting.get(mine.source, 0) == 0:
            ceiling = inf * 2  # nothing claims, none on its way: without a helper it never drains
    over: list[list[Any]] = []
    at_share: list[list[Any]] = []
    replaced: list[Fraction] = []  # the delays of stops above a share, made or refused
    for d in decisions:
        x = d.load
        if x.source in taken or x.helpers - x.stopping <= 0:
            continue
        if CLASS_PRIORITY[x.run_class] >= CLASS_PRIORITY[mine.run_class]:
            continue  # only a lower class is ever preempted
        others = longest(x.source, mine.source)
        end = max(drain(x, less=1), others)
        if x.helpers - x.stopping > d.share:  # an at-share stop may replace it, made or not
            replaced.append(end - end_now)
        if end > ceiling:
            continue  # past the beneficiary's own end, and past a critical one's gain
        row = [drain(x) >= others, end - end_now, d.weight, x.source, x.run_class]
        (over if x.helpers - x.stopping > d.share else at_share).append(row)
    if replaced:
        least = min(replaced)
        over += [r for r in at_share if r[1] < least]
    for r in over:  # the source deciding the end is spared while one of a class <= its own may go
        rank = CLASS_PRIORITY[r[4]]
        r[0] = r[0] and any(o is not r and CLASS_PRIORITY[o[4]] <= rank for o in over)
    return [r[3] for r in sorted(over, key=lambda r: r[:4])]


load_st = st.builds(
    SourceLoad,
    source=st.sampled_from([f"s{i}" for i in range(6)]),
    run_class=st.sampled_from(list(CLASS_PRIORITY)),
    backlog=st.one_of(st.just(0), st.integers(0, 2_000)),
    wait_s=st.sampled_from([math.inf, 0.0, 0.5, 2.0, 5.0, 10.0, 20.0, 40.0, 50.0, 60.0]),
    wait_high_for_s=st.sampled_from([0.0, 2.0]),
    coming=st.integers(0, 2),
    helpers=st.integers(0, 4),
    stopping=st.integers(0, 1),
    max_helpers=st.integers(0, 4),
    throughput=st.one_of(st.none(), st.sampled_from([0.5, 2.0, 4.0, 40.0])),
    start_s=st.sampled_from([0.0, 5.0]),
)


@settings(max_examples=1500, deadline=None)
@given(
    loads=st.lists(load_st, min_size=1, max_size=6, unique_by=lambda x: x.source),
    budget=st.integers(0, 8),
    pick=st.integers(0, 5),
    taken=st.sets(st.sampled_from([f"s{i}" for i in range(6)]), max_size=2),
    starting=st.dictionaries(st.sampled_from([f"s{i}" for i in range(6)]), st.integers(0, 2)),
)
def test_victims_equal_the_plain_rule(
    loads: list[SourceLoad], budget: int, pick: int, taken: set[str], starting: dict[str, int]
) -> None:
    loads = [replace(x, stopping=min(x.stopping, x.helpers)) for x in loads]
    decisions = decide(loads, FleetSettings(budget=budget))
    beneficiary = decisions[pick % len(decisions)]
    got = victims(decisions, beneficiary, taken, starting)
    plain = _plain_victims(decisions, beneficiary, taken, starting)
    assert [v.decision.load.source for v in got] == plain
    for v in got:  # priority: only a lower class is ever stopped
        assert (
            CLASS_PRIORITY[v.decision.load.run_class] < CLASS_PRIORITY[beneficiary.load.run_class]
        )
    if got and got[0].decides:  # the source deciding the end goes only when no other may
        rank = CLASS_PRIORITY[got[0].decision.load.run_class]
        assert not any(not v.decides and CLASS_PRIORITY[v.decision.load.run_class] <= rank
                       for v in got[1:]), got  # fmt: skip
    # the whole round: each preemption stops one running helper of a lower class
    actions = plan_actions(decisions, FleetSettings(budget=budget))
    by_name = {d.load.source: d.load for d in decisions}
    for victim, name in actions.preempted.items():
        x, mine = by_name[victim], by_name[name]
        assert CLASS_PRIORITY[x.run_class] < CLASS_PRIORITY[mine.run_class], (victim, name)
        assert 1 <= actions.stop[victim] <= x.helpers - x.stopping


_waits = st.sampled_from([5.0, 12.5, 20.0, 35.0, 50.0, 60.0, 90.0, 142.0, 200.0])


@settings(max_examples=800, deadline=None)
@given(
    low=st.tuples(st.integers(50, 1000), _waits, st.integers(1, 4)),
    normal=st.tuples(st.integers(0, 800), _waits, st.integers(0, 3)),
    critical=st.tuples(
        st.integers(0, 400), st.one_of(_waits, st.just(math.inf)), st.integers(0, 2)
    ),
    throughput=st.sampled_from([2.5, 4.0]),
    start_s=st.sampled_from([0.0, 5.0, 7.5]),
)
def test_in_the_plays_shape_victims_for_a_normal_source_equal_the_plain_rule(
    low: tuple[int, float, int],
    normal: tuple[int, float, int],
    critical: tuple[int, float, int],
    throughput: float,
    start_s: float,
) -> None:
    """The plays' three classes, the budget full, `burst` the beneficiary: where the rules for
    a non-critical beneficiary (its drain with the helper it is given; a higher class that may
    still grow left out) decide, which the general property above rarely builds."""

    def load(name: str, run_class: str, shape: tuple[int, float, int], most: int) -> SourceLoad:
        backlog, wait, helpers = shape
        return SourceLoad(name, run_class, backlog=backlog, wait_s=wait, wait_high_for_s=30.0,
                          helpers=helpers, max_helpers=most, throughput=throughput,
                          start_s=start_s)  # fmt: skip

    loads = [load("bulk-low", "low", low, 4), load("burst", "normal", normal, 4),
             load("urgent", "critical", critical, 2)]  # fmt: skip
    budget = sum(x.helpers for x in loads)
    decisions = decide(loads, FleetSettings(budget=budget))
    beneficiary = decisions[1]
    got = victims(decisions, beneficiary)
    assert [v.decision.load.source for v in got] == _plain_victims(
        decisions, beneficiary, set(), {}
    )


def _play(urgent_wait: float) -> list[SourceLoad]:
    """`urgent` arrives while the budget of 4 is full: `burst` (360 items, 250 left) and
    `bulk-low` (600, 500 left, the one that decides "all drained") with 2 helpers each, one
    process claiming 4 items/s, the run and two helpers each: 12 items/s per source."""
    return [
        SourceLoad("bulk-low", "low", backlog=500, wait_s=500 / 12, wait_high_for_s=30.0,
                   helpers=2, max_helpers=2, throughput=4.0, start_s=5.0),
        SourceLoad("burst", "normal", backlog=250, wait_s=250 / 12, wait_high_for_s=30.0,
                   helpers=2, max_helpers=2, throughput=4.0, start_s=5.0),
        SourceLoad("urgent", "critical", backlog=200, wait_s=urgent_wait, wait_high_for_s=2.0,
                   helpers=0, max_helpers=2, throughput=4.0, start_s=5.0),
    ]  # fmt: skip


def test_the_burst_gives_its_helper_and_the_source_that_decides_the_end_keeps_its_own() -> None:
    """The plays' preemption took `bulk-low`'s helper (lowest weight) and paid a second start
    on the source that decides "all drained"; `burst` without a helper still drains in 31 s,
    before `bulk-low`'s 42 s: its helper goes."""
    fleet = FleetSettings(budget=4)
    decisions = decide(_play(50.0), fleet)
    actions = plan_actions(decisions, fleet)
    assert actions.preempted == {"burst": "urgent"}, actions
    assert actions.victim_why["burst"].startswith("off the critical path: drains in 31.2 s")
    # the next round (the helper stopping): nothing more stopped while its slot frees
    stopping = [replace(x, stopping=1) if x.source == "burst" else x for x in _play(50.0)]
    assert plan_actions(decide(stopping, fleet), fleet).stop == {}
    # it ended, `urgent` got the slot: `burst` below its share does not take `bulk-low`'s
    after = with_helpers(_play(50.0), {"burst": 1, "urgent": 1})
    again = plan_actions(decide(after, fleet), fleet)
    assert "bulk-low" not in again.stop, again


def test_a_critical_source_still_gets_a_helper_from_the_source_that_decides_the_end() -> None:
    """Only `bulk-low` holds helpers (40 s to drain, 58.8 s without one): the critical source
    preempts it when the helper saves it more than the 18.8 s the stop costs the fleet's end
    (its run alone, 200 at 4/s: 50 s; 27.5 s with a helper 5 s away), not for 5.7 s (at 10/s:
    20 s, 14.3 s with one); a normal source short of its share does not, unless its own drain
    decides the end."""
    fleet = FleetSettings(budget=2)
    alone = [
        SourceLoad("bulk-low", "low", backlog=500, wait_s=40.0, helpers=2, max_helpers=2,
                   throughput=4.0),
        SourceLoad("urgent", "critical", backlog=200, wait_s=50.0, wait_high_for_s=2.0,
                   max_helpers=2, throughput=4.0, start_s=5.0),
    ]  # fmt: skip
    assert plan_actions(decide(alone, fleet), fleet).preempted == {"bulk-low": "urgent"}
    quick = [alone[0], replace(alone[1], wait_s=20.0, start_s=0.0)]
    assert plan_actions(decide(quick, fleet), fleet).preempted == {}
    normal = [alone[0], SourceLoad("burst", "normal", backlog=100, wait_s=20.0,
                                   wait_high_for_s=2.0, max_helpers=2, throughput=4.0)]  # fmt: skip
    assert plan_actions(decide(normal, fleet), fleet).preempted == {}
    longer = [alone[0], SourceLoad("burst", "normal", backlog=1000, wait_s=200.0,
                                   wait_high_for_s=2.0, max_helpers=2, throughput=4.0)]  # fmt: skip
    assert plan_actions(decide(longer, fleet), fleet).preempted == {"bulk-low": "burst"}
    # the open play's start: `burst` planned, nothing of it claims yet: its drain is not known
    unknown = [alone[0], SourceLoad("burst", "normal", backlog=360, wait_s=math.inf,
                                    wait_high_for_s=2.0, max_helpers=4)]  # fmt: skip
    assert decide(unknown, fleet)[1].share >= 1
    assert plan_actions(decide(unknown, fleet), fleet).preempted == {}


def _decided(
    loads: list[SourceLoad], fleet: FleetSettings, name: str
) -> tuple[list[Decision], Decision]:
    """The round's decisions, and the one for source ``name``."""
    decisions = decide(loads, fleet)
    return decisions, next(d for d in decisions if d.load.source == name)


def test_a_source_that_gave_its_helpers_to_a_critical_one_does_not_take_one_on_the_path() -> None:
    """The `capped` play of 2026-12-06 08:19: `urgent` took both of `burst`'s helpers; `burst`
    (its own run: 226 left at 4/s, 56.5 s) then took one from `bulk-low` (420 left at 12/s,
    35 s; 52.5 s without it), judged on its drain *before* the helper it was given. With that
    helper (7.5 s to arrive) `burst` drains in 32 s: the stop would move the fleet's end from
    35 s to 52.5 s for a source that then ends first. A longer `burst` still takes it."""
    fleet = FleetSettings(budget=4)
    loads = [
        SourceLoad("bulk-low", "low", backlog=420, wait_s=35.0, wait_high_for_s=30.0,
                   helpers=2, max_helpers=2, throughput=4.0, start_s=7.5),
        SourceLoad("burst", "normal", backlog=226, wait_s=56.5, wait_high_for_s=30.0,
                   helpers=0, max_helpers=2, throughput=4.0, start_s=7.5),
        SourceLoad("urgent", "critical", backlog=150, wait_s=12.5, wait_high_for_s=2.0,
                   helpers=2, max_helpers=2, throughput=4.0, start_s=7.5),
    ]  # fmt: skip
    decisions, burst = _decided(loads, fleet, "burst")
    assert burst.share > 0 and burst.want > 0  # it is short of its share
    assert victims(decisions, burst) == []
    assert plan_actions(decisions, fleet).preempted == {}
    longer = [loads[0], replace(loads[1], backlog=800, wait_s=200.0), loads[2]]
    assert plan_actions(decide(longer, fleet), fleet).preempted == {"bulk-low": "burst"}


def test_a_lower_stop_is_not_off_the_path_because_a_critical_source_is_not_served_yet() -> None:
    """The `open` play of 2026-12-06 08:51: `urgent` just requested, its own run claiming alone
    (200 due at 1.4/s: 142 s), not asking yet (its window not held); `burst`, short of its
    share, took a helper from `bulk-low` as "off the critical path" (74 s without it, the
    longest other `urgent`'s 142 s), and `urgent` took that helper from `burst` a moment later.
    `urgent` may still grow (0 of its 2): it is left out of the ends, and `bulk-low`'s stop is
    on the path, past `burst`'s own end: refused. At its cap, `urgent` counts again."""
    fleet = FleetSettings(budget=4)
    loads = [
        SourceLoad("bulk-low", "low", backlog=520, wait_s=520 / 9.0, wait_high_for_s=30.0,
                   helpers=3, max_helpers=4, throughput=2.5, start_s=5.0),
        SourceLoad("burst", "normal", backlog=250, wait_s=250 / 5.0, wait_high_for_s=30.0,
                   helpers=1, max_helpers=4, throughput=2.5, start_s=5.0),
        SourceLoad("urgent", "critical", backlog=200, wait_s=142.0, wait_high_for_s=0.0,
                   helpers=0, max_helpers=2, throughput=2.5, start_s=5.0),
    ]  # fmt: skip
    decisions, burst = _decided(loads, fleet, "burst")
    assert burst.share > burst.load.helpers  # short: it asks
    assert victims(decisions, burst) == []
    # `urgent` (its pool size asks one) takes `bulk-low`'s helper itself, with no detour
    assert plan_actions(decisions, fleet).preempted == {"bulk-low": "urgent"}
    capped = [*loads[:2], replace(loads[2], helpers=2, max_helpers=2)]
    found = victims(*_decided(capped, fleet, "burst"))
    assert [v.decision.load.source for v in found] == ["bulk-low"]


def test_a_critical_source_moves_the_end_no_later_than_its_helper_saves_it() -> None:
    """The `capped` play with preemption (runs 10 and 11 of 2026-12-06): `urgent` had taken one
    helper (on its way) and asked for its second; the only stop left was on the fleet's
    critical path (`bulk-low`: 40 s to drain, 60 s without one). The helper, 12 s away, would
    have drained `urgent` 4.3 s sooner (25 s -> 20.7 s) and the fleet 20 s later: refused. Once
    the helper saves more than the stop costs (a longer `urgent`), it is made."""
    fleet = FleetSettings(budget=4)
    loads = [
        SourceLoad("bulk-low", "low", backlog=480, wait_s=40.0, wait_high_for_s=30.0,
                   helpers=2, max_helpers=2, throughput=4.0, start_s=12.0),
        SourceLoad("burst", "normal", backlog=240, wait_s=30.0, wait_high_for_s=30.0,
                   helpers=1, max_helpers=2, throughput=4.0, start_s=12.0),
        SourceLoad("urgent", "critical", backlog=200, wait_s=50.0, wait_high_for_s=2.0,
                   helpers=1, coming=1, max_helpers=2, throughput=4.0, start_s=12.0),
    ]  # fmt: skip
    decisions, urgent = _decided(loads, fleet, "urgent")
    assert urgent.share > urgent.load.helpers  # short: it asks
    assert helper_gain_s(urgent.load) == Fraction(13, 3)
    assert victims(decisions, urgent) == []
    assert plan_actions(decisions, fleet).preempted == {}
    longer = [*loads[:2], replace(loads[2], backlog=1000, wait_s=250.0)]
    assert plan_actions(decide(longer, fleet), fleet).preempted == {"bulk-low": "urgent"}
