"""The adaptive host window: its rules on their own, then against real local hosts.

Rules: slow start doubles per round trip, overload cuts multiplicatively and once per round
trip, the window never leaves [1, per_domain_concurrency] (Hypothesis), fixed mode never moves.
Hosts: a fixed pool of K workers (latency grows above K in flight) settles the window near K;
a host that answers 429 above a rate it does not announce gets fewer than 2 % 429s after
warm-up. Throughput comparisons (adaptive vs the best fixed setting, vs nginx) are measured in
bench/politeness.py, not asserted here.
"""

from __future__ import annotations

import asyncio
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.config import AdaptiveSettings, CircuitSettings
from collector.fetch.adaptive import HostGate, Signal
from collector.fetch.engine import FetchEngine
from collector.frontier.base import ClaimedItem
from collector.policy.retry import RetryBudget, RetrySettings
from collector.policy.urls import HostPolicy
from tests.politeness_site import PolitenessSite

ON = AdaptiveSettings(start=2)


def _ok(gate: HostGate, latency: float = 0.01) -> None:
    gate.in_flight = gate.limit  # a window in use
    gate.observe("ok", sent_at=time.monotonic(), latency_s=latency, paced=False)


def test_slow_start_then_one_cut_per_round_trip() -> None:
    gate = HostGate(32, ON)
    assert gate.limit == 2
    for _ in range(6):
        _ok(gate)
    assert gate.limit == 8  # +1 per answer while in slow start
    sent = time.monotonic()
    gate.observe("overload", sent_at=sent, latency_s=0, paced=False)
    assert gate.limit == 4
    for _ in range(5):  # the rest of that round trip's failures: no further cut
        gate.observe("overload", sent_at=sent, latency_s=0, paced=False)
    assert gate.limit == 4
    for _ in range(4):  # after the cut: +1 per window of answers
        _ok(gate)
    assert gate.limit == 4 or gate.limit == 5
    assert not gate.slow_start


def test_latency_well_above_its_floor_cuts_but_a_fast_hosts_jitter_does_not() -> None:
    gate = HostGate(32, ON)
    for _ in range(10):
        _ok(gate, latency=0.0005)
    before = gate.limit
    for _ in range(10):
        _ok(gate, latency=0.003)  # 6x the floor, but only 2.5 ms above it: not a signal
    assert gate.limit >= before
    for _ in range(10):
        _ok(gate, latency=0.2)
    assert gate.cuts >= 1 and gate.limit < 32


def test_throttled_answers_start_pacing() -> None:
    gate = HostGate(32, ON)
    now = time.monotonic()
    for i in range(20, 0, -1):  # 20 sends over the last second
        gate._sends.append(now - i * 0.05)
    gate.observe("throttled", sent_at=time.monotonic(), latency_s=0, paced=False)
    assert gate.rate is not None and 5 <= gate.rate <= 15  # half the rate it went at


def test_fixed_mode_never_moves() -> None:
    gate = HostGate(7, None)
    for signal in ("ok", "overload", "throttled"):
        gate.observe(signal, sent_at=time.monotonic(), latency_s=5, paced=False)
    assert gate.limit == 7 and gate.rate is None


@settings(max_examples=200, deadline=None)
@given(
    ceiling=st.integers(1, 64),
    start=st.integers(1, 64),
    events=st.lists(
        st.tuples(st.sampled_from(["ok", "overload", "throttled", "other"]), st.floats(0, 2)),
        max_size=200,
    ),
)
def test_window_stays_between_one_and_the_ceiling(
    ceiling: int, start: int, events: list[tuple[Signal, float]]
) -> None:
    gate = HostGate(ceiling, AdaptiveSettings(start=start))
    for signal, latency in events:
        gate.in_flight = gate.limit
        gate.observe(signal, sent_at=time.monotonic(), latency_s=latency, paced=True)
        assert 1 <= gate.limit <= ceiling


