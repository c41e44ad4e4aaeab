"""A source's learned revisit schedule: each settled page's history updated, and its next due
time drawn from its change rate and the source's request budget (``ttl.revisit: adaptive``).

The settle step calls :meth:`RevisitSchedule.settled` for every page it settles done (stored,
found unchanged, or answered 304), in both modes: the history is always kept, so switching a
source to ``adaptive`` starts from what its pages already showed. With ``revisit: fixed`` (the
default) the page is fresh for ``ttl.fresh_for(url)`` as before; with ``adaptive`` for the
interval the budget gives its class.

The budget is spent by :func:`collector.policy.revisit.revisit_intervals`, solved over *classes*
of pages (a change rate rounded to a quarter of a power of two, and the page's priority weight,
1..10), so one solve serves every page: at most a few hundred classes whatever the source's
size. The classes' counts are kept incrementally (a settled page moves from the class of the
history its claim handed out to that of its new one) and the solve is cached, redone when a
class appears that it did not price, or once ``RESOLVE_SHARE`` of the pages moved since.
``tests/test_revisit_budget.py`` compares both with a plain recomputation from every page.

Each process keeps its own counts, read from the frontier (:meth:`Frontier.histories`) when the
run plans (or a helper first settles): helpers of one source start from the same histories and
move the pages they settle, so their views drift apart by what the others settled since, at
most one run's worth; each run reads them afresh.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

from collector.frontier.base import PageHistory
from collector.policy.priority import PrioritySettings
from collector.policy.revisit import change_rate_of_sums, revisit_intervals
from collector.policy.ttl import TTLSettings

__all__ = [
    "HISTORY_WINDOW",
    "RESOLVE_SHARE",
    "Budget",
    "RevisitSchedule",
    "class_of",
    "class_rate",
    "observed",
]

HISTORY_WINDOW = 50.0  # observations a history weighs at most (older ones fade, see observed)
RESOLVE_SHARE = 0.05  # the budget is solved again once this share of the pages changed class
_STEPS_PER_DOUBLING = 4  # rate classes: a quarter of a power of two apart (~19 % wide)

Key = tuple[int, int]  # (rate class, weight)


def observed(history: PageHistory | None, *, at: float, changed: bool) -> PageHistory:
    """``history`` after a fetch settled at ``at`` that found the page ``changed`` (a new
    content hash) or not (an unchanged record, or a 304).

    The first fetch observes nothing (there is no interval before it); each later one adds
    the interval since the last. Past ``HISTORY_WINDOW`` observations the sums are scaled down
    together, so the last ~50 intervals decide (a page whose rate moved is followed). A fetch
    dated before the last one (clocks of two workers) counts as fetched, not as an interval.
    """
    h = history or PageHistory()
    changes, seen, seen_s, changed_s = h.changes, h.observed, h.observed_s, h.changed_s
    last_changed = h.last_changed_at
    last = h.last_fetched_at
    if last is not None and at > last:
        dt = at - last
        seen, seen_s = seen + 1, seen_s + dt
        if changed:
            changes, changed_s, last_changed = changes + 1, changed_s + dt, at
        if seen > HISTORY_WINDOW:
            k = HISTORY_WINDOW / seen
            changes, seen_s, changed_s = changes * k, seen_s * k, changed_s * k
            seen = HISTORY_WINDOW
    rate = (
        change_rate_of_sums(changes, changed_s, seen_s - changed_s, prior_s=seen_s / seen)
        if seen > 0
        else 0.0
    )
    newest = at if last is None else max(at, last)
    return PageHistory(h.fetches + 1, changes, seen, seen_s, changed_s, newest, last_changed, rate)


def class_of(rate: float, weight: int) -> Key:
    """The class of a page changing ``rate`` times a second, of priority ``weight``."""
    return (round(_STEPS_PER_DOUBLING * math.log2(max(rate, 1e-12))), weight)


def class_rate(key: Key) -> float:
    """The rate a class stands for."""
    return float(2.0 ** (key[0] / _STEPS_PER_DOUBLING))


class Budget:
    """Pages counted by class, and the intervals that spend ``budget_per_s`` over them.

    The fast path of :func:`revisit_intervals` over every page: counts moved one page at a
    time, the solve cached (see the module docstring for when it is redone).
    """

    def __init__(
        self, *, budget_per_s: float, min_s: float, max_s: float, min_gain: float = 0.0
    ) -> None:
        self.budget_per_s, self.min_s, self.max_s = budget_per_s, min_s, max_s
        self.min_gain = min_gain
        self.counts: Counter[Key] = Counter()
        self._intervals: dict[Key, float] = {}
        self._moved = 0
        self.solves = 0

    @property
    def pages(self) -> int:
        return sum(self.counts.values())

    def move(self, old: Key | None, new: Key | None) -> None:
        """One page left class ``old`` (None: it was not counted) for ``new`` (None: gone)."""
        if old == new:
            return
        if old is not None and self.counts[old] > 0:
            self.counts[old] -= 1
            if not self.counts[old]:
                del self.counts[old]
        if new is not None:
            self.counts[new] += 1
        self._moved += 1

    @property
    def stale(self) -> bool:
        """Enough pages moved since the last solve that the next interval solves again."""
        return self._moved > RESOLVE_SHARE * self.pages

    def interval(self, key: Key) -> float:
        """The revisit interval of a page of class ``key`` (counted), solved if due."""
        if key not in self._intervals or self.stale:
            self.solve()
        return self._intervals.get(key, self.max_s)

    def solve(self) -> dict[Key, float]:
        """Price the budget over the classes as they are now (the cache's one writer)."""
        keys = sorted(self.counts)
        intervals = revisit_intervals(
            [class_rate(k) for k in keys],
            [float(k[1]) for k in keys],
            budget_per_s=self.budget_per_s,
            min_s=self.min_s,
            max_s=self.max_s,
            counts=[self.counts[k] for k in keys],
            min_gain=self.min_gain,
        )
        self._intervals = dict(zip(keys, intervals, strict=True))
        self._moved = 0
        self.solves += 1
        return dict(self._intervals)


class RevisitSchedule:
    """One source's revisit decisions: the history update, and the next due time."""

    def __init__(self, ttl: TTLSettings, priority: PrioritySettings) -> None:
        self.ttl, self.priority = ttl, priority
        self.adaptive = ttl.revisit == "adaptive"
        self.budget: Budget | None = None
        if self.adaptive:
            assert ttl.budget_per_hour is not None  # checked when the source loads
            self.budget = Budget(
                budget_per_s=ttl.budget_per_hour / 3_600.0,
                min_s=ttl.min_fresh_s,
                max_s=ttl.max_fresh_s,
                # in the solve's units: weighted seconds (a page of weight w gains w dF/df)
                min_gain=ttl.min_gain_s * priority.weight,
            )

    def key(self, url: str, history: PageHistory | None) -> Key | None:
        """A page's class; a page never settled has none (it is not counted yet). One settled
        once, with no interval seen, is taken to change once per its fixed TTL."""
        if history is None:
            return None
        weight, _ = self.priority.weight_and_cost(url)
        rate = history.rate
        if rate <= 0:
            rate = 1.0 / max(self.ttl.fresh_for(url), 1.0)
        return class_of(rate, weight)

    def load(self, histories: Iterable[tuple[str, PageHistory]]) -> int:
        """Count the pages the frontier holds histories of (a run's start); how many."""
        if self.budget is None:
            return 0
        budget = Budget(
            budget_per_s=self.budget.budget_per_s,
            min_s=self.budget.min_s,
            max_s=self.budget.max_s,
            min_gain=self.budget.min_gain,
        )
        for url, history in histories:
            budget.move(None, self.key(url, history))
        self.budget = budget
        return budget.pages

    def settled(
        self, url: str, before: PageHistory | None, *, at: float, changed: bool
    ) -> tuple[float, PageHistory]:
        """A page settled done at ``at``: (seconds it stays fresh, its new history).

        ``before`` is the history its claim handed out (the page's class until now).
        """
        after = observed(before, at=at, changed=changed)
        if self.budget is None:
            return self.ttl.fresh_for(url), after
        key = self.key(url, after)
        self.budget.move(self.key(url, before), key)
        assert key is not None
        return self.budget.interval(key), after
