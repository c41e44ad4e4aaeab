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
        assert (await circuit.admit("h")).go  # two failures: still closed
        ok = await circuit.admit("h")
        await circuit.record("h", ok, failed=False)  # a success resets the run of failures
        await fail(circuit, n=2)
        assert (await circuit.admit("h")).go
        await fail(circuit)  # third in a row
        admission = await circuit.admit("h")
        assert not admission.go and admission.not_before == pytest.approx(clock.now + 10)
        assert circuit.deferred_until("h") == pytest.approx(clock.now + 10)
        assert [kind for kind, _ in events] == ["opened"]
        assert events[0][1]["host"] == "h" and events[0][1]["consecutive_failures"] == 3
        assert (await circuit.admit("other")).go  # per host

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
