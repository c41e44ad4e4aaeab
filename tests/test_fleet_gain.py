"""The "no gain" rule (collector/fleet/model.py ``gained``, collector/fleet/tracker.py): a
helper whose arrival did not raise its source's claim rate (a source bound by its host's rate,
a box with no CPU left) caps the source's step-ups at the helpers it had before, across a step
down, for ``no_gain_keep_s``; a helper that claims its share leaves the source uncapped.
Against a plain model in exact fractions, and in virtual time on the tracker."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.fleet.model import FleetSettings, HelperStarts, gained, want
from collector.fleet.tracker import SourceTracker
from collector.frontier.base import Holder, StateCounts


def _plain_gained(
    rate_before: Fraction, processes_before: Fraction, rate_after: Fraction,
    processes_after: Fraction, added: int, min_share: Fraction,
) -> bool:  # fmt: skip
    """The rule as written: the processes there before at their old rate each, and
    ``min_share`` of that rate for each one added."""
    if processes_before <= 0 or rate_before <= 0:
        return rate_after > rate_before
    each = rate_before / processes_before
    return rate_after >= (processes_after - added) * each + added * min_share * each


rates = st.integers(0, 400).map(lambda x: Fraction(x, 4))
counts = st.integers(0, 48).map(lambda x: Fraction(x, 4))


@settings(max_examples=2000, deadline=None)
@given(rates, counts, rates, counts, st.integers(0, 6), st.sampled_from([0.25, 0.5, 1.0]))
def test_gained_equals_the_plain_rule(
    before: Fraction, p_before: Fraction, after: Fraction, p_after: Fraction, added: int,
    share: float,
) -> None:  # fmt: skip
    plain = _plain_gained(before, p_before, after, p_after, added, Fraction(str(share)))
    assert gained(float(before), float(p_before), float(after), float(p_after), added, share) == (
        plain
    )


@settings(max_examples=500, deadline=None)
@given(st.integers(1, 12), st.integers(1, 4), st.sampled_from([1.0, 2.5, 40.0]))
def test_a_process_that_claims_its_share_gains_and_one_that_adds_nothing_does_not(
    processes: int, added: int, each: float
) -> None:
    before = processes * each
    assert gained(before, processes, (processes + added) * each, processes + added, added, 0.5)
    assert not gained(before, processes, before, processes + added, added, 0.5)


def _play(
    host_rate: float, seconds: float, tracker: SourceTracker, fleet: FleetSettings,
    helper_at: float, helper_leaves_at: float = 1e9,
) -> list[tuple[float, int, str]]:  # fmt: skip
    """A source's own run claiming 40 items/s, a helper from ``helper_at`` (until
    ``helper_leaves_at``), the claims capped at ``host_rate`` items/s; every second the want
    of a source whose claim wait is high (a deep backlog). Returns (time, want, why)."""
    claimed, arrived, wants = 0.0, False, []
    for step in range(int(seconds * 10)):
        now = step / 10
        helper = helper_at <= now < helper_leaves_at
        claimed += min(40.0 * (1 + helper), host_rate) / 10
        ids = {"h1"} if helper else set()
        holders = [Holder("run", 2, now), *([Holder("h1", 2, now)] if helper else [])]
        tracker.sample(now, StateCounts(queued=100_000, done=int(claimed)), holders, ids)
        if helper and not arrived:
            arrived = True
            tracker.helpers_arrived(now, 1)
        if step % 10 == 0:
            load = tracker.load(now, len(ids))
            count, why, _ = want(load, fleet)
            wants.append((now, count, why))
    return wants


def _tracker(fleet: FleetSettings) -> SourceTracker:
    return SourceTracker("s", "normal", max_helpers=4, settings=fleet,
                         starts=HelperStarts(prior_s=5.0))  # fmt: skip


def test_a_helper_that_did_not_raise_the_rate_is_not_asked_for_again_until_the_keep_ran_out() -> (
    None
):
    fleet = FleetSettings(no_gain_keep_s=60.0)
    tracker = _tracker(fleet)
    # host-bound at 40/s: the helper from 12 s adds nothing; it leaves at 40 s (a step down)
    wants = _play(40.0, 120.0, tracker, fleet, helper_at=12.0, helper_leaves_at=40.0)
    before = [w for t, w, _ in wants if 2.0 <= t < 12.0]
    assert before and all(w >= 1 for w in before)  # a deep backlog: the claim wait asks
    judged = [(t, w, why) for t, w, why in wants if 23.0 <= t < 82.0]
    assert judged and all(w == min(1, w) for _, w, _ in judged), judged  # no second helper
    after_leaving = [(t, w, why) for t, w, why in judged if t >= 41.0]
    assert after_leaving and all(w == 0 for _, w, _ in after_leaving), after_leaving
    assert all("brought no gain" in why for _, _, why in after_leaving)
    again = [w for t, w, _ in wants if t >= 84.0]  # the keep (60 s from 22 s) ran out
    assert again and all(w >= 1 for w in again)


def test_a_helper_that_claims_its_share_leaves_the_source_uncapped() -> None:
    fleet = FleetSettings()
    tracker = _tracker(fleet)
    wants = _play(1e9, 40.0, tracker, fleet, helper_at=12.0)  # no host limit: 80/s with it
    assert all("no gain" not in why for _, _, why in wants)
    assert tracker.load(40.0, 1).no_gain_above is None
    assert [w for t, w, _ in wants if t >= 25.0][-1] >= 2  # it asks for more


def test_helpers_that_come_with_their_run_are_judged_on_its_work_not_the_wait_before() -> None:
    """Helpers started with their source's run (a forecast) arrive as the run's first claims
    begin: the seconds before, with nothing claiming, are not "the rate before". Counted over
    them, a run's first claims (two batches at once: fetch-ahead) over a process seen in a few
    samples made one process worth many, and the run's first two helpers "brought no gain
    (1.6/s before, 10.7/s after)" in the capped play of 2026-12-06 21:01."""
    fleet = FleetSettings(gain_window_s=10.0)
    tracker = SourceTracker("s", "low", max_helpers=4, settings=fleet, starts=HelperStarts())
    claimed = 0.0
    for step in range(300):  # 9.5 s of a run starting; its first claim takes two batches (6)
        now = step / 10  # then 4 items/s a process; two helpers from 10 s
        run = now >= 9.5
        helpers = {"h1", "h2"} if now >= 10.0 else set()
        claimed += 6.0 if step == 95 else 0.4 * (run + len(helpers))
        holders = [*([Holder("run", 2, now)] if run else []),
                   *(Holder(h, 2, now) for h in sorted(helpers))]  # fmt: skip
        tracker.sample(now, StateCounts(queued=600, done=int(claimed)), holders, helpers)
        if step == 100:
            tracker.helpers_arrived(now, 2, 2)
    assert tracker.no_gain is None  # too little work seen before them to judge: no verdict
