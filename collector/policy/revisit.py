"""Revisit intervals learned from each page's history: how often it changes, and how often it
is worth fetching under a request budget.

Pure functions, no I/O (collector.policy.revisit_budget applies them to the histories the
frontier keeps, docs/revisits.md "Learned revisit intervals"; ``bench/freshness.py`` measures
them in simulated time):

* :func:`change_rate`: a page's Poisson change rate from what its fetches saw. A fetch only
  tells whether the page changed *at least once* since the last one (a changed body, or a 200
  after a 304-able request), never how often, so the naive "changes / time" under-counts fast
  pages and says 0 for a page seen unchanged ten times. The maximum-likelihood estimate for a
  Poisson process watched at irregular intervals (Cho and Garcia-Molina, "Estimating frequency
  of change", 2003) solves ``sum_changed t e^{-lt} / (1 - e^{-lt}) = sum_unchanged t``; with
  half an observation of each kind added (their bias-reducing 0.5), a page seen only unchanged
  gets a small rate that falls as the unchanged visits pile up, and one seen only changed a
  large but finite one. :func:`change_rate_of_sums` is the same from the sums a frontier keeps.
* :func:`revisit_intervals`: given each page's rate and weight (its priority) and a budget of
  fetches per second, the fetch frequencies that maximise the weighted expected freshness
  ``sum w F(l, f)``, ``F = (f / l) (1 - e^{-l / f})`` (the share of time a copy fetched every
  ``1/f`` matches a page changing at rate ``l``), under ``sum f = budget``: the Lagrange condition
  ``w dF/df = mu`` per page, ``mu`` found by bisection. Pages that change faster than the budget
  can follow get *less* attention, not more (fetching them buys little freshness), which is
  what beats a fixed TTL; the intervals are then kept within ``[min_s, max_s]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["change_rate", "change_rate_of_sums", "freshness", "revisit_intervals"]

_PRIOR = 0.5  # half a changed and half an unchanged observation (Cho and Garcia-Molina's bias fix)


def _score(rate: float, changed: Sequence[float], unchanged_s: float) -> float:
    """d/d(rate) of the log-likelihood (decreasing in rate); changed intervals in seconds."""
    total = -unchanged_s
    for t in changed:
        x = rate * t
        total += t / math.expm1(x) if x < 700 else 0.0
    return total


def change_rate(
    changed_s: Sequence[float], unchanged_s: Sequence[float], *, prior_s: float | None = None
) -> float:
    """Changes per second of a page whose fetches found it changed after each interval of
    ``changed_s`` and unchanged after each of ``unchanged_s`` (seconds since the fetch before).

    ``prior_s``: the length of the half-observations added to each side (default: the mean of
    all intervals), so that a history of one kind only still has an estimate. An empty history
    has none: 0.0.
    """
    intervals = [*changed_s, *unchanged_s]
    if not intervals:
        return 0.0
    prior = prior_s if prior_s is not None else sum(intervals) / len(intervals)
    if prior <= 0:
        raise ValueError(f"change_rate: intervals must be positive, got a mean of {prior}")
    # the prior: half an interval of each kind (a changed one weighs t / (e^{lt} - 1) x 0.5)
    changed = list(changed_s)
    quiet = sum(unchanged_s) + _PRIOR * prior

    def score(rate: float) -> float:
        return _score(rate, changed, quiet) + _PRIOR * prior / math.expm1(rate * prior)

    low, high = 1e-12 / prior, 1.0 / prior
    while score(high) > 0:  # the root is above: widen (the score falls to -quiet < 0)
        low, high = high, high * 4
    for _ in range(200):
        mid = math.sqrt(low * high)
        if score(mid) > 0:
            low = mid
        else:
            high = mid
        if high - low <= 1e-12 * high:
            break
    return math.sqrt(low * high)


def change_rate_of_sums(
    changes: float, changed_s: float, unchanged_s: float, *, prior_s: float
) -> float:
    """:func:`change_rate` of a history kept as sums (what a frontier stores per page): its
    ``changes`` changed intervals taken as ``changed_s / changes`` each (exact for regular
    visits), ``unchanged_s`` the length of the unchanged ones, ``prior_s`` the mean interval.
    Counts may be fractions (a history scaled down to its window). 0.0 without a prior."""
    if prior_s <= 0:
        return 0.0
    mean = changed_s / changes if changes > 0 else 0.0
    quiet = unchanged_s + _PRIOR * prior_s

    def score(rate: float) -> float:
        total = _PRIOR * prior_s / math.expm1(rate * prior_s) - quiet
        if mean > 0:
            x = rate * mean
            total += changes * mean / math.expm1(x) if x < 700 else 0.0
        return total

    low, high = 1e-12 / prior_s, 1.0 / prior_s
    while score(high) > 0:
        low, high = high, high * 4
    while high - low > 1e-9 * high:  # bisection in log space: ~35 steps
        mid = math.sqrt(low * high)
        if score(mid) > 0:
            low = mid
        else:
            high = mid
    return math.sqrt(low * high)


def freshness(rate: float, frequency: float) -> float:
    """Expected share of time a copy fetched ``frequency`` times a second matches a page that
    changes ``rate`` times a second (Poisson): ``(f / l) (1 - e^{-l / f})``; 1 for a page that
    never changes, 0 for one never fetched that does."""
    if rate <= 0:
        return 1.0
    if frequency <= 0:
        return 0.0
    x = rate / frequency
    return -math.expm1(-x) / x


def _marginal(rate: float, frequency: float) -> float:
    """dF/df: what one more fetch a second buys a page."""
    if rate <= 0:
        return 0.0
    if frequency <= 0:
        return 1.0 / rate  # the limit as f -> 0 of (1 - e^{-x}(1 + x)) / l, x = l / f -> inf
    x = rate / frequency
    return (-math.expm1(-x) - x * math.exp(-x)) / rate


def _frequency_for(rate: float, weight: float, mu: float) -> float:
    """The frequency where ``weight * dF/df == mu`` (dF/df falls with f), 0 when even the first
    fetch is worth less than ``mu``.

    In ``x = rate / f``: ``dF/df = g(x) / rate`` with ``g(x) = 1 - e^{-x}(1 + x)``, rising from
    0 to 1, so ``x`` solves ``g(x) = mu rate / weight``: Newton's steps (``g' = x e^{-x}``) kept
    inside a shrinking bracket, a halving when a step would leave it (a few steps, not the
    hundred a bisection in ``f`` takes).
    """
    if rate <= 0 or weight * _marginal(rate, 0.0) <= mu:
        return 0.0
    target = mu * rate / weight
    if target <= 0:
        return math.inf
    low, high = 0.0, 1.0
    while _g(high) < target:
        low, high = high, high * 2
    x = (low + high) / 2
    for _ in range(200):
        value = _g(x) - target
        if value > 0:
            high = x
        else:
            low = x
        slope = x * math.exp(-x)
        step = x - value / slope if slope > 0 else (low + high) / 2
        if not low < step < high:
            step = (low + high) / 2
        if abs(step - x) <= 1e-13 * x or high - low <= 1e-13 * high:
            x = step
            break
        x = step
    return rate / x


def _g(x: float) -> float:
    """``1 - e^{-x}(1 + x)`` (its series below 1e-3, where the difference loses digits)."""
    if x < 1e-3:
        return x * x * (0.5 - x / 3 + x * x / 8)
    return -math.expm1(-x) - x * math.exp(-x)


def revisit_intervals(
    rates: Sequence[float],
    weights: Sequence[float],
    *,
    budget_per_s: float,
    min_s: float,
    max_s: float,
    counts: Sequence[int] | None = None,
    min_gain: float = 0.0,
) -> list[float]:
    """Each page's revisit interval (seconds, within ``[min_s, max_s]``) that spends at most
    ``budget_per_s`` fetches a second where they keep the most weighted freshness.

    ``counts``: how many pages each entry stands for (pages of one rate and weight share their
    optimum, so a source's pages can be solved as a few classes); one each by default.

    ``min_gain``: the least a fetch must buy, in weighted seconds of freshness (``w dF/df``: one
    more fetch of a page keeps its copy fresh ``dF/df`` seconds longer on average). It is a
    floor under the budget's price: where the budget would buy fetches worth less (pages that
    never change, pages already fetched about as often as they change), it is left unspent.
    0 spends the whole budget.

    A page that gets no fetch from the optimum (it changes too fast to be worth it, or never) is
    given ``max_s``: bounds are the user's promise, the optimum is only advice within them.
    """
    if len(rates) != len(weights):
        raise ValueError("revisit_intervals: one weight per rate")
    if budget_per_s <= 0 or not rates:
        return [max_s] * len(rates)
    n = list(counts) if counts is not None else [1] * len(rates)
    top = max((w * _marginal(r, 0.0) for r, w in zip(rates, weights, strict=True)), default=0.0)
    if top <= 0:
        return [max_s] * len(rates)
    # The bounds change what the optimum spends (a page clamped to max_s still costs 1/max_s,
    # one clamped to min_s less than it asked): the budget handed to the optimum is corrected
    # by what the clamped intervals really spend, a few times over.
    spend = max(budget_per_s - sum(n) / max_s, 0.0)
    intervals = [max_s] * len(rates)
    if top <= min_gain:  # not even the first fetch of any page is worth the price
        return intervals
    for _ in range(6):
        if spend <= 0:
            break
        frequencies, priced = _optimum(rates, weights, n, spend, top, min_gain)
        intervals = _bounded(frequencies, min_s, max_s)
        if priced:  # the floor, not the budget, set the price: what it spends is all it wants
            break
        spent = sum(k / i for k, i in zip(n, intervals, strict=True))
        if abs(spent - budget_per_s) <= 1e-3 * budget_per_s:
            break
        spend = max(spend + budget_per_s - spent, 0.0)
    return intervals


def _bounded(frequencies: list[float], min_s: float, max_s: float) -> list[float]:
    return [min(max(max_s if f <= 0 else 1.0 / f, min_s), max_s) for f in frequencies]


def _optimum(
    rates: Sequence[float],
    weights: Sequence[float],
    n: list[int],
    spend: float,
    top: float,
    floor: float,
) -> tuple[list[float], bool]:
    """Frequencies that spend at most ``spend`` fetches a second (``n`` pages per entry) at one
    price, never below ``floor``; and whether the floor set it (the budget was not binding)."""
    if floor > 0:
        at_floor = [_frequency_for(r, w, floor) for r, w in zip(rates, weights, strict=True)]
        if sum(k * f for k, f in zip(n, at_floor, strict=True)) <= spend:
            return at_floor, True
    low, high = floor, top  # mu: the price of one fetch a second
    for _ in range(60):
        mu = (low + high) / 2
        total = sum(k * _frequency_for(r, w, mu) for r, w, k in zip(rates, weights, n, strict=True))
        if total > spend:
            low = mu
        else:
            high = mu
    # Between the two last prices: where the pages' gains are flat (a page far faster than the
    # budget can follow), one price step moves many fetches, finer than a double can say. The
    # frequencies at the higher price (spending at most the budget) get the rest of it in the
    # share each page moves between the two prices.
    under = [_frequency_for(r, w, high) for r, w in zip(rates, weights, strict=True)]
    if low <= 0:  # the budget buys more than every page wants
        return under, False
    over = [_frequency_for(r, w, low) for r, w in zip(rates, weights, strict=True)]
    below = sum(k * f for k, f in zip(n, under, strict=True))
    above = sum(k * f for k, f in zip(n, over, strict=True))
    if above <= below:
        return under, False
    share = min(max((spend - below) / (above - below), 0.0), 1.0)
    return [u + share * (o - u) for u, o in zip(under, over, strict=True)], False
