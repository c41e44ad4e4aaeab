"""The forecast (collector/fleet/forecast.py): while a source's own run is on its way and nothing
of it claims, the autoscaler sizes its helpers by what that run is expected to plan, so they
start with the run instead of a plan and a process start after it (docs/fleet.md, "Forecast").

- the seed count agrees with the plain count of the seed list on generated lists;
- what a plan is expected to leave due, on a real SQLite frontier: every seed of a source never
  planned, nothing of one planned and fresh, the due items and the new seeds otherwise;
- in virtual time: a run on its way with a long list gets its pool before it claims, a short
  list none; the forecast stops standing in once the run planned and claims; the throughput is
  the last one measured for the source, else the prior; and with the plays' eight sources the
  first decision already gives the budget to the two long ones by class (the fixed split's
  helpers, without an operator choosing them).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.backends import open_frontier
from collector.config import Source, load_source
from collector.fleet.forecast import expected_due, prior_throughput
from collector.fleet.model import FleetSettings, ScalingRules, decide, plan_actions
from collector.fleet.tracker import SourceTracker
from collector.frontier.base import Completed, Holder, Offer, StateCounts
from tests.helpers import write_source

T0 = 1_700_000_000.0
URL = "http://127.0.0.1:9/items/{i}.json"

_lines = st.lists(
    st.one_of(
        st.integers(0, 50).map(lambda i: URL.format(i=i)),  # repeats on purpose
        st.sampled_from(["", "   ", "# a comment", "  # indented comment", "\t"]),
        st.integers(0, 50).map(lambda i: f"  {URL.format(i=i)}  "),
    ),
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(
    urls=st.lists(st.integers(0, 50).map(lambda i: URL.format(i=i)), max_size=5),
    lines=st.one_of(st.none(), _lines),
    span=st.one_of(st.none(), st.tuples(st.integers(0, 40), st.integers(0, 40))),
)
def test_the_seed_count_is_the_seed_lists_length(
    tmp_path_factory: pytest.TempPathFactory, urls: list[str], lines: list[str] | None,
    span: tuple[int, int] | None,
) -> None:  # fmt: skip
    folder = tmp_path_factory.mktemp("seeds")
    seeds: dict[str, object] = {}
    if urls:
        seeds["urls"] = urls
    if lines is not None:
        (folder / "seeds.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        seeds["file"] = "seeds.txt"
    if span is not None:
        seeds["template"] = "http://127.0.0.1:9/t/{i}"
        seeds["range"] = [min(span), max(span)]
    if not seeds:
        seeds["urls"] = [URL.format(i=0)]
    source = load_source(write_source(folder, seeds=seeds))
    assert source.seed_count() == sum(1 for _ in source.seed_urls())  # the plain reference


def _source(folder: Path, count: int, concurrency: int = 2) -> Source:
    path = write_source(folder, name="fc", seeds={"urls": [URL.format(i=i) for i in range(count)]},
                        limits={"concurrency": concurrency})  # fmt: skip
    return load_source(path)


def test_what_a_plan_is_expected_to_leave_due_on_a_real_frontier(tmp_path: Path) -> None:
    source = _source(tmp_path, 10)
    frontier = open_frontier(source)
    try:
        name = source.name
        assert expected_due(frontier, source, now=T0) == 10  # never planned: every seed
        rank = lambda u, age, fresh: 1.0  # noqa: E731
        frontier.offer(name, [Offer(URL.format(i=i), 100.0) for i in range(10)], now=T0,
                       queue_ttl_s=3600, rank_for=rank, run_id="r1")  # fmt: skip
        assert expected_due(frontier, source, now=T0) == 10  # planned, all queued
        lease = frontier.claim(name, 10, now=T0, lease_s=60)
        short = {URL.format(i=i) for i in range(3)}  # three go stale after 10 s
        outcomes = [Completed(item.url, fresh_until=T0 + (10 if item.url in short else 1e6),
                              fetched_at=T0) for item in lease.items]  # fmt: skip
        assert frontier.ack(lease, outcomes, now=T0).accepted == 10
        assert expected_due(frontier, source, now=T0 + 1) == 0  # all fresh
        assert expected_due(frontier, source, now=T0 + 20) == 3  # three stale
        grown = _source(tmp_path, 15)  # the list grew by five
        assert expected_due(frontier, grown, now=T0 + 20) == 3 + 5
    finally:
        frontier.close()
    assert prior_throughput(_source(tmp_path, 1, concurrency=4)) == 4.0


FLEET = FleetSettings(budget=4, wait_high_s=0.05, wait_held_s=1.0)


def _tracker(name: str, run_class: str, cap: int, prior: float = 2.0) -> SourceTracker:
    return SourceTracker(name, run_class, max_helpers=cap, settings=FLEET, rules=ScalingRules(),
                         prior_throughput=prior)  # fmt: skip


def test_a_run_on_its_way_with_a_long_list_gets_its_pool_before_it_claims() -> None:
    tracker = _tracker("bulk", "low", 4)
    for step in range(10):  # its run is starting: nothing in the frontier yet
        tracker.sample(step * 0.1, StateCounts(), [], set())
    plain = tracker.load(1.0, 0, coming=1)
    assert plain.backlog == 0 and decide([plain], FLEET)[0].want == 0  # without: nothing
    load = tracker.load(1.0, 0, coming=1, forecast=600)
    assert load.backlog == 600 and math.isinf(load.wait_s) and load.forecast == 600
    assert load.throughput == 2.0  # the prior: nothing measured yet
    (decision,) = decide([load], FLEET)
    # 600 x 0.8 / (2/s x 60 s) = 4 processes: its run and 3 helpers
    assert decision.want == 3 and "expected once its run planned" in decision.why
    short = tracker.load(1.0, 0, coming=1, forecast=30)
    assert decide([short], FLEET)[0].want == 0  # its run alone drains 30 within the horizon


def test_the_forecast_gives_way_to_the_frontier_once_the_run_claims() -> None:
    tracker = _tracker("bulk", "low", 4)
    for step in range(30):  # planned 600, claiming 4/s for 3 s
        now = step * 0.1
        counts = StateCounts(queued=600 - 4 * step // 10, leased=2, done=4 * step // 10)
        tracker.sample(now, counts, [Holder("run", 2, now)], set())
    load = tracker.load(3.0, 0, coming=0, forecast=600)
    assert load.forecast == 0 and math.isfinite(load.wait_s)  # measured now: no forecast
    assert load.backlog < 600
    assert math.isclose(load.throughput or 0, 4.0, rel_tol=0.2)  # measured, not the prior
    # its next run, on its way again: sized by what was measured, not by the prior
    for step in range(40):
        tracker.sample(10 + step * 0.1, StateCounts(done=600), [], set())
    again = tracker.load(14.0, 0, coming=1, forecast=600)
    assert again.forecast == 600 and math.isclose(again.throughput or 0, 4.0, rel_tol=0.2)


def test_the_first_decision_gives_the_long_sources_the_budget_by_class() -> None:
    """The plays' eight sources (tests/fleet_world.py): all requested at once, none planned."""
    plays = [("crit-a", "critical", 30, 1), ("high-a", "high", 30, 1), ("high-b", "high", 30, 1),
             ("norm-b", "normal", 30, 1), ("low-b", "low", 30, 1), ("burst", "normal", 360, 2),
             ("bulk-low", "low", 600, 2)]  # fmt: skip
    loads = []
    for name, run_class, items, cap in plays:
        tracker = _tracker(name, run_class, cap)
        tracker.sample(0.0, StateCounts(), [], set())
        loads.append(tracker.load(0.5, 0, coming=1, forecast=items))
    decisions = decide(loads, FLEET)
    actions = plan_actions(decisions, FLEET)
    assert actions.start == {"burst": 2, "bulk-low": 2}  # the small ones drain in their run
    assert not actions.stop


