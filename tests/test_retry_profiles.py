"""Named retry profiles, jitter modes, the time budget and the 429 degrade, each held to a plain
model (collector.policy.retry, collector.fetch.pacing.Degrade), and the degrade in the engine
against a real local site: nothing handed back is lost or counted as an attempt."""

from __future__ import annotations

import asyncio
import math
import random
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.config import SourceError, load_source
from collector.demo.site import FaultSite
from collector.errors import RecoverableFetchError
from collector.fetch.engine import FetchEngine
from collector.fetch.pacing import Degrade
from collector.frontier.base import ClaimedItem
from collector.policy.retry import RetryBudget, RetrySettings, RetryTimeBudget
from collector.policy.urls import HostPolicy
from collector.run.collection import Collection
from tests.helpers import sink_lines, write_source
from tests.politeness_site import PolitenessSite

PROPS = settings(max_examples=200, deadline=None)

growths = st.sampled_from(["exponential", "linear"])
jitters = st.sampled_from(["full", "proportional", "none"])
positive = st.floats(min_value=1e-3, max_value=100)


def model_ceiling(growth: str, base: float, cap: float, multiplier: float, n: int) -> float:
    """The n-th ceiling, by repeated multiplication (stopping at the cap)."""
    n = max(n, 1)
    if growth == "linear":
        return min(cap, base * n)
    ceiling = base
    for _ in range(n - 1):
        if ceiling >= cap:
            break
        ceiling *= multiplier
    return min(cap, ceiling)


def model_bounds(jitter: str, ceiling: float) -> tuple[float, float]:
    return {"full": (0.0, ceiling), "proportional": (0.5 * ceiling, 1.5 * ceiling)}.get(
        jitter, (ceiling, ceiling)
    )


# --- profiles and jitter -----------------------------------------------------------------------
@st.composite
def profiles(draw: st.DrawFn) -> dict[str, Any]:
    base = draw(positive)
    return {
        "growth": draw(growths),
        "base_s": base,
        "cap_s": base * draw(st.floats(min_value=1, max_value=1000)),
        "multiplier": draw(st.floats(min_value=1, max_value=10)),
        "jitter": draw(jitters),
    }


@PROPS
@given(profile=profiles(), n=st.integers(-3, 200), seed=st.integers(0, 2**32))
def test_a_profiles_backoff_stays_within_its_jitter_bounds(
    profile: dict[str, Any], n: int, seed: int
) -> None:
    s = RetrySettings(profiles={"p": profile}, default_profile="p").for_url("http://x/")
    ceiling = model_ceiling(
        profile["growth"], profile["base_s"], profile["cap_s"], profile["multiplier"], n
    )
    assert math.isclose(s.ceiling(n), ceiling, rel_tol=1e-9)
    low, high = model_bounds(profile["jitter"], s.ceiling(n))
    delay = s.backoff(n, random.Random(seed))
    assert low <= delay <= high


@pytest.mark.parametrize("jitter", ["full", "proportional", "none"])
def test_each_jitter_modes_draws_span_its_range(jitter: str) -> None:
    s = RetrySettings(base_s=1.0, cap_s=1.0, jitter=jitter)
    rng = random.Random(7)
    draws = [s.backoff(1, rng) for _ in range(4000)]
    low, high = model_bounds(jitter, 1.0)
    assert all(low <= d <= high for d in draws)
    width = high - low
    assert min(draws) <= low + 0.01 * width and max(draws) >= high - 0.01 * width
    if width:  # spread evenly: each tenth of the range holds 10 % +- 2.5 % of the draws
        tenths = [0] * 10
        for d in draws:
            tenths[min(int((d - low) / width * 10), 9)] += 1
        assert all(300 <= t <= 500 for t in tenths), tenths


@PROPS
@given(base=positive, cap=st.floats(1e-3, 1e4), n=st.integers(-3, 2000), seed=st.integers(0, 2**32))
def test_a_source_without_profiles_draws_exactly_as_before(
    base: float, cap: float, n: int, seed: int
) -> None:
    s = RetrySettings(base_s=base, cap_s=cap)
    assert s.for_url("https://any/url") is s
    before = random.Random(seed).uniform(0.0, min(cap, base * 2.0 ** min(max(n, 1) - 1, 60)))
    assert s.backoff(n, random.Random(seed)) == before


