"""Properties of the priority score (collector.policy.priority): monotonicity, rank/score
consistency, the anti-starvation bound, and per-URL rules."""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from collector import defaults
from collector.policy.priority import (
    CRITICAL_HEAD_START_S,
    MAX_BASE_SCORE,
    PriorityRule,
    PrioritySettings,
    base_score,
    rank,
    score_at,
    urgency,
)

PROPS = settings(max_examples=200, deadline=None)

ages = st.none() | st.floats(min_value=0, max_value=1e9)
fresh = st.floats(min_value=0, max_value=1e7)
weights = st.integers(min_value=1, max_value=10)
retries = st.integers(min_value=0, max_value=60)
costs = st.floats(min_value=0, max_value=1e6)
# UNIX seconds, as the frontier uses (time.time()), with some room before 1970 for generality.
times = st.floats(min_value=-1e6, max_value=4e9)
aging = st.floats(min_value=1e-6, max_value=1e6)


def _ordered(a: float | None, b: float | None) -> tuple[float | None, float | None]:
    """Order two ages from least to most stale; None (never fetched) is the stalest."""
    if a is None:
        return b, a
    if b is None:
        return a, b
    return (a, b) if a <= b else (b, a)


# --- base_score monotonicity ---------------------------------------------------------------------
@PROPS
@given(age=ages, fresh_s=fresh, w=st.lists(weights, min_size=2, max_size=2), r=retries, c=costs)
def test_base_score_non_decreasing_in_weight(age, fresh_s, w, r, c):
    lo, hi = sorted(w)
    assert base_score(age_s=age, fresh_s=fresh_s, weight=lo, retries=r, cost=c) <= base_score(
        age_s=age, fresh_s=fresh_s, weight=hi, retries=r, cost=c
    )


@PROPS
@given(a1=ages, a2=ages, fresh_s=fresh, w=weights, r=retries, c=costs)
def test_base_score_non_decreasing_in_staleness(a1, a2, fresh_s, w, r, c):
    younger, older = _ordered(a1, a2)
    assert base_score(age_s=younger, fresh_s=fresh_s, weight=w, retries=r, cost=c) <= base_score(
        age_s=older, fresh_s=fresh_s, weight=w, retries=r, cost=c
    )


@PROPS
@given(age=ages, fresh_s=fresh, w=weights, rs=st.lists(retries, min_size=2, max_size=2), c=costs)
def test_base_score_non_increasing_in_retries(age, fresh_s, w, rs, c):
    few, many = sorted(rs)
    assert base_score(age_s=age, fresh_s=fresh_s, weight=w, retries=few, cost=c) >= base_score(
        age_s=age, fresh_s=fresh_s, weight=w, retries=many, cost=c
    )


@PROPS
@given(age=ages, fresh_s=fresh, w=weights, r=retries, cs=st.lists(costs, min_size=2, max_size=2))
def test_base_score_non_increasing_in_cost(age, fresh_s, w, r, cs):
    cheap, dear = sorted(cs)
    assert base_score(age_s=age, fresh_s=fresh_s, weight=w, retries=r, cost=cheap) >= base_score(
        age_s=age, fresh_s=fresh_s, weight=w, retries=r, cost=dear
    )


@PROPS
@given(age=ages, fresh_s=fresh, w=weights, r=retries, c=costs)
def test_base_score_within_bounds(age, fresh_s, w, r, c):
    score = base_score(age_s=age, fresh_s=fresh_s, weight=w, retries=r, cost=c)
    assert 0.0 <= score <= MAX_BASE_SCORE


def test_base_score_factors():
    full = base_score(age_s=None, fresh_s=60, weight=10, retries=0, cost=0)
    assert full == MAX_BASE_SCORE
    assert base_score(age_s=None, fresh_s=60, weight=10, retries=2, cost=0) == pytest.approx(
        10 * defaults.RETRY_PENALTY**2
    )
    assert base_score(age_s=None, fresh_s=60, weight=10, retries=0, cost=50) == pytest.approx(
        10 / (1 + defaults.COST_FACTOR * 50)
    )
    # Negative retries / cost are treated as zero.
    assert base_score(age_s=None, fresh_s=60, weight=4, retries=-3, cost=-9) == 4.0


# --- urgency -------------------------------------------------------------------------------------
@PROPS
@given(
    age=st.floats(min_value=-1e9, max_value=1e12), fresh_s=st.floats(min_value=-1e6, max_value=1e9)
)
def test_urgency_in_unit_interval(age, fresh_s):
    assert 0.0 <= urgency(age, fresh_s) <= 1.0


