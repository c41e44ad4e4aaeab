"""The adaptive host window: its rules on their own, then against real local hosts.

Rules: slow start doubles per round trip, overload cuts multiplicatively and once per round
trip, the window never leaves [1, per_domain_concurrency] (Hypothesis), fixed mode never moves.
Hosts: a fixed pool of K workers (latency grows above K in flight) settles the window near K;
a host that answers 429 above a rate it does not announce gets fewer than 2 % 429s after
warm-up. On virtual time (an event loop whose clock jumps to its next timer, modelled
hosts): the issue's noise mix at a steady share is fetched as fast as fixed, a token bucket
is found and kept to, a rate recovers within seconds once a limit goes away, and a pace
stops at its floor unless the host throttles there too. Throughput comparisons (adaptive vs
the best fixed setting, vs Scrapy's AutoThrottle) are measured in bench/politeness.py.
"""

from __future__ import annotations

import asyncio
import collections
import math
import selectors
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.config import AdaptiveSettings, CircuitSettings
from collector.fetch import adaptive
from collector.fetch.adaptive import HostGate, Signal
from collector.fetch.engine import FetchEngine
from collector.fetch.pacing import Pacing
from collector.frontier.base import ClaimedItem
from collector.policy.retry import RetryBudget, RetrySettings
from collector.policy.urls import HostPolicy
from tests.politeness_site import PolitenessSite, SiteProcess

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


def test_one_page_timing_out_again_and_again_cuts_the_window_once() -> None:
    """The demo's one slow page, retried three times, left its host at "window 2 of 16 after
    timeouts": each retry's timeout was read as the host's overload. A page that times out
    again is that page's trouble; a different page timing out is news again."""
    gate = HostGate(32, ON)
    for _ in range(10):
        _ok(gate)
    before = gate.limit
    for _ in range(4):
        sent = time.monotonic()
        gate.observe("overload", sent_at=sent, latency_s=0, paced=False, url="/slow")
        gate.recovered = True  # good answers came in between the retries
        gate.cut_at = -math.inf
    assert gate.cuts == 1 and gate.limit == before // 2, (gate.cuts, gate.limit)
    gate.observe("overload", sent_at=time.monotonic(), latency_s=0, paced=False, url="/other")
    assert gate.cuts == 2
    gate.observe("ok", sent_at=time.monotonic(), latency_s=0.01, paced=False, url="/slow")
    gate.recovered, gate.cut_at = True, -math.inf
    gate.observe("overload", sent_at=time.monotonic(), latency_s=0, paced=False, url="/slow")
    assert gate.cuts == 3  # it answered well in between: a new timeout is news


def test_a_slow_page_on_a_host_that_answers_everything_else_does_not_cut() -> None:
    """A page that times out after 1 s while pages sent after it came back in 10 ms: the host
    was serving, the page is slow (the demo's ``delay=5`` page cut its host's window to 8 of
    16 and the run ended "slowed"). A host that stops answering times out the pages sent
    after it too: that cuts, once."""
    gate = HostGate(16, ON)
    for _ in range(20):
        _ok(gate)
    before = gate.limit
    slow_sent = time.monotonic()
    gate.observe("ok", sent_at=slow_sent + 0.1, latency_s=0.01, paced=False, url="/fast")
    gate.observe("overload", sent_at=slow_sent, latency_s=0, paced=False, url="/slow")
    assert gate.cuts == 0 and gate.limit >= before, (gate.cuts, gate.limit)
    hung = time.monotonic() + 1.0  # sent after every good answer; they all time out
    for n in range(5):
        gate.observe("overload", sent_at=hung + n * 0.01, latency_s=0, paced=False, url=f"/{n}")
    assert gate.cuts == 1 and gate.limit == before // 2, (gate.cuts, gate.limit)


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


def test_our_lateness_lowers_what_is_judged_never_the_floor() -> None:
    """A 150 ms host whose first answers waited 100 ms for our loop (a thousand tasks
    starting): discounted, they read 50 ms. Learnt from them, the floor would be 50 ms and the
    host's own 150 ms three times it: cut after cut (a 100-300 ms host fell to a window of 3).
    The floor comes from the raw figures; the same answers, later and undiscounted, are no
    signal. (Fails when the floor is learnt from the discounted latency.)"""
    gate = HostGate(32, ON)
    for _ in range(12):
        gate.in_flight = gate.limit
        gate.observe("ok", sent_at=time.monotonic(), latency_s=0.05, paced=False,
                     raw_latency_s=0.15)  # fmt: skip
    for _ in range(30):
        _ok(gate, latency=0.15)  # the loop quiet now: nothing to take out
    assert gate.cuts == 0, gate.slowdown()
    assert gate.floor >= 0.14, gate.floor
    for _ in range(20):
        _ok(gate, latency=0.6)  # the host really queues: still seen
    assert gate.cuts >= 1


