"""The local moving window grants exactly when the plain moving-window rule says (a property).

``LocalMovingWindow`` keeps only the send times inside the window, per key, in a deque it trims
from the left, and sleeps until the oldest leaves. The plain reference keeps every grant and
answers the textbook rule: a request arriving at ``t`` is granted at the first moment ``t' >= t``
when fewer than N grants lie in ``(t' - window, t']``, i.e. ``max(t, grants[-N] + window)``.
Time is a simulated clock here (the module's ``time.monotonic`` and ``asyncio.sleep`` are
replaced for this test only), so the comparison is exact up to the window's 1 ms retry step.
"""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.fetch import ratelimit
from collector.fetch.ratelimit import LocalMovingWindow

RATES = st.sampled_from(["1/second", "3/second", "5/2 seconds", "2/minute", "10/second"])
REQUESTS = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.floats(0, 3, allow_nan=False)),
    min_size=1,
    max_size=40,
)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


def _reference(amount: int, window: float, requests: list[tuple[str, float]]) -> list[float]:
    clock, grants, out = 1000.0, dict[str, list[float]](), []
    for key, gap in requests:
        clock += gap
        sent = grants.setdefault(key, [])
        if len(sent) < amount or sent[-amount] + window <= clock + 1e-9:  # the edge, in floats
            granted = clock
        else:  # a wait, never shorter than the limiter's 1 ms floor
            granted = clock + max(0.001, sent[-amount] + window - clock)
        sent.append(granted)
        out.append(granted)
        clock = granted  # requests are made one after another
    return out


@settings(max_examples=300, deadline=None)
@given(RATES, REQUESTS)
def test_grants_are_the_plain_moving_window_rule(
    rate: str, requests: list[tuple[str, float]]
) -> None:
    clock = _Clock()
    window = LocalMovingWindow(rate)

    async def run() -> list[float]:
        out = []
        for key, gap in requests:
            clock.now += gap
            await window.acquire(key)
            out.append(clock.now)
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ratelimit, "time", types.SimpleNamespace(monotonic=clock.monotonic))
        patch.setattr(ratelimit, "asyncio", types.SimpleNamespace(sleep=clock.sleep))
        got = asyncio.run(run())
    want = _reference(window.amount, window.window_s, requests)
    assert got == pytest.approx(want, abs=1e-6), f"{rate}: {requests}"
    for key in {k for k, _ in requests}:  # memory: only the sends inside the window are kept
        assert len(window._sent[key]) <= window.amount


def _unused(*_: Any) -> None: ...
