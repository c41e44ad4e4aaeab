"""Backoff, retry decisions, the retry budget and Retry-After parsing (collector.policy.retry)."""

from __future__ import annotations

import math
import random
import threading
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from collector.errors import FetchError, PermanentFetchError, RecoverableFetchError
from collector.policy.retry import (
    RECOVERABLE_STATUS,
    RetryBudget,
    RetrySettings,
    is_recoverable_status,
    parse_retry_after,
)

PROPS = settings(max_examples=200, deadline=None)

profiles = st.sampled_from(["exponential", "linear"])
bases = st.floats(min_value=1e-3, max_value=100)
caps = st.floats(min_value=1e-3, max_value=1e4)
retry_numbers = st.integers(min_value=-5, max_value=5000)


def recoverable(error_class: str = "timeout", retry_after_s: float | None = None) -> FetchError:
    return RecoverableFetchError("boom", error_class=error_class, retry_after_s=retry_after_s)


# --- ceiling and backoff -------------------------------------------------------------------------
@PROPS
@given(profile=profiles, base=bases, cap=caps, n=retry_numbers, seed=st.integers(0, 2**32))
def test_backoff_in_zero_to_ceiling(profile, base, cap, n, seed):
    s = RetrySettings(profile=profile, base_s=base, cap_s=cap)
    ceiling = s.ceiling(n)
    delay = s.backoff(n, random.Random(seed))
    assert 0.0 <= delay < ceiling


@PROPS
@given(profile=profiles, base=bases, cap=caps, ns=st.lists(retry_numbers, min_size=2, max_size=2))
def test_ceiling_non_decreasing_and_capped(profile, base, cap, ns):
    s = RetrySettings(profile=profile, base_s=base, cap_s=cap)
    lo, hi = sorted(ns)
    assert s.ceiling(lo) <= s.ceiling(hi) <= cap
    assert s.ceiling(lo) > 0


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        ("exponential", [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]),
        ("linear", [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]),
    ],
)
def test_ceiling_values(profile, expected):
    s = RetrySettings(profile=profile, base_s=0.5, cap_s=10.0)
    assert [s.ceiling(n) for n in range(1, 8)] == pytest.approx(expected)
    assert s.ceiling(0) == s.ceiling(1) == 0.5  # retry numbers below 1 count as the first


def test_ceiling_huge_retry_number_does_not_overflow():
    assert RetrySettings(base_s=0.5, cap_s=30).ceiling(10**6) == 30
    assert RetrySettings(profile="linear", base_s=0.5, cap_s=30).ceiling(10**6) == 30


def test_backoff_is_spread_over_the_whole_interval():
    s = RetrySettings(base_s=1.0, cap_s=8.0)
    rng = random.Random(7)
    draws = [s.backoff(4, rng) for _ in range(2000)]
    assert max(draws) < 8.0
    assert min(draws) < 0.5 and max(draws) > 7.5  # full jitter, not "ceiling +- a bit"


# --- decide() ------------------------------------------------------------------------------------
@PROPS
@given(
    error_class=st.sampled_from(["http_404", "parse_error", "refused_url", "too_large"]),
    attempts=st.integers(min_value=1, max_value=100),
)
def test_permanent_error_is_dead_at_once(error_class, attempts):
    s = RetrySettings()
    budget = RetryBudget(ratio=1.0, min_retries=100)
    d = s.decide(
        PermanentFetchError("x", error_class=error_class),
        attempts=attempts,
        first_attempt_at=0,
        now=0,
        budget=budget,
    )
    assert (d.action, d.reason) == ("dead", error_class)
    assert budget.retries == 0 and budget.refused == 0  # the budget is not even asked


@PROPS
@given(max_attempts=st.integers(1, 20), extra=st.integers(0, 20), error_class=st.text(min_size=1))
def test_attempts_exhausted(max_attempts, extra, error_class):
    s = RetrySettings(max_attempts=max_attempts)
    d = s.decide(recoverable(error_class), attempts=max_attempts + extra, first_attempt_at=0, now=0)
    assert d.action == "dead"
    assert d.reason == f"retries_exhausted:{error_class}"


def test_max_attempts_one_means_no_retry():
    d = RetrySettings(max_attempts=1).decide(recoverable(), attempts=1, first_attempt_at=0, now=0)
    assert (d.action, d.reason) == ("dead", "retries_exhausted:timeout")


@PROPS
@given(
    retry_after=st.floats(min_value=0, max_value=1e7),
    clamp=st.floats(min_value=1, max_value=1e4),
    attempts=st.integers(1, 5),
    seed=st.integers(0, 2**32),
)
def test_retry_after_honoured_and_clamped(retry_after, clamp, attempts, seed):
    s = RetrySettings(
        max_attempts=10, max_total_s=1e9, max_retry_after_s=clamp, base_s=0.5, cap_s=30
    )
    d = s.decide(
        recoverable("http_429", retry_after_s=retry_after),
        attempts=attempts,
        first_attempt_at=0,
        now=0,
        rng=random.Random(seed),
    )
    assert d.action in {"inline", "later"}
    assert d.delay_s >= min(retry_after, clamp)
    assert d.delay_s <= max(s.ceiling(attempts), clamp)
    assert d.reason == "http_429"


