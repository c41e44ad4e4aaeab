"""Which queued item is worth fetching next.

The score of an item is::

    base  = urgency(age) x weight x RETRY_PENALTY**retries x 1 / (1 + COST_FACTOR x cost)
    score = base + aging_rate x (waited + CRITICAL_HEAD_START_S if weight >= 8 else waited)

* ``urgency`` grows with the time since the URL was last fetched, relative to its freshness TTL
  (1 for a URL never fetched), so the stalest data is refreshed first;
* ``weight`` (1..10) is how important the source or URL rule says it is;
* every failed attempt multiplies by 0.7, so a failing URL yields to healthy ones;
* expensive pages (cost, e.g. KiB of the last response) yield to cheap ones;
* an item of weight >= ``CRITICAL_WEIGHT`` (8) starts with an hour of waiting credited
  (``CRITICAL_HEAD_START_S``): offered behind a backlog, it is claimed before every item of
  weight < 8 that has waited less than that hour (a plain weight-9-over-5 lead would be overtaken
  by a backlog older than 4 minutes);
* ``aging_rate x waited`` lifts everything that waits, so nothing starves: ``base`` is at most
  10, hence an item that has waited ``10 / aging_rate`` seconds plus the head start outranks any
  newcomer (``starvation_bound_s``), a steady stream of critical items included.

Stores cannot re-sort a queue as time passes, so the score is kept in a time-invariant form:
``rank = base - aging_rate x enqueued_at``. For every ``now``, ``score(now) = rank + aging_rate x
now``, so ordering by ``rank`` is ordering by score at any moment, and a backend only needs one
static sorted index (SQLite index, Redis sorted set).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from collector import defaults
from collector.policy._urlmatch import UrlMatch

__all__ = [
    "CRITICAL_HEAD_START_S",
    "CRITICAL_WEIGHT",
    "MAX_BASE_SCORE",
    "PriorityRule",
    "PrioritySettings",
    "base_score",
    "rank",
    "score_at",
    "urgency",
]

PriorityClass = Literal["critical", "high", "normal", "low"]
MAX_BASE_SCORE = 10.0  # urgency <= 1, weight <= 10, penalties <= 1
CRITICAL_WEIGHT = 8  # a weight from which an item is critical: head of the queue
CRITICAL_HEAD_START_S = 3600.0  # waiting credited to a critical item as it is queued


def urgency(age_s: float | None, fresh_s: float) -> float:
    """0..1: how overdue a URL is. ``None`` (never fetched) is fully urgent."""
    if age_s is None:
        return 1.0
    horizon = max(fresh_s, 1.0)
    return 1.0 - math.exp(-max(age_s, 0.0) / horizon)


def base_score(
    *, age_s: float | None, fresh_s: float, weight: float, retries: int, cost: float
) -> float:
    """The multi-factor score before aging; in (0, MAX_BASE_SCORE]."""
    return (
        urgency(age_s, fresh_s)
        * weight
        * defaults.RETRY_PENALTY ** max(retries, 0)
        / (1.0 + defaults.COST_FACTOR * max(cost, 0.0))
    )


def rank(
    base: float, *, enqueued_at: float, aging_per_minute: float, critical: bool = False
) -> float:
    """Time-invariant sort key: higher rank is served first. A ``critical`` item ranks as if
    queued ``CRITICAL_HEAD_START_S`` earlier."""
    credited = enqueued_at - CRITICAL_HEAD_START_S if critical else enqueued_at
    return base - (aging_per_minute / 60.0) * credited


def score_at(item_rank: float, *, now: float, aging_per_minute: float) -> float:
    """The score an item of ``item_rank`` has at time ``now``."""
    return item_rank + (aging_per_minute / 60.0) * now


class PriorityRule(UrlMatch):
    """Per-URL override of weight and cost; first match wins."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    weight: int | None = Field(None, ge=1, le=10, description="Importance 1..10.")
    cost: float | None = Field(None, ge=0, description="Relative cost of fetching.")


class PrioritySettings(BaseModel):
    """The ``priority:`` section of a source."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    run_class: PriorityClass = Field(
        defaults.PRIORITY_CLASS,
        alias="class",
        description="Run class: critical/high/normal/low (Prefect work queue priority 1..4).",
    )
    weight: int = Field(defaults.PRIORITY_WEIGHT, ge=1, le=10, description="Importance 1..10.")
    cost: float = Field(0.0, ge=0, description="Default relative cost of a URL.")
    aging_per_minute: float = Field(
        defaults.AGING_PER_MINUTE,
        gt=0,
        description="Score gained per minute of waiting; bounds starvation at 10/rate minutes.",
    )
    rules: tuple[PriorityRule, ...] = Field((), description="Per-URL weight/cost overrides.")

    def weight_and_cost(self, url: str) -> tuple[int, float]:
        for rule in self.rules:
            if rule.matches(url):
                return (
                    rule.weight if rule.weight is not None else self.weight,
                    rule.cost if rule.cost is not None else self.cost,
                )
        return self.weight, self.cost

    def rank_for(
        self,
        url: str,
        *,
        enqueued_at: float,
        age_s: float | None,
        fresh_s: float,
        retries: int = 0,
        observed_cost: float | None = None,
    ) -> float:
        weight, cost = self.weight_and_cost(url)
        if observed_cost is not None:
            cost = max(cost, observed_cost)
        base = base_score(age_s=age_s, fresh_s=fresh_s, weight=weight, retries=retries, cost=cost)
        return rank(
            base,
            enqueued_at=enqueued_at,
            aging_per_minute=self.aging_per_minute,
            critical=weight >= CRITICAL_WEIGHT,
        )

    @property
    def starvation_bound_s(self) -> float:
        """An item that waited this long outranks any newly queued item, a critical one too."""
        return MAX_BASE_SCORE / (self.aging_per_minute / 60.0) + CRITICAL_HEAD_START_S