def test_the_gate_never_lets_more_than_the_window_in_flight() -> None:
    async def scenario() -> int:
        gate = HostGate(10, AdaptiveSettings(start=3))
        peak = 0

        async def one() -> None:
            nonlocal peak
            await gate.acquire()
            try:
                peak = max(peak, gate.in_flight)
                assert gate.in_flight <= gate.limit
                await asyncio.sleep(0.001)
            finally:
                gate.release()

        await asyncio.gather(*(one() for _ in range(50)))
        return peak

    assert asyncio.run(scenario()) == 3  # no answers observed: the window did not move


# --- against real hosts --------------------------------------------------------------------
def _engine(ceiling: int, adaptive: AdaptiveSettings | None) -> FetchEngine:
    return FetchEngine(
        retry=RetrySettings(base_s=0.05, cap_s=0.2, max_attempts=50, max_total_s=600),
        host_policy=HostPolicy(allow_private_networks=True),
        http_timeout_s=5,
        request_deadline_s=10,
        concurrency=ceiling,
        per_domain_concurrency=ceiling,
        adaptive=adaptive,
        circuit=None,
    )


async def _fetch_all(engine: FetchEngine, site: PolitenessSite, n: int) -> list[int]:
    """Fetch items 0..n-1 in batches, recording the host's window after each batch."""
    windows = []
    budget = RetryBudget(ratio=10.0, min_retries=100_000)
    async with engine:
        todo = [ClaimedItem(site.url(i), 0, None, 0.0) for i in range(n)]
        while todo:
            batch, todo = todo[:100], todo[100:]
            results = await engine.fetch_batch(batch, budget=budget)
            todo += [ClaimedItem(r.url, 0, None, 0.0) for r in results if r.status != "ok"]
            windows.append(engine.windows()["127.0.0.1"])
    return windows


def test_a_fixed_worker_pool_settles_the_window_near_its_size() -> None:
    pool = 4
    with PolitenessSite(workers=pool, service_s=0.04) as site:
        windows = asyncio.run(_fetch_all(_engine(32, AdaptiveSettings()), site, 800))
    settled = windows[len(windows) // 2 :]
    # Fixed, this engine would keep 32 in flight (8x the pool, 8x the latency).
    assert all(pool / 2 <= w <= 3 * pool for w in settled), windows


def _adapted_share_after_warm_up() -> tuple[float, int]:
    with PolitenessSite(rate=100) as site:
        asyncio.run(_fetch_all(_engine(16, AdaptiveSettings()), site, 1000))
        log = sorted(site.log)
    start, end = log[0][0], log[-1][0]
    after_warm_up = [status for at, status in log if at > start + (end - start) / 3]
    return after_warm_up.count(429) / len(after_warm_up), len(after_warm_up)


def _fixed_share() -> float:
    with PolitenessSite(rate=100) as site:

        async def some() -> None:
            engine = _engine(16, None)
            budget = RetryBudget(ratio=10.0, min_retries=100_000)
            async with engine:
                items = [ClaimedItem(site.url(i), 0, None, 0.0) for i in range(300)]
                await engine.fetch_batch(items, budget=budget)

        asyncio.run(some())
        statuses = [status for _, status in site.log]
    return statuses.count(429) / len(statuses)


def test_an_unannounced_rate_limit_gets_far_fewer_429s_adapted_than_fixed() -> None:
    """Side by side in one test, so the box's load weighs on both: fixed concurrency runs into
    the unannounced limit (the check can fail), the adaptive window at most half as often.

    bench/politeness.py on a quiet box: 0.4 % adapted vs 24 % fixed. A CI box at load 10-15 has
    pushed the adapted share alone to 2-6 %, which is why no absolute bound is asserted."""
    fixed = _fixed_share()
    adapted, measured = _adapted_share_after_warm_up()
    assert fixed > 0.04, fixed  # the limit is real: without adaptation it answers 429 often
    assert adapted < fixed / 2, (adapted, fixed, measured)


_ = CircuitSettings  # the breaker is off in these tests (circuit=None): 429s must not open it