@PROPS
@given(
    rules=st.lists(
        st.tuples(st.sampled_from(["https://a/", "https://a/pay/", "https://b/"]),
                  st.sampled_from(["payment", "recon"])),
        max_size=4,
    ),
    default=st.sampled_from([None, "payment", "recon"]),
    url=st.sampled_from(["https://a/pay/1", "https://a/x", "https://b/", "https://c/"]),
)  # fmt: skip
def test_the_profile_of_a_url_is_its_first_rules_else_the_default(
    rules: list[tuple[str, str]], default: str | None, url: str
) -> None:
    s = RetrySettings(
        base_s=0.5,
        profiles={"payment": {"base_s": 0.1, "cap_s": 2}, "recon": {"base_s": 5, "cap_s": 600}},
        default_profile=default,
        rules=[{"prefix": prefix, "profile": name} for prefix, name in rules],
    )
    expected = next((name for prefix, name in rules if url.startswith(prefix)), default)
    picked = s.for_url(url)
    assert picked.base_s == {"payment": 0.1, "recon": 5.0, None: 0.5}[expected]
    assert picked is s if expected is None else not (picked.profiles or picked.rules)


def test_a_profile_takes_the_sections_values_it_does_not_give() -> None:
    s = RetrySettings(
        max_attempts=6,
        max_total_s=100,
        profiles={"recon": {"base_s": 5, "cap_s": 600, "multiplier": 3, "max_duration_s": 50}},
    )
    recon = s.named("recon")
    assert (recon.max_attempts, recon.max_total_s, recon.jitter) == (6, 50.0, "full")
    assert [recon.ceiling(n) for n in (1, 2, 3, 4, 5, 6)] == [5, 15, 45, 135, 405, 600]


def _problems(tmp_path: Path, **retry: Any) -> list[str]:
    with pytest.raises(SourceError) as caught:
        load_source(write_source(tmp_path, seeds={"urls": ["http://127.0.0.1:9/1"]}, retry=retry))
    return caught.value.problems


def test_bad_profiles_are_one_line_each_naming_where(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        profiles={
            "payment": {"base_s": 2, "cap_s": 1},
            "recon": {"base_s": 2, "cap_s": 5, "max_duration_s": 1},
        },
        default_profile="paymnt",
        rules=[{"prefix": "https://x/", "profile": "reconciliation"}],
    )
    assert len(problems) == 4, problems
    assert any(
        "retry: default_profile: unknown profile 'paymnt' (did you mean 'payment'?)" in p
        for p in problems
    ), problems
    assert any("retry: rules[0].profile: unknown profile 'reconciliation'" in p for p in problems)
    assert any("profiles.payment: cap_s (1) is below base_s (2)" in p for p in problems)
    assert any("profiles.recon: max_duration_s (1) is below base_s (2)" in p for p in problems)
    assert all("\n" not in p for p in problems)


def test_a_max_duration_under_one_request_deadline_is_refused(tmp_path: Path) -> None:
    (problem,) = _problems(tmp_path, base_s=0.05, profiles={"fast": {"max_duration_s": 2}})
    assert problem.endswith(
        "retry.profiles.fast: max_duration_s (2) is shorter than one request deadline "
        "(ttl.request_deadline_s = 3)"
    ), problem


def test_profiles_load_from_a_source_file(tmp_path: Path) -> None:
    source = load_source(
        write_source(
            tmp_path,
            seeds={"urls": ["http://127.0.0.1:9/1"]},
            retry={
                "profiles": {
                    "payment": {"base_s": 0.1, "cap_s": 2, "max_duration_s": 30,
                                "jitter": "proportional"},
                    "recon": {"base_s": 5, "cap_s": 600, "multiplier": 3, "max_duration_s": 3600},
                },
                "default_profile": "recon",
                "rules": [{"pattern": "/pay/", "profile": "payment"}],
            },
        )
    )  # fmt: skip
    assert source.retry.for_url("https://shop/pay/1").jitter == "proportional"
    assert source.retry.for_url("https://shop/items/1").cap_s == 600


# --- the time budget ---------------------------------------------------------------------------
def model_grants(asks: list[tuple[float, float]], limit: float, window: float) -> list[bool]:
    """Each ask (time, seconds) granted when the granted seconds of the window ending at its
    time, plus its own, stay within the limit."""
    granted: list[tuple[float, float]] = []
    verdicts = []
    for at, seconds in asks:
        recent = [s for t, s in granted if t > at - window]
        ok = math.fsum([*recent, seconds]) <= limit
        if ok:
            granted.append((at, seconds))
        verdicts.append(ok)
    return verdicts