@PROPS
@given(fresh_s=st.floats(min_value=-1e6, max_value=1e9))
def test_urgency_never_fetched_is_one(fresh_s):
    assert urgency(None, fresh_s) == 1.0


def test_urgency_examples():
    assert urgency(0, 3600) == 0.0
    assert urgency(-5, 3600) == 0.0  # clock skew: a future fetch time is "just fetched"
    assert urgency(3600, 3600) == pytest.approx(1 - math.exp(-1))
    # fresh_s below one second uses a one-second horizon.
    assert urgency(1, 0) == pytest.approx(1 - math.exp(-1))


# --- rank / score_at -----------------------------------------------------------------------------
@PROPS
@given(
    items=st.lists(
        st.tuples(st.floats(min_value=0, max_value=MAX_BASE_SCORE), times), min_size=2, max_size=20
    ),
    rate=aging,
    now=times,
)
def test_ordering_by_rank_is_ordering_by_score(items, rate, now):
    ranks = [rank(b, enqueued_at=t, aging_per_minute=rate) for b, t in items]
    scores = [score_at(r, now=now, aging_per_minute=rate) for r in ranks]
    # Adding the same amount to every rank keeps the order (ties may appear by rounding,
    # never an inversion).
    for (r1, s1), (r2, s2) in itertools.permutations(zip(ranks, scores, strict=True), 2):
        if r1 <= r2:
            assert s1 <= s2
    by_rank = sorted(range(len(ranks)), key=lambda i: ranks[i])
    assert [scores[i] for i in by_rank] == sorted(scores)


@PROPS
@given(
    base=st.floats(min_value=0, max_value=MAX_BASE_SCORE),
    t=times,
    rate=aging,
    wait=st.floats(0, 1e6),
)
def test_score_at_is_base_plus_aging(base, t, rate, wait):
    r = rank(base, enqueued_at=t, aging_per_minute=rate)
    expected = base + rate / 60.0 * wait
    tolerance = 1e-9 * (abs(rate / 60.0 * t) + abs(rate / 60.0 * (t + wait)) + 1)
    assert score_at(r, now=t + wait, aging_per_minute=rate) == pytest.approx(
        expected, abs=tolerance
    )


def test_rank_for_matches_base_and_rank():
    p = PrioritySettings(weight=7, cost=3, aging_per_minute=2.0)
    got = p.rank_for("https://x/a", enqueued_at=1000.0, age_s=120.0, fresh_s=60.0, retries=1)
    base = base_score(age_s=120.0, fresh_s=60.0, weight=7, retries=1, cost=3)
    assert got == rank(base, enqueued_at=1000.0, aging_per_minute=2.0)
    # observed_cost only ever raises the cost.
    cheaper = p.rank_for("https://x/a", enqueued_at=0, age_s=None, fresh_s=60, observed_cost=1)
    dearer = p.rank_for("https://x/a", enqueued_at=0, age_s=None, fresh_s=60, observed_cost=100)
    plain = p.rank_for("https://x/a", enqueued_at=0, age_s=None, fresh_s=60)
    assert cheaper == plain > dearer


# --- anti-starvation -----------------------------------------------------------------------------
@pytest.mark.parametrize("rate", [0.1, 1.0, 60.0])
def test_starvation_bound_value(rate):
    assert PrioritySettings(aging_per_minute=rate).starvation_bound_s == pytest.approx(
        600.0 / rate + CRITICAL_HEAD_START_S
    )


@PROPS
@given(
    rate=aging,
    t0=st.floats(min_value=0, max_value=4e9),
    over=st.floats(min_value=1e-3, max_value=1e7),
    age=ages,
    fresh_s=fresh,
    r=retries,
    c=costs,
)
def test_old_item_outranks_every_newcomer_after_the_bound(rate, t0, over, age, fresh_s, r, c):
    """Waited longer than the bound (by at least a millisecond, the resolution the frontier's
    clock gives) => outranks a newcomer with the largest possible base score."""
    low = PrioritySettings(weight=1, aging_per_minute=rate)
    high = PrioritySettings(weight=10, aging_per_minute=rate)
    waited = low.starvation_bound_s + over
    old = low.rank_for(
        "https://x/old", enqueued_at=t0, age_s=age, fresh_s=fresh_s, retries=r, observed_cost=c
    )
    new = high.rank_for("https://x/new", enqueued_at=t0 + waited, age_s=None, fresh_s=60)
    assert old > new


