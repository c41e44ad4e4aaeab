"""The loop-lateness discount: its running peak against a plain maximum, and a real busy loop."""

from __future__ import annotations

import asyncio
import time

from hypothesis import given
from hypothesis import strategies as st

from collector.fetch.looplag import LoopLag

_samples = st.lists(
    st.tuples(st.floats(0.0, 0.5), st.floats(0.0, 0.2)),  # (time since the last, lateness)
    max_size=200,
)


@given(_samples, st.floats(0.05, 2.0))
def test_the_running_peak_is_the_plain_maximum_of_the_window(
    steps: list[tuple[float, float]], window_s: float
) -> None:
    """The deque keeps only samples that can still be the peak; read at every step, it is the
    plain max over every sample of the last ``window_s`` (0.0 with none)."""
    lag = LoopLag(window_s=window_s)
    seen: list[tuple[float, float]] = []
    now = 1000.0
    for gap, late in steps:
        now += gap
        lag.note(late, now)
        seen.append((now, late))
        lag._expire(now)
        plain = max((x for t, x in seen if t >= now - window_s), default=0.0)
        got = lag._peaks[0][1] if lag._peaks else 0.0
        assert got == plain, (got, plain)


def test_a_busy_stretch_is_discounted_whole_and_forgotten_after_the_window() -> None:
    """A stretch of 80 ms in which the loop does not yield shows as ~80 ms of lateness (less at
    most one sampling interval); a window later that sample is gone from the discount.

    "Gone" is checked on the sample itself, not on the discount's value: on a loaded box the
    sampler is often late by tens of ms of its own, so the window's later peak is not zero."""

    async def scenario() -> tuple[float, tuple[float, float], float, list[tuple[float, float]]]:
        lag = LoopLag(window_s=1.0)
        lag.start()
        try:
            await asyncio.sleep(0.1)
            until = time.monotonic() + 0.08
            while time.monotonic() < until:
                pass
            await asyncio.sleep(0.05)
            during = lag.lag
            peak = lag._peaks[0]  # (when noted, lateness): the stretch's sample
            await asyncio.sleep(1.2)
            read_at = time.monotonic()
            lag.discount(0.1)  # a reading expires what is older than the window
            return during, peak, read_at, list(lag._peaks)
        finally:
            await lag.stop()

    during, peak, read_at, kept = asyncio.run(scenario())
    assert during >= 0.08 - 0.02 - 0.005, during
    assert peak[0] < read_at - 1.0, (peak, read_at)  # the stretch is out of the window
    assert peak not in kept and all(noted >= read_at - 1.0 for noted, _ in kept), (peak, kept)
