"""The learned schedule's fast paths against plain references (collector.policy.revisit_budget):
the rate kept as sums against the estimator over every interval, the class counts moved one
page at a time against counting every page again, the cached solve against solving every page
on its own; and the ``ttl.revisit`` settings' one-line problems."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.config import SourceError, load_source
from collector.frontier.base import PageHistory
from collector.policy.priority import PrioritySettings
from collector.policy.revisit import change_rate, revisit_intervals
from collector.policy.revisit_budget import (
    HISTORY_WINDOW,
    Budget,
    RevisitSchedule,
    class_of,
    class_rate,
    observed,
)
from collector.policy.ttl import TTLSettings
from tests.helpers import write_source

T0 = 1_700_000_000.0
_visits = st.lists(
    st.tuples(st.floats(min_value=60.0, max_value=5 * 86_400.0), st.booleans()),
    max_size=int(HISTORY_WINDOW),
)


@settings(max_examples=150, deadline=None)
@given(_visits)
def test_the_history_s_rate_is_the_estimator_over_its_intervals(
    visits: list[tuple[float, bool]],
) -> None:
    """Within the window the sums say exactly what the intervals said: the rate is
    change_rate's over the same intervals, the changed ones at their mean (regular visits)."""
    history, at = observed(None, at=T0, changed=True), T0
    for gap, changed in visits:
        at += gap
        history = observed(history, at=at, changed=changed)
    assert history.fetches == len(visits) + 1
    assert history.observed == len(visits)
    assert history.changes == sum(1 for _, c in visits if c)
    assert math.isclose(history.observed_s, sum(g for g, _ in visits), rel_tol=1e-9)
    assert history.last_fetched_at == at
    if not visits:
        assert history.rate == 0.0
        return
    gaps = [g for g, c in visits if c]
    mean = sum(gaps) / len(gaps) if gaps else 0.0
    want = change_rate(
        [mean] * len(gaps),
        [g for g, c in visits if not c],
        prior_s=sum(g for g, _ in visits) / len(visits),
    )
    assert math.isclose(history.rate, want, rel_tol=1e-6)


def test_past_the_window_old_intervals_fade_and_a_burst_is_followed() -> None:
    day = 86_400.0
    h, at = None, T0
    for _ in range(200):  # quiet for 200 days
        at += day
        h = observed(h, at=at, changed=False)
    assert h is not None and h.observed == HISTORY_WINDOW and h.fetches == 200
    quiet = h.rate
    for _ in range(25):  # then a change every visit
        at += day
        h = observed(h, at=at, changed=True)
    assert h.rate > 10 * quiet  # half the window changed: the rate follows, not 25 of 225
    assert h.last_changed_at == at
    # a fetch dated before the last (another worker's clock) counts, observes nothing
    late = observed(h, at=at - 10, changed=True)
    assert (late.fetches, late.observed, late.changes) == (h.fetches + 1, h.observed, h.changes)


_moves = st.lists(
    st.tuples(
        st.integers(0, 12),  # page
        st.sampled_from([None, 1e-6, 1e-5, 3e-5, 1e-4, 1e-3]),  # its new rate (None: gone)
        st.integers(1, 10),  # its weight
    ),
    min_size=1,
    max_size=60,
)


@pytest.mark.slow  # ~10-20 s: a plain solve of every page at each cached solve
@settings(max_examples=60, deadline=None)
@given(_moves, st.floats(min_value=1.0, max_value=200.0))
def test_counts_and_cached_solve_match_a_plain_recomputation(
    moves: list[tuple[int, float | None, int]], per_hour: float
) -> None:
    budget = Budget(budget_per_s=per_hour / 3_600, min_s=600.0, max_s=30 * 86_400.0)
    pages: dict[int, tuple[int, int]] = {}
    snapshot: dict[int, tuple[int, int]] = {}
    want: dict[tuple[int, int], float] = {}
    for page, rate, weight in moves:
        new = None if rate is None else class_of(rate, weight)
        budget.move(pages.get(page), new)
        if new is None:
            pages.pop(page, None)
        else:
            pages[page] = new
        # the incremental counts are the pages counted again
        assert budget.counts == Counter(pages.values())
        if not pages:
            continue
        key = next(iter(pages.values()))
        before = budget.solves
        got = budget.interval(key)
        if budget.solves > before:  # what the cached solve priced, solved page by page
            snapshot = dict(pages)
            keys = list(snapshot.values())
            plain = revisit_intervals(
                [class_rate(k) for k in keys],
                [float(k[1]) for k in keys],
                budget_per_s=budget.budget_per_s,
                min_s=budget.min_s,
                max_s=budget.max_s,
            )
            want = dict(zip(keys, plain, strict=True))
        # the cached answer is the plain one of the last solve
        assert key in want
        assert math.isclose(got, want[key], rel_tol=2e-3), (got, want[key])