def test_no_helper_is_preempted_for_a_forecast_only_for_a_need_measured() -> None:
    """A critical source requested while the budget is full: its forecast starts helpers into
    free slots only; a lower class's helper is stopped for it once its run claims and its
    claim wait is measured (the other drains known by then: a stop chosen blind took the
    fleet's long pole, a `bulk-low` helper that had not claimed yet, 2026-12-06 21:12)."""
    busy = []
    for name, run_class in (("burst", "normal"), ("bulk-low", "low")):
        tracker = _tracker(name, run_class, 2)
        for step in range(30):  # planned, claiming 12 items/s with its run and 2 helpers
            now = step * 0.1
            counts = StateCounts(queued=1000 - 12 * step // 10, done=12 * step // 10)
            holders = [Holder(h, 2, now) for h in ("run", "h1", "h2")]
            tracker.sample(now, counts, holders, {"h1", "h2"})
        busy.append(tracker.load(3.0, 2))
    urgent = _tracker("urgent", "critical", 2)
    urgent.sample(0.0, StateCounts(), [], set())
    forecast = urgent.load(3.0, 0, coming=1, forecast=200)
    decisions = decide([*busy, forecast], FLEET)
    assert {d.load.source: d.want for d in decisions}["urgent"] == 1  # 200 x 0.8 / 120: 2
    actions = plan_actions(decisions, FLEET)
    assert not actions.stop and not actions.start  # the budget is full: it waits for its run
    for step in range(40):  # its run planned and claims 2/s: a wait of 100 s, held
        now = 3.0 + step * 0.1
        counts = StateCounts(queued=200 - 2 * step // 10, done=2 * step // 10)
        urgent.sample(now, counts, [Holder("run", 2, now)], set())
    measured = urgent.load(7.0, 0, coming=0, forecast=200)
    assert measured.forecast == 0
    actions = plan_actions(decide([*busy, measured], FLEET), FLEET)
    assert actions.preempted and set(actions.preempted.values()) == {"urgent"}


def test_no_forecast_while_a_process_of_the_source_holds_leases() -> None:
    """A second run waits for its source's lock while the first drains the frontier: the
    figures of the one working are measured, and a forecast read a while ago (600 due) must
    not stand in for them, even once the queue is empty and its last batch is in hand."""
    tracker = _tracker("s", "normal", 4)
    for step in range(30):
        now = step * 0.1
        counts = StateCounts(queued=0, leased=3, done=597)  # the last batch, held
        tracker.sample(now, counts, [Holder("first-run", 3, now)], set())
    load = tracker.load(3.0, 0, coming=1, forecast=600)
    assert load.forecast == 0 and load.backlog == 0
    assert decide([load], FLEET)[0].want == 0