def test_fixed_mode_never_moves() -> None:
    gate = HostGate(7, None)
    for signal in ("ok", "overload", "throttled"):
        gate.observe(signal, sent_at=time.monotonic(), latency_s=5, paced=False)
    assert gate.limit == 7 and gate.rate is None and gate.slowdown() is None


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


async def _fetch_all_sampled(engine: FetchEngine, site: PolitenessSite, n: int) -> list[int]:
    """:func:`_fetch_all`, the host's window read every 50 ms while it runs (not only at each
    batch's end: 8 readings, of which a loaded box's one bad moment was a quarter)."""
    windows: list[int] = []
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            if (window := engine.windows().get("127.0.0.1")) is not None:
                windows.append(window)
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    try:
        await _fetch_all(engine, site, n)
    finally:
        done.set()
        await sampler
    return windows


def test_a_fixed_worker_pool_settles_the_window_near_its_size() -> None:
    pool = 4
    with PolitenessSite(workers=pool, service_s=0.04) as site:
        windows = asyncio.run(_fetch_all_sampled(_engine(32, AdaptiveSettings()), site, 800))
    settled = windows[len(windows) // 2 :]
    # Fixed, this engine would keep 32 in flight (8x the pool, 8x the latency). Settled: around
    # the pool's size, never half way to 32. (Every window within 3x once failed on a loaded
    # box: one step to 13 among 8s, the latency floor being noisy there; the median holds. Of
    # 4 readings at batch ends, one outside 4x failed once at high load: read every 50 ms, the
    # second half's windows are about 80 readings, 9 in 10 of them asked to be within 4x.)
    # Fails without the latency cut (latency_factor 1000: broken on purpose, 2026-12-06; every
    # reading then 32). The median within 4x, as every reading is asked: within 3x failed once
    # at load 7 (2026-12-07 CI: median 13, readings 14-15 among lower ones; 8 on a quiet box).
    assert len(settled) >= 20, windows
    assert pool / 2 <= statistics.median(settled) <= 4 * pool, windows
    within = [w for w in settled if pool / 2 <= w <= 4 * pool]
    assert len(within) >= 0.9 * len(settled), windows


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


# --- on virtual time: hosts modelled in-process, the gate as the engine drives it ------------
class _Clock:
    """Virtual time: the loop's clock and the gate's ``time.monotonic``. The selector never
    blocks; it moves the clock to the next timer instead, so a minute runs in a moment."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def _virtual_loop(clock: _Clock) -> asyncio.AbstractEventLoop:
    class Selector(selectors.SelectSelector):
        def select(self, timeout: float | None = None) -> list[Any]:
            if timeout is not None and timeout > 0:
                clock.now += timeout
            return super().select(0)

    loop = asyncio.SelectorEventLoop(Selector())
    loop.time = clock.monotonic  # type: ignore[method-assign]
    return loop


@dataclass
class _Host:
    """A modelled host: how it answers attempt ``attempt`` of item ``i`` sent at ``now``.

    Returns (signal, latency, retry after or None). ``noise``: the issue's mix, the same share
    at every rate (item i % 50 in {0, 1}: 503 once; == 2: 429 with Retry-After 1 once; i % 10
    == 5: 404; == 3: malformed, a 200 for the gate). ``bucket``: a token bucket of ``rate``/s
    (burst ``rate`` / 10) that answers 429 above it, with ``retry_after`` when set.
    """

    latency: float = 0.05
    fail_latency: float | None = None  # a throttled answer's latency, when not ``latency``
    noise: bool = False
    bucket: float | None = None
    retry_after: float | None = None
    limited_until: float = math.inf  # the bucket applies until then
    tokens: float = 0.0
    refilled: float = 0.0
    answers: list[tuple[float, str]] = field(default_factory=list)

    def answer(self, i: int, attempt: int, now: float) -> tuple[Signal, float | None]:
        signal: Signal = "ok"
        retry_after = None
        if self.bucket is not None and now < self.limited_until:
            burst = max(self.bucket / 10, 1.0)
            self.tokens = min(burst, self.tokens + (now - self.refilled) * self.bucket)
            self.refilled = now
            if self.tokens < 1:
                signal, retry_after = "throttled", self.retry_after
            else:
                self.tokens -= 1
        if self.noise and attempt == 0 and signal == "ok":
            if i % 50 in (0, 1):
                signal = "throttled"
            elif i % 50 == 2:
                signal, retry_after = "throttled", 1.0
            elif i % 10 == 5:
                signal = "other"
        self.answers.append((now, signal))
        return signal, retry_after


def _simulate(
    host: _Host, gate: HostGate, *, items: int, workers: int = 64, for_s: float = 600.0
) -> tuple[float, list[tuple[float, float | None]], int]:
    """Fetch ``items`` through ``gate`` as the engine does (a retry waits its backoff or
    Retry-After outside the gate), for at most ``for_s`` virtual seconds; returns (virtual
    seconds, (time, paced rate) each second, items fetched)."""
    clock = _Clock()
    until = clock.now + for_s
    fetched = 0
    todo: collections.deque[tuple[int, int]] = collections.deque((i, 0) for i in range(items))
    rates: list[tuple[float, float | None]] = []

    async def worker() -> None:
        while todo and clock.now < until:
            i, attempt = todo.popleft()
            paced = await gate.acquire()
            sent = gate.sent()
            try:
                signal, retry_after = host.answer(i, attempt, clock.now)
                fast = signal == "throttled" and host.fail_latency is not None
                await asyncio.sleep(host.fail_latency if fast else host.latency)  # type: ignore[arg-type]
                gate.observe(signal, sent_at=sent, latency_s=clock.now - sent, paced=paced)
            finally:
                gate.release()
            if signal != "throttled":
                nonlocal fetched
                fetched += 1
            else:
                await asyncio.sleep(retry_after if retry_after is not None else 0.05)
                todo.append((i, attempt + 1))

    async def watch(done: asyncio.Event) -> None:
        while not done.is_set():
            rates.append((clock.now, gate.rate))
            await asyncio.sleep(1.0)

    async def run() -> float:
        started = clock.now
        done = asyncio.Event()
        watcher = asyncio.create_task(watch(done))
        await asyncio.gather(*(worker() for _ in range(workers)))
        done.set()
        await watcher
        return clock.now - started

    loop = _virtual_loop(clock)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(adaptive, "time", clock)
        try:
            return loop.run_until_complete(run()), rates, fetched
        finally:
            loop.close()


def test_a_host_with_noise_at_a_steady_share_is_fetched_as_fast_as_fixed() -> None:
    """The issue's mix (6 % throttled once, at any rate): the adaptive gate must not pace it
    down. Fixed, 16 in flight at 50 ms: ~300 pages/s; main's gate fell to a few per second."""
    items = 6000
    fixed_s, _, fixed = _simulate(_Host(noise=True), HostGate(16, None), items=items)
    assert fixed == items
    gate = HostGate(16, AdaptiveSettings())
    adaptive_s, rates, fetched = _simulate(_Host(noise=True), gate, items=items, for_s=4 * fixed_s)
    assert fetched == items, f"{fetched} of {items} in 4x the fixed time; paced {rates}"
    assert fixed_s / adaptive_s >= 0.9, (fixed_s, adaptive_s, rates)
    assert gate.slowdown() is None, gate.slowdown()


def test_noise_answered_faster_than_the_pages_is_not_taken_for_a_limit() -> None:
    """The mess of a loaded box: the 503/429s come back in 1 ms, the pages in 300 ms, and the
    failing pages come in clusters (three in a row of every 50). Judging an epoch by the answers
    it happened to have counted the fast failures and missed the slow pages sent beside them:
    a share of 20 % where the host has 6 %, then cut after cut (a CI run took 3.3x the fixed
    time). Epochs judged once their sends have answered see the real share."""
    items = 6000
    host = _Host(latency=0.3, fail_latency=0.001, noise=True)
    fixed_s, _, fixed = _simulate(host, HostGate(32, None), items=items)
    assert fixed == items
    gate = HostGate(32, AdaptiveSettings())
    host = _Host(latency=0.3, fail_latency=0.001, noise=True)
    adaptive_s, rates, fetched = _simulate(host, gate, items=items, for_s=4 * fixed_s)
    assert fetched == items, f"{fetched} of {items} in 4x the fixed time; paced {rates}"
    assert fixed_s / adaptive_s >= 0.9, (fixed_s, adaptive_s, rates)
    assert gate.slowdown() is None, gate.slowdown()


def test_a_real_limit_is_found_and_kept_to() -> None:
    """A token bucket of 100/s that answers 429 above it: after warm-up the host gets >= 90 %
    of its rate and <= 2 % of the answers are 429s; the gate says why it is paced."""
    host = _Host(latency=0.002, bucket=100.0)
    gate = HostGate(16, AdaptiveSettings())
    seconds, rates, _ = _simulate(host, gate, items=3000)
    warm = host.answers[0][0] + seconds / 3
    later = [signal for at, signal in host.answers if at >= warm]
    ok = later.count("ok")
    assert ok / (host.answers[-1][0] - warm) >= 90, (ok, seconds, rates)
    assert later.count("throttled") / len(later) <= 0.02, (later.count("throttled"), len(later))
    why = gate.slowdown()
    assert why is not None and why.startswith("paced to ") and "429/503" in why, why


def test_after_a_limit_goes_away_the_rate_recovers_in_seconds() -> None:
    """Limited to 20/s for 30 s, then not: within 20 s of the limit's end the host is unpaced
    (main's gate grew per paced answer: from 20/s, minutes)."""
    host = _Host(latency=0.01, bucket=20.0, limited_until=1030.0)
    gate = HostGate(16, AdaptiveSettings())
    _, rates, _ = _simulate(host, gate, items=100_000, workers=16, for_s=60.0)
    during = [rate for at, rate in rates if 1010 <= at <= 1030]
    assert during and all(r is not None and r < 40 for r in during), rates  # it was paced
    after = [rate for at, rate in rates if at >= 1050]
    assert after and all(r is None for r in after), rates


def test_a_paced_rate_stays_above_the_floor_unless_the_host_throttles_there() -> None:
    """Virtual time: a host refusing 60 % at every rate is limited (too loud for noise); the
    rate comes down, stops at the floor, and goes below it only after an epoch *at the floor*
    that was in excess too."""
    pacing = Pacing(floor=2.0)
    now = 0.0
    seen: list[float] = []
    for k in range(2000):  # sent at the paced rate (100/s unpaced), answered at once
        pacing.sent(now)
        pacing.answered(throttled=k % 5 < 3, sent_at=now, now=now)
        rate = pacing.rate(now)
        seen.append(rate if rate is not None else 100.0)
        now += 1 / seen[-1]
    below = [i for i, r in enumerate(seen) if r < 2.0]
    at_floor = [i for i, r in enumerate(seen) if 2.0 <= r <= 2.0 * 1.01]
    assert at_floor and below, seen[::20]
    assert at_floor[0] < below[0], (at_floor[0], below[0])
    assert all(seen[i] >= 2.0 for i in range(below[0])), seen[::20]
    # below the floor only after a whole epoch at it (>= 20 answers, all sent from the floor)
    assert below[0] - at_floor[0] >= 20, (at_floor[0], below[0])


def test_noise_is_learned_and_a_cut_undone() -> None:
    """Epochs at any rate with 6 % throttled: the first excess cuts, the test epoch shows the
    same share, the cut is undone (unpaced again) and 6 % becomes the host's noise."""
    pacing = Pacing()
    now = 0.0
    for n in range(3000):
        pacing.sent(now)
        pacing.answered(throttled=n % 50 < 3, sent_at=now, now=now)
        now += 0.01
    assert pacing.cuts >= 1 and pacing.undone == pacing.cuts, (pacing.cuts, pacing.undone)
    assert pacing.rate(now) is None and 0.04 <= pacing.noise <= 0.08, pacing.noise


@pytest.mark.parametrize("every_s", [2, 3, 5])
def test_noise_in_bursts_is_not_taken_for_a_limit(every_s: int) -> None:
    """A loud second (20 % throttled) every few seconds, 6 % in between, at any rate. The epoch
    that caused a cut was picked for being loud: compared with it alone, the quiet epoch after
    it looks like a limit found (z 2.9), and every loud second cuts again. Compared with the
    two epochs before it too, it is the host's usual share: the cut is undone, the noise
    learned, and the run costs at most a tenth more than unpaced."""
    pacing = Pacing()
    now = 0.0
    for n in range(12_000):  # 120 s unpaced (100/s)
        loud = int(now) % every_s == 0
        pacing.sent(now)
        pacing.answered(throttled=n % 50 < (10 if loud else 3), sent_at=now, now=now)
        rate = pacing.rate(now)
        now += 1 / (rate if rate is not None else 100.0)
    assert pacing.undone >= 1, (pacing.cuts, pacing.evidence)
    assert now <= 1.1 * 120, (now, pacing.cuts, pacing.undone, pacing.evidence)
    end = pacing.rate(now)  # unpaced, or a pace far above what it sends (it ends at 8x)
    assert end is None or end >= 200, (end, pacing.noise)


def test_the_progress_line_counts_the_slowed_hosts() -> None:
    from flows.cli._progress import hosts_words

    assert hosts_words({"a": 3}, {}) == ["window 3"]
    slowed = {"a": "paced to 9.0/s after 429/503s (share 20% at 40/s, 0% at 10/s)"}
    assert hosts_words({"a": 3, "b": 32}, slowed) == ["windows 3-32", "1 host slowed"]
    slowed["b"] = "window 4 of 32: latency 3.1x its floor"
    assert hosts_words({"a": 3, "b": 4}, slowed) == ["windows 3-4", "2 hosts slowed"]


class _RawShadow(HostGate):
    """The engine's gate for the host, beside a twin that judges the very same answers raw.

    Every answer the engine reports (its latency with our loop's lateness taken out, and the raw
    figure) goes to this gate as the engine sent it, and to ``shadow`` with the raw figure as
    what is judged: one run, the same answers at the same moments, so a box's load weighs on
    both alike. Two separate runs (one discounted, one not) were compared before, and a loaded
    box, slowing the host for real in one run more than in the other, failed the comparison.
    """

    def __init__(self, ceiling: int, settings: AdaptiveSettings | None) -> None:
        super().__init__(ceiling, settings)
        self.shadow = HostGate(ceiling, settings)

    def observe(
        self,
        signal: Signal,
        *,
        sent_at: float,
        latency_s: float,
        paced: bool,
        url: str | None = None,
        raw_latency_s: float | None = None,
    ) -> None:
        raw = latency_s if raw_latency_s is None else raw_latency_s
        self.shadow.in_flight = self.in_flight
        self.shadow.observe(signal, sent_at=sent_at, latency_s=raw, paced=paced, url=url)
        super().observe(
            signal, sent_at=sent_at, latency_s=latency_s, paced=paced, url=url,
            raw_latency_s=raw_latency_s,
        )  # fmt: skip


def _latency_cuts(gate: HostGate) -> int:
    return gate.cuts if gate.cause == "latency" else 0


def _windows_with_a_busy_loop() -> tuple[_RawShadow, float]:
    """A fast local host fetched while this same loop is busy 60 ms of every 100 ms (parsing,
    validating, writing other pages; or another process on the CPU): the host's gate (its
    raw twin inside) and the worst loop lateness the engine saw."""
    worst = 0.0

    async def scenario() -> _RawShadow:
        nonlocal worst
        engine = _engine(16, AdaptiveSettings())
        engine._new_gate = lambda: _RawShadow(16, AdaptiveSettings())  # type: ignore[method-assign]
        stop = asyncio.Event()

        async def busy() -> None:
            nonlocal worst
            while not stop.is_set():
                until = time.monotonic() + 0.06
                while time.monotonic() < until:
                    pass
                worst = max(worst, engine._loop_lag.lag)
                await asyncio.sleep(0.04)

        with SiteProcess() as site:  # off this process: the busy loop slows only the client
            hog: asyncio.Task[None] | None = None
            budget = RetryBudget(ratio=10.0, min_retries=100_000)
            try:
                async with engine:
                    for start in range(0, 3000, 100):
                        if start == 300 and hog is None:  # the floor is learned on a quiet
                            hog = asyncio.create_task(busy())  # loop first (by answers, not
                        batch = [  # by the clock: a quiet box fetched all 3000 in a second)
                            ClaimedItem(site.url(i), 0, None, 0.0)
                            for i in range(start, start + 100)
                        ]
                        await engine.fetch_batch(batch, budget=budget)
                    gate = engine.slots["127.0.0.1"].gate
                    assert isinstance(gate, _RawShadow)
                    return gate
            finally:
                stop.set()
                if hog is not None:
                    await hog

    gate = asyncio.run(scenario())
    return gate, worst


@pytest.mark.slow
def test_our_own_busy_loop_is_not_read_as_the_hosts_latency() -> None:
    """Answers wait for this loop while it works: judged raw, a fast host's latency rises
    far above its floor and the window is cut for our load (the check can fail: the raw twin
    of the same answers is cut). Discounted by the loop's recent worst lateness, the same
    answers cut the window for latency less often (on a quiet box not at all). The host runs
    in a process of its own: in this one, the busy loop would hold the GIL from it and slow
    the host for real. (Fails when the engine judges the raw latency: broken on purpose,
    2026-12-06, the two counts were equal.)"""
    gate, worst = _windows_with_a_busy_loop()
    raw_cuts, cuts = _latency_cuts(gate.shadow), _latency_cuts(gate)
    seen = (cuts, gate.slowdown(), raw_cuts, gate.shadow.slowdown(), f"loop lag {worst:.3f} s")
    assert worst >= 0.03, seen  # the loop was busy, and the engine's sampler saw it
    assert raw_cuts >= 1, seen  # counted only when latency made the last cut
    assert cuts < raw_cuts, seen