def test_retry_after_ignored_when_not_respected():
    s = RetrySettings(respect_retry_after=False, base_s=0.5, cap_s=1.0, max_inline_delay_s=2.0)
    d = s.decide(recoverable(retry_after_s=500), attempts=1, first_attempt_at=0, now=0)
    assert d.action == "inline" and d.delay_s < 1.0


def test_infinite_retry_after_is_clamped():
    s = RetrySettings(max_retry_after_s=60, max_total_s=1e6)
    ra = parse_retry_after("1e999", now=0)
    d = s.decide(recoverable(retry_after_s=ra), attempts=1, first_attempt_at=0, now=0)
    assert (d.action, d.delay_s) == ("later", 60)


@PROPS
@given(
    first=st.floats(min_value=0, max_value=1e9),
    elapsed=st.floats(min_value=0, max_value=1e4),
    max_total=st.floats(min_value=1, max_value=1e4),
    retry_after=st.none() | st.floats(min_value=0, max_value=1e4),
    seed=st.integers(0, 2**32),
)
def test_total_duration_cap(first, elapsed, max_total, retry_after, seed):
    s = RetrySettings(max_attempts=100, max_total_s=max_total, base_s=1, cap_s=60)
    now = first + elapsed
    rng_seed = random.Random(seed)
    expected_delay = s.backoff(2, random.Random(seed))
    if retry_after is not None:
        expected_delay = max(expected_delay, min(retry_after, s.max_retry_after_s))
    d = s.decide(
        recoverable("timeout", retry_after_s=retry_after),
        attempts=2,
        first_attempt_at=first,
        now=now,
        rng=rng_seed,
    )
    if now + expected_delay - first > max_total:
        assert (d.action, d.reason) == ("dead", "max_total_exceeded:timeout")
    else:
        assert d.action in {"inline", "later"}
        assert now + d.delay_s - first <= max_total


def test_total_duration_cap_example():
    s = RetrySettings(max_total_s=100, max_attempts=10)
    d = s.decide(
        recoverable("connect_error", retry_after_s=50), attempts=2, first_attempt_at=0, now=60
    )
    assert (d.action, d.reason) == ("dead", "max_total_exceeded:connect_error")


@PROPS
@given(
    threshold=st.floats(min_value=0, max_value=100),
    attempts=st.integers(1, 8),
    seed=st.integers(0, 2**32),
)
def test_inline_vs_later_threshold(threshold, attempts, seed):
    s = RetrySettings(max_attempts=10, base_s=1, cap_s=120, max_inline_delay_s=threshold)
    d = s.decide(
        recoverable(), attempts=attempts, first_attempt_at=0, now=0, rng=random.Random(seed)
    )
    assert d.delay_s == s.backoff(attempts, random.Random(seed))
    assert d.action == ("inline" if d.delay_s <= threshold else "later")
    assert d.reason == "timeout"


def test_inline_and_later_examples():
    s = RetrySettings(max_inline_delay_s=2.0, max_total_s=1e6)
    inline = s.decide(recoverable(retry_after_s=1.5), attempts=1, first_attempt_at=0, now=0)
    # base 0.5: the first backoff is < 0.5, so Retry-After 1.5 decides the delay.
    assert (inline.action, inline.delay_s) == ("inline", 1.5)
    later = s.decide(recoverable(retry_after_s=120), attempts=1, first_attempt_at=0, now=0)
    assert (later.action, later.delay_s) == ("later", 120)
    never_inline = RetrySettings(max_inline_delay_s=0, base_s=5, cap_s=10)
    rng = random.Random(1)
    d = never_inline.decide(recoverable(), attempts=1, first_attempt_at=0, now=0, rng=rng)
    assert d.action == "later"


# --- RetryBudget ---------------------------------------------------------------------------------
@PROPS
@given(
    ratio=st.floats(min_value=0, max_value=1),
    minimum=st.integers(0, 50),
    ops=st.lists(st.booleans(), max_size=400),  # True: a request, False: a retry asked for
)
def test_budget_never_exceeds_its_allowance(ratio, minimum, ops):
    budget = RetryBudget(ratio=ratio, min_retries=minimum)
    asked = 0
    for is_request in ops:
        if is_request:
            budget.record_request()
        else:
            asked += 1
            granted = budget.try_spend()
            allowance = max(minimum, ratio * budget.requests)
            assert budget.retries <= allowance
            if not granted:
                # Refused only when one more retry would exceed the allowance.
                assert budget.retries + 1 > allowance
        assert budget.retries <= max(minimum, ratio * budget.requests)
    assert budget.retries + budget.refused == asked