@settings(max_examples=60, deadline=None)
@given(
    rate=st.sampled_from([0.5, 1.0, 6.0, 60.0]),
    arrivals=st.integers(min_value=1, max_value=4),
    spare=st.integers(min_value=0, max_value=2),
    tick_s=st.sampled_from([1.0, 5.0, 30.0]),
    r=st.integers(min_value=0, max_value=20),
    c=st.floats(min_value=0, max_value=1e4),
    t_start=st.floats(min_value=0, max_value=2e9),
)
def test_simulated_queue_serves_the_low_item_within_the_bound(
    rate, arrivals, spare, tick_s, r, c, t_start
):
    """Every tick, ``arrivals`` new weight-10 never-fetched items arrive and the workers claim
    ``arrivals + spare`` items by max rank; the waiting weight-1 item is claimed within the
    bound (plus one tick of claim granularity)."""
    low = PrioritySettings(weight=1, aging_per_minute=rate)
    high = PrioritySettings(weight=10, aging_per_minute=rate)
    bound = low.starvation_bound_s
    claims = arrivals + spare
    seq = itertools.count()
    queue: list[tuple[float, int, str]] = []  # (-rank, seq, url): heapq is a min-heap

    def push(url: str, settings_: PrioritySettings, now: float, **kw: Any) -> None:
        item_rank = settings_.rank_for(url, enqueued_at=now, fresh_s=60, **kw)
        heapq.heappush(queue, (-item_rank, next(seq), url))

    push("https://x/low", low, t_start, age_s=None, retries=r, observed_cost=c)
    now = t_start
    served_at = None
    max_ticks = int(bound / tick_s) + 10
    for _ in range(max_ticks):
        now += tick_s
        for _ in range(arrivals):
            push(f"https://x/hot/{next(seq)}", high, now, age_s=None)
        for _ in range(claims):
            if not queue:
                break
            _, _, url = heapq.heappop(queue)
            if url == "https://x/low":
                served_at = now
        if served_at is not None:
            break
    assert served_at is not None, "the weight-1 item starved"
    assert served_at - t_start <= bound + tick_s


# --- per-URL rules -------------------------------------------------------------------------------
def test_rules_first_match_wins_for_weight_and_cost():
    p = PrioritySettings(
        weight=5,
        cost=1.0,
        rules=(
            PriorityRule(prefix="https://x/vip/", weight=10),
            PriorityRule(pattern=r"\.json$", weight=2, cost=50.0),
            PriorityRule(pattern=r"/vip/", weight=1, cost=99.0),  # shadowed by the first rule
            PriorityRule(pattern=r"heavy", cost=7.0),
        ),
    )
    assert p.weight_and_cost("https://x/vip/a.json") == (10, 1.0)  # cost falls back
    assert p.weight_and_cost("https://x/items/a.json") == (2, 50.0)
    assert p.weight_and_cost("https://x/heavy/page") == (5, 7.0)  # weight falls back
    assert p.weight_and_cost("https://x/other") == (5, 1.0)


@PROPS
@given(
    flags=st.lists(st.booleans(), min_size=1, max_size=6),
    ws=st.lists(weights, min_size=6, max_size=6),
)
def test_rules_first_match_wins_property(flags, ws):
    url = "https://x/page"
    rules = tuple(
        PriorityRule(prefix=url if hit else "https://other/", weight=w)
        for hit, w in zip(flags, ws, strict=False)
    )
    p = PrioritySettings(weight=3, rules=rules)
    expected = next((w for hit, w in zip(flags, ws, strict=False) if hit), 3)
    assert p.weight_and_cost(url)[0] == expected


def test_settings_validation():
    with pytest.raises(ValidationError):
        PrioritySettings(weight=11)
    with pytest.raises(ValidationError):
        PrioritySettings(weight=0)
    with pytest.raises(ValidationError):
        PrioritySettings(aging_per_minute=0)
    with pytest.raises(ValidationError):
        PriorityRule(prefix="https://x/", weight=11)
    with pytest.raises(ValidationError, match="exactly one"):
        PriorityRule(weight=3)
    assert PrioritySettings.model_validate({"class": "high"}).run_class == "high"
    assert PrioritySettings(run_class="low").run_class == "low"
