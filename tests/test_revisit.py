"""Learned revisit intervals (collector.policy.revisit) against plain references: the change
rate against a grid search of the same likelihood, the budget split against a greedy allocation
of small fetch increments (optimal for concave freshness), on generated histories and pages."""

from __future__ import annotations

import functools
import math
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.policy.revisit import change_rate, freshness, revisit_intervals

_interval = st.floats(min_value=60.0, max_value=7 * 86_400.0)


def _log_likelihood(
    rate: float, changed: list[float], unchanged: list[float], prior: float
) -> float:
    """The plain reading: a changed interval t has probability 1 - e^{-rt}, an unchanged one
    e^{-rt}; plus half an observation of each kind of length ``prior``."""
    total = sum(math.log(-math.expm1(-rate * t)) for t in changed)
    total -= rate * sum(unchanged)
    total += 0.5 * math.log(-math.expm1(-rate * prior)) - 0.5 * rate * prior
    return total


@settings(max_examples=150, deadline=None)
@given(st.lists(_interval, max_size=12), st.lists(_interval, max_size=12))
def test_the_rate_is_the_likelihood_s_maximum(changed: list[float], unchanged: list[float]) -> None:
    if not changed and not unchanged:
        assert change_rate(changed, unchanged) == 0.0
        return
    prior = (sum(changed) + sum(unchanged)) / (len(changed) + len(unchanged))
    got = change_rate(changed, unchanged)
    grid = [
        math.exp(math.log(1e-9) + i * (math.log(1.0) - math.log(1e-9)) / 4000) for i in range(4001)
    ]
    best = max(grid, key=lambda r: _log_likelihood(r, changed, unchanged, prior))
    assert (
        _log_likelihood(got, changed, unchanged, prior)
        >= _log_likelihood(best, changed, unchanged, prior) - 1e-6
    )
    assert got > 0


def test_unchanged_visits_lower_the_rate_and_changes_raise_it() -> None:
    day = 86_400.0
    rates = [change_rate([], [day] * n) for n in (1, 5, 20, 100)]
    assert all(a > b for a, b in pairwise(rates))  # never 0, ever smaller
    hourly = change_rate([3600.0] * 30, [3600.0] * 10)
    assert 0.9 / 3600 < hourly < 2.0 / 3600  # e^{-l h} ~ 10/40: l ~ 1.4 / h
    assert change_rate([3600.0] * 10, []) > hourly  # only changes: large, finite


def _weighted(rates: list[float], weights: list[float], intervals: list[float]) -> float:
    return sum(w * freshness(r, 1 / i) for r, w, i in zip(rates, weights, intervals, strict=True))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([0.0, 1 / 86_400, 1 / 3_600, 1 / 600, 1 / 60]),
            st.integers(1, 10),
        ),
        min_size=1,
        max_size=8,
    ),
    st.floats(min_value=0.5, max_value=4.0),
    st.sampled_from([0.0, 0.0, 60.0, 600.0, 3_600.0, 20_000.0]),
)
def test_the_split_is_as_good_as_a_greedy_one(
    pages: list[tuple[float, int]], scale: float, floor: float
) -> None:
    """The split maximises weighted freshness, less ``min_gain`` per fetch a second, within the
    budget. The reference: the budget in 2,000 small steps, each to the page it helps most,
    stopping once the best next step buys less than the floor (0: the whole budget)."""
    rates = [r for r, _ in pages]
    weights = [float(w) for _, w in pages]
    min_s, max_s = 1.0, 1e9
    budget = scale * len(pages) / 3_600  # fetches a second
    got = revisit_intervals(
        rates, weights, budget_per_s=budget, min_s=min_s, max_s=max_s, min_gain=floor
    )
    spent = sum(1 / i for i in got)
    assert spent <= budget * 1.01 + len(pages) / max_s
    step = budget / 2_000
    freq = [0.0] * len(pages)
    for _ in range(2_000):
        gains = [
            w * (freshness(r, f + step) - freshness(r, f)) if r > 0 else 0.0
            for r, w, f in zip(rates, weights, freq, strict=True)
        ]
        best = max(range(len(pages)), key=gains.__getitem__)
        if gains[best] < floor * step:
            break
        freq[best] += step
    greedy = [1 / f if f > 0 else max_s for f in freq]

    def value(intervals: list[float]) -> float:
        return _weighted(rates, weights, intervals) - floor * sum(1 / i for i in intervals)

    assert value(got) >= value(greedy) - 1e-3 * sum(weights)


def test_a_gain_floor_leaves_the_budget_unspent_where_fetches_buy_little() -> None:
    """Pages that change once a day and pages that never do, a budget of one fetch a minute
    each: without a floor the daily pages take all they can (every min_s); with a floor of an
    hour of freshness a fetch, each is fetched where one more fetch still buys an hour, and the
    pages that never change at max_s."""
    rates, weights = [1 / 86_400] * 5 + [0.0] * 5, [1.0] * 10
    solve = functools.partial(
        revisit_intervals, rates, weights, budget_per_s=10 / 60, min_s=60.0, max_s=30 * 86_400.0
    )
    spend_all = solve()
    floored = solve(min_gain=3_600.0)
    assert spend_all[:5] == [60.0] * 5
    assert all(i == 30 * 86_400.0 for i in floored[5:])
    daily = floored[0]
    assert sum(1 / i for i in floored) < 0.01 * 10 / 60  # a few fetches a day, not 1,440 a page
    # one more fetch of a daily page at its interval buys about the floor (dF/df = 3,600 s)
    f, df = 1 / daily, 1e-9
    gain = (freshness(1 / 86_400, f + df) - freshness(1 / 86_400, f)) / df
    assert gain == pytest.approx(3_600.0, rel=1e-3)
    # a floor above what the first fetch of any page buys: nothing is worth fetching
    assert solve(min_gain=1e6) == [30 * 86_400.0] * 10


def test_bounds_are_kept() -> None:
    got = revisit_intervals(
        [1 / 60, 0.0, 1 / 86_400], [5, 5, 5], budget_per_s=1.0, min_s=300, max_s=86_400
    )
    assert all(300 <= i <= 86_400 for i in got)
    assert got[1] == 86_400  # never changes: the longest
