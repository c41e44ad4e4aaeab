"""The circuit breaker's state machine (closed -> open -> half-open), on a fake clock.

The outage end to end (a real host going down mid-run, two workers on Redis) is in
tests/test_circuit_outage.py.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.config import CircuitSettings, LimitsSettings
from collector.fetch.circuit import CircuitBoard, cooldown_s


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def board(clock: Clock, **options: Any) -> tuple[CircuitBoard, list[tuple[str, dict[str, Any]]]]:
    settings = CircuitSettings(**{"failures": 3, "cooldown_s": 10, "jitter": 0, **options})
    events: list[tuple[str, dict[str, Any]]] = []
    circuit = CircuitBoard(settings, probe_window_s=5, clock=clock, rng=random.Random(1))
    circuit.listeners.append(lambda kind, data: events.append((kind, data)))
    return circuit, events


async def closed(circuit: CircuitBoard, host: str = "h") -> bool:
    """Whether a request would go now (one not sent: the engine forgets its admission)."""
    admission = await circuit.admit(host)
    circuit.forget(host, admission)
    return admission.go


async def fail(circuit: CircuitBoard, host: str = "h", n: int = 1) -> None:
    for _ in range(n):
        admission = await circuit.admit(host)
        assert admission.go
        await circuit.record(host, admission, failed=True)


def test_opens_after_consecutive_failures_and_defers_until_the_cooldown() -> None:
    async def scenario() -> None:
        clock = Clock()
        circuit, events = board(clock)
        await fail(circuit, n=2)
        assert await closed(circuit)  # two failures: still closed
        ok = await circuit.admit("h")
        await circuit.record("h", ok, failed=False)  # a success resets the run of failures
        await fail(circuit, n=2)
        assert await closed(circuit)
        await fail(circuit)  # third in a row
        admission = await circuit.admit("h")
        assert not admission.go and admission.not_before == pytest.approx(clock.now + 10)
        assert circuit.deferred_until("h") == pytest.approx(clock.now + 10)
        assert [kind for kind, _ in events] == ["opened"]
        assert events[0][1]["host"] == "h" and events[0][1]["consecutive_failures"] == 3
        assert await closed(circuit, "other")  # per host

    asyncio.run(scenario())


def test_opens_on_a_failure_ratio_over_the_window() -> None:
    async def scenario() -> None:
        circuit, _ = board(Clock(), failures=100, window=10, failure_ratio=0.5)
        for i in range(10):  # alternate: never 2 in a row, but 5 of 10 failed
            admission = await circuit.admit("h")
            assert admission.go, i
            await circuit.record("h", admission, failed=i % 2 == 1)
        assert not (await circuit.admit("h")).go

    asyncio.run(scenario())


def test_half_open_lets_a_bounded_number_of_probes_and_grows_the_cooldown() -> None:
    async def scenario() -> None:
        clock = Clock()
        circuit, events = board(clock, probes=2, cooldown_factor=3)
        await fail(circuit, n=3)
        clock.now += 10.01  # cool-down over: half-open
        first, second, third = [await circuit.admit("h") for _ in range(3)]
        assert first.go and second.go and first.probe_epoch == second.probe_epoch == 1
        assert not third.go  # the probes are out
        await circuit.record("h", first, failed=True)  # a probe failed: open again, longer
        await circuit.record("h", second, failed=True)  # same opening: not tripped twice
        again = await circuit.admit("h")
        assert not again.go and again.not_before == pytest.approx(clock.now + 30)
        assert [kind for kind, _ in events] == ["opened", "opened"]
        clock.now += 30.01
        probe = await circuit.admit("h")
        assert probe.go and probe.probe_epoch == 2
        await circuit.record("h", probe, failed=False)  # success: closed
        assert [kind for kind, _ in events] == ["opened", "opened", "closed"]
        assert all([(await circuit.admit("h")).go for _ in range(10)])
        assert circuit.opened == 2 and circuit.closed == 1

    asyncio.run(scenario())


def test_a_lost_probe_frees_its_slot_at_the_next_round() -> None:
    async def scenario() -> None:
        clock = Clock()
        circuit, _ = board(clock, probes=1)
        await fail(circuit, n=3)
        clock.now += 10.01
        assert (await circuit.admit("h")).go  # this probe never reports (its batch was cut)
        assert not (await circuit.admit("h")).go
        clock.now += 5  # one probe window later
        assert (await circuit.admit("h")).go

    asyncio.run(scenario())


def test_answers_after_opening_do_not_count_twice() -> None:
    async def scenario() -> None:
        clock = Clock()
        circuit, events = board(clock)
        in_flight = [await circuit.admit("h") for _ in range(8)]  # all sent while closed
        for admission in in_flight:
            await circuit.record("h", admission, failed=True)
        assert [kind for kind, _ in events] == ["opened"]
        clock.now += 10.01
        probe = await circuit.admit("h")
        assert probe.go and probe.probe_epoch == 1  # first opening, not the sixth

    asyncio.run(scenario())


@settings(max_examples=200, deadline=None)
@given(
    opens=st.integers(1, 30),
    draw=st.floats(0, 1, exclude_max=True),
    base=st.floats(0.1, 100),
    factor=st.floats(1, 4),
    jitter=st.floats(0, 0.9),
)
def test_cooldown_grows_and_stays_within_jitter_of_its_cap(
    opens: int, draw: float, base: float, factor: float, jitter: float
) -> None:
    s = CircuitSettings(cooldown_s=base, cooldown_factor=factor, cooldown_max_s=300, jitter=jitter)
    value = cooldown_s(s, opens, draw)
    nominal = min(base * factor ** (opens - 1), 300)
    assert nominal * (1 - jitter) - 1e-9 <= value <= nominal * (1 + jitter) + 1e-9
    assert cooldown_s(s, opens + 1, draw) >= value - 1e-9  # never shorter when opened again


def test_settings_switches() -> None:
    assert LimitsSettings.model_validate({"circuit": False}).circuit.enabled is False
    assert LimitsSettings.model_validate({"adaptive": False}).adaptive.enabled is False
    on = LimitsSettings.model_validate({"circuit": {"failures": 2}}).circuit
    assert on.enabled and on.failures == 2
    with pytest.raises(ValueError, match="failure_ratio"):
        LimitsSettings.model_validate({"circuit": {"failure_ratio": 2}})


@settings(max_examples=60, deadline=None)
@given(
    answers=st.lists(
        st.one_of(st.sampled_from(["bad-0", "bad-1"]), st.integers(0, 50).map(lambda n: f"ok-{n}")),
        min_size=1,
        max_size=300,
    )
)
def test_a_few_pages_that_always_fail_never_open_the_breaker(answers: list[str]) -> None:
    """Two pages that always answer 503, retried in any order among good pages (their retries
    crowd a batch's tail), never open a breaker that opens on 3 failures in a row or half of
    the last 6: a page failing again is evidence about the page, not about the host."""

    async def scenario() -> None:
        circuit, events = board(Clock(), window=6, failure_ratio=0.5)
        for page in answers:
            admission = await circuit.admit("h")
            assert admission.go, (page, events)
            await circuit.record("h", admission, failed=page.startswith("bad"), url=page)
        assert events == []

    asyncio.run(scenario())


def test_distinct_pages_failing_open_it_as_before() -> None:
    async def scenario() -> None:
        circuit, events = board(Clock())
        for n in range(3):
            admission = await circuit.admit("h")
            await circuit.record("h", admission, failed=True, url=f"page-{n}")
        assert not (await circuit.admit("h")).go
        assert [kind for kind, _ in events] == ["opened"]

    asyncio.run(scenario())


def _longest_run(failed: list[bool]) -> int:
    """The plain reference: the longest run of failures in send order."""
    longest = run = 0
    for f in failed:
        run = run + 1 if f else 0
        longest = max(longest, run)
    return longest


@settings(max_examples=200, deadline=None)
@given(data=st.data(), failed=st.lists(st.booleans(), min_size=1, max_size=60))
def test_consecutive_means_consecutive_as_sent_whatever_order_the_answers_come_in(
    data: st.DataObject, failed: list[bool]
) -> None:
    """All sent at once (32 in flight), answered in any order (a 503 answers in a millisecond,
    a page in 300 ms): the breaker opens exactly when the send order holds ``failures`` failures
    in a row, as the plain reference counts them. Counting in answer order, three fast failures
    among slow pages opened it on a host that served every other page."""
    answer_order = data.draw(st.permutations(range(len(failed))))

    async def scenario() -> None:
        circuit, events = board(Clock(), failures=3, window=1000, failure_ratio=1.0)
        admissions = [await circuit.admit("h") for _ in failed]
        for i in answer_order:
            if circuit.open_hosts():
                break
            await circuit.record("h", admissions[i], failed=failed[i], url=f"page-{i}")
        opened = [kind for kind, _ in events] == ["opened"]
        assert opened == (_longest_run(failed) >= 3), (failed, answer_order, events)

    asyncio.run(scenario())


def test_a_request_never_sent_does_not_hold_back_a_run() -> None:
    """The engine forgets an admission it did not use (too late for its batch, cancelled): the
    failures around it are still a run."""

    async def scenario() -> None:
        circuit, events = board(Clock())
        first = await circuit.admit("h")
        unused = await circuit.admit("h")
        second, third = await circuit.admit("h"), await circuit.admit("h")
        for admission in (first, second, third):
            await circuit.record("h", admission, failed=True)
        assert events == []  # the unused one is still in flight: it could be a success
        circuit.forget("h", unused)
        fourth = await circuit.admit("h")
        await circuit.record("h", fourth, failed=True)
        assert [kind for kind, _ in events] == ["opened"]

    asyncio.run(scenario())