@PROPS
@given(
    # exact binary fractions too, so grants land exactly on a window's edge
    steps=st.lists(
        st.tuples(
            st.one_of(st.floats(0, 0.5), st.sampled_from([0.0, 0.125, 0.25, 0.5])),
            st.one_of(st.floats(0, 0.2), st.sampled_from([0.0625, 0.125])),
        ),
        min_size=1,
        max_size=200,
    ),
    limit=st.one_of(st.floats(0.01, 1.0), st.sampled_from([0.25, 0.5])),
    window=st.one_of(st.floats(0.1, 2.0), st.sampled_from([0.25, 0.5, 1.0])),
)
def test_the_time_budget_grants_what_the_model_grants_and_never_more(
    steps: list[tuple[float, float]], limit: float, window: float
) -> None:
    budget = RetryTimeBudget(limit_s=limit, window_s=window)
    asks, now = [], 1000.0
    for dt, seconds in steps:
        now += dt
        asks.append((now, seconds))
    verdicts = [budget.try_spend(seconds, now=at) for at, seconds in asks]
    assert verdicts == model_grants(asks, limit, window)
    assert budget.refused == verdicts.count(False)
    granted = [(at, s) for (at, s), ok in zip(asks, verdicts, strict=True) if ok]
    for end, _ in granted:  # every window ending at a grant holds at most the limit
        assert math.fsum(s for t, s in granted if end - window < t <= end) <= limit + 1e-9


def test_a_grant_leaves_the_window_exactly_window_s_later() -> None:
    budget = RetryTimeBudget(limit_s=0.25, window_s=1.0)
    asks = [(10.0, 0.25), (10.5, 0.125), (11.0, 0.25), (11.5, 0.125)]
    verdicts = [budget.try_spend(seconds, now=at) for at, seconds in asks]
    assert verdicts == model_grants(asks, 0.25, 1.0) == [True, False, True, False]


def test_an_inline_wait_over_the_time_budget_waits_in_the_frontier() -> None:
    s = RetrySettings(base_s=0.2, cap_s=0.2, jitter="none", budget_time_s=0.3)
    budget = RetryTimeBudget(limit_s=0.3, window_s=1.0)
    error = RecoverableFetchError("boom", error_class="timeout")
    first = s.decide(error, attempts=1, first_attempt_at=0, now=10.0, time_budget=budget)
    second = s.decide(error, attempts=1, first_attempt_at=0, now=10.5, time_budget=budget)
    third = s.decide(error, attempts=1, first_attempt_at=0, now=11.01, time_budget=budget)
    assert (first.action, second.action, third.action) == ("inline", "later", "inline")
    assert second.reason == "retry_time_budget" and second.delay_s == 0.2


async def test_the_engine_defers_inline_waits_past_its_time_budget(site: FaultSite) -> None:
    urls = [site.url(f"/items/{i}.json?status=503&times=1") for i in range(10)]
    engine = _engine(base_s=0.04, cap_s=0.04, jitter="none", budget_time_s=0.1, budget_window_s=600)
    async with engine:
        results = await engine.fetch_batch(
            [ClaimedItem(u, 0, None, 0.0) for u in urls],
            budget=RetryBudget(ratio=1, min_retries=100),
        )
    waited = [r for r in results if r.status == "ok"]  # retried inline after 0.04 s
    later = [r for r in results if r.status == "failed"]
    assert len(waited) == 2 and all(r.attempts == 2 for r in waited)  # 0.08 s of 0.1
    assert len(later) == 8 and all(
        r.decision is not None and r.decision.reason == "retry_time_budget" for r in later
    )
    assert engine.time_budget is not None and engine.time_budget.refused == 8


# --- the 429 degrade ---------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(share=st.floats(0.05, 1.0), seed=st.integers(0, 2**32), n=st.integers(2000, 6000))
def test_the_degrade_sends_its_share_and_hands_back_the_rest(
    share: float, seed: int, n: int
) -> None:
    degrade, rng = Degrade(share, hold_s=5.0), random.Random(seed)
    degrade.throttled(100.0)
    sent = back = 0
    for i in range(n):
        now = 100.0 + i * 4.9 / n  # all within the hold
        until = degrade.admit(now, rng)
        if until is None:
            sent += 1
        else:
            back += 1
            assert 105.0 <= until <= 110.0  # after the degrade, within one more hold
    assert sent + back == n and (degrade.sent, degrade.handed_back) == (sent, back)
    sigma = math.sqrt(n * share * (1 - share))
    assert abs(sent - n * share) <= 5 * sigma + 1, (sent, n * share)
    assert degrade.admit(105.0, rng) is None  # the hold is over: everything goes