@PROPS
@given(ratio=st.floats(min_value=0, max_value=1), minimum=st.integers(0, 50), n=st.integers(0, 500))
def test_budget_after_n_requests(ratio, minimum, n):
    budget = RetryBudget(ratio=ratio, min_retries=minimum)
    for _ in range(n):
        budget.record_request()
    asked = n + minimum + 5
    granted = sum(budget.try_spend() for _ in range(asked))
    allowance = max(minimum, ratio * n)
    assert granted <= allowance
    assert granted == math.floor(allowance)
    assert budget.refused == asked - granted


def test_budget_examples():
    budget = RetryBudget(ratio=0.1, min_retries=2)
    assert [budget.try_spend() for _ in range(3)] == [True, True, False]
    for _ in range(50):
        budget.record_request()
    # allowance max(2, 5) = 5: three more retries, then refusals.
    assert [budget.try_spend() for _ in range(4)] == [True, True, True, False]
    assert (budget.retries, budget.refused) == (5, 2)


def test_budget_is_thread_safe():
    budget = RetryBudget(ratio=0.5, min_retries=0)
    for _ in range(1000):
        budget.record_request()
    results: list[bool] = []
    lock = threading.Lock()

    def spend() -> None:
        mine = [budget.try_spend() for _ in range(200)]
        with lock:
            results.extend(mine)

    threads = [threading.Thread(target=spend) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(results) == budget.retries == 500
    assert budget.refused == 1600 - 500


def test_budget_refusal_is_later_not_dead():
    s = RetrySettings(base_s=0.5, max_inline_delay_s=2.0)
    budget = RetryBudget(ratio=0.0, min_retries=0)
    d = s.decide(recoverable(), attempts=1, first_attempt_at=0, now=0, budget=budget)
    assert d.action == "later"
    assert d.reason == "retry_budget"
    assert d.delay_s >= s.base_s
    assert (budget.retries, budget.refused) == (0, 1)


def test_budget_spent_on_granted_retry():
    s = RetrySettings()
    budget = RetryBudget(ratio=0.0, min_retries=1)
    first = s.decide(recoverable(), attempts=1, first_attempt_at=0, now=0, budget=budget)
    second = s.decide(recoverable(), attempts=1, first_attempt_at=0, now=0, budget=budget)
    assert first.action in {"inline", "later"} and first.reason == "timeout"
    assert (second.action, second.reason) == ("later", "retry_budget")


def test_budget_not_asked_for_dead_items():
    s = RetrySettings(max_attempts=2)
    budget = RetryBudget(ratio=0.0, min_retries=0)
    d = s.decide(recoverable(), attempts=2, first_attempt_at=0, now=0, budget=budget)
    assert d.action == "dead" and budget.refused == 0


# --- parse_retry_after ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("120", 120.0),
        ("  7 ", 7.0),
        ("0", 0.0),
        ("1.5", 1.5),
        ("-5", 0.0),
        ("-0.1", 0.0),
        ("nan", None),
        ("NaN", None),
        ("soon", None),
        ("", None),
        (None, None),
        ("12 seconds", None),
        ("Mon, 99 Foo 2024 99:99:99 GMT", None),
    ],
)
def test_parse_retry_after_values(value, expected):
    assert parse_retry_after(value, now=1_700_000_000.0) == expected


def test_parse_retry_after_http_date():
    now = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
    later = format_datetime(now + timedelta(seconds=90), usegmt=True)
    assert parse_retry_after(later, now=now.timestamp()) == pytest.approx(90.0)
    past = format_datetime(now - timedelta(hours=1), usegmt=True)
    assert parse_retry_after(past, now=now.timestamp()) == 0.0


@PROPS
@given(seconds=st.integers(min_value=-(10**6), max_value=10**7))
def test_parse_retry_after_http_date_property(seconds):
    now = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
    header = format_datetime(now + timedelta(seconds=seconds), usegmt=True)
    assert parse_retry_after(header, now=now.timestamp()) == pytest.approx(max(0, seconds))


@PROPS
@given(value=st.text(max_size=40))
def test_parse_retry_after_never_raises(value):
    result = parse_retry_after(value, now=0.0)
    assert result is None or result >= 0.0


# --- recoverable statuses ------------------------------------------------------------------------
@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_recoverable_statuses(status):
    assert is_recoverable_status(status)


@pytest.mark.parametrize("status", [200, 301, 400, 401, 403, 404, 405, 410, 422, 501])
def test_non_recoverable_statuses(status):
    assert not is_recoverable_status(status)


def test_every_recoverable_status_is_408_425_429_or_5xx():
    assert all(s in {408, 425, 429} or 500 <= s <= 599 for s in RECOVERABLE_STATUS)


# --- settings ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        {"base_s": 0},
        {"cap_s": -1},
        {"max_attempts": 0},
        {"max_total_s": 0},
        {"budget_ratio": 1.5},
        {"budget_ratio": -0.1},
        {"budget_min": -1},
        {"max_retry_after_s": 0},
        {"max_inline_delay_s": -1},
        {"profile": "fibonacci"},
        {"bogus": 1},
    ],
)
def test_invalid_settings_refused(kwargs):
    with pytest.raises(ValidationError):
        RetrySettings(**kwargs)