def test_the_solve_is_redone_only_when_pages_moved_enough() -> None:
    budget = Budget(budget_per_s=0.1, min_s=600.0, max_s=30 * 86_400.0)
    slow, fast = class_of(1e-6, 5), class_of(1e-4, 5)
    for _ in range(1_000):
        budget.move(None, slow)
    budget.interval(slow)
    solves = budget.solves
    for _ in range(10):  # 1 % of the pages
        budget.move(slow, fast)
    budget.interval(fast)  # a class it never priced: solved again
    assert budget.solves == solves + 1
    budget.move(fast, slow)
    budget.interval(slow)
    assert budget.solves == solves + 1  # one page moved since: the cache stands


def test_fixed_keeps_the_rules_and_adaptive_spends_the_budget_within_bounds() -> None:
    priority = PrioritySettings(weight=5)
    fixed = RevisitSchedule(TTLSettings(default_fresh_s=3_600), priority)
    fresh_s, h = fixed.settled("https://a.test/1", None, at=T0, changed=True)
    assert (fresh_s, h.fetches) == (3_600, 1)
    ttl = TTLSettings(
        default_fresh_s=3_600, revisit="adaptive", budget_per_hour=10, min_fresh_s=900,
        max_fresh_s=86_400,
    )  # fmt: skip
    adaptive = RevisitSchedule(ttl, priority)
    hist: dict[str, PageHistory] = {}
    for i in range(100):  # half change every hour, half never
        url = f"https://a.test/{i}"
        _, hist[url] = adaptive.settled(url, None, at=T0, changed=True)
    intervals = {}
    for url, before in hist.items():
        changed = int(url.rsplit("/", 1)[1]) % 2 == 0
        intervals[url], hist[url] = adaptive.settled(url, before, at=T0 + 3_600, changed=changed)
    assert all(900 <= i <= 86_400 for i in intervals.values())
    # 10 fetches an hour for 100 pages: what is spent is about the budget
    assert adaptive.budget is not None
    assert adaptive.budget.pages == 100
    solved = adaptive.budget.solve()  # the classes as they are now: spends the budget
    spent = sum(n / solved[k] for k, n in adaptive.budget.counts.items()) * 3_600
    assert spent == pytest.approx(10, rel=0.01), spent
    # 0.1 fetch an hour a page follows neither well: the pages seen unchanged (slower) get more
    assert intervals["https://a.test/1"] < intervals["https://a.test/0"]


@pytest.mark.parametrize(
    ("ttl", "said"),
    [
        ({"revisit": "adaptive"}, "revisit: adaptive needs budget_per_hour"),
        ({"budget_per_hour": 100}, "budget_per_hour is only read with revisit: adaptive"),
        (
            {"revisit": "adaptive", "budget_per_hour": 5, "min_fresh_s": 10, "max_fresh_s": 5},
            "min_fresh_s (10 s) must be <= max_fresh_s (5 s)",
        ),
        ({"revisit": "sometimes"}, "revisit"),
        ({"revisit": "adaptive", "budget_per_hour": 0}, "budget_per_hour"),
        ({"min_gain_s": 60}, "min_gain_s is only read with revisit: adaptive"),
        ({"revisit": "adaptive", "budget_per_hour": 5, "min_gain_s": -1}, "min_gain_s"),
    ],
)
def test_bad_revisit_settings_are_one_line_each(
    tmp_path: Path, ttl: dict[str, object], said: str
) -> None:
    path = write_source(tmp_path, seeds={"urls": ["https://a.test/1"]}, ttl=ttl)
    with pytest.raises(SourceError) as caught:
        load_source(path)
    lines = [line for line in str(caught.value).splitlines() if said in line]
    assert len(lines) == 1, str(caught.value)
    assert "ttl" in lines[0], lines[0]