def _engine(**retry: Any) -> FetchEngine:
    return FetchEngine(
        retry=RetrySettings(**{"base_s": 5, "cap_s": 5, "max_attempts": 3, **retry}),
        host_policy=HostPolicy(allow_private_networks=True),
        http_timeout_s=2.0,
        request_deadline_s=3.0,
        concurrency=1,
        per_domain_concurrency=1,
        rng=random.Random(3),
    )


async def test_a_host_answering_429_gets_the_degrade_share_and_loses_nothing(
    site: FaultSite,
) -> None:
    urls = [site.url(f"/items/{i}.json?status=429&times=9") for i in range(200)]
    engine = _engine(degrade_share=0.3, max_inline_delay_s=0)
    async with engine:
        results = await engine.fetch_batch(
            [ClaimedItem(u, 0, None, 0.0) for u in urls],
            budget=RetryBudget(ratio=1, min_retries=1000),
        )
    assert [r.url for r in results] == urls  # every item back, in order
    sent = [r for r in results if r.status == "failed"]
    back = [r for r in results if r.status == "deferred"]
    assert len(sent) + len(back) == len(urls)
    assert all(r.decision is not None and r.decision.action == "later" for r in sent)
    assert all(r.attempts == 0 and r.not_before > 0 for r in back)  # not an attempt
    assert {r.deferred_why for r in back} == {"rate_degraded"}  # not said to be the breaker
    assert site.request_count("/items/") == len(sent)  # what was sent, nothing more
    # the first 429 starts the degrade; 199 requests after it, 30 % +- 5 sigma sent
    assert abs((len(sent) - 1) - 199 * 0.3) <= 5 * math.sqrt(199 * 0.21)


async def test_without_a_degrade_every_request_is_sent(site: FaultSite) -> None:
    urls = [site.url(f"/items/{i}.json?status=429&times=9") for i in range(20)]
    async with _engine() as engine:
        results = await engine.fetch_batch(
            [ClaimedItem(u, 0, None, 0.0) for u in urls],
            budget=RetryBudget(ratio=1, min_retries=100),
        )
    assert [r.status for r in results] == ["failed"] * 20


def test_handed_back_items_stay_queued_and_a_rerun_collects_them_all(tmp_path: Path) -> None:
    """A run stopped while its host is degraded leaves the handed-back items queued, not failed;
    the next run collects every item once."""
    items = 40
    with PolitenessSite(rate=20) as site:
        path = write_source(
            tmp_path,
            seeds={"template": site.url(0).replace("/0", "/{i}"), "range": [0, items]},
            limits={"concurrency": 4, "per_domain_concurrency": 4,
                    "circuit": {"enabled": False}},  # the degrade alone hands items back
            retry={"base_s": 0.05, "cap_s": 0.2, "max_attempts": 50, "budget_min": 10_000,
                   "degrade_share": 0.3, "degrade_hold_s": 0.3},
        )  # fmt: skip
        source = load_source(path)

        async def first() -> Collection:  # one batch, then stop (as a cancelled run does)
            with Collection(source, run_id=str(uuid.uuid4())) as run:
                run.plan()
                async with run.engine() as engine:
                    lease = await run.claim(items)
                    results = await run.fetch(engine, lease)
                    await run.settle(lease, results)
                    assert any(r.status == "deferred" for r in results)
                run.finish()
                return run

        async def rerun() -> Collection:
            with Collection(source, run_id=str(uuid.uuid4())) as run:
                run.plan()  # the seed list is unchanged: nothing offered again
                async with run.engine() as engine:
                    while True:
                        lease = await run.claim(20)
                        if not lease.items:
                            wait = await run.seconds_until_claimable()
                            if wait is None:
                                break
                            await asyncio.sleep(min(max(wait, 0.02), 0.5))
                            continue
                        await run.settle(lease, await run.fetch(engine, lease))
                run.finish()
                return run

        stopped = asyncio.run(first())
        assert stopped.ledger.dead_lettered == 0 and stopped.ledger.queued > 0
        again = asyncio.run(rerun())
    rows = sink_lines(tmp_path / "out")
    assert again.ledger.dead_lettered == 0 and again.ledger.balanced, again.ledger.problems
    assert sorted(row["id"] for row in rows) == list(range(items))  # each once
